#include "kv/client.h"

#include <fmt/format.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <queue>
#include <thread>

#include "core/config.h"
#include "core/log.h"
#include "kv/io.h"
#include "kv/kv_config.h"

namespace gw::kv {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// --- Op ------------------------------------------------------------------------------------------

void Op::finish_one(const Status& s) {
  std::lock_guard<std::mutex> lock(mu);
  if (pending == 0) return;
  if (status.ok() && !s.ok()) status = s;
  if (--pending == 0) cv.notify_all();
}

Status Op::wait(sys::Deadline until, bool cancel_on_timeout) {
  std::unique_lock<std::mutex> lock(mu);
  const sys::Deadline d = std::min(until, deadline_);
  cv.wait_until(lock, d, [&] { return over(); });
  if (over()) return status;
  if (cancel_on_timeout || sys::expired(deadline_)) {
    // The buffers are the caller's again: late replies go nowhere, and the request has ended.
    // A receiver already copying into them, or a sender already writing from them, finishes
    // first (each has its own deadline); queued frames are no longer sent.
    cancelled = true;
    cv.wait(lock, [&] { return reading == 0 && writing == 0; });
    status = timeout_error(
        "kv: {} of the request's frames unanswered after GW_TIMEOUT_MS (a server or the workers "
        "it waits for did not answer)",
        pending);
    pending = 0;
    cv.notify_all();
    return status;
  }
  return timeout_error("kv: request still running");
}

bool Op::done() {
  std::lock_guard<std::mutex> lock(mu);
  return over();
}

Status Op::result() {
  std::lock_guard<std::mutex> lock(mu);
  return status;
}

// --- ServerLink ----------------------------------------------------------------------------------

class ServerLink {
 public:
  struct Item {
    uint64_t epoch = 0;
    int order = 0;  // 0: requests, 1: clock, 2: bye (after everything)
    int priority = 0;
    uint64_t seq = 0;
    Header h;
    const void* payload = nullptr;
    std::shared_ptr<const std::vector<uint8_t>> owned;  // an encoded push: payload points here
    std::shared_ptr<Op> op;
    void* out = nullptr;  // pull: where the reply's value goes
  };
  struct Later {
    bool operator()(const Item& a, const Item& b) const {
      if (a.epoch != b.epoch) return a.epoch > b.epoch;
      if (a.order != b.order) return a.order > b.order;
      if (a.priority != b.priority) return a.priority < b.priority;
      return a.seq > b.seq;
    }
  };
  struct Target {
    std::shared_ptr<Op> op;
    void* out = nullptr;
    size_t bytes = 0;
  };

  ServerLink(Client* client, uint32_t index, std::string addr, sys::Fd fd)
      : client_(client), index_(index), addr_(std::move(addr)), fd_(std::move(fd)) {}
  ~ServerLink() { stop(); }

  void run() {
    sender_ = std::thread([this] { send_loop(); });
    receiver_ = std::thread([this] { recv_loop(); });
  }

