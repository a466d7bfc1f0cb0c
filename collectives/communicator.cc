// The Communicator: lazy per-peer, per-channel connections through the store, and one executor
// that runs any schedule (collectives/schedule.h) chunked and pipelined over several channels,
// progressed from the calling thread by polling every outstanding request round-robin.
#include "collectives/communicator.h"

#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "collectives/communicator_impl.h"
#include "collectives/cost_model.h"
#include "collectives/reduce.h"
#include "collectives/schedule.h"
#include "core/bootstrap.h"
#include "core/config.h"
#include "core/log.h"
#include "core/net/transport.h"
#if defined(GW_HAVE_DPDK)
#include "dpdk/dpdk_transport.h"
#endif

namespace gw::coll {
namespace {

constexpr int kWindow = 4;  // chunks in flight per direction per channel
constexpr int kMaxChannels = 16;
// All-to-all steps run at once (each on its own peer's connection): p-1 of them, up to this many.
// On a 4-rank tcp job every rank then streams to its three peers together instead of one after
// the other, so no link idles while a step drains.
constexpr int kAlltoallInFlight = 8;

// Tag = (collective sequence number, step id): a rank that runs a different collective or a
// different step than its peer fails the receive with a tag mismatch instead of mixing data.
int make_tag(uint32_t seq, int step) {
  return static_cast<int>(((seq & 0x7FFFFu) << 12) | (static_cast<uint32_t>(step) & 0xFFFu));
}

// Waiting policy: spin for a couple of microseconds (a peer on another core usually answers
// within that); then, until spin_us, keep polling but give the core away between polls with
// sched_yield(), which returns at once when nothing else wants this core and otherwise runs the
// other task (often the very peer being waited for, when the ranks outnumber the cores); then,
// when every connection being waited on can be waited on with poll() (tcp), block in poll() for
// at most 1 ms; otherwise (shm) yield for a while, then sleep briefly.
class Backoff {
 public:
  explicit Backoff(int64_t spin_us) : spin_(std::chrono::microseconds(spin_us)) {}
  void reset() { idle_ = 0; }
  // gather(&fds) appends the descriptors to wait on and returns false if some connection
  // cannot be waited on that way.
  template <typename Gather>
  void idle(Gather&& gather) {
    if (idle_++ == 0) since_ = Clock::now();
    const auto waited = Clock::now() - since_;
    if (waited < kPureSpin) return;
    if (waited < spin_) {
      sched_yield();
      return;
    }
    fds_.clear();
    if (gather(&fds_) && !fds_.empty()) {
      (void)::poll(fds_.data(), fds_.size(), 1);
      return;
    }
    if (waited < spin_ + std::chrono::milliseconds(2)) {
      sched_yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  void idle() {
    idle([](std::vector<pollfd>*) { return false; });
  }

 private:
  static constexpr std::chrono::microseconds kPureSpin{2};
  std::vector<pollfd> fds_;
  std::chrono::microseconds spin_;
  int64_t idle_ = 0;
  Clock::time_point since_;
};

struct Plan {
  int chan = 0;
  size_t base = 0;  // element offset of this channel's slice
  Schedule sched;
};

class AsyncState {
 public:
  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
    cv_.notify_all();
  }
  bool wait_for(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [this] { return done_; });
  }
  bool done(Status* s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) *s = status_;
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

class AsyncOpImpl : public AsyncOp {
 public:
  AsyncOpImpl(std::shared_ptr<AsyncState> st, int64_t bound_ms)
      : st_(std::move(st)), bound_ms_(bound_ms) {}
  ~AsyncOpImpl() override { (void)wait(-1); }
  Status wait(int64_t timeout_ms) override {
    // -1: until done; the op itself ends within the communicator's deadline (or at once when
    // aborted), so this is bounded too.
    const int64_t ms = timeout_ms < 0 ? bound_ms_ : timeout_ms;
    const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
    while (true) {
      Status s;
      if (st_->done(&s)) return s;
      if (timeout_ms >= 0 && Clock::now() >= deadline) {
        return timeout_error("iallreduce: still running after {} ms", timeout_ms);
      }
      st_->wait_for(std::chrono::milliseconds(10));
    }
  }
  Status test(bool* done) override {
    Status s;
    *done = st_->done(&s);
    return *done ? s : ok_status();
  }

 private:
  std::shared_ptr<AsyncState> st_;
  int64_t bound_ms_;
};

class CommImpl : public Communicator {
 public:
  CommImpl() = default;
  ~CommImpl() override;

  Status init(const CommOptions& options, const CommInternalOptions& internal);

  int rank() const override { return rank_; }
  int size() const override { return world_; }
  Status allreduce(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                   ReduceOp op) override;
  Status broadcast(void* buf, size_t count, DataType dtype, int root) override;
  Status allgather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype) override;
  Status reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount, DataType dtype,
                        ReduceOp op) override;
  Status barrier() override;
  Status alltoall(const void* sendbuf, void* recvbuf, size_t count, DataType dtype) override;
  Result<std::unique_ptr<AsyncOp>> iallreduce(const void* sendbuf, void* recvbuf, size_t count,
                                              DataType dtype, ReduceOp op) override;
  void abort() override { aborted_.store(true); }
  bool aborted() const override { return aborted_.load(); }
  Algo choose_allreduce_algo(size_t bytes) const override {
    return choose_allreduce(world_, bytes, cost_, forced_algo_).algo;
  }

