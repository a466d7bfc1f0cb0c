// The schedule executor: runs plans (schedules placed on channels, collectives/schedule.h) over a
// ConnectionPool, chunked and pipelined (kWindow chunks in flight per direction per channel),
// progressed from the calling thread by polling every outstanding request round-robin. Each
// plan runs its steps in order; a step that waits for another plan (Step::after_plan) starts
// once that plan has finished the steps it names.
//
// Every range ends with a chunk shorter than a full one, so a receive whose size differs from the
// schedule's is reported as "ranks disagree on count". Not thread-safe: one run() at a time.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/connection_pool.h"
#include "collectives/schedule.h"
#include "collectives/stall.h"
#include "collectives/types.h"
#include "core/status.h"

namespace gw::coll {

struct ExecutorOptions {
  size_t chunk_bytes = 512 * 1024;
  int64_t spin_us = 50;
  int64_t timeout_ms = 0;  // for the error messages; the deadline is run()'s
  StallOptions stall;      // the stall inspector (collectives/stall.h); off by default
};

class Executor {
 public:
  static constexpr int kWindow = 4;  // chunks in flight per direction per channel

  // `pool` and `aborted` must outlive the executor.
  Executor(ConnectionPool* pool, const std::atomic<bool>* aborted, ExecutorOptions options);

  size_t chunk_bytes() const { return options_.chunk_bytes; }
  void set_chunk_bytes(size_t bytes) { options_.chunk_bytes = bytes; }

  // Runs the plans of collective number `seq` (it goes into every tag, with the step id) to the
  // end, reading `in` and writing `out` (the same buffer when in place). Connects first what is
  // not connected yet. Returns the first error, kAborted when aborted, kTimeout at the deadline.
  Status run(const char* name, uint32_t seq, const std::vector<Plan>& plans, const uint8_t* in,
             uint8_t* out, DataType dtype, ReduceOp op, Deadline deadline);

  // A buffer of at least `bytes` owned by the executor (valid until the next call).
  uint8_t* scratch(size_t bytes);

 private:
  struct ChanRun;

  Status progress(const char* name, uint32_t seq, ChanRun& c, const std::vector<ChanRun>* runs,
                  const uint8_t* in, uint8_t* out, DataType dtype, ReduceOp op, bool* progressed);
  uint8_t* staging(int plan);

  // For the timeline (core/timeline.h), set only while it is on: when the current run's first
  // chunk arrived (-1: not yet), and the microseconds its reductions took.
  int64_t first_recv_us_ = -1;
  int64_t reduce_us_ = 0;

  ConnectionPool* pool_;
  const std::atomic<bool>* aborted_;
  ExecutorOptions options_;
  std::vector<std::vector<uint8_t>> staging_;
  std::vector<uint8_t> scratch_;
};

}  // namespace gw::coll
