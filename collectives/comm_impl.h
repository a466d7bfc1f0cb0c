// Internal to gw_coll: the Communicator's implementation class, shared by the files that
// implement it by concern: communicator.cc (set-up, split, creation), comm_collectives.cc (the
// symmetric collectives and their tag signature), comm_rooted.cc (reduce, gather, scatter,
// all-to-all-v, and the generic run/start of a CollectiveCall).
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/async_queue.h"
#include "collectives/call.h"
#include "collectives/communicator.h"
#include "collectives/connection_pool.h"
#include "collectives/cost_model.h"
#include "collectives/executor.h"
#include "collectives/group.h"
#include "collectives/p2p.h"
#include "collectives/schedule.h"
#include "collectives/shm_direct.h"
#include "core/config_snapshot.h"
#include "core/log.h"

namespace gw::coll {

inline constexpr int kMaxChannels = 16;
// All-to-all steps run at once (each on its own peer's connection): p-1 of them, up to this many.
// On a 4-rank tcp job every rank then streams to its three peers together instead of one after
// the other, so no link idles while a step drains.
inline constexpr int kAlltoallInFlight = 8;

// What a communicator and the communicators split from it share: the options they were made
// with, resolved once.
struct CommSettings {
  std::string mode;         // auto or a registered backend
  std::string route_host;   // CommOptions::route_host
  config::Snapshot config;  // read at creation; handed to the transports
  int64_t timeout_ms = 0;
  TransportFactory factory;
  int64_t chunk_cfg = 0;  // GW_CHUNK_SIZE (0: per transport)
  int nchannels_cfg = 0;
  int64_t spin_us = 50;
  double stall_warn_s = 0;  // GW_STALL_WARN_S
  Algo forced_algo = Algo::kAuto;
  // GW_ALGO_BROADCAST, GW_ALGO_ALLGATHER, GW_ALGO_REDUCE_SCATTER, indexed by Collective.
  std::array<Algo, 3> forced_coll = {Algo::kAuto, Algo::kAuto, Algo::kAuto};
};

// The executor's options from the settings (communicator.cc).
ExecutorOptions executor_options(const CommSettings& s, const Group& g);
// Checks dtype, NULL buffers with count > 0, the count's size and overlaps of a and b (a_elems,
// b_elems elements) unless a == b.
Status validate_buffers(const char* name, const void* a, const void* b, size_t count,
                        DataType dtype, size_t a_elems, size_t b_elems);
// The call's signature as the 19 bits of the tag's sequence field.
// count: the rooted collectives' (every rank passes the same); 0 for the others, whose counts
// the executor checks from the sizes.
uint32_t fold_signature(int kind, DataType dtype, ReduceOp op, bool reduces, int root,
                        uint64_t count = 0);
// Every transport words a receive whose tag differs from the send's as a "tag mismatch"
// (core/net/transport.h); in a collective that is a peer running another call.
bool tag_mismatch(const Status& s);

class CommImpl : public Communicator {
 public:
  CommImpl(Group group, CommSettings settings)
      : group_(std::move(group)),
        settings_(std::move(settings)),
        pool_(group_,
              PoolOptions{settings_.mode, settings_.factory, settings_.timeout_ms,
                          settings_.spin_us, settings_.config, settings_.route_host},
              &aborted_),
        exec_(&pool_, &aborted_, executor_options(settings_, group_)),
        direct_(group_.rank(), group_.size(), shm_direct_options(settings_.config)) {}
  ~CommImpl() override;