 private:
  struct ChanRun;

  Status allreduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                          ReduceOp op);
  // Runs under exec_mu_: checks abort/broken state, numbers the collective, and marks the
  // communicator broken when `body` fails (its connections are closed so peers fail fast too).
  template <typename F>
  Status run_collective(const char* name, F&& body);
  Status check_usable(const char* name) const;
  void wait_async_idle();

  int channels_for(size_t bytes) const;
  Result<net::Transport*> transport_for(int peer);
  Status connect_all(const char* name, const std::vector<Plan>& plans, Deadline deadline);
  Status execute(const char* name, std::vector<Plan>& plans, const uint8_t* in, uint8_t* out,
                 DataType dtype, ReduceOp op, Deadline deadline);
  Status progress(const char* name, ChanRun& c, const uint8_t* in, uint8_t* out, DataType dtype,
                  ReduceOp op, bool* progressed);
  uint8_t* staging(int chan);
  uint8_t* scratch(size_t bytes);
  std::string key(const char* kind, int src, int dst, int chan) const {
    return fmt::format("conn/{}/{}/{}", src, dst, chan);
  }

  int rank_ = -1, world_ = 0;
  int64_t timeout_ms_ = 0;
  std::unique_ptr<Store> store_;  // this communicator's prefix of the caller's store
  std::string token_;
  std::string mode_;  // auto, tcp, shm
  std::string host_id_;
  std::vector<int> host_of_rank_;
  TransportFactory factory_;
  std::map<std::string, std::unique_ptr<net::Transport>> transports_;
  std::map<std::string, std::string> alias_;  // auto's shm -> tcp fallback
  size_t chunk_bytes_ = 512 * 1024;
  int nchannels_cfg_ = 0;
  int64_t spin_us_ = 50;
  Algo forced_algo_ = Algo::kAuto;
  CostParams cost_;

  std::map<std::pair<int, int>, std::unique_ptr<net::SendComm>> send_;  // (peer, chan)
  std::map<std::pair<int, int>, std::unique_ptr<net::RecvComm>> recv_;
  std::vector<std::vector<uint8_t>> staging_;
  std::vector<uint8_t> scratch_;
  uint32_t seq_ = 0;
  std::atomic<bool> aborted_{false};
  Status broken_;
  std::set<std::pair<int, int>> logged_;  // (algo, size class)

  std::mutex exec_mu_;  // one collective at a time

  // iallreduce: one progress thread, started on first use, runs queued ops in order.
  std::mutex q_mu_;
  std::condition_variable q_cv_;
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<AsyncState>>> queue_;
  bool q_running_ = false;
  bool q_stop_ = false;
  std::thread worker_;
};

struct CommImpl::ChanRun {
  Plan* plan = nullptr;
  size_t step = 0;
  bool started = false;
  net::SendComm* sc = nullptr;
  net::RecvComm* rc = nullptr;
  size_t chunk_elems = 1;
  size_t ns = 0, nr = 0;  // chunks to send / receive in this step
  size_t s_posted = 0, s_done = 0, r_posted = 0, r_done = 0;
  std::deque<std::pair<net::Request*, size_t>> sreqs, rreqs;
  uint8_t* stage = nullptr;
  bool finished() const { return step >= plan->sched.size(); }
};

// ---- set-up -----------------------------------------------------------------------------------

// net::make_transport, plus the backends that live above gw_core: gw_dpdk is reached from here so
// that every program linking the collectives (libgradwire.so, gradwire-perf) links it too.
Result<std::unique_ptr<net::Transport>> default_transport(const std::string& name,
                                                          const net::TransportOptions& options) {
#if defined(GW_HAVE_DPDK)
  if (name == "dpdk") return dpdk::make_dpdk_transport(options);
#endif
  return net::make_transport(name, options);
}

