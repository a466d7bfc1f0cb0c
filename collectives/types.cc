#include "collectives/types.h"

#include <array>
#include <string>

namespace gw::coll {

namespace {
struct DtypeName {
  std::string_view name;
  DataType type;
};
constexpr std::array<DtypeName, 17> kDtypeNames = {{
    {"float32", DataType::kF32},
    {"f32", DataType::kF32},
    {"float", DataType::kF32},
    {"float64", DataType::kF64},
    {"f64", DataType::kF64},
    {"double", DataType::kF64},
    {"float16", DataType::kF16},
    {"f16", DataType::kF16},
    {"half", DataType::kF16},
    {"bfloat16", DataType::kBF16},
    {"bf16", DataType::kBF16},
    {"int32", DataType::kI32},
    {"i32", DataType::kI32},
    {"int64", DataType::kI64},
    {"i64", DataType::kI64},
    {"uint8", DataType::kU8},
    {"u8", DataType::kU8},
}};
constexpr std::array<std::string_view, kNumReduceOps> kOpNames = {"sum", "prod", "min", "max",
                                                                  "avg"};
}  // namespace

std::optional<DataType> parse_dtype(std::string_view name) {
  for (const auto& d : kDtypeNames) {
    if (d.name == name) return d.type;
  }
  return std::nullopt;
}

std::string_view dtype_name(DataType t) {
  switch (t) {
    case DataType::kF32:
      return "float32";
    case DataType::kF64:
      return "float64";
    case DataType::kF16:
      return "float16";
    case DataType::kBF16:
      return "bfloat16";
    case DataType::kI32:
      return "int32";
    case DataType::kI64:
      return "int64";
    case DataType::kU8:
      return "uint8";
  }
  return "?";
}

std::optional<ReduceOp> parse_op(std::string_view name) {
  for (size_t i = 0; i < kOpNames.size(); ++i) {
    if (kOpNames[i] == name) return static_cast<ReduceOp>(i);
  }
  return std::nullopt;
}

std::string_view op_name(ReduceOp op) {
  int i = static_cast<int>(op);
  return valid_op(i) ? kOpNames[i] : "?";
}

}  // namespace gw::coll
