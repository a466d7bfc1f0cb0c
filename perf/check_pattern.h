// Input patterns and exact result checks for `gradwire-perf --check`.
//
// Every element of every rank's input is a small integer that depends on the rank and the index,
// so that a block sent to the wrong rank, a missing contribution or a stale buffer shows up as a
// wrong element. Values are kept small enough that sums and products stay exact in every dtype
// (uint8 included), so integer results are compared exactly and float results within a
// tolerance that only covers the dtype's rounding (f16/bf16 are reduced in float32 and rounded).
#pragma once

#include <cstddef>
#include <cstdint>

#include "collectives/types.h"

namespace gw::perf {

// kAlltoallv is checked by perf/coll_alltoallv.h (its own uneven splits), not by count_wrong.
enum class Collective {
  kAllreduce,
  kAllgather,
  kReduceScatter,
  kBroadcast,
  kAlltoall,
  kAlltoallv,
  kReduce,   // rooted: gw_reduce
  kGather,   // rooted: gw_gather
  kScatter,  // rooted: gw_scatter
};

// The collectives with a root (--root; the table's root column).
inline bool is_rooted(Collective c) {
  return c == Collective::kBroadcast || c == Collective::kReduce || c == Collective::kGather ||
         c == Collective::kScatter;
}

// The value rank `rank` contributes at (global) index `index`, for this dtype/op/world.
int64_t pattern_value(coll::DataType dtype, coll::ReduceOp op, int world, int rank, size_t index);

// Writes `count` elements of dtype starting at global index `first`, with rank's pattern.
void fill_pattern(void* buf, size_t count, coll::DataType dtype, coll::ReduceOp op, int world,
                  int rank, size_t first);

// Writes a value no pattern produces (-1, 255 for uint8), so unwritten output is detected.
void fill_sentinel(void* buf, size_t count, coll::DataType dtype);

// Counts the elements of this rank's output that differ from what the collective must produce.
// `count` is the collective's count argument (per-rank block for allgather/reduce_scatter/alltoall,
// gather/scatter; alltoall and scatter inputs are fill_pattern over the whole send buffer from
// index 0). reduce and gather define an output at the root only: elsewhere nothing is wrong.
size_t count_wrong(Collective coll, const void* out, size_t count, coll::DataType dtype,
                   coll::ReduceOp op, int world, int rank, int root);

}  // namespace gw::perf
