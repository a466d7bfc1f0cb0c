// The Communicator's rooted collectives (reduce, gather, scatter) and all-to-all-v, and the
// generic entry points run()/start() of a CollectiveCall (the i-forms). Schedules and algorithm
// choice: collectives/rooted_schedule.h.
#include <cstring>
#include <utility>
#include <vector>

#include "collectives/comm_impl.h"
#include "collectives/reduce.h"
#include "collectives/rooted_schedule.h"

namespace gw::coll {

namespace {

// The one map from the kinds every Communicator has to their collectives: `forms` has the
// Communicator's public methods (the base class's run() passes itself; CommImpl::run_locked() a
// view of its _locked bodies); `rest` runs any other kind (alltoallv and the rooted ones).
template <typename Forms, typename Rest>
Status run_by_kind(Forms& forms, const CollectiveCall& c, Rest&& rest) {
  switch (c.kind) {
    case CallKind::kAllreduce:
      return forms.allreduce(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
    case CallKind::kBroadcast:
      return forms.broadcast(c.recvbuf, c.count, c.dtype, c.root);
    case CallKind::kAllgather:
      return forms.allgather(c.sendbuf, c.recvbuf, c.count, c.dtype);
    case CallKind::kReduceScatter:
      return forms.reduce_scatter(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
    case CallKind::kBarrier:
      return forms.barrier();
    case CallKind::kAlltoall:
      return forms.alltoall(c.sendbuf, c.recvbuf, c.count, c.dtype);
    default:
      return rest(c);
  }
}

}  // namespace

// ---- the base class's forms ---------------------------------------------------------------------

Status Communicator::run(const CollectiveCall& c) {
  return run_by_kind(*this, c, [](const CollectiveCall& other) {
    return unsupported("{}: this communicator does not have it", call_name(other.kind));
  });
}

Result<std::unique_ptr<AsyncOp>> Communicator::start(const CollectiveCall& c) {
  return unsupported("{}: this communicator has no non-blocking form of it", call_name(c.kind));
}

// ---- CommImpl -----------------------------------------------------------------------------------

Status CommImpl::run_locked(const CollectiveCall& c) {
  struct Locked {  // the public forms' bodies (exec_mu_ is held)
    CommImpl& self;
    Status allreduce(const void* s, void* r, size_t n, DataType d, ReduceOp op) {
      return self.allreduce_locked(s, r, n, d, op);
    }
    Status broadcast(void* b, size_t n, DataType d, int root) {
      return self.broadcast_locked(b, n, d, root);
    }
    Status allgather(const void* s, void* r, size_t n, DataType d) {
      return self.allgather_locked(s, r, n, d);
    }
    Status reduce_scatter(const void* s, void* r, size_t n, DataType d, ReduceOp op) {
      return self.reduce_scatter_locked(s, r, n, d, op);
    }
    Status barrier() { return self.barrier_locked(); }
    Status alltoall(const void* s, void* r, size_t n, DataType d) {
      return self.alltoall_locked(s, r, n, d);
    }
  } locked{*this};
  return run_by_kind(locked, c, [this](const CollectiveCall& r) {
    switch (r.kind) {
      case CallKind::kAlltoallv:
        return alltoallv_locked(r);
      case CallKind::kReduce:
        return reduce_locked(r.sendbuf, r.recvbuf, r.count, r.dtype, r.op, r.root);
      case CallKind::kGather:
        return gather_locked(r.sendbuf, r.recvbuf, r.count, r.dtype, r.root);
      case CallKind::kScatter:
        return scatter_locked(r.sendbuf, r.recvbuf, r.count, r.dtype, r.root);
      default:
        return invalid_arg("collective: unknown kind {}", static_cast<int>(r.kind));
    }
  });
}

Result<std::unique_ptr<AsyncOp>> CommImpl::start(const CollectiveCall& c) {
  // Refused now rather than at wait(): a bad argument fails only this rank, at once.
  GW_RETURN_IF_ERROR(check_call(c, rank(), size()));
  const char* name = call_name(c.kind);
  GW_RETURN_IF_ERROR(check_usable(name));
  // Ops queue behind each other, so "wait forever" means a few deadlines at most.
  return queue_.push(
      name,
      [this, call = c] {
        std::lock_guard<std::mutex> elock(exec_mu_);
        return run_locked(call);
      },
      settings_.timeout_ms);
}

namespace {

// reduce, gather and scatter as a call (check_call checks their arguments alike).
Status check_rooted_call(CallKind kind, const void* sendbuf, void* recvbuf, size_t count,
                         DataType dtype, ReduceOp op, int root, int rank, int size) {
  CollectiveCall c;
  c.kind = kind;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.root = root;
  return check_call(c, rank, size);
}

// One plan of the steps.
std::vector<Plan> one_plan(Schedule s) {
  std::vector<Plan> plans(1);
  plans[0].sched = std::move(s);
  return plans;
}

}  // namespace

Status CommImpl::run_phases(const char* name, const std::vector<std::vector<Plan>>& phases,
                            const uint8_t* in, uint8_t* out, DataType dtype, ReduceOp op,
                            Deadline deadline, bool check_ring) {
  // Connections with every peer first, whatever the call's arguments (the phases' links depend
  // on the root), so that ranks that disagree on them all connect the same links and meet the
  // mismatch in a message; and before any phase, since a peer that fails a phase closes its
  // connections and returns, so one that connected only then would wait until the deadline.
  std::vector<Plan> all(1);
  for (int k = 1; k < size(); ++k) {
    Step st;
    st.send_to = (rank() + k) % size();
    st.recv_from = (rank() + size() - k) % size();
    all[0].sched.push_back(st);
  }
  for (const auto& phase : phases) all.insert(all.end(), phase.begin(), phase.end());
  GW_RETURN_IF_ERROR(pool_.connect_all(name, all, deadline));
  if (check_ring) {
    Step st;
    st.id = 0xFFF;  // above every phase's ids
    st.send_to = (rank() + 1) % size();
    st.recv_from = (rank() + size() - 1) % size();
    GW_RETURN_IF_ERROR(exec_.run(name, tag_seq_, one_plan({st}), in, out, dtype, op, deadline));
  }
  for (const auto& phase : phases) {
    GW_RETURN_IF_ERROR(exec_.run(name, tag_seq_, phase, in, out, dtype, op, deadline));
  }
  return ok_status();
}

Status CommImpl::reduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                               ReduceOp op, int root) {
  GW_RETURN_IF_ERROR(check_rooted_call(CallKind::kReduce, sendbuf, recvbuf, count, dtype, op, root,
                                       rank(), size()));
  const CallSig sig{CallKind::kReduce, dtype, op, true, root, true, count};
  return run_collective("reduce", sig, [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(dtype);
    const size_t bytes = count * es;
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    const bool at_root = rank() == root;
    if (size() == 1) {
      if (in != recvbuf && bytes) std::memcpy(recvbuf, in, bytes);
      if (op == ReduceOp::kAvg) finalize_avg(dtype, recvbuf, count, 1);
      return ok_status();
    }
    // The other ranks reduce their subtree's (chain's) part into scratch.
    uint8_t* out = at_root && bytes ? static_cast<uint8_t*>(recvbuf)
                                    : exec_.scratch(std::max<size_t>(1, bytes));
    const bool tree = prefer_tree_reduce(size(), bytes, cost_.alpha_us, cost_.bw_gbps,
                                         cost_.reduce_gbps, exec_.chunk_bytes());
    const Schedule data =
        tree ? tree_reduce(rank(), size(), root, count) : chain_reduce(rank(), size(), root, count);
    GW_RETURN_IF_ERROR(
        run_phases("reduce", {one_plan(data), one_plan(reduce_token(rank(), size(), root, tree))},
                   in, out, dtype, op, deadline, true));
    if (at_root && op == ReduceOp::kAvg) finalize_avg(dtype, recvbuf, count, size());
    return ok_status();
  });
}

Status CommImpl::gather_locked(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype,
                               int root) {
  GW_RETURN_IF_ERROR(check_rooted_call(CallKind::kGather, sendbuf, recvbuf, sendcount, dtype,
                                       ReduceOp::kSum, root, rank(), size()));
  const CallSig sig{CallKind::kGather, dtype, ReduceOp::kSum, false, root, true, sendcount};
  return run_collective("gather", sig, [&](Deadline deadline) -> Status {
    const size_t blk = sendcount * dtype_size(dtype);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    const bool at_root = rank() == root;
    uint8_t* out = at_root ? static_cast<uint8_t*>(recvbuf) : nullptr;
    // memmove: in place is sendbuf at the root's own block (then nothing moves).
    if (at_root && blk && in != out + rank() * blk) std::memmove(out + rank() * blk, in, blk);
    if (size() == 1) return ok_status();
    if (out == nullptr) out = exec_.scratch(1);  // the token's (empty) destination
    return run_phases(
        "gather",
        {spread_steps(rooted_blocks(rank(), size(), root, sendcount, true), kAlltoallInFlight),
         spread_steps(rooted_token(rank(), size(), root), kAlltoallInFlight)},
        in, out, dtype, ReduceOp::kSum, deadline, true);
  });
}

Status CommImpl::scatter_locked(const void* sendbuf, void* recvbuf, size_t recvcount,
                                DataType dtype, int root) {
  GW_RETURN_IF_ERROR(check_rooted_call(CallKind::kScatter, sendbuf, recvbuf, recvcount, dtype,
                                       ReduceOp::kSum, root, rank(), size()));
  const CallSig sig{CallKind::kScatter, dtype, ReduceOp::kSum, false, root, true, recvcount};
  return run_collective("scatter", sig, [&](Deadline deadline) -> Status {
    const size_t blk = recvcount * dtype_size(dtype);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    auto* out = static_cast<uint8_t*>(recvbuf);
    const bool at_root = rank() == root;
    // memmove: in place is recvbuf at the root's own block of sendbuf.
    if (at_root && blk && out != in + rank() * blk) std::memmove(out, in + rank() * blk, blk);
    if (size() == 1) return ok_status();
    if (out == nullptr) out = exec_.scratch(1);
    return run_phases(
        "scatter",
        {spread_steps(rooted_blocks(rank(), size(), root, recvcount, false), kAlltoallInFlight),
         spread_steps(rooted_ack(rank(), size(), root), kAlltoallInFlight),
         spread_steps(rooted_token(rank(), size(), root), kAlltoallInFlight)},
        in, out, dtype, ReduceOp::kSum, deadline, true);
  });
}

Status CommImpl::alltoallv_locked(const CollectiveCall& c) {
  GW_RETURN_IF_ERROR(check_call(c, rank(), size()));
  const CallSig sig{CallKind::kAlltoallv, c.dtype};
  return run_collective("alltoallv", sig, [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(c.dtype);
    const auto me = static_cast<size_t>(rank());
    const auto* in = static_cast<const uint8_t*>(c.sendbuf);
    auto* out = static_cast<uint8_t*>(c.recvbuf);
    if (in == out && in != nullptr) {
      // In place: the exchange writes blocks of the output that later steps still read as input.
      size_t end = 0;
      for (size_t j = 0; j < c.sendcounts.size(); ++j) {
        if (c.sendcounts[j]) end = std::max(end, (c.sdispls[j] + c.sendcounts[j]) * es);
      }
      if (end) {
        uint8_t* copy = exec_.scratch(end);
        std::memcpy(copy, in, end);
        in = copy;
      }
    }
    if (c.recvcounts[me]) {
      std::memcpy(out + c.rdispls[me] * es, in + c.sdispls[me] * es, c.recvcounts[me] * es);
    }
    if (size() == 1) return ok_status();
    uint8_t* sink = out != nullptr ? out : exec_.scratch(1);
    // Then every pair once more, empty: a rank that failed the exchange never sends it, so no
    // rank ends well when any disagreed.
    return run_phases("alltoallv",
                      {spread_steps(pairwise_alltoallv(rank(), size(), c.sendcounts, c.sdispls,
                                                       c.recvcounts, c.rdispls),
                                    kAlltoallInFlight),
                       spread_steps(pairwise_token(rank(), size()), kAlltoallInFlight)},
                      in, sink, c.dtype, ReduceOp::kSum, deadline, false);
  });
}

}  // namespace gw::coll
