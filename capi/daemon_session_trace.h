// Daemon mode's side of GW_TIMELINE (core/timeline.h): what a trainer in daemon mode records of its
// own calls, beside the daemon's trace of the job (gradwirectl trace, daemon/job_trace.h).
//
// Each C ABI call is one event of category "collective" on the calling thread (pid = rank), from
// the call to its completion (an iallreduce: from its post to the gw_wait or gw_test that saw it
// complete), named after the call (allreduce, reduce, alltoallv...), with args bytes (the call's
// larger side), dtype, op, seq (its first submission's number, which the daemon's trace shows as
// `seq`), submissions, mode "daemon", and failed when the daemon failed one. Inside it, its phases
// (category "phase"; recorded where they happen: daemon/client.cc, capi/daemon_*.cc):
//   copy to arena          a buffer not from gw_mem_alloc copied into arena staging
//   wait for daemon        until a submission's completion (or room in the submission ring)
//   copy from arena        a staged result copied back to the caller's buffer
//   stage from device,     device memory the daemon could not import, copied to host memory
//   stage to device        before the host path and back after it
//   wait for queued calls  a blocking call waiting for the i-forms issued before it
// A call composed over others (reduce over allreduce, a staged device call over the host path,
// alltoallv over allgather and alltoall) is one event: the outermost records, the inner ones add
// their phases to it. Off, each hook is one relaxed load (timeline::on()).
#pragma once

#include <cstdint>
#include <cstring>

#include "collectives/call.h"
#include "collectives/types.h"
#include "core/timeline.h"

namespace gw::capi {

// The bytes a call's event says: its larger side (a world of `size` ranks).
uint64_t call_bytes(const coll::CollectiveCall& call, int size);

// One call: [construction, destruction) as its event, when the timeline is on and no call is
// recorded on this thread already. op: null for calls that do not reduce.
class CallSpan {
 public:
  CallSpan(const char* name, uint64_t bytes, coll::DataType dtype, const coll::ReduceOp* op);
  ~CallSpan();
  CallSpan(const CallSpan&) = delete;
  CallSpan& operator=(const CallSpan&) = delete;

 private:
  const char* name_;
  uint64_t bytes_;
  coll::DataType dtype_;
  bool reduces_;
  coll::ReduceOp op_ = coll::ReduceOp::kSum;
  int64_t ts_ = -1;  // -1: not recording (off, or nested in another)
  timeline::CallNotes notes_;
};

// Writes a call's event (CallSpan's; an iallreduce's at its completion).
void record_call(const char* name, int64_t ts_us, uint64_t bytes, coll::DataType dtype,
                 const coll::ReduceOp* op, const timeline::CallNotes& notes);

// A phase: [construction, destruction) with its bytes (0: none), when the timeline is on.
class PhaseSpan {
 public:
  explicit PhaseSpan(const char* name, uint64_t bytes = 0)
      : name_(name), bytes_(bytes), ts_(timeline::on() ? timeline::now_us() : -1) {}
  ~PhaseSpan() {
    if (ts_ >= 0) end();
  }
  PhaseSpan(const PhaseSpan&) = delete;
  PhaseSpan& operator=(const PhaseSpan&) = delete;

 private:
  void end();
  const char* name_;
  uint64_t bytes_;
  int64_t ts_;
};

inline constexpr const char* kCopyToArena = "copy to arena";
inline constexpr const char* kCopyFromArena = "copy from arena";

// memcpy into arena staging / out of it, as a phase.
inline void copy_to_arena(void* dst, const void* src, size_t n) {
  PhaseSpan p(kCopyToArena, n);
  std::memcpy(dst, src, n);
}
inline void copy_from_arena(void* dst, const void* src, size_t n) {
  PhaseSpan p(kCopyFromArena, n);
  std::memcpy(dst, src, n);
}

}  // namespace gw::capi