Status CommImpl::init(const CommOptions& o, const CommInternalOptions& internal) {
  if (o.world_size < 1) return invalid_arg("communicator: world size {} < 1", o.world_size);
  if (o.rank < 0 || o.rank >= o.world_size) {
    return invalid_arg("communicator: rank {} out of range 0..{}", o.rank, o.world_size - 1);
  }
  if (!o.store) return invalid_arg("communicator: a store is required");
  if (o.transport != "auto" && o.transport != "tcp" && o.transport != "shm" &&
      o.transport != "dpdk") {
    return invalid_arg("communicator: transport '{}': expected auto, tcp, shm or dpdk",
                       o.transport);
  }
  GW_RETURN_IF_ERROR(config::validate());
  rank_ = o.rank;
  world_ = o.world_size;
  mode_ = o.transport;
  timeout_ms_ = o.timeout_ms >= 0 ? o.timeout_ms : config::get_int(config::Key::kTimeoutMs);
  if (timeout_ms_ <= 0) return invalid_arg("communicator: timeout {} ms must be > 0", timeout_ms_);
  factory_ = internal.transport_factory;
  if (!factory_) factory_ = &default_transport;
  GW_ASSIGN_OR_RETURN(forced_algo_, parse_algo(config::get_string(config::Key::kAlgo)));
  const int64_t chunk_cfg = config::get_int(config::Key::kChunkSize);  // 0: per transport
  chunk_bytes_ =
      chunk_cfg > 0 ? static_cast<size_t>(std::max<int64_t>(4096, chunk_cfg)) : size_t{512} * 1024;
  nchannels_cfg_ = static_cast<int>(
      std::clamp<int64_t>(config::get_int(config::Key::kNchannels), 0, kMaxChannels));
  spin_us_ = std::max<int64_t>(0, config::get_int(config::Key::kSpinUs));

  const Deadline deadline = deadline_after_ms(timeout_ms_);
  // Each rank counts the communicators it created on this store; ranks create them in the same
  // order, so the counts agree and give every communicator its own key prefix.
  auto gen = o.store->add(fmt::format("gw/comm_gen/{}", rank_), 1, deadline);
  if (!gen.ok()) return gen.status().with_context("communicator: numbering on the store");
  store_ = make_prefix_store(o.store, fmt::format("gw/comm{}/", *gen));

  if (!o.job_token.empty()) {
    token_ = o.job_token;
  } else {
    auto tok = agree_job_token(*store_, rank_, deadline);
    if (!tok.ok()) return tok.status().with_context("communicator");
    token_ = *tok;
  }
  if (o.host_id.empty()) {
    host_id_ = host_identity();
    auto hosts = exchange_hosts(*store_, rank_, world_, deadline);
    if (!hosts.ok()) return hosts.status().with_context("communicator");
    host_of_rank_ = hosts->host_of_rank;
  } else {
    // The caller names the host: exchange those names the same way exchange_hosts does.
    host_id_ = o.host_id;
    GW_RETURN_IF_ERROR(store_->set(fmt::format("hostid/{}", rank_),
                                   Bytes(host_id_.begin(), host_id_.end()), deadline));
    std::vector<std::string> ids;
    for (int r = 0; r < world_; ++r) {
      auto v = store_->get(fmt::format("hostid/{}", r), deadline);
      if (!v.ok()) {
        return v.status().with_context(
            fmt::format("communicator: waiting for the host identity of rank {}", r));
      }
      std::string id(v->begin(), v->end());
      auto it = std::find(ids.begin(), ids.end(), id);
      host_of_rank_.push_back(static_cast<int>(it - ids.begin()));
      if (it == ids.end()) ids.push_back(id);
    }
  }
  if (static_cast<int>(host_of_rank_.size()) != world_) {
    return internal_error("communicator: host map has {} ranks, expected {}", host_of_rank_.size(),
                          world_);
  }
  bool multi_host = false;
  for (int r = 0; r < world_; ++r) {
    if (host_of_rank_[r] != host_of_rank_[rank_]) {
      multi_host = true;
      if (mode_ == "shm") {
        return invalid_arg(
            "communicator: transport shm was forced but rank {} is on another host than rank {} "
            "(shared memory works within one host; use tcp or auto)",
            r, rank_);
      }
    }
  }
  // Cost model figures from the transport most links use.
  std::string main = mode_ == "auto" ? (multi_host ? "tcp" : "shm") : mode_;
  double lat = 0, bw = 0;
  if (world_ > 1) {
    int probe = (rank_ + 1) % world_;
    for (int r = 0; r < world_; ++r) {
      if (r != rank_ && (host_of_rank_[r] != host_of_rank_[rank_]) == multi_host) probe = r;
    }
    GW_ASSIGN_OR_RETURN(net::Transport * t, transport_for(probe));
    main = t->properties().name;
    lat = t->properties().latency_us;
    bw = t->properties().bandwidth_gbps;
  }
  cost_ = cost_params_for(main, lat, bw);
  // Auto chunk: shared memory wants chunks whose staging stays in cache (4 ranks, 64 MiB here:
  // 64-128K about 2.8 GB/s busbw, 512K about 2.0); sockets want fewer, larger calls (512K).
  if (chunk_cfg <= 0 && main == "shm") chunk_bytes_ = size_t{128} * 1024;
  GW_LOG_DEBUG("communicator rank {}/{}: transport {}, chunk {}, channels {}, algo {}", rank_,
               world_, main, format_bytes(chunk_bytes_), nchannels_cfg_, algo_name(forced_algo_));
  return ok_status();
}

