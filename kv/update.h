// The servers' update rules over one partition's bytes (kv/wire.h's dtypes): sum accumulates in the
// value's own dtype (coll::reduce's kernels), sgd works in double and rounds once per element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/types.h"

namespace gw::kv {

bool is_float(coll::DataType t);
// dst[i] += src[i] (integers wrap; f16/bf16 through f32).
void add_into(coll::DataType t, void* dst, const void* src, size_t count);
// The sgd step with g[i] = grad[i] * scale (scale: 1/pushes for a clock's mean):
//   v[i] = momentum * v[i] + g[i];  value[i] -= lr * v[i]   (v sized on first use, zeroed)
// Floating dtypes only (the callers refuse integer dtypes with sgd at init).
void sgd_step(coll::DataType t, void* value, const void* grad, size_t count, double scale,
              double lr, double momentum, std::vector<double>* velocity);

}  // namespace gw::kv