  void enqueue(Item item) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_.ok()) {
      if (item.op) item.op->finish_one(failed_);
      return;
    }
    item.seq = seq_++;
    queue_.push(std::move(item));
    cv_.notify_all();
  }

  // Fails every queued and outstanding frame with s; with `dead`, later enqueues fail at once
  // too (else the link stays up for the goodbye of gw_kv_destroy).
  void fail_all(const Status& s, bool dead = true) {
    std::vector<std::shared_ptr<Op>> ops;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (dead && failed_.ok()) failed_ = s;
      while (!queue_.empty()) {
        if (queue_.top().op) ops.push_back(queue_.top().op);
        queue_.pop();
      }
      for (auto& [id, t] : outstanding_) ops.push_back(t.op);
      outstanding_.clear();
      cv_.notify_all();
    }
    for (auto& op : ops) op->finish_one(s);
  }

  // Lets the sender finish what is queued (the Bye last), then ends both threads.
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      draining_ = true;
      cv_.notify_all();
    }
    if (sender_.joinable()) sender_.join();
    stop_.store(true, std::memory_order_release);
    if (fd_.valid()) shutdown(fd_.get(), SHUT_RDWR);
    if (receiver_.joinable()) receiver_.join();
    fail_all(aborted_error("kv: the store was destroyed (gw_kv_destroy) before the request ended"));
  }

  const std::string& addr() const { return addr_; }

 private:
  void send_loop() {
    for (;;) {
      Item item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue_.empty() || draining_ || !failed_.ok(); });
        if (!failed_.ok()) return;
        if (queue_.empty()) return;  // draining and nothing left
        item = queue_.top();
        queue_.pop();
        if (item.op && item.payload != nullptr) {
          // The payload is the caller's buffer: the op stays open until the write returns, even
          // when its reply (the server has the bytes once sendmsg copied them), another link's
          // failure or a timeout finishes it first. A cancelled op's buffer is not read again.
          std::lock_guard<std::mutex> op_lock(item.op->mu);
          if (item.op->cancelled) continue;
          ++item.op->writing;
        }
        if (item.op && item.h.type != Type::kBye) {
          size_t bytes =
              (item.h.type == Type::kPull || item.h.type == Type::kPushPull)
                  ? item.h.count * coll::dtype_size(static_cast<coll::DataType>(item.h.dtype))
                  : 0;
          outstanding_[item.h.req_id] = Target{item.op, item.out, bytes};
        }
      }
      if (item.h.type == Type::kBye) bye_sent_.store(true, std::memory_order_release);
      Status s = write_frame(fd_.get(), item.h, item.payload,
                             sys::deadline_after_ms(client_->timeout_ms()));
      if (item.op && item.payload != nullptr) {
        std::lock_guard<std::mutex> op_lock(item.op->mu);
        if (--item.op->writing == 0) item.op->cv.notify_all();
      }
      if (!s.ok()) {
        died(s);
        return;
      }
      if (item.h.type == Type::kBye) return;
    }
  }

  void died(const Status& why) {
    if (stop_.load(std::memory_order_acquire) || bye_sent_.load(std::memory_order_acquire)) return;
    Status s = peer_error("kv server {} ({}) died or failed: {}; it held {}", index_, addr_,
                          why.message(), client_->keys_of(index_));
    fail_all(s);
    client_->set_broken(s);
  }

  // Its reads take no stop flag: stop() shuts the socket down, which ends them at once (EOF), so an
  // idle link sleeps without a timer; died() then sees stop_ and stays quiet.
  void recv_loop() {
    std::vector<uint8_t> scratch;
    for (;;) {
      Header h;
      Status s = read_header(fd_.get(), &h, sys::Deadline::max(), nullptr);
      if (s.ok()) s = check_reply(h);
      if (!s.ok()) {
        died(s);
        return;
      }
      if (h.type == Type::kError) {
        std::string msg(h.payload, '\0');
        s = read_exact(fd_.get(), msg.data(), msg.size(),
                       sys::deadline_after_ms(client_->timeout_ms()), nullptr);
        if (!s.ok()) {
          died(s);
          return;
        }
        const int code = h.aux >= 1 && h.aux <= static_cast<uint64_t>(Code::kInternal)
                             ? static_cast<int>(h.aux)
                             : static_cast<int>(Code::kPeer);
        Status err(static_cast<Code>(code), fmt::format("kv server {}: {}", index_, msg));
        std::shared_ptr<Op> op = take(h.req_id, nullptr);
        if (op) {
          op->finish_one(err);
        } else {
          fail_all(err);  // the connection itself was refused
          client_->set_broken(err);
          return;
        }
        continue;
      }
      client_->note(index_, h);
      Target t;
      std::shared_ptr<Op> op = take(h.req_id, &t);
      if (h.payload > 0) {
        if (!op || t.bytes != h.payload) {
          died(peer_error("a reply of {} bytes to request {} that expects {}", h.payload, h.req_id,
                          t.bytes));
          return;
        }
        // The op's lock is not held while reading: every server's receiver fills its part of
        // one op's buffer at once; `reading` keeps a cancel from returning meanwhile.
        void* dst = t.out;
        bool counted = false;
        {
          std::lock_guard<std::mutex> lock(op->mu);
          if (op->cancelled || dst == nullptr) {
            scratch.resize(h.payload);
            dst = scratch.data();
          } else {
            ++op->reading;
            counted = true;
          }
        }
        s = read_exact(fd_.get(), dst, h.payload, sys::deadline_after_ms(client_->timeout_ms()),
                       nullptr);
        if (counted) {
          std::lock_guard<std::mutex> lock(op->mu);
          if (--op->reading == 0) op->cv.notify_all();
        }
        if (!s.ok()) {
          died(s);
          return;
        }
      }
      if (op) op->finish_one(ok_status());
    }
  }

  std::shared_ptr<Op> take(uint64_t req_id, Target* t) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = outstanding_.find(req_id);
    if (it == outstanding_.end()) return nullptr;
    std::shared_ptr<Op> op = it->second.op;
    if (t != nullptr) *t = it->second;
    outstanding_.erase(it);
    return op;
  }

  Client* const client_;
  const uint32_t index_;
  const std::string addr_;
  sys::Fd fd_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> bye_sent_{false};  // the server closes after it: no death
  std::thread sender_, receiver_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Item, std::vector<Item>, Later> queue_;
  std::map<uint64_t, Target> outstanding_;
  uint64_t seq_ = 0;
  bool draining_ = false;
  Status failed_;
};

