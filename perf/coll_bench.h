// The collective sweeps of gradwire-perf (allreduce, allgather, reduce_scatter, broadcast,
// alltoall, alltoallv, and the rooted reduce, gather, scatter),
// nccl-tests style, run through the C ABI (libgradwire.so) exactly as an application would.
#pragma once

#include <cstdint>
#include <string>

#include "collectives/types.h"
#include "core/config.h"
#include "core/status.h"
#include "gradwire/gradwire.h"
#include "perf/check_pattern.h"

namespace gw::perf {

struct CollConfig {
  Collective coll = Collective::kAllreduce;
  std::string name = "allreduce";
  uint64_t min_bytes = 1024;
  uint64_t max_bytes = 256ull << 20;
  int factor = 2;
  uint64_t step_bytes = 0;  // -i: > 0 steps the size by this many bytes instead of by `factor`
  coll::DataType dtype = coll::DataType::kF32;
  coll::ReduceOp op = coll::ReduceOp::kSum;
  int root = 0;
  int np = 0;  // 0: take rank/world/store from the launcher's environment
  std::string transport = "auto";
  std::string algo;  // "" : GW_ALGO as set in the environment
  int iters = 0;     // 0: adaptive
  int warmup = 2;
  // --warmup-ms: before the first size is timed, untimed calls of it until this long has passed
  // on every rank (a transport's first thousands of frames may be slower than the rest).
  int64_t warmup_ms = 100;
  int check_iters = 0;  // -c N: checked calls per size and placement (0: no check)
  // -a: how one iteration's time is taken across ranks, as nccl-tests' -a: rank 0's, the mean,
  // the fastest rank's, or the slowest rank's (the default).
  enum class Average { kRank0 = 0, kMean = 1, kMin = 2, kMax = 3 };
  Average average = Average::kMax;
  bool blocking = true;   // -z 0: allreduce iterations issued with gw_iallreduce, waited at the end
  bool progress = false;  // progress lines on stderr even when it is not a tty
  std::string json_path;  // "" : no JSON
  int64_t timeout_ms = 0;  // 0: GW_TIMEOUT_MS
  // --mem-alloc: the send and receive buffers come from gw_mem_alloc (daemon mode: the trainer's
  // shared arena, so collectives on them are zero-copy; direct mode: aligned host memory).
  bool mem_alloc = false;
  // --cpu: after each row, rank 0's "# cpu:" line: the machine's CPU time (and rank 0's own) per
  // GB moved in the out-of-place timed iterations (perf/cpu_meter.h).
  bool cpu = false;
};

// gw_comm_describe(comm, key) as a string ("?" when the call fails): what the communicator
// resolved (transport, interface, channels, allreduce algorithm by size).
std::string comm_describe(gw_comm_t comm, const char* key);

// Writes one JSON document (text, already serialized) to path; false with a message on stderr.
bool write_json_text(const std::string& path, const std::string& text);

// Bus-bandwidth factor of nccl-tests: allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall,
// gather and scatter (n-1)/n; broadcast and reduce 1.
double busbw_factor(Collective coll, int nranks);

// Sets a setting at the API layer of the configuration, both in this program and in libgradwire
// (which keeps its own copy): the perf tool's options override the environment this way.
Status set_api_value(const config::Row& row, const std::string& value);

// Iterations for one size when --iters is not given: clamp(2e9 / size / nranks, 3, 50), the rule
// the peer baselines (shared/peers) use, so both sides average over comparable work.
int adaptive_iters(uint64_t bytes, int nranks);

// The element count nccl-tests uses for a size: whole elements, a multiple of nranks for
// allgather / reduce_scatter / alltoall / gather / scatter (the size column is then the whole
// gathered / scattered buffer; for alltoall the whole send buffer of one rank).
size_t count_for_size(Collective coll, uint64_t bytes, coll::DataType dtype, int nranks);

// Checks the configuration (sizes, factor, root, iterations) before any rank starts.
Status validate(const CollConfig& config);

// Runs the whole sweep; returns the process exit status (0 ok, 1 wrong results, 2 error).
// With config.np > 0 it forks np ranks with a private store and supervises them; otherwise this
// process is one rank of a job started by torchrun / mpirun / srun / GW_* variables.
int run_collective(const CollConfig& config);

}  // namespace gw::perf
