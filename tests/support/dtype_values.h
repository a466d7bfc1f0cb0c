// One element of any dtype as a double and back, for tests that fill buffers of every dtype with
// values they can check: small integers are exact in every dtype, so sums and products of a few
// ranks are too, whatever order the reduction takes.
#pragma once

#include <cstdint>
#include <cstring>

#include "collectives/reduce.h"
#include "collectives/types.h"

namespace gw::testing {

// v as one element of dtype t at p (v must be representable: small integers are, in every dtype;
// the 16-bit floats round to the nearest, the integers truncate).
inline void encode(coll::DataType t, double v, uint8_t* p) {
  switch (t) {
    case coll::DataType::kF32: {
      const auto x = static_cast<float>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case coll::DataType::kF64:
      std::memcpy(p, &v, 8);
      break;
    case coll::DataType::kF16: {
      const uint16_t h = coll::float_to_half(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case coll::DataType::kBF16: {
      const uint16_t h = coll::float_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case coll::DataType::kI32: {
      const auto x = static_cast<int32_t>(v);
      std::memcpy(p, &x, 4);
      break;
    }
    case coll::DataType::kI64: {
      const auto x = static_cast<int64_t>(v);
      std::memcpy(p, &x, 8);
      break;
    }
    case coll::DataType::kU8:
      *p = static_cast<uint8_t>(v);
      break;
  }
}

inline double decode(coll::DataType t, const uint8_t* p) {
  switch (t) {
    case coll::DataType::kF32: {
      float x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case coll::DataType::kF64: {
      double x;
      std::memcpy(&x, p, 8);
      return x;
    }
    case coll::DataType::kF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return coll::half_to_float(h);
    }
    case coll::DataType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return coll::bf16_to_float(h);
    }
    case coll::DataType::kI32: {
      int32_t x;
      std::memcpy(&x, p, 4);
      return x;
    }
    case coll::DataType::kI64: {
      int64_t x;
      std::memcpy(&x, p, 8);
      return static_cast<double>(x);
    }
    case coll::DataType::kU8:
      return *p;
  }
  return 0;
}

}  // namespace gw::testing