// --- Client --------------------------------------------------------------------------------------

Client::Client(const ClientOptions& options)
    : options_(options),
      min_clock_(options.servers.size(), 0),
      dropped_(options.servers.size(), 0),
      lost_(options.servers.size(), 0),
      next_seen_(options.servers.size(), 0) {}

Client::~Client() { (void)close(); }

Result<std::unique_ptr<Client>> Client::connect(const ClientOptions& given) {
  ClientOptions options = given;
  // The chunk is resolved here, on the worker, and sent in the Hello: every worker of a store
  // must agree (a server refuses a Hello whose chunk_bytes differ from the store's).
  const int64_t chunk =
      options.chunk_bytes >= 0 ? options.chunk_bytes : config::get_int(kv_config::kChunkBytes);
  options.config.chunk_bytes =
      chunk <= 0 || static_cast<uint64_t>(chunk) >= options.config.partition_bytes
          ? 0
          : static_cast<uint64_t>(chunk);
  if (Status s = check_config(options.config); !s.ok()) {
    return s.with_context(options.chunk_bytes < 0 ? "GW_KV_CHUNK_BYTES" : "kv store config");
  }
  std::unique_ptr<Client> c(new Client(options));
  if (!options.config.codec.empty()) {
    GW_ASSIGN_OR_RETURN(c->encoder_, PushEncoder::create(options.config.codec, options.rank));
  }
  const sys::Deadline deadline = sys::deadline_after_ms(options.timeout_ms);
  const std::vector<uint8_t> hello = encode_hello(options.config, options.token);
  for (uint32_t i = 0; i < options.servers.size(); ++i) {
    const std::string& addr = options.servers[i];
    auto fd = connect_to(addr, deadline);
    if (!fd.ok()) return fd.status().with_context(fmt::format("kv server {}", i));
    Header h;
    h.type = Type::kHello;
    h.worker = options.rank;
    h.aux = options.store_id;
    h.payload = static_cast<uint32_t>(hello.size());
    Status s = write_frame(fd->get(), h, hello.data(), deadline);
    Header r;
    if (s.ok()) s = read_header(fd->get(), &r, deadline, nullptr);
    if (s.ok()) s = check_reply(r);
    if (s.ok() && r.type == Type::kError) {
      std::string msg(r.payload, '\0');
      s = read_exact(fd->get(), msg.data(), msg.size(), deadline, nullptr);
      if (s.ok()) s = invalid_arg("{}", msg);
    }
    if (!s.ok()) return s.with_context(fmt::format("kv server {} ({}) hello", i, addr));
    c->links_.push_back(std::make_unique<ServerLink>(c.get(), i, addr, std::move(*fd)));
  }
  for (auto& l : c->links_) l->run();
  return c;
}

size_t Client::part_elems(coll::DataType dtype) const {
  return std::max<size_t>(1, options_.config.partition_bytes / coll::dtype_size(dtype));
}

size_t Client::chunk_elems(coll::DataType dtype) const {
  const size_t per = part_elems(dtype);
  if (options_.config.chunk_bytes == 0) return per;
  return std::min(per, std::max<size_t>(1, options_.config.chunk_bytes / coll::dtype_size(dtype)));
}

Status Client::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_;
}

void Client::set_broken(const Status& s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return;
    broken_ = s;
  }
  GW_LOG_ERROR("{}", s.message());
  for (auto& l : links_) l->fail_all(s, /*dead=*/false);
}

