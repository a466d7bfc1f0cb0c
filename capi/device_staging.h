// Staging of CUDA device buffers for the collectives and point-to-point in direct mode: the
// device ranges a call reads are copied into host memory (DeviceMemory::stage) before it, the
// call runs on host memory, and the ranges it writes are copied back after it (for the i-forms
// and gw_irecv: when gw_wait / gw_test finds the operation done). The copies are synchronous on
// the legacy default stream of the buffer's device: the header's promise is that the caller
// finished writing the input before the call, and that the output is in device memory, visible
// to every stream, when the call (or the wait) returns.
//
// Which bytes move (es: the dtype's size, p: ranks):
//   allreduce, alltoall      send in, recv out (count x es, x p for alltoall)
//   broadcast                the root's buffer in, every other rank's out
//   allgather, gather        send in; recv out (gather: at the root only)
//   reduce_scatter, scatter  send in (scatter: at the root only); recv out
//   reduce                   send in; recv out at the root
//   alltoallv                send in up to its furthest displacement; recv in and out (bytes
//                            between the blocks stay as they were)
//   in place (the buffers overlap as the header allows): the union in, the receive part out.
//
// Not pipelined: slicing a call would have to happen on every rank alike, and a rank cannot
// know whether the others' buffers are device memory (a rank slicing its broadcast while another
// runs it whole would mismatch the collectives). Slices of the collective itself (copies of
// slice k+1 overlapping the exchange of slice k inside one collective) are the way; not built.
#pragma once

#include <cstddef>
#include <memory>

#include "capi/device_memory.h"
#include "capi/session.h"
#include "collectives/call.h"
#include "core/status.h"

namespace gw::capi {

// Which of a call's buffers are CUDA device memory (the C layer asked the driver once each).
struct DeviceFlags {
  bool send = false;
  bool recv = false;
  bool any() const { return send || recv; }
};

// A blocking call with device buffers: copy in, Session::run on host memory, copy out.
Status run_staged(Session& st, const coll::CollectiveCall& call, DeviceFlags dev);
// An i-form: copies in now, starts the host call (Session::iallreduce for kAllreduce when
// `iallreduce`, else Session::start), and returns a request that copies out when it is done.
Result<std::unique_ptr<SessionRequest>> start_staged(Session& st, const coll::CollectiveCall& call,
                                                     DeviceFlags dev, bool iallreduce);
// gw_isend / gw_irecv on a device buffer of `bytes` bytes (a receive copies out the bytes that
// arrived).
Result<std::unique_ptr<SessionRequest>> p2p_staged(Session& st, bool send, void* buf, size_t bytes,
                                                   int peer, int tag);

}  // namespace gw::capi