  // set_up(), then, had it failed before the ranks compared outcomes (agree_cost_params), says so
  // to the others (agree_setup_outcome) so they fail at once naming this rank.
  Status init();

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Status allreduce(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                   ReduceOp op) override {
    return serialized([&] { return allreduce_locked(sendbuf, recvbuf, count, dtype, op); });
  }
  Status broadcast(void* buf, size_t count, DataType dtype, int root) override {
    return serialized([&] { return broadcast_locked(buf, count, dtype, root); });
  }
  Status allgather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype) override {
    return serialized([&] { return allgather_locked(sendbuf, recvbuf, sendcount, dtype); });
  }
  Status reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount, DataType dtype,
                        ReduceOp op) override {
    return serialized(
        [&] { return reduce_scatter_locked(sendbuf, recvbuf, recvcount, dtype, op); });
  }
  Status barrier() override {
    return serialized([&] { return barrier_locked(); });
  }
  Status alltoall(const void* sendbuf, void* recvbuf, size_t count, DataType dtype) override {
    return serialized([&] { return alltoall_locked(sendbuf, recvbuf, count, dtype); });
  }
  Status run(const CollectiveCall& call) override {
    return serialized([&] { return run_locked(call); });
  }
  Result<std::unique_ptr<AsyncOp>> start(const CollectiveCall& call) override;
  Result<std::unique_ptr<AsyncOp>> iallreduce(const void* sendbuf, void* recvbuf, size_t count,
                                              DataType dtype, ReduceOp op) override;
  Result<std::shared_ptr<P2PRequest>> isend(const void* buf, size_t bytes, int peer,
                                            int tag) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->isend(buf, bytes, peer, tag);
  }
  Result<std::shared_ptr<P2PRequest>> irecv(void* buf, size_t bytes, int peer, int tag) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->irecv(buf, bytes, peer, tag);
  }
  Result<net::MemRegion*> reg_dmabuf(int peer, bool send, void* iova, size_t bytes, uint64_t offset,
                                     int fd, Deadline deadline) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->reg_dmabuf(peer, send, iova, bytes, offset, fd, deadline);
  }
  Result<std::shared_ptr<P2PRequest>> isend_registered(const void* buf, size_t bytes, int peer,
                                                       int tag, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->isend(buf, bytes, peer, tag, mr);
  }
  Result<std::shared_ptr<P2PRequest>> irecv_registered(void* buf, size_t bytes, int peer, int tag,
                                                       net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->irecv(buf, bytes, peer, tag, mr);
  }
  Status dereg_dmabuf(int peer, bool send, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->dereg_dmabuf(peer, send, mr);
  }
  Result<bool> flush_dmabuf(int peer, void* iova, size_t bytes, net::MemRegion* mr,
                            Deadline deadline) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->flush_dmabuf(peer, iova, bytes, mr, deadline);
  }
  void abort() override { aborted_.store(true); }
  bool aborted() const override { return aborted_.load(); }
  // Shared buffers while the allreduce's direct path may run (GW_ALGO not forced); every direct
  // collective maps them then.
  bool wants_shared_host_memory() const override {
    return settings_.forced_algo == Algo::kAuto && direct_.maps_shared_buffers();
  }
  Algo choose_allreduce_algo(size_t bytes) const override {
    if (size() == 1)
      return settings_.forced_algo == Algo::kAuto ? Algo::kRing : settings_.forced_algo;
    auto c = choose_allreduce(group_, bytes, cost_, settings_.forced_algo);
    return c.ok() ? c->algorithm->algo : settings_.forced_algo;
  }
  Result<std::unique_ptr<Communicator>> split(int color, int key) override;
  std::string describe() const override { return summary_; }
  std::map<std::string, std::string> resolved() const override { return resolved_; }
  HostLayout host_layout() const override {
    return HostLayout{group_.host(), group_.nhosts(), group_.local_rank(), group_.local_size(),
                      uniform_hosts(group_.hosts())};
  }

 private:
  // One collective at a time, after the queued asynchronous ones (the issue order).
  template <typename F>
  Status serialized(F&& body) {
    wait_async_idle();
    std::lock_guard<std::mutex> lock(exec_mu_);
    return body();
  }
  // The collectives' bodies; each runs under exec_mu_.
  Status run_locked(const CollectiveCall& call);
  // Runs `call`, one of direct_'s collectives, with the exchanges it needs over this call's tags,
  // and puts it on the timeline as `name` of `bytes`; *ran as the call's.
  Status run_direct(const char* name, size_t bytes, Deadline deadline,
                    const std::function<Status(const Exchange&, bool*)>& call, bool* ran);
  // Whether a `kind` of `bytes` (its whole buffer) reads the peers' buffers (direct_), unless its
  // GW_ALGO_* knob forces an algorithm.
  bool direct_wants(Collective kind, size_t bytes) const;
  Status allreduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                          ReduceOp op);
  Status broadcast_locked(void* buf, size_t count, DataType dtype, int root);
  Status allgather_locked(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype);
  Status reduce_scatter_locked(const void* sendbuf, void* recvbuf, size_t recvcount, DataType dtype,
                               ReduceOp op);
  Status barrier_locked();
  Status alltoall_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype);
  // comm_rooted.cc
  Status reduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                       ReduceOp op, int root);
  Status gather_locked(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype,
                       int root);
  Status scatter_locked(const void* sendbuf, void* recvbuf, size_t recvcount, DataType dtype,
                        int root);
  Status alltoallv_locked(const CollectiveCall& call);
  // Runs the phases one after the other (each a set of plans run together, for tag_seq_), after
  // connecting what all of them use.
  // check_ring: first an empty message round the ring (each rank to the next), whose tag carries
  // the call's signature, so that ranks that disagree on it fail before any data moves, whoever
  // would have sent first.
  Status run_phases(const char* name, const std::vector<std::vector<Plan>>& phases,
                    const uint8_t* in, uint8_t* out, DataType dtype, ReduceOp op, Deadline deadline,
                    bool check_ring);
  // What the ranks of one collective must agree on besides its count (the executor checks the
  // count exactly, from the sizes it receives, and names both sides' sizes): the kind, the dtype,
  // the op and the root. run_collective folds it into the sequence field of every tag of the
  // call (the executor tags each message with (sequence, step)), so a peer that disagrees on any
  // of them fails a receive with a tag mismatch, reported as the callers' error. No byte is added
  // to a message; two different signatures fold alike with a chance of 2^-19, as two calls 2^19
  // apart already share their tags.
  struct CallSig {
    CallKind kind;
    DataType dtype = DataType::kU8;
    ReduceOp op = ReduceOp::kSum;
    bool reduces = false;    // whether op matters
    int root = -1;           // the rooted collectives'
    bool has_count = false;  // whether count is part of the signature (the rooted collectives)
    size_t count = 0;
  };
  // Runs under exec_mu_: checks abort/broken state, numbers the collective (tag_seq_: the number
  // with `sig` folded in), and marks the communicator broken when `body` fails (its connections
  // are closed so peers fail fast too).
  template <typename F>
  Status run_collective(const char* name, const CallSig& sig, F&& body);
  Status check_usable(const char* name) const;
  void wait_async_idle() { queue_.wait_idle(); }
  int channels_for(size_t bytes) const;
  // The collective's algorithm for `bytes` (its GW_ALGO_* row or the cost model); requires
  // size() > 1. log_choice logs it at INFO once per algorithm and size class.
  Result<CollectiveChoice> choose(Collective kind, size_t bytes, size_t elem_bytes) const {
    return choose_collective(kind, group_, bytes, call_cost(elem_bytes),
                             settings_.forced_coll[static_cast<size_t>(kind)]);
  }
  // The agreed figures with this call's element size and the executor's chunk.
  CostParams call_cost(size_t elem_bytes) const {
    CostParams p = cost_;
    p.elem_bytes = elem_bytes;
    p.chunk_bytes = exec_.chunk_bytes();
    return p;
  }
  void log_choice(Collective kind, size_t bytes, const CollectiveChoice& choice, size_t nplans);
  // Rank 0 publishes cost_, the others replace theirs with it.
  Status agree_cost_params();
  Status set_up();
  bool outcome_said_ = false;  // agree_setup_outcome ran (agree_cost_params)
  // "transport tcp (eth0:10.0.0.1, 1 socket per connection, 0 I/O threads)".
  static std::string describe_transport(std::string_view level, const net::Properties& p);
  // describe()'s text, once the transports and the cost model are known.
  std::string make_summary(const std::string& transports);

  Group group_;
  CommSettings settings_;
  std::atomic<bool> aborted_{false};
  ConnectionPool pool_;
  Executor exec_;
  // Large allreduces within one host over shm (collectives/shm_direct.h); eligible from set_up().
  ShmDirect direct_;
  CostParams cost_;

  uint32_t seq_ = 0;
  uint32_t tag_seq_ = 0;  // seq_ with the call's signature folded in: what the tags carry
  Status broken_;
  // (collective, algo, size class); allreduce is -1.
  std::set<std::tuple<int, int, int>> logged_;
  // choose_allreduce's answers and the plans they build, by (bytes, element size, chunk):
  // training repeats the same calls every step, and evaluating the model (every entry's rule and
  // cost) and building the plans took most of a 4 KiB shm allreduce (3.5 us; 1.2 us without).
  // Emptied when it reaches kMaxCachedChoices. Under exec_mu_.
  static constexpr size_t kMaxCachedChoices = 256;
  struct CachedAllreduce {
    AllreduceChoice choice;
    std::vector<Plan> plans;  // this rank's, for bytes / element size elements
  };
  std::map<std::tuple<size_t, size_t, size_t>, CachedAllreduce> allreduce_choices_;
  Result<const CachedAllreduce*> allreduce_plans(size_t count, size_t elem_bytes);
  // The same for broadcast, allgather and reduce-scatter: the choice for `bytes` (the model's
  // size of the call) and the plans for `count` elements from `root`, on as many channels as the
  // algorithm takes for `channel_bytes` (0: one channel).
  struct CachedCollective {
    CollectiveChoice choice;
    std::vector<Plan> plans;
  };
  std::map<std::tuple<int, size_t, size_t, int, size_t, size_t>, CachedCollective>
      collective_choices_;
  Result<const CachedCollective*> collective_plans(Collective kind, size_t bytes, size_t count,
                                                   int root, size_t channel_bytes,
                                                   size_t elem_bytes);
  std::string summary_;                          // describe(), made by init()
  std::map<std::string, std::string> resolved_;  // resolved(), made by init()

  std::mutex exec_mu_;  // one collective at a time
  AsyncQueue queue_;    // iallreduce
  // Point-to-point (collectives/p2p.h), made on first use; connections of its own.
  std::mutex p2p_mu_;
  std::unique_ptr<PointToPoint> p2p_;
  Result<PointToPoint*> point_to_point() {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    if (aborted()) return aborted_error("point-to-point: communicator aborted");
    if (!p2p_) {
      p2p_ = std::make_unique<PointToPoint>(
          group_,
          PoolOptions{settings_.mode, settings_.factory, settings_.timeout_ms, settings_.spin_us,
                      settings_.config, settings_.route_host},
          P2POptions{settings_.timeout_ms, settings_.spin_us, exec_.chunk_bytes()}, &aborted_);
    }
    return p2p_.get();
  }
};