void Client::note(uint32_t server, const Header& h) {
  std::lock_guard<std::mutex> lock(mu_);
  min_clock_[server] = h.aux;
  dropped_[server] = h.aux2;
  lost_[server] = h.aux3;
  next_seen_[server] = std::max(next_seen_[server], h.clock);
}

std::string Client::keys_of(uint32_t server) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  size_t n = 0;
  const uint32_t servers = static_cast<uint32_t>(options_.servers.size());
  for (const auto& [key, k] : keys_) {
    std::string parts;
    for (uint32_t p = 0; p < k.parts; ++p) {
      if (server_of(key, p, servers) != server) continue;
      parts += fmt::format("{}{}", parts.empty() ? "" : ",", p);
    }
    if (parts.empty()) continue;
    if (++n <= 32)
      out += fmt::format("{}key {} (partitions {})", out.empty() ? "" : ", ", key, parts);
  }
  if (n == 0) return "no keys of this worker";
  if (n > 32) out += fmt::format(" and {} more keys", n - 32);
  return out;
}

Result<std::shared_ptr<Op>> Client::start(Kind kind, uint64_t key, const void* value, void* out,
                                          size_t count, coll::DataType dtype, int priority) {
  GW_RETURN_IF_ERROR(broken());
  if (closed_) return aborted_error("kv: the store was destroyed");
  if (count == 0) return invalid_arg("count is 0: a key holds at least one element");
  const size_t elem = coll::dtype_size(dtype);
  const size_t per = part_elems(dtype);
  const uint64_t parts = (count + per - 1) / per;
  // Each partition travels as units of `cper` elements (chunks; one unit when not streamed);
  // unit j of partition p is frame partition p * upp + j, on partition p's server.
  const size_t cper = chunk_elems(dtype);
  const uint64_t upp = (per + cper - 1) / cper;
  if (parts * upp > kMaxPartitions) {
    return invalid_arg(
        "key {}: {} partitions of {} chunks exceed the limit of {} units per key (raise "
        "partition_bytes or GW_KV_CHUNK_BYTES)",
        key, parts, upp, kMaxPartitions);
  }
  const bool sync_modes = options_.config.mode == 0 || options_.config.mode == 3;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(key);
    if (kind == Kind::kInit) {
      if (encoder_ && !encodable_dtype(dtype)) {
        return invalid_arg(
            "key {}: the store's pushes are encoded with {}, which takes floating values only "
            "(float32, float64, float16, bfloat16), not {}",
            key, options_.config.codec, coll::dtype_name(dtype));
      }
      if (encoder_ && per > kMaxPayload / sizeof(float)) {
        return invalid_arg(
            "key {}: a partition of {} {} elements decodes to more than {} bytes of f32 on the "
            "server (lower partition_bytes for encoded pushes of 16-bit keys)",
            key, per, coll::dtype_name(dtype), kMaxPayload);
      }
      if (options_.config.update == 1 && dtype != coll::DataType::kF32 &&
          dtype != coll::DataType::kF64 && dtype != coll::DataType::kF16 &&
          dtype != coll::DataType::kBF16) {
        return invalid_arg("key {}: the sgd update needs a floating dtype, not {}", key,
                           coll::dtype_name(dtype));
      }
      if (it != keys_.end() && (it->second.count != count || it->second.dtype != dtype)) {
        return invalid_arg("key {} was initialised with {} elements of {}, not {} of {}", key,
                           it->second.count, coll::dtype_name(it->second.dtype), count,
                           coll::dtype_name(dtype));
      }
      if (it == keys_.end()) {
        keys_[key] = Key{count, dtype, static_cast<uint32_t>(parts), UINT64_MAX};
      }
    } else {
      if (it == keys_.end()) {
        return invalid_arg("key {} is unknown: gw_kv_init it (on every worker) first", key);
      }
      if (it->second.count != count || it->second.dtype != dtype) {
        return invalid_arg("key {} holds {} elements of {}, not {} of {}", key, it->second.count,
                           coll::dtype_name(it->second.dtype), count, coll::dtype_name(dtype));
      }
      if ((kind == Kind::kPush || kind == Kind::kPushPull) && sync_modes) {
        if (it->second.pushed_clock == clock_) {
          return invalid_arg(
              "key {} was pushed already in clock {}: under bsp/sync a worker pushes a key once "
              "per clock (call gw_kv_clock between)",
              key, clock_);
        }
        it->second.pushed_clock = clock_;
      }
    }
  }
  const Type type = kind == Kind::kInit   ? Type::kInit
                    : kind == Kind::kPush ? Type::kPush
                    : kind == Kind::kPull ? Type::kPull
                                          : Type::kPushPull;
  auto op = std::make_shared<Op>(sys::deadline_after_ms(options_.timeout_ms));
  const size_t last_n = count - (parts - 1) * per;
  op->pending = (parts - 1) * upp + (last_n + cper - 1) / cper;
  const uint32_t servers = static_cast<uint32_t>(links_.size());
  for (uint64_t p = 0; p < parts; ++p) {
    const size_t part_first = p * per;
    const size_t part_n = std::min(per, count - part_first);
    ServerLink* link = links_[server_of(key, static_cast<uint32_t>(p), servers)].get();
    for (uint64_t j = 0; j * cper < part_n; ++j) {
      const size_t first = part_first + j * cper;
      const size_t n = std::min(cper, part_n - j * cper);
      const uint32_t unit = static_cast<uint32_t>(p * upp + j);
      ServerLink::Item item;
      item.epoch = clock_;
      item.priority = priority;
      item.op = op;
      Header& h = item.h;
      h.type = type;
      h.dtype = static_cast<uint8_t>(dtype);
      h.worker = options_.rank;
      h.partition = unit;
      h.key = key;
      h.clock = clock_;
      h.req_id = next_req_++;
      h.count = n;
      h.total = count;
      if (type != Type::kPull) {
        item.payload = static_cast<const uint8_t*>(value) + first * elem;
        h.payload = static_cast<uint32_t>(n * elem);
      }
      if (encoder_ && (type == Type::kPush || type == Type::kPushPull)) {
        // Encoded here, in the caller's thread: the frame carries the encoding, and the residual
        // of (key, unit) keeps what the codec dropped for this unit's next push.
        uint64_t step = 0;
        auto enc = encoder_->encode(key, unit, static_cast<const uint8_t*>(value) + first * elem,
                                    dtype, n, &step);
        if (!enc.ok()) {
          op->finish_one(enc.status());
          continue;
        }
        item.owned = std::move(*enc);
        item.payload = item.owned->data();
        h.payload = static_cast<uint32_t>(item.owned->size());
        h.flags = static_cast<uint16_t>(encoder_->codec().spec().kind);
        h.aux = step;
      }
      if (type == Type::kPull || type == Type::kPushPull) {
        item.out = static_cast<uint8_t*>(out) + first * elem;
      }
      link->enqueue(std::move(item));
    }
  }
  return op;
}

