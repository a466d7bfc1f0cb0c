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

// ---- the base class's forms ---------------------------------------------------------------------

Status Communicator::reduce(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                            ReduceOp op, int root) {
  CollectiveCall c;
  c.kind = CallKind::kReduce;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.root = root;
  return run(c);
}

Status Communicator::gather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype,
                            int root) {
  CollectiveCall c;
  c.kind = CallKind::kGather;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = sendcount;
  c.dtype = dtype;
  c.root = root;
  return run(c);
}

Status Communicator::scatter(const void* sendbuf, void* recvbuf, size_t recvcount, DataType dtype,
                             int root) {
  CollectiveCall c;
  c.kind = CallKind::kScatter;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = recvcount;
  c.dtype = dtype;
  c.root = root;
  return run(c);
}

Status Communicator::alltoallv(const void* sendbuf, const size_t* sendcounts, const size_t* sdispls,
                               void* recvbuf, const size_t* recvcounts, const size_t* rdispls,
                               DataType dtype) {
  if (!sendcounts || !sdispls || !recvcounts || !rdispls) {
    return invalid_arg("alltoallv: sendcounts, sdispls, recvcounts and rdispls must not be NULL");
  }
  const auto p = static_cast<size_t>(size());
  CollectiveCall c;
  c.kind = CallKind::kAlltoallv;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.dtype = dtype;
  c.sendcounts.assign(sendcounts, sendcounts + p);
  c.sdispls.assign(sdispls, sdispls + p);
  c.recvcounts.assign(recvcounts, recvcounts + p);
  c.rdispls.assign(rdispls, rdispls + p);
  return run(c);
}

