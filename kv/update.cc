#include "kv/update.h"

#include <cstring>

#include "collectives/reduce.h"

namespace gw::kv {

namespace {

double load(coll::DataType t, const void* p, size_t i) {
  switch (t) {
    case coll::DataType::kF32:
      return static_cast<const float*>(p)[i];
    case coll::DataType::kF64:
      return static_cast<const double*>(p)[i];
    case coll::DataType::kF16:
      return coll::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case coll::DataType::kBF16:
      return coll::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    default:
      return 0;
  }
}

void store(coll::DataType t, void* p, size_t i, double v) {
  switch (t) {
    case coll::DataType::kF32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case coll::DataType::kF64:
      static_cast<double*>(p)[i] = v;
      break;
    case coll::DataType::kF16:
      static_cast<uint16_t*>(p)[i] = coll::float_to_half(static_cast<float>(v));
      break;
    case coll::DataType::kBF16:
      static_cast<uint16_t*>(p)[i] = coll::float_to_bf16(static_cast<float>(v));
      break;
    default:
      break;
  }
}

}  // namespace

bool is_float(coll::DataType t) {
  return t == coll::DataType::kF32 || t == coll::DataType::kF64 || t == coll::DataType::kF16 ||
         t == coll::DataType::kBF16;
}

void add_into(coll::DataType t, void* dst, const void* src, size_t count) {
  coll::reduce(t, coll::ReduceOp::kSum, dst, src, dst, count);
}

void sgd_step(coll::DataType t, void* value, const void* grad, size_t count, double scale,
              double lr, double momentum, std::vector<double>* velocity) {
  if (velocity->size() != count) velocity->assign(count, 0.0);
  double* v = velocity->data();
  for (size_t i = 0; i < count; ++i) {
    v[i] = momentum * v[i] + load(t, grad, i) * scale;
    store(t, value, i, load(t, value, i) - lr * v[i]);
  }
}

}  // namespace gw::kv