Result<net::Transport*> CommImpl::transport_for(int peer) {
  std::string name = mode_;
  if (mode_ == "auto") name = host_of_rank_[peer] == host_of_rank_[rank_] ? "shm" : "tcp";
  if (auto a = alias_.find(name); a != alias_.end()) name = a->second;
  auto it = transports_.find(name);
  if (it != transports_.end()) return it->second.get();
  net::TransportOptions topts;
  topts.job_token = token_;
  topts.timeout_ms = timeout_ms_;
  topts.host_id = host_id_;
  topts.rank = rank_;
  auto t = factory_(name, topts);
  if (!t.ok() && mode_ == "auto" && name == "shm" && t.status().code() == Code::kUnsupported) {
    // auto: a host without shared memory still works over loopback tcp.
    GW_LOG_WARN("transport shm unavailable ({}); using tcp within the host",
                t.status().to_string());
    alias_["shm"] = "tcp";
    return transport_for(peer);
  }
  if (!t.ok()) {
    return t.status().with_context(fmt::format("transport {} for rank {}", name, peer));
  }
  net::Transport* raw = t->get();
  transports_[name] = std::move(*t);
  return raw;
}

CommImpl::~CommImpl() {
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    q_stop_ = true;
    // A communicator destroyed with ops pending ends them: the running one sees the abort flag,
    // the queued ones never start.
    if (q_running_ || !queue_.empty()) aborted_.store(true);
    for (auto& [fn, st] : queue_) st->finish(aborted_error("iallreduce: communicator destroyed"));
    queue_.clear();
  }
  q_cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  std::lock_guard<std::mutex> lock(exec_mu_);
  send_.clear();
  recv_.clear();
}

// ---- connections ------------------------------------------------------------------------------

