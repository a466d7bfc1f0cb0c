#include "daemon/counters.h"

#include <algorithm>
#include <utility>

#include "core/net/backend_registry.h"
#include "daemon/transport_offer.h"

namespace gw::daemon {

Counters::Counters(std::vector<std::string> transports)
    : transports_(std::move(transports)),
      inter_in_(new std::atomic<uint64_t>[transports_.size() + 1]()),
      inter_out_(new std::atomic<uint64_t>[transports_.size() + 1]()) {}

Counters::Counters() : Counters(net::backend_names()) {}

int Counters::transport_slot(const std::string& name) const {
  for (size_t i = 0; i < transports_.size(); ++i) {
    if (name == transports_[i]) return static_cast<int>(i);
  }
  return other_slot();
}

void Counters::observe(Phase phase, int64_t ns) {
  Histogram& h = phases_[static_cast<int>(phase)];
  const double s = static_cast<double>(ns) / 1e9;
  int b = 0;
  while (b < DurationHistogram::kBuckets - 1 && s > DurationHistogram::kBounds[b]) ++b;
  h.buckets[b].fetch_add(1, std::memory_order_relaxed);
  h.count.fetch_add(1, std::memory_order_relaxed);
  h.sum_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(ns, 0)), std::memory_order_relaxed);
}

void Counters::collective(Opcode op, const Status& s) {
  const int k = static_cast<int>(op) - 1;
  if (k >= 0 && k < kNumOpcodes) by_opcode_[k][s.ok() ? 0 : 1].fetch_add(1);
  if (s.ok()) return;
  error(ErrorKind::kCollective);
  const int code = static_cast<int>(s.code());
  if (code >= 0 && code < 9) collective_errors_[code].fetch_add(1);
}

ServerStats Counters::snapshot(const std::vector<std::string>& offered) const {
  ServerStats s;
  s.accepted = accepted.load();
  s.refused = refused.load();
  s.live_clients = live_clients.load();
  s.live_arenas = live_arenas.load();
  s.live_imports = live_imports.load();
  s.live_jobs = live_jobs.load();
  s.collectives = collectives.load();
  s.failed = failed.load();
  for (int k = 0; k < kNumOpcodes; ++k) {
    for (int r = 0; r < 2; ++r) s.by_opcode[k][r] = by_opcode_[k][r].load();
  }
  for (int k = 0; k < kNumErrorKinds; ++k) s.errors[k] = errors_[k].load();
  for (int k = 0; k < 9; ++k) s.collective_errors[k] = collective_errors_[k].load();
  s.arena_bytes_in = arena_in_.load();
  s.arena_bytes_out = arena_out_.load();
  for (int t = 0; t <= other_slot(); ++t) {
    const uint64_t in = inter_in_[t].load(), out = inter_out_[t].load();
    s.inter_bytes_in += in;
    s.inter_bytes_out += out;
    const std::string name = t < other_slot() ? transports_[t] : std::string("other");
    if (in + out > 0 || std::find(offered.begin(), offered.end(), name) != offered.end()) {
      s.inter.push_back({name, in, out});
    }
  }
  s.transport = encode_offer(offered);
  s.kv_stores = kv_stores();
  s.nccl_jobs = nccl_jobs();
  for (int p = 0; p < kNumPhases; ++p) {
    for (int b = 0; b < DurationHistogram::kBuckets; ++b) {
      s.phases[p].buckets[b] = phases_[p].buckets[b].load();
    }
    s.phases[p].count = phases_[p].count.load();
    s.phases[p].sum_s = static_cast<double>(phases_[p].sum_ns.load()) / 1e9;
  }
  return s;
}

std::shared_ptr<Counters::NcclTotals> Counters::nccl_totals(const std::string& nccl_job) {
  std::lock_guard<std::mutex> lock(nccl_mu_);
  std::shared_ptr<NcclTotals>& t = nccl_[nccl_job];
  if (!t) t = std::make_shared<NcclTotals>();
  return t;
}

std::vector<NcclJobStats> Counters::nccl_jobs() const {
  std::lock_guard<std::mutex> lock(nccl_mu_);
  std::vector<NcclJobStats> out;
  for (const auto& [id, t] : nccl_) {
    // Held by the map and by each live connection's job.
    out.push_back({id, static_cast<uint64_t>(t.use_count() - 1), t->bytes.load()});
  }
  return out;
}

void Counters::add_kv(const std::string& job, int32_t host_index,
                      const std::shared_ptr<kv::Server>& s) {
  std::lock_guard<std::mutex> lock(kv_mu_);
  // Forget the servers of jobs gone since (their entries would otherwise wait for a reader).
  kv_.erase(
      std::remove_if(kv_.begin(), kv_.end(), [](const KvEntry& e) { return e.server.expired(); }),
      kv_.end());
  kv_.push_back({job, host_index, s});
}

std::vector<KvStoreStats> Counters::kv_stores() const {
  std::vector<KvStoreStats> out;
  std::lock_guard<std::mutex> lock(kv_mu_);
  for (auto it = kv_.begin(); it != kv_.end();) {
    std::shared_ptr<kv::Server> server = it->server.lock();
    if (!server) {
      it = kv_.erase(it);
      continue;
    }
    for (const kv::Server::StoreInfo& info : server->stores()) {
      const kv::StoreSummary& m = info.summary;
      KvStoreStats k;
      k.job = it->job;
      k.host_index = it->host_index;
      k.store = info.id;
      k.mode = kv::mode_text(m.config);
      k.update = kv::update_text(m.config);
      k.codec = m.config.codec.empty() ? "none" : m.config.codec;
      k.workers = m.config.workers;
      k.live = m.live;
      k.lost = m.lost;
      k.keys = m.keys;
      k.partitions = m.partitions;
      k.bytes = m.bytes;
      k.min_clock = m.min_clock;
      k.max_clock = m.max_clock;
      k.dropped = m.dropped;
      k.state = m.failed ? "failed" : m.finished ? "finished" : "open";
      out.push_back(std::move(k));
    }
    ++it;
  }
  return out;
}

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kHello:
      return "hello";
    case ErrorKind::kCredentials:
      return "credentials";
    case ErrorKind::kCapacity:
      return "capacity";
    case ErrorKind::kProtocol:
      return "protocol";
    case ErrorKind::kCollective:
      return "collective";
  }
  return "?";
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kLocalReduce:
      return "local_reduce";
    case Phase::kInterHost:
      return "inter_host";
    case Phase::kCopyBack:
      return "copy_back";
  }
  return "?";
}

}  // namespace gw::daemon