Status Communicator::run(const CollectiveCall& c) {
  switch (c.kind) {
    case CallKind::kAllreduce:
      return allreduce(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
    case CallKind::kBroadcast:
      return broadcast(c.recvbuf, c.count, c.dtype, c.root);
    case CallKind::kAllgather:
      return allgather(c.sendbuf, c.recvbuf, c.count, c.dtype);
    case CallKind::kReduceScatter:
      return reduce_scatter(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
    case CallKind::kBarrier:
      return barrier();
    case CallKind::kAlltoall:
      return alltoall(c.sendbuf, c.recvbuf, c.count, c.dtype);
    default:
      return unsupported("{}: this communicator does not have it", call_name(c.kind));
  }
}

Result<std::unique_ptr<AsyncOp>> Communicator::start(const CollectiveCall& c) {
  return unsupported("{}: this communicator has no non-blocking form of it", call_name(c.kind));
}

// ---- CommImpl -----------------------------------------------------------------------------------

Status CommImpl::run_locked(const CollectiveCall& c) {
  switch (c.kind) {
    case CallKind::kAllreduce:
      return allreduce_locked(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
    case CallKind::kBroadcast:
      return broadcast_locked(c.recvbuf, c.count, c.dtype, c.root);
    case CallKind::kAllgather:
      return allgather_locked(c.sendbuf, c.recvbuf, c.count, c.dtype);
    case CallKind::kReduceScatter:
      return reduce_scatter_locked(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
    case CallKind::kBarrier:
      return barrier_locked();
    case CallKind::kAlltoall:
      return alltoall_locked(c.sendbuf, c.recvbuf, c.count, c.dtype);
    case CallKind::kAlltoallv:
      return alltoallv_locked(c);
    case CallKind::kReduce:
      return reduce_locked(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op, c.root);
    case CallKind::kGather:
      return gather_locked(c.sendbuf, c.recvbuf, c.count, c.dtype, c.root);
    case CallKind::kScatter:
      return scatter_locked(c.sendbuf, c.recvbuf, c.count, c.dtype, c.root);
  }
  return invalid_arg("collective: unknown kind {}", static_cast<int>(c.kind));
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

// One plan of the steps.
std::vector<Plan> one_plan(Schedule s) {
  std::vector<Plan> plans(1);
  plans[0].sched = std::move(s);
  return plans;
}

}  // namespace

Status CommImpl::reduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                               ReduceOp op, int root) {
  CollectiveCall c;
  c.kind = CallKind::kReduce;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  c.root = root;
  GW_RETURN_IF_ERROR(check_call(c, rank(), size()));
  const CallSig sig{CallKind::kReduce, dtype, op, true, root};
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
    GW_RETURN_IF_ERROR(exec_.run("reduce", tag_seq_, one_plan(data), in, out, dtype, op, deadline));
    GW_RETURN_IF_ERROR(exec_.run("reduce", tag_seq_,
                                 one_plan(reduce_token(rank(), size(), root, tree)), in, out, dtype,
                                 op, deadline));
    if (at_root && op == ReduceOp::kAvg) finalize_avg(dtype, recvbuf, count, size());
    return ok_status();
  });
}

Status CommImpl::gather_locked(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype,
                               int root) {
  CollectiveCall c;
  c.kind = CallKind::kGather;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = sendcount;
  c.dtype = dtype;
  c.root = root;
  GW_RETURN_IF_ERROR(check_call(c, rank(), size()));
  const CallSig sig{CallKind::kGather, dtype, ReduceOp::kSum, false, root};
  return run_collective("gather", sig, [&](Deadline deadline) -> Status {
    const size_t blk = sendcount * dtype_size(dtype);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    const bool at_root = rank() == root;
    uint8_t* out = at_root ? static_cast<uint8_t*>(recvbuf) : nullptr;
    // memmove: in place is sendbuf at the root's own block (then nothing moves).
    if (at_root && blk && in != out + rank() * blk) std::memmove(out + rank() * blk, in, blk);
    if (size() == 1) return ok_status();
    if (out == nullptr) out = exec_.scratch(1);  // the token's (empty) destination
    GW_RETURN_IF_ERROR(exec_.run(
        "gather", tag_seq_,
        spread_steps(rooted_blocks(rank(), size(), root, sendcount, true), kAlltoallInFlight), in,
        out, dtype, ReduceOp::kSum, deadline));
    return exec_.run("gather", tag_seq_,
                     spread_steps(rooted_token(rank(), size(), root), kAlltoallInFlight), in, out,
                     dtype, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::scatter_locked(const void* sendbuf, void* recvbuf, size_t recvcount,
                                DataType dtype, int root) {
  CollectiveCall c;
  c.kind = CallKind::kScatter;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = recvcount;
  c.dtype = dtype;
  c.root = root;
  GW_RETURN_IF_ERROR(check_call(c, rank(), size()));
  const CallSig sig{CallKind::kScatter, dtype, ReduceOp::kSum, false, root};
  return run_collective("scatter", sig, [&](Deadline deadline) -> Status {
    const size_t blk = recvcount * dtype_size(dtype);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    auto* out = static_cast<uint8_t*>(recvbuf);
    const bool at_root = rank() == root;
    // memmove: in place is recvbuf at the root's own block of sendbuf.
    if (at_root && blk && out != in + rank() * blk) std::memmove(out, in + rank() * blk, blk);
    if (size() == 1) return ok_status();
    if (out == nullptr) out = exec_.scratch(1);
    const auto run = [&](const Schedule& s) {
      return exec_.run("scatter", tag_seq_, spread_steps(s, kAlltoallInFlight), in, out, dtype,
                       ReduceOp::kSum, deadline);
    };
    GW_RETURN_IF_ERROR(run(rooted_blocks(rank(), size(), root, recvcount, false)));
    GW_RETURN_IF_ERROR(run(rooted_ack(rank(), size(), root)));
    return run(rooted_token(rank(), size(), root));
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
    GW_RETURN_IF_ERROR(exec_.run(
        "alltoallv", tag_seq_,
        spread_steps(
            pairwise_alltoallv(rank(), size(), c.sendcounts, c.sdispls, c.recvcounts, c.rdispls),
            kAlltoallInFlight),
        in, sink, c.dtype, ReduceOp::kSum, deadline));
    // Every pair once more, empty: a rank that failed the exchange never sends it, so no rank
    // ends well when any disagreed.
    return exec_.run("alltoallv", tag_seq_,
                     spread_steps(pairwise_token(rank(), size()), kAlltoallInFlight), in, sink,
                     c.dtype, ReduceOp::kSum, deadline);
  });
}

}  // namespace gw::coll