Status CommImpl::connect_all(const char* name, const std::vector<Plan>& plans, Deadline deadline) {
  std::set<std::pair<int, int>> need_send, need_recv;
  for (const auto& p : plans) {
    for (const auto& st : p.sched) {
      if (st.send_to >= 0 && !send_.count({st.send_to, p.chan}))
        need_send.insert({st.send_to, p.chan});
      if (st.recv_from >= 0 && !recv_.count({st.recv_from, p.chan}))
        need_recv.insert({st.recv_from, p.chan});
    }
  }
  if (need_send.empty() && need_recv.empty()) return ok_status();
  // 1. Listen and publish every handle we need first: this never blocks, so no rank can wait on
  //    a handle that its peer only publishes after waiting on ours.
  std::map<std::pair<int, int>, std::unique_ptr<net::Listener>> listeners;
  for (auto [peer, chan] : need_recv) {
    auto ctx = [&] {
      return fmt::format("{}: connect from rank {} (channel {})", name, peer, chan);
    };
    auto t = transport_for(peer);
    if (!t.ok()) return t.status().with_context(ctx());
    net::Handle h;
    auto l = (*t)->listen(&h);
    if (!l.ok()) return l.status().with_context(ctx());
    Status s = store_->set(key("conn", peer, rank_, chan), Bytes(h.bytes.begin(), h.bytes.end()),
                           deadline);
    if (!s.ok()) return s.with_context(ctx());
    listeners[{peer, chan}] = std::move(*l);
  }
  // 2. Read the peers' handles (short waits so abort is noticed) and start connecting.
  std::map<std::pair<int, int>, std::unique_ptr<net::Connector>> connectors;
  for (auto [peer, chan] : need_send) {
    auto ctx = [&] { return fmt::format("{}: connect to rank {} (channel {})", name, peer, chan); };
    Result<Bytes> v = Status(Code::kTimeout, "not yet");
    while (true) {
      if (aborted()) return aborted_error("{}: communicator aborted", ctx());
      auto slice = std::min(deadline, deadline_after_ms(100));
      v = store_->get(key("conn", rank_, peer, chan), slice);
      if (v.ok() || v.status().code() != Code::kTimeout || Clock::now() >= deadline) break;
    }
    if (!v.ok()) return v.status().with_context(ctx() + ": waiting for its handle");
    if (v->size() != net::kHandleSize) {
      return internal_error("{}: handle of {} bytes, expected {}", ctx(), v->size(),
                            net::kHandleSize);
    }
    net::Handle h;
    std::copy(v->begin(), v->end(), h.bytes.begin());
    auto t = transport_for(peer);
    if (!t.ok()) return t.status().with_context(ctx());
    auto c = (*t)->connect(h);
    if (!c.ok()) return c.status().with_context(ctx());
    connectors[{peer, chan}] = std::move(*c);
  }
  // 3. Poll connects and accepts alternately until all are up.
  Backoff backoff(spin_us_);
  while (!listeners.empty() || !connectors.empty()) {
    bool any = false;
    for (auto it = connectors.begin(); it != connectors.end();) {
      auto sc = it->second->poll();
      if (!sc.ok()) {
        return sc.status().with_context(fmt::format("{}: connect to rank {} (channel {})", name,
                                                    it->first.first, it->first.second));
      }
      if (*sc) {
        send_[it->first] = std::move(*sc);
        it = connectors.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    for (auto it = listeners.begin(); it != listeners.end();) {
      auto rc = it->second->accept();
      if (!rc.ok()) {
        return rc.status().with_context(fmt::format("{}: accept from rank {} (channel {})", name,
                                                    it->first.first, it->first.second));
      }
      if (*rc) {
        recv_[it->first] = std::move(*rc);
        it = listeners.erase(it);
        any = true;
      } else {
        ++it;
      }
    }
    if (aborted()) return aborted_error("{}: communicator aborted while connecting", name);
    if (Clock::now() >= deadline) {
      int peer =
          !listeners.empty() ? listeners.begin()->first.first : connectors.begin()->first.first;
      return timeout_error("{}: connecting with rank {}: not established within {} ms", name, peer,
                           timeout_ms_);
    }
    if (any) {
      backoff.reset();
    } else {
      backoff.idle();
    }
  }
  return ok_status();
}

// ---- the executor -----------------------------------------------------------------------------

uint8_t* CommImpl::staging(int chan) {
  if (staging_.size() <= static_cast<size_t>(chan)) staging_.resize(chan + 1);
  auto& s = staging_[chan];
  if (s.size() < kWindow * chunk_bytes_) s.resize(kWindow * chunk_bytes_);
  return s.data();
}

uint8_t* CommImpl::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

// A transport's "message truncated": the sender sent more than the receive posted for it.
bool truncated(const Status& s) {
  return s.code() == Code::kInvalidArg && s.message().find("truncated") != std::string::npos;
}

Status CommImpl::progress(const char* name, ChanRun& c, const uint8_t* in, uint8_t* out,
                          DataType dtype, ReduceOp op, bool* progressed) {
  const size_t es = dtype_size(dtype);
  const Step& st = c.plan->sched[c.step];
  // Always a short last chunk (schedule.h): one more, empty message only when the range is a
  // whole number of chunks, so that a count mismatch always shows as a size mismatch.
  auto nchunks = [&](size_t count) { return count / c.chunk_elems + 1; };
  auto chunk = [&](const Range& r, size_t i) {
    const size_t off = i * c.chunk_elems;
    return Range{c.plan->base + r.offset + off,
                 std::min(c.chunk_elems, r.count - std::min(off, r.count))};
  };
  if (!c.started) {
    c.started = true;
    c.ns = st.send_to >= 0 ? nchunks(st.send.count) : 0;
    c.nr = st.recv_from >= 0 ? nchunks(st.recv.count) : 0;
    c.s_posted = c.s_done = c.r_posted = c.r_done = 0;
    c.sc = st.send_to >= 0 ? send_.at({st.send_to, c.plan->chan}).get() : nullptr;
    c.rc = st.recv_from >= 0 ? recv_.at({st.recv_from, c.plan->chan}).get() : nullptr;
  }
  const int tag = make_tag(seq_, st.id);
  auto where = [&](bool send) {
    return fmt::format("{} step {}: {} rank {}", name, st.id, send ? "send to" : "recv from",
                       send ? st.send_to : st.recv_from);
  };
  // Post receives: straight into the output for copies, into the staging ring for reductions.
  while (c.r_posted < c.nr && c.r_posted < c.r_done + kWindow) {
    Range r = chunk(st.recv, c.r_posted);
    uint8_t* dst = st.action == RecvAction::kReduce
                       ? c.stage + (c.r_posted % kWindow) * chunk_bytes_
                       : out + r.offset * es;
    auto req = c.rc->irecv(dst, r.count * es, tag, nullptr);
    if (!req.ok()) {
      if (truncated(req.status())) {
        return invalid_arg("{}: ranks disagree on count: rank {} sent more than expected ({})",
                           where(false), st.recv_from, req.status().message());
      }
      return req.status().with_context(where(false));
    }
    if (*req == nullptr) break;
    c.rreqs.emplace_back(*req, c.r_posted++);
    *progressed = true;
  }
  while (c.s_posted < c.ns && c.s_posted < c.s_done + kWindow &&
         (!st.forward || c.s_posted < c.r_done)) {
    Range r = chunk(st.send, c.s_posted);
    const uint8_t* src = (st.send_from_input ? in : out) + r.offset * es;
    auto req = c.sc->isend(src, r.count * es, tag, nullptr);
    if (!req.ok()) {
      // tcp reports the receiver's truncation notice on whatever call comes next, isend too.
      if (truncated(req.status())) {
        return invalid_arg("{}: ranks disagree on count: rank {} expected fewer bytes ({})",
                           where(true), st.send_to, req.status().message());
      }
      return req.status().with_context(where(true));
    }
    if (*req == nullptr) break;
    c.sreqs.emplace_back(*req, c.s_posted++);
    *progressed = true;
  }
  // Requests of one comm complete in order: test the oldest only.
  while (!c.rreqs.empty()) {
    auto [req, idx] = c.rreqs.front();
    bool done = false;
    size_t got = 0;
    Status s = c.rc->test(req, &done, &got);
    if (!s.ok()) {
      c.rreqs.pop_front();
      if (truncated(s)) {
        return invalid_arg(
            "{}: ranks disagree on count: rank {} sent more than the {} bytes "
            "expected ({})",
            where(false), st.recv_from, chunk(st.recv, idx).count * es, s.message());
      }
      return s.with_context(where(false));
    }
    if (!done) break;
    c.rreqs.pop_front();
    Range r = chunk(st.recv, idx);
    if (got != r.count * es) {
      return invalid_arg("{}: ranks disagree on count: rank {} sent {} bytes, expected {}",
                         where(false), st.recv_from, got, r.count * es);
    }
    if (st.action == RecvAction::kReduce) {
      const uint8_t* local = (st.reduce_with_input ? in : out) + r.offset * es;
      reduce(dtype, op, local, c.stage + (idx % kWindow) * chunk_bytes_, out + r.offset * es,
             r.count);
    }
    ++c.r_done;
    *progressed = true;
  }
  while (!c.sreqs.empty()) {
    bool done = false;
    size_t got = 0;
    Status s = c.sc->test(c.sreqs.front().first, &done, &got);
    if (!s.ok()) {
      c.sreqs.pop_front();
      if (truncated(s)) {
        return invalid_arg("{}: ranks disagree on count: rank {} expected fewer bytes ({})",
                           where(true), st.send_to, s.message());
      }
      return s.with_context(where(true));
    }
    if (!done) break;
    c.sreqs.pop_front();
    ++c.s_done;
    *progressed = true;
  }
  if (c.r_done == c.nr && c.s_done == c.ns) {
    ++c.step;
    c.started = false;
    *progressed = true;
  }
  return ok_status();
}

Status CommImpl::execute(const char* name, std::vector<Plan>& plans, const uint8_t* in,
                         uint8_t* out, DataType dtype, ReduceOp op, Deadline deadline) {
  GW_RETURN_IF_ERROR(connect_all(name, plans, deadline));
  std::vector<ChanRun> runs(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    runs[i].plan = &plans[i];
    runs[i].chunk_elems = std::max<size_t>(1, chunk_bytes_ / dtype_size(dtype));
    runs[i].stage = staging(plans[i].chan);
  }
  Backoff backoff(spin_us_);
  while (true) {
    bool any = false, all_done = true;
    for (auto& c : runs) {
      while (!c.finished()) {
        bool progressed = false;
        GW_RETURN_IF_ERROR(progress(name, c, in, out, dtype, op, &progressed));
        any |= progressed;
        if (!progressed) break;
      }
      all_done &= c.finished();
    }
    if (all_done) return ok_status();
    if (aborted()) return aborted_error("{}: communicator aborted", name);
    if (Clock::now() >= deadline) {
      for (auto& c : runs) {
        if (c.finished()) continue;
        const Step& st = c.plan->sched[c.step];
        const bool on_recv = c.r_done < c.nr;
        return timeout_error("{} step {}: {} rank {}: no progress within {} ms", name, st.id,
                             on_recv ? "recv from" : "send to", on_recv ? st.recv_from : st.send_to,
                             timeout_ms_);
      }
    }
    if (any) {
      backoff.reset();
    } else {
      backoff.idle([&runs](std::vector<pollfd>* fds) {
        for (const auto& c : runs) {
          if (c.finished()) continue;
          if (c.r_done < c.nr && (c.rc == nullptr || !c.rc->wait_fds(fds))) return false;
          if (c.s_done < c.ns && (c.sc == nullptr || !c.sc->wait_fds(fds))) return false;
        }
        return true;
      });
    }
  }
}

// ---- collectives ------------------------------------------------------------------------------

int CommImpl::channels_for(size_t bytes) const {
  if (nchannels_cfg_ > 0) return nchannels_cfg_;
  // One channel until each would still carry several chunks per ring step.
  const size_t per_rank_step = bytes / static_cast<size_t>(world_);
  if (per_rank_step >= 8 * chunk_bytes_) return 4;
  if (per_rank_step >= 2 * chunk_bytes_) return 2;
  return 1;
}

Status CommImpl::check_usable(const char* name) const {
  if (aborted()) return aborted_error("{}: communicator aborted", name);
  if (!broken_.ok()) {
    return Status(broken_.code(),
                  fmt::format("{}: communicator unusable after an earlier error: {}", name,
                              broken_.message()));
  }
  return ok_status();
}

void CommImpl::wait_async_idle() {
  std::unique_lock<std::mutex> lock(q_mu_);
  // Bounded: every queued op ends within its own deadline (or at once when aborted).
  q_cv_.wait(lock, [this] { return queue_.empty() && !q_running_; });
}

template <typename F>
Status CommImpl::run_collective(const char* name, F&& body) {
  GW_RETURN_IF_ERROR(check_usable(name));
  ++seq_;
  Status s = body(deadline_after_ms(timeout_ms_));
  if (!s.ok() && s.code() != Code::kAborted) {
    // Close every connection: the peers' pending operations fail with kPeer at once instead of
    // waiting for their deadline, and this communicator refuses later calls.
    GW_LOG_ERROR("rank {}: {}", rank_, s.to_string());
    broken_ = s;
    send_.clear();
    recv_.clear();
  }
  return s;
}

Status validate_buffers(const char* name, const void* a, const void* b, size_t count,
                        DataType dtype, size_t a_elems, size_t b_elems) {
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("{}: invalid dtype {}", name, static_cast<int>(dtype));
  }
  if (count > 0 && (a == nullptr || b == nullptr)) {
    return invalid_arg("{}: null buffer with count {}", name, count);
  }
  const size_t es = dtype_size(dtype);
  if (count > (SIZE_MAX / 64) / es) return invalid_arg("{}: count {} too large", name, count);
  if (a != b && count > 0) {
    auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    if (pa < pb + b_elems * es && pb < pa + a_elems * es) {
      return invalid_arg("{}: send and receive buffers overlap without being the same buffer",
                         name);
    }
  }
  return ok_status();
}

Status CommImpl::allreduce(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                           ReduceOp op) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  return allreduce_locked(sendbuf, recvbuf, count, dtype, op);
}

