#include "perf/check_pattern.h"

#include <cmath>
#include <cstring>

#include "collectives/reduce.h"

namespace gw::perf {

using coll::bf16_to_float;
using coll::DataType;
using coll::float_to_bf16;
using coll::float_to_half;
using coll::half_to_float;
using coll::ReduceOp;

namespace {

bool is_float(DataType t) {
  return t == DataType::kF32 || t == DataType::kF64 || t == DataType::kF16 || t == DataType::kBF16;
}

void store(void* buf, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::kF32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DataType::kF64:
      static_cast<double*>(buf)[i] = v;
      break;
    case DataType::kF16:
      static_cast<uint16_t*>(buf)[i] = float_to_half(static_cast<float>(v));
      break;
    case DataType::kBF16:
      static_cast<uint16_t*>(buf)[i] = float_to_bf16(static_cast<float>(v));
      break;
    case DataType::kI32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kI64:
      static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v);
      break;
    case DataType::kU8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

double load(const void* buf, size_t i, DataType t) {
  switch (t) {
    case DataType::kF32:
      return static_cast<const float*>(buf)[i];
    case DataType::kF64:
      return static_cast<const double*>(buf)[i];
    case DataType::kF16:
      return half_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBF16:
      return bf16_to_float(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kI32:
      return static_cast<const int32_t*>(buf)[i];
    case DataType::kI64:
      return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kU8:
      return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

// Expected reduction of every rank's pattern at `index`, computed exactly (the values keep every
// intermediate result within the dtype's exact integer range).
double expected_reduction(DataType t, ReduceOp op, int world, size_t index) {
  int64_t acc = pattern_value(t, op, world, 0, index);
  for (int r = 1; r < world; ++r) {
    int64_t v = pattern_value(t, op, world, r, index);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = v < acc ? v : acc;
        break;
      case ReduceOp::kMax:
        acc = v > acc ? v : acc;
        break;
    }
  }
  if (op == ReduceOp::kAvg) {
    if (is_float(t)) return static_cast<double>(acc) / world;
    return static_cast<double>(acc / world);  // integers: truncated
  }
  return static_cast<double>(acc);
}

bool matches(DataType t, double got, double want, int world) {
  if (!is_float(t)) return got == want;
  double eps = 0;
  switch (t) {
    case DataType::kF32:
      eps = 1.2e-7;
      break;
    case DataType::kF64:
      eps = 2.3e-16;
      break;
    case DataType::kF16:
      eps = 9.8e-4;
      break;
    case DataType::kBF16:
      eps = 7.9e-3;
      break;
    default:
      break;
  }
  // One rounding per reduction step at most, plus the final division of avg.
  double tol = eps * (world + 1) * std::fabs(want) + eps;
  return std::fabs(got - want) <= tol;  // NaN never matches
}

}  // namespace

int64_t pattern_value(DataType dtype, ReduceOp op, int world, int rank, size_t index) {
  if (op == ReduceOp::kProd) {
    // Exactly one rank contributes 2 at each index, the others 1: the product is 2 everywhere
    // but comes from a different rank per index.
    return (index + static_cast<size_t>(rank)) % static_cast<size_t>(world) == 0 ? 2 : 1;
  }
  // Sums of `world` values must stay exact: below 256 for uint8 and bfloat16 (8-bit mantissa),
  // which bounds the values to 255 / world.
  int64_t range = 31;
  if (dtype == DataType::kU8 || dtype == DataType::kBF16) {
    range = world > 0 ? 255 / world : 1;
    if (range > 31) range = 31;
    if (range < 1) range = 1;
  }
  return static_cast<int64_t>((index * 7 + static_cast<size_t>(rank) * 13) %
                              static_cast<size_t>(range));
}

void fill_pattern(void* buf, size_t count, DataType dtype, ReduceOp op, int world, int rank,
                  size_t first) {
  for (size_t i = 0; i < count; ++i) {
    store(buf, i, dtype, static_cast<double>(pattern_value(dtype, op, world, rank, first + i)));
  }
}

void fill_sentinel(void* buf, size_t count, DataType dtype) {
  for (size_t i = 0; i < count; ++i) store(buf, i, dtype, -1.0);
}

size_t count_wrong(Collective coll, const void* out, size_t count, DataType dtype, ReduceOp op,
                   int world, int rank, int root) {
  size_t wrong = 0;
  switch (coll) {
    case Collective::kAllreduce:
      for (size_t i = 0; i < count; ++i) {
        if (!matches(dtype, load(out, i, dtype), expected_reduction(dtype, op, world, i), world)) {
          ++wrong;
        }
      }
      break;
    case Collective::kReduceScatter: {
      size_t base = static_cast<size_t>(rank) * count;
      for (size_t i = 0; i < count; ++i) {
        if (!matches(dtype, load(out, i, dtype), expected_reduction(dtype, op, world, base + i),
                     world)) {
          ++wrong;
        }
      }
      break;
    }
    case Collective::kAllgather:
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) {
          double want = static_cast<double>(pattern_value(dtype, op, world, r, i));
          if (load(out, static_cast<size_t>(r) * count + i, dtype) != want) ++wrong;
        }
      }
      break;
    case Collective::kBroadcast:
      for (size_t i = 0; i < count; ++i) {
        double want = static_cast<double>(pattern_value(dtype, op, world, root, i));
        if (load(out, i, dtype) != want) ++wrong;
      }
      break;
    case Collective::kReduce:
      if (rank != root) break;
      for (size_t i = 0; i < count; ++i) {
        if (!matches(dtype, load(out, i, dtype), expected_reduction(dtype, op, world, i), world)) {
          ++wrong;
        }
      }
      break;
    case Collective::kGather:
      if (rank != root) break;
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) {
          double want = static_cast<double>(pattern_value(dtype, op, world, r, i));
          if (load(out, static_cast<size_t>(r) * count + i, dtype) != want) ++wrong;
        }
      }
      break;
    case Collective::kScatter:
      // This rank's block of the root's input.
      for (size_t i = 0; i < count; ++i) {
        double want = static_cast<double>(
            pattern_value(dtype, op, world, root, static_cast<size_t>(rank) * count + i));
        if (load(out, i, dtype) != want) ++wrong;
      }
      break;
    case Collective::kAlltoallv:
      break;  // perf/coll_alltoallv.h
    case Collective::kAlltoall:
      // Block r of the output is block `rank` of rank r's input.
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) {
          double want = static_cast<double>(
              pattern_value(dtype, op, world, r, static_cast<size_t>(rank) * count + i));
          if (load(out, static_cast<size_t>(r) * count + i, dtype) != want) ++wrong;
        }
      }
      break;
  }
  return wrong;
}

}  // namespace gw::perf
