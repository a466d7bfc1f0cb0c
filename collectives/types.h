// Element types and reduction operators. Numeric values equal the C ABI's gw_dtype_t / gw_op_t.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace gw::coll {

enum class DataType : int { kF32 = 0, kF64 = 1, kF16 = 2, kBF16 = 3, kI32 = 4, kI64 = 5, kU8 = 6 };
inline constexpr int kNumDataTypes = 7;
enum class ReduceOp : int { kSum = 0, kProd = 1, kMin = 2, kMax = 3, kAvg = 4 };
inline constexpr int kNumReduceOps = 5;

inline size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::kF32:
      return 4;
    case DataType::kF64:
      return 8;
    case DataType::kF16:
      return 2;
    case DataType::kBF16:
      return 2;
    case DataType::kI32:
      return 4;
    case DataType::kI64:
      return 8;
    case DataType::kU8:
      return 1;
  }
  return 0;
}
inline bool valid_dtype(int t) { return t >= 0 && t < kNumDataTypes; }
inline bool valid_op(int op) { return op >= 0 && op < kNumReduceOps; }

// "float32"/"f32"/"float", "float64", "float16"/"half", "bfloat16", "int32", "int64", "uint8"
std::optional<DataType> parse_dtype(std::string_view name);
std::string_view dtype_name(DataType t);                  // "float32", ...
std::optional<ReduceOp> parse_op(std::string_view name);  // "sum", "prod", "min", "max", "avg"
std::string_view op_name(ReduceOp op);

}  // namespace gw::coll