Status Client::clock() {
  GW_RETURN_IF_ERROR(broken());
  if (closed_) return aborted_error("kv: the store was destroyed");
  uint64_t next = clock_ + 1;
  if (options_.config.mode == 3) {  // sync: a worker behind joins the newest open clock
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t c : next_seen_) next = std::max(next, c);
  }
  auto op = std::make_shared<Op>(sys::deadline_after_ms(options_.timeout_ms));
  op->pending = links_.size();
  for (auto& l : links_) {
    ServerLink::Item item;
    item.epoch = clock_;
    item.order = 1;
    item.op = op;
    item.h.type = Type::kClock;
    item.h.worker = options_.rank;
    item.h.clock = next;
    item.h.req_id = next_req_++;
    l->enqueue(std::move(item));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    clock_ = next;
  }
  return op->wait(sys::Deadline::max(), true);
}

ClientStats Client::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ClientStats s;
  s.clock = clock_;
  s.min_clock =
      min_clock_.empty() ? clock_ : *std::min_element(min_clock_.begin(), min_clock_.end());
  for (uint64_t d : dropped_) s.dropped += d;
  for (uint64_t l : lost_) s.lost = std::max(s.lost, l);
  return s;
}

Status Client::close() {
  if (closed_) return ok_status();
  closed_ = true;
  for (auto& l : links_) {
    ServerLink::Item item;
    item.epoch = UINT64_MAX;
    item.order = 2;
    item.h.type = Type::kBye;
    item.h.worker = options_.rank;
    l->enqueue(std::move(item));
  }
  for (auto& l : links_) l->stop();
  Status b = broken();
  return b;
}

}  // namespace gw::kv