Status CommImpl::allreduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                                  ReduceOp op) {
  GW_RETURN_IF_ERROR(validate_buffers("allreduce", sendbuf, recvbuf, count, dtype, count, count));
  if (!valid_op(static_cast<int>(op))) {
    return invalid_arg("allreduce: invalid op {}", static_cast<int>(op));
  }
  return run_collective("allreduce", [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(dtype);
    const size_t bytes = count * es;
    auto* out = static_cast<uint8_t*>(recvbuf);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    if (world_ == 1) {
      if (in != out && bytes) std::memcpy(out, in, bytes);
      return ok_status();
    }
    AlgoChoice choice = choose_allreduce(world_, bytes, cost_, forced_algo_);
    const int nch =
        choice.algo == Algo::kRing ? channels_for(bytes) : std::min(2, channels_for(bytes));
    if (logged_.insert({static_cast<int>(choice.algo), size_class(bytes)}).second) {
      GW_LOG_INFO("{}", describe_choice(bytes, choice, nch));
    }
    std::vector<Plan> plans(nch);
    for (int c = 0; c < nch; ++c) {
      Range slice = block_range(count, nch, c);
      plans[c].chan = c;
      plans[c].base = slice.offset;
      plans[c].sched = choice.algo == Algo::kRhd ? rhd_allreduce(rank_, world_, slice.count)
                                                 : ring_allreduce(rank_, world_, slice.count);
    }
    GW_RETURN_IF_ERROR(execute("allreduce", plans, in, out, dtype, op, deadline));
    if (op == ReduceOp::kAvg) finalize_avg(dtype, out, count, world_);
    return ok_status();
  });
}

