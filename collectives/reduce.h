// Element-wise reduction kernels used by every collective.
//
// reduce() computes out[i] = a[i] op b[i] for `count` elements. `out` may alias `a` or `b`
// exactly (not partially). f16/bf16 are widened to f32, combined, and rounded back to nearest
// even; NaN stays NaN. Integer sum/prod wrap (two's complement), never UB. min/max propagate NaN
// from either side. kAvg reduces like kSum; the collective divides once at the end with
// finalize_avg().
//
// The vector path (AVX2 + F16C + FMA) is chosen once at run time with __builtin_cpu_supports;
// the build never assumes the CPU it runs on. All functions are thread-safe and never block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "collectives/types.h"

namespace gw::coll {

void reduce(DataType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t count);

// The portable path, same results as reduce(); exposed so tests can compare the two.
void reduce_portable(DataType dtype, ReduceOp op, const void* a, const void* b, void* out,
                     size_t count);

// buf[i] /= nranks (integers truncate toward zero). nranks must be >= 1.
void finalize_avg(DataType dtype, void* buf, size_t count, int nranks);

// "avx2" or "portable": which path reduce() dispatches to on this CPU.
std::string_view reduce_isa();

// Scalar conversions (round to nearest even, NaN preserved), shared with tests and codecs.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bf16_to_float(uint16_t h);
uint16_t float_to_bf16(float f);

}  // namespace gw::coll