template <typename F>
Status CommImpl::run_collective(const char* name, const CallSig& sig, F&& body) {
  GW_RETURN_IF_ERROR(check_usable(name));
  ++seq_;
  tag_seq_ = seq_ ^ fold_signature(static_cast<int>(sig.kind), sig.dtype, sig.op, sig.reduces,
                                   sig.root, sig.has_count ? sig.count + 1 : 0);
  Status s = body(deadline_after_ms(settings_.timeout_ms));
  if (tag_mismatch(s)) {
    // The header's promise: arguments that disagree are the callers' error.
    std::string mine = fmt::format("{} of {}", name, dtype_name(sig.dtype));
    if (sig.reduces) mine += fmt::format(", op {}", op_name(sig.op));
    if (sig.root >= 0) mine += fmt::format(", root {}", sig.root);
    if (sig.has_count) mine += fmt::format(", count {}", sig.count);
    s = invalid_arg(
        "{}: ranks disagree on the collective, its dtype, op, root or count, or on the order of "
        "calls: "
        "rank {} called {} as its collective #{} ({})",
        name, rank(), mine, seq_, s.message());
  }
  if (!s.ok() && s.code() != Code::kAborted) {
    // Close every connection: the peers' pending operations fail with kPeer at once instead of
    // waiting for their deadline, and this communicator refuses later calls.
    GW_LOG_ERROR("rank {}: {}", rank(), s.to_string());
    broken_ = s;
    pool_.close_all();
  }
  return s;
}

}  // namespace gw::coll