Status CommImpl::broadcast(void* buf, size_t count, DataType dtype, int root) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  GW_RETURN_IF_ERROR(validate_buffers("broadcast", buf, buf, count, dtype, count, count));
  if (root < 0 || root >= world_) {
    return invalid_arg("broadcast: root {} out of range 0..{}", root, world_ - 1);
  }
  return run_collective("broadcast", [&](Deadline deadline) -> Status {
    if (world_ == 1) return ok_status();
    const int nch = channels_for(count * dtype_size(dtype) * static_cast<size_t>(world_) / 2);
    std::vector<Plan> plans(nch);
    for (int c = 0; c < nch; ++c) {
      Range slice = block_range(count, nch, c);
      plans[c].chan = c;
      plans[c].base = slice.offset;
      plans[c].sched = chain_broadcast(rank_, world_, root, slice.count);
    }
    auto* p = static_cast<uint8_t*>(buf);
    return execute("broadcast", plans, p, p, dtype, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::allgather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("allgather: invalid dtype {}", static_cast<int>(dtype));
  }
  if (sendcount > 0 && (sendbuf == nullptr || recvbuf == nullptr)) {
    return invalid_arg("allgather: null buffer with count {}", sendcount);
  }
  return run_collective("allgather", [&](Deadline deadline) -> Status {
    const size_t blk = sendcount * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recvbuf);
    // memmove: "in place" callers pass sendbuf inside recvbuf (at their own block or at 0).
    if (blk && sendbuf != out + rank_ * blk) std::memmove(out + rank_ * blk, sendbuf, blk);
    if (world_ == 1) return ok_status();
    std::vector<Plan> plans(1);
    plans[0].sched = ring_allgather(rank_, world_, sendcount);
    return execute("allgather", plans, out, out, dtype, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                DataType dtype, ReduceOp op) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  if (!valid_dtype(static_cast<int>(dtype)) || !valid_op(static_cast<int>(op))) {
    return invalid_arg("reduce_scatter: invalid dtype {} or op {}", static_cast<int>(dtype),
                       static_cast<int>(op));
  }
  if (recvcount > 0 && (sendbuf == nullptr || recvbuf == nullptr)) {
    return invalid_arg("reduce_scatter: null buffer with count {}", recvcount);
  }
  return run_collective("reduce_scatter", [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(dtype);
    const size_t total = recvcount * static_cast<size_t>(world_);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    uint8_t* work = world_ == 1 ? nullptr : scratch(total * es);
    if (world_ > 1) {
      std::vector<Plan> plans(1);
      plans[0].sched = ring_reduce_scatter(rank_, world_, total);
      GW_RETURN_IF_ERROR(execute("reduce_scatter", plans, in, work, dtype, op, deadline));
    }
    const uint8_t* mine = world_ == 1 ? in : work + rank_ * recvcount * es;
    if (recvcount) std::memmove(recvbuf, mine, recvcount * es);
    if (op == ReduceOp::kAvg) finalize_avg(dtype, recvbuf, recvcount, world_);
    return ok_status();
  });
}

Status CommImpl::barrier() {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  return run_collective("barrier", [&](Deadline deadline) -> Status {
    if (world_ == 1) return ok_status();
    // A ring allgather of one byte per rank: after p-1 steps every rank has heard, directly or
    // through its neighbours, from every other rank.
    uint8_t* buf = scratch(static_cast<size_t>(world_));
    buf[rank_] = 1;
    std::vector<Plan> plans(1);
    plans[0].sched = ring_allgather(rank_, world_, 1);
    return execute("barrier", plans, buf, buf, DataType::kU8, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::alltoall(const void* sendbuf, void* recvbuf, size_t count, DataType dtype) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("alltoall: invalid dtype {}", static_cast<int>(dtype));
  }
  const size_t p = static_cast<size_t>(world_);
  if (count > (SIZE_MAX / 64) / dtype_size(dtype) / p) {
    return invalid_arg("alltoall: count {} too large for {} ranks", count, world_);
  }
  GW_RETURN_IF_ERROR(
      validate_buffers("alltoall", sendbuf, recvbuf, count, dtype, p * count, p * count));
  return run_collective("alltoall", [&](Deadline deadline) -> Status {
    const size_t blk = count * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recvbuf);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    if (in == out && world_ > 1 && blk > 0) {
      // Step k overwrites block (me-k) of the output before step p-k has sent that block of the
      // input: in place needs a copy of the input.
      uint8_t* copy = scratch(p * blk);
      std::memcpy(copy, in, p * blk);
      in = copy;
    }
    if (in != out && blk > 0) std::memcpy(out + rank_ * blk, in + rank_ * blk, blk);
    if (world_ == 1) return ok_status();
    // The steps are independent: deal them round-robin to up to kAlltoallInFlight plans that run
    // together. Each step talks to a different peer, so no two plans share a connection.
    Schedule all = pairwise_alltoall(rank_, world_, count);
    const size_t nplans = std::min<size_t>(all.size(), kAlltoallInFlight);
    std::vector<Plan> plans(nplans);
    for (size_t i = 0; i < all.size(); ++i) plans[i % nplans].sched.push_back(all[i]);
    return execute("alltoall", plans, in, out, dtype, ReduceOp::kSum, deadline);
  });
}

Result<std::unique_ptr<AsyncOp>> CommImpl::iallreduce(const void* sendbuf, void* recvbuf,
                                                      size_t count, DataType dtype, ReduceOp op) {
  GW_RETURN_IF_ERROR(validate_buffers("iallreduce", sendbuf, recvbuf, count, dtype, count, count));
  if (!valid_op(static_cast<int>(op))) {
    return invalid_arg("iallreduce: invalid op {}", static_cast<int>(op));
  }
  GW_RETURN_IF_ERROR(check_usable("iallreduce"));
  auto st = std::make_shared<AsyncState>();
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    queue_.emplace_back(
        [this, sendbuf, recvbuf, count, dtype, op] {
          std::lock_guard<std::mutex> elock(exec_mu_);
          return allreduce_locked(sendbuf, recvbuf, count, dtype, op);
        },
        st);
    if (!worker_.joinable()) {
      worker_ = std::thread([this] {
        std::unique_lock<std::mutex> lock(q_mu_);
        while (true) {
          q_cv_.wait(lock, [this] { return q_stop_ || !queue_.empty(); });
          if (queue_.empty()) return;  // stopping
          auto [fn, state] = std::move(queue_.front());
          queue_.pop_front();
          q_running_ = true;
          lock.unlock();
          Status s = fn();
          state->finish(s.ok() ? s : s.with_context("iallreduce"));
          lock.lock();
          q_running_ = false;
          q_cv_.notify_all();
        }
      });
    }
  }
  q_cv_.notify_all();
  // Ops queue behind each other, so "wait forever" means a few deadlines at most.
  return std::unique_ptr<AsyncOp>(std::make_unique<AsyncOpImpl>(st, timeout_ms_));
}

}  // namespace

Result<std::unique_ptr<Communicator>> create_communicator(const CommOptions& options,
                                                          const CommInternalOptions& internal) {
  auto comm = std::make_unique<CommImpl>();
  GW_RETURN_IF_ERROR(comm->init(options, internal));
  return std::unique_ptr<Communicator>(std::move(comm));
}

Result<std::unique_ptr<Communicator>> Communicator::create(const CommOptions& options) {
  return create_communicator(options, CommInternalOptions{});
}

}  // namespace gw::coll
