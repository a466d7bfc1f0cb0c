#include "kv/rules.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "kv/update.h"

namespace gw::kv {

namespace {

enum Mode : uint32_t { kBsp = 0, kSsp = 1, kAsp = 2, kSync = 3 };
enum Update : uint32_t { kSum = 0, kSgd = 1 };

coll::DataType dt(uint8_t d) { return static_cast<coll::DataType>(d); }

}  // namespace

StoreRules::StoreRules(const StoreConfig& config, int server_rank)
    : config_(config), server_rank_(server_rank), workers_(config.workers) {}

uint32_t StoreRules::live() const {
  uint32_t n = 0;
  for (const Worker& w : workers_) n += w.alive ? 1 : 0;
  return n;
}

bool StoreRules::finished() const {
  for (const Worker& w : workers_) {
    if (w.alive && !w.bye) return false;
  }
  return true;
}

uint64_t StoreRules::min_clock() const {
  uint64_t m = UINT64_MAX, all = 0;
  for (const Worker& w : workers_) {
    all = std::max(all, w.clock);
    if (w.alive && !w.bye) m = std::min(m, w.clock);
  }
  return m == UINT64_MAX ? all : m;
}

StoreSummary StoreRules::summary() const {
  StoreSummary s;
  s.config = config_;
  uint64_t last_key = 0;
  for (const auto& [pk, p] : parts_) {
    if (s.partitions == 0 || pk.first != last_key) ++s.keys;  // parts_ is ordered by key
    last_key = pk.first;
    ++s.partitions;
    s.bytes += p.value.size();
  }
  s.min_clock = min_clock();
  for (const Worker& w : workers_) {
    s.max_clock = std::max(s.max_clock, w.clock);
    s.live += w.alive && !w.bye ? 1 : 0;
  }
  s.dropped = dropped_;
  s.lost = lost_;
  s.failed = !failed_.ok();
  s.finished = finished();
  return s;
}

Answer StoreRules::answer(const Header& h, Partition* p, bool with_value) const {
  Answer a;
  a.worker = h.worker;
  Header& r = a.reply;
  r.type = Type::kReply;
  r.dtype = h.dtype;
  r.worker = static_cast<uint32_t>(server_rank_);
  r.partition = h.partition;
  r.key = h.key;
  r.clock = p != nullptr ? p->next_clock : 0;
  r.req_id = h.req_id;
  r.count = h.count;
  r.total = h.total;
  r.aux = min_clock();
  r.aux2 = dropped_;
  r.aux3 = lost_;
  if (with_value && p != nullptr) {
    if (!p->snapshot) p->snapshot = std::make_shared<const std::vector<uint8_t>>(p->value);
    a.payload = Bytes(p->snapshot);
    r.payload = static_cast<uint32_t>(a.payload.size());
  }
  return a;
}

Answer StoreRules::error(const Header& h, const Status& s) const {
  Answer a = answer(h, nullptr, false);
  a.reply.type = Type::kError;
  a.reply.aux = static_cast<uint64_t>(s.code());
  std::string m = s.message();
  if (m.size() > kMaxErrorBytes) m.resize(kMaxErrorBytes);
  a.payload.assign(m.begin(), m.end());
  a.reply.payload = static_cast<uint32_t>(a.payload.size());
  return a;
}

Status StoreRules::check_shape(const Partition& p, const Header& h) const {
  if (p.dtype != h.dtype || p.total != h.total || p.count != h.count) {
    return invalid_arg(
        "key {} partition {}: {} elements of {} (key of {}) do not match the key's {} elements of "
        "{} (key of {})",
        h.key, h.partition, h.count, coll::dtype_name(dt(h.dtype)), h.total, p.count,
        coll::dtype_name(dt(p.dtype)), p.total);
  }
  return ok_status();
}

void StoreRules::apply(Partition& p, const uint8_t* contribution, uint32_t pushes) {
  p.snapshot.reset();  // the value changes: answers from here on carry the new one
  if (config_.update == kSum) {
    if (config_.mode == kBsp || config_.mode == kSync) {
      std::memcpy(p.value.data(), contribution, p.value.size());  // the clock's sum
    } else {
      add_into(dt(p.dtype), p.value.data(), contribution, p.count);
    }
    return;
  }
  sgd_step(dt(p.dtype), p.value.data(), contribution, p.count, 1.0 / pushes, config_.lr,
           config_.momentum, &p.velocity);
}

Status StoreRules::push(Partition& p, const Header& h, const uint8_t* payload) {
  if (config_.mode == kAsp || config_.mode == kSsp) {
    apply(p, payload, 1);
    return ok_status();
  }
  const uint64_t c = h.clock;
  if (c < p.next_clock) {
    if (config_.mode == kSync) {
      ++dropped_;  // a backup worker's late push: its clock closed without it
      return ok_status();
    }
    return invalid_arg("key {} partition {}: push of clock {} after that clock closed", h.key,
                       h.partition, c);
  }
  Round& r = p.rounds[c];
  if (r.pushed.empty()) r.pushed.assign(config_.workers, false);
  if (r.pushed[h.worker]) {
    return invalid_arg("key {}: worker {} pushed it twice in clock {} (call gw_kv_clock between)",
                       h.key, h.worker, c);
  }
  r.pushed[h.worker] = true;
  if (r.acc.empty()) {
    r.acc.assign(payload, payload + p.value.size());
  } else {
    add_into(dt(p.dtype), r.acc.data(), payload, p.count);
  }
  ++r.pushes;
  close_rounds(p);
  return ok_status();
}

void StoreRules::close_rounds(Partition& p) {
  if (config_.mode != kBsp && config_.mode != kSync) return;
  for (;;) {
    const uint64_t c = p.next_clock;
    auto it = p.rounds.find(c);
    Round* r = it == p.rounds.end() ? nullptr : &it->second;
    bool closable =
        config_.mode == kSync && r != nullptr && r->pushes >= static_cast<uint32_t>(config_.sync_k);
    if (!closable) {
      bool any = false;
      closable = true;
      for (uint32_t w = 0; w < workers_.size() && closable; ++w) {
        const Worker& wk = workers_[w];
        if (!wk.alive || wk.bye) continue;
        any = true;
        closable = (r != nullptr && r->pushed[w]) || wk.clock > c;
      }
      if (!any && r == nullptr) return;  // nobody left to close clocks for
    }
    if (!closable) return;
    if (r == nullptr) {
      // Nobody pushed clock c and every live worker is past it: the clocks up to the next one
      // that has pushes, or that a live worker has not finished, close alike with nothing to
      // apply. Jump there at once (a worker may claim a clock of 2^60: one step per clock would
      // never end).
      uint64_t next = UINT64_MAX;
      auto nx = p.rounds.upper_bound(c);
      if (nx != p.rounds.end()) next = nx->first;
      for (const Worker& wk : workers_) {
        if (wk.alive && !wk.bye) next = std::min(next, wk.clock);
      }
      if (next == UINT64_MAX) return;
      p.next_clock = std::max(c + 1, next);
      continue;
    }
    if (r->pushes > 0) apply(p, r->acc.data(), r->pushes);
    p.rounds.erase(it);
    ++p.next_clock;
  }
}

void StoreRules::close_all() {
  for (auto& [k, p] : parts_) close_rounds(p);
}

bool StoreRules::may_pull(const Partition& p, const Header& h) const {
  switch (config_.mode) {
    case kAsp:
      return true;
    case kSsp: {
      const uint64_t s = static_cast<uint64_t>(config_.staleness);
      return min_clock() >= (h.clock > s ? h.clock - s : 0);
    }
    default: {
      uint64_t need = h.clock;
      auto it = p.rounds.find(h.clock);
      if (it != p.rounds.end() && it->second.pushed[h.worker]) need = h.clock + 1;
      return p.next_clock >= need;
    }
  }
}

void StoreRules::release(std::vector<Answer>* out) {
  size_t keep = 0;
  for (size_t i = 0; i < waiting_.size(); ++i) {
    const Header& h = waiting_[i].head;
    const Worker& w = workers_[h.worker];
    if (!w.alive || w.bye) continue;  // nobody to answer
    auto it = parts_.find({h.key, h.partition});
    if (it != parts_.end() && may_pull(it->second, h)) {
      out->push_back(answer(h, &it->second, true));
      continue;
    }
    waiting_[keep++] = waiting_[i];
  }
  waiting_.resize(keep);
}

void StoreRules::fail(Status s, std::vector<Answer>* out) {
  if (failed_.ok()) failed_ = std::move(s);
  for (const Waiting& w : waiting_) out->push_back(error(w.head, failed_));
  waiting_.clear();
}

void StoreRules::on_frame(const Header& h, const uint8_t* payload, std::vector<Answer>* out) {
  if (h.type == Type::kHello || h.type == Type::kBye) return;
  if (!failed_.ok()) {
    out->push_back(error(h, failed_));
    return;
  }
  Worker& wk = workers_[h.worker];
  if (h.type == Type::kClock) {
    if (h.clock <= wk.clock) {
      out->push_back(error(h, invalid_arg("worker {} clock {} does not advance its clock {}",
                                          h.worker, h.clock, wk.clock)));
      return;
    }
    wk.clock = h.clock;
    close_all();
    out->push_back(answer(h, nullptr, false));
    release(out);
    return;
  }
  const PartKey pk{h.key, h.partition};
  auto it = parts_.find(pk);
  if (h.type == Type::kInit) {
    if (it == parts_.end()) {
      if (config_.update == kSgd && !is_float(dt(h.dtype))) {
        out->push_back(error(h, invalid_arg("key {}: the sgd update needs a floating dtype, not {}",
                                            h.key, coll::dtype_name(dt(h.dtype)))));
        return;
      }
      Partition p;
      p.dtype = h.dtype;
      p.count = h.count;
      p.total = h.total;
      p.value.assign(payload, payload + h.payload);
      // A store created while other workers have moved on starts at the oldest live clock.
      p.next_clock = (config_.mode == kBsp || config_.mode == kSync) ? min_clock() : 0;
      it = parts_.emplace(pk, std::move(p)).first;
    } else {
      Status s = check_shape(it->second, h);
      if (!s.ok()) {
        out->push_back(error(h, s));
        return;
      }
    }
    out->push_back(answer(h, &it->second, false));
    return;
  }
  if (it == parts_.end()) {
    out->push_back(error(
        h, invalid_arg("key {} (partition {}) is not initialised: gw_kv_init it on every worker "
                       "first",
                       h.key, h.partition)));
    return;
  }
  Partition& p = it->second;
  Status s = check_shape(p, h);
  if (!s.ok()) {
    out->push_back(error(h, s));
    return;
  }
  if (h.type == Type::kPush || h.type == Type::kPushPull) {
    s = push(p, h, payload);
    if (!s.ok()) {
      out->push_back(error(h, s));
      return;
    }
    if (h.type == Type::kPush) out->push_back(answer(h, &p, false));
  }
  if (h.type == Type::kPull || h.type == Type::kPushPull) {
    if (may_pull(p, h)) {
      out->push_back(answer(h, &p, true));
    } else {
      waiting_.push_back(Waiting{h});
    }
  }
  release(out);
}

void StoreRules::on_bye(uint32_t worker, std::vector<Answer>* out) {
  if (workers_[worker].bye) return;
  workers_[worker].bye = true;
  close_all();
  release(out);
  drop_values_if_finished();
}

void StoreRules::on_dead(uint32_t worker, const std::string& why, std::vector<Answer>* out) {
  Worker& wk = workers_[worker];
  if (!wk.alive || wk.bye) return;
  wk.alive = false;
  if (!failed_.ok()) {
    drop_values_if_finished();
    return;
  }
  if (config_.mode == kBsp) {
    fail(peer_error("worker {} died ({}): under bsp every clock waits for every worker", worker,
                    why),
         out);
  } else if (config_.mode == kSync && live() < static_cast<uint32_t>(config_.sync_k)) {
    fail(peer_error("worker {} died ({}): {} live workers are fewer than sync:{}", worker, why,
                    live(), config_.sync_k),
         out);
  } else {
    ++lost_;
    GW_LOG_WARN("kv server {}: worker {} lost ({}); the store goes on with {} of {} workers",
                server_rank_, worker, why, live(), workers_.size());
    close_all();
    release(out);
  }
  drop_values_if_finished();
}

void StoreRules::drop_values_if_finished() {
  if (!finished()) return;
  // No worker can pull any more (a worker that said goodbye or died is refused a new hello), so
  // the values, momenta and open rounds are memory held for nobody: give it back now rather than
  // when the job ends. The partitions stay listed (keys, partitions, clocks) with 0 bytes.
  for (auto& [key, p] : parts_) {
    std::vector<uint8_t>().swap(p.value);
    p.snapshot.reset();
    std::vector<double>().swap(p.velocity);
    p.rounds.clear();
  }
  waiting_.clear();
}

}  // namespace gw::kv
