// One collective call as plain data: what the i-forms queue and what the C layer hands a Session
// (capi/session.h), so that every collective, blocking or not, goes through one entry point
// (Communicator::run / Communicator::start) instead of one virtual per collective and form.
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/types.h"
#include "core/status.h"

namespace gw::coll {

// The order is part of the tag signature (communicator.h): new kinds go at the end.
enum class CallKind {
  kAllreduce,
  kBroadcast,
  kAllgather,
  kReduceScatter,
  kBarrier,
  kAlltoall,
  kAlltoallv,
  kReduce,
  kGather,
  kScatter,
};

// "allreduce", "broadcast", ..., "scatter".
const char* call_name(CallKind kind);

// The arguments of the C header's call of that kind (the field names follow it):
// - allreduce, reduce: sendbuf, recvbuf, count, dtype, op (reduce: root; recvbuf used at the root)
// - broadcast: recvbuf is the buffer, count, dtype, root
// - allgather, gather: count is the sendcount (gather: root; recvbuf used at the root)
// - reduce_scatter, scatter: count is the recvcount (scatter: root; sendbuf used at the root)
// - alltoall: count per rank; alltoallv: the four vectors (size() entries each, in elements)
// - barrier: nothing
// Buffers belong to the caller and must stay valid until the call (or its request) is done.
struct CollectiveCall {
  CallKind kind = CallKind::kBarrier;
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kU8;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;
};

// The argument checks of reduce, gather, scatter and alltoallv (other kinds: dtype, op and root
// only) for `rank` of `nranks`, as kInvalidArg with a message that names the argument: dtype and
// op valid, root in range, sizes that fit a buffer (count x elements x blocks <= 2^57 bytes),
// buffers non-NULL where they have bytes to move (the root's only at the root), distinct send and
// receive buffers not overlapping (in place: gather's sendbuf at the root's own block of recvbuf,
// scatter's recvbuf at the root's own block of sendbuf, alltoallv's sendbuf == recvbuf), and for
// alltoallv: nranks entries per vector, displacement + count without overflow, receive blocks not
// overlapping each other, and sendcounts[rank] == recvcounts[rank].
Status check_call(const CollectiveCall& call, int rank, int nranks);

}  // namespace gw::coll
