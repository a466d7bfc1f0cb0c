// Reduction kernels against a scalar reference written independently here: every (dtype, op),
// odd lengths, exact aliasing, special values (NaN, inf, -0, subnormals), integer wrap-around.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "collectives/reduce.h"
#include "tests/support/dtype_values.h"

namespace gw::coll {
namespace {

constexpr size_t kLengths[] = {0, 1, 7, 33, 1003};

// ---- reference --------------------------------------------------------------------------------

template <typename T>
T ref_op(ReduceOp op, T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return a + b;
      case ReduceOp::kProd:
        return a * b;
      case ReduceOp::kMin:
        return std::isnan(a) ? a : std::isnan(b) ? b : (a < b ? a : b);
      case ReduceOp::kMax:
        return std::isnan(a) ? a : std::isnan(b) ? b : (a > b ? a : b);
    }
  } else {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return static_cast<T>(static_cast<uint64_t>(U(a)) + uint64_t(U(b)));
      case ReduceOp::kProd:
        return static_cast<T>(static_cast<uint64_t>(U(a)) * uint64_t(U(b)));
      case ReduceOp::kMin:
        return a < b ? a : b;
      case ReduceOp::kMax:
        return a > b ? a : b;
    }
  }
  return T{};
}

// Generates raw element bytes for dtype, mixing ordinary values with special ones.
std::vector<uint8_t> make_values(DataType dt, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> real(-4.0, 4.0);
  std::vector<uint8_t> out(n * dtype_size(dt) + 1);
  const double specials[] = {std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             -0.0,
                             0.0,
                             1e-6,   // subnormal in f16
                             1e-40,  // subnormal in f32
                             65504.0,
                             70000.0};
  for (size_t i = 0; i < n; ++i) {
    double v = real(rng);
    if (rng() % 13 == 0) v = specials[rng() % std::size(specials)];
    uint8_t* p = out.data() + i * dtype_size(dt);
    switch (dt) {
      case DataType::kF32:
      case DataType::kF64:
      case DataType::kF16:
      case DataType::kBF16:
        gw::testing::encode(dt, v, p);
        break;
      case DataType::kI32: {
        int32_t x = static_cast<int32_t>(rng());  // full range: sums and products overflow
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::kI64: {
        int64_t x = static_cast<int64_t>((uint64_t(rng()) << 32) | rng());
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::kU8:
        p[0] = static_cast<uint8_t>(rng());
        break;
    }
  }
  return out;
}

std::vector<uint8_t> reference(DataType dt, ReduceOp op, const uint8_t* a, const uint8_t* b,
                               size_t n) {
  std::vector<uint8_t> out(n * dtype_size(dt) + 1);
  for (size_t i = 0; i < n; ++i) {
    auto elem = [&](auto tag) {
      using T = decltype(tag);
      T x, y;
      std::memcpy(&x, a + i * sizeof(T), sizeof(T));
      std::memcpy(&y, b + i * sizeof(T), sizeof(T));
      T r = ref_op(op, x, y);
      std::memcpy(out.data() + i * sizeof(T), &r, sizeof(T));
    };
    auto elem16 = [&](auto to_f, auto from_f) {
      uint16_t x, y;
      std::memcpy(&x, a + i * 2, 2);
      std::memcpy(&y, b + i * 2, 2);
      uint16_t r = from_f(ref_op(op, to_f(x), to_f(y)));
      std::memcpy(out.data() + i * 2, &r, 2);
    };
    switch (dt) {
      case DataType::kF32:
        elem(float{});
        break;
      case DataType::kF64:
        elem(double{});
        break;
      case DataType::kI32:
        elem(int32_t{});
        break;
      case DataType::kI64:
        elem(int64_t{});
        break;
      case DataType::kU8:
        elem(uint8_t{});
        break;
      case DataType::kF16:
        elem16(half_to_float, float_to_half);
        break;
      case DataType::kBF16:
        elem16(bf16_to_float, float_to_bf16);
        break;
    }
  }
  return out;
}

bool is_nan_elem(DataType dt, const uint8_t* p) {
  switch (dt) {
    case DataType::kF32:
      return std::isnan(std::bit_cast<float>(*reinterpret_cast<const uint32_t*>(p)));
    case DataType::kF64:
      return std::isnan(std::bit_cast<double>(*reinterpret_cast<const uint64_t*>(p)));
    case DataType::kF16:
      return std::isnan(half_to_float(*reinterpret_cast<const uint16_t*>(p)));
    case DataType::kBF16:
      return std::isnan(bf16_to_float(*reinterpret_cast<const uint16_t*>(p)));
    default:
      return false;
  }
}

// Bitwise equal, except that any NaN matches any NaN.
void expect_same(DataType dt, const uint8_t* got, const uint8_t* want, size_t n,
                 const std::string& what) {
  const size_t es = dtype_size(dt);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* g = got + i * es;
    const uint8_t* w = want + i * es;
    if (is_nan_elem(dt, w)) {
      ASSERT_TRUE(is_nan_elem(dt, g)) << what << " element " << i << ": NaN lost";
      continue;
    }
    ASSERT_EQ(0, std::memcmp(g, w, es)) << what << " element " << i;
  }
}

using KernelFn = void (*)(DataType, ReduceOp, const void*, const void*, void*, size_t);

struct Case {
  DataType dt;
  ReduceOp op;
};

class ReduceKernelTest : public ::testing::TestWithParam<Case> {};

void check_kernel(KernelFn fn, const char* name, DataType dt, ReduceOp op) {
  for (size_t n : kLengths) {
    for (int mode = 0; mode < 3; ++mode) {  // distinct, out == a, out == b
      // Offset by one byte-element so vector paths see unaligned pointers too.
      auto a = make_values(dt, n, static_cast<uint32_t>(n * 7 + 1));
      auto b = make_values(dt, n, static_cast<uint32_t>(n * 7 + 2));
      auto want = reference(dt, op, a.data(), b.data(), n);
      std::vector<uint8_t> out(n * dtype_size(dt) + 1, 0xAB);
      uint8_t* o = mode == 0 ? out.data() : mode == 1 ? a.data() : b.data();
      fn(dt, op, a.data(), b.data(), o, n);
      std::string what =
          fmt::format("{} {} {} n={} mode={}", name, dtype_name(dt), op_name(op), n, mode);
      expect_same(dt, o, want.data(), n, what);
      if (mode == 0) {
        EXPECT_EQ(out[n * dtype_size(dt)], 0xAB) << what << ": wrote past the end";
      }
    }
  }
}

TEST_P(ReduceKernelTest, DispatchedMatchesReference) {
  check_kernel(&reduce, "dispatched", GetParam().dt, GetParam().op);
}

TEST_P(ReduceKernelTest, PortableMatchesReference) {
  check_kernel(&reduce_portable, "portable", GetParam().dt, GetParam().op);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (int d = 0; d < kNumDataTypes; ++d)
    for (int o = 0; o < kNumReduceOps; ++o)
      cases.push_back({static_cast<DataType>(d), static_cast<ReduceOp>(o)});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllTypesAndOps, ReduceKernelTest, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) {
                           return std::string(dtype_name(info.param.dt)) + "_" +
                                  std::string(op_name(info.param.op));
                         });

// ---- conversions ------------------------------------------------------------------------------

TEST(HalfConversion, KnownValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3C00);
  EXPECT_EQ(float_to_half(-2.0f), 0xC000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_half(65519.0f), 0x7BFF);                      // below the rounding threshold
  EXPECT_EQ(float_to_half(65520.0f), 0x7C00);                      // rounds to inf
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -25)), 0x0000);         // tie rounds to even (0)
  EXPECT_EQ(float_to_half(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 ulp tie rounds to even (2)
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(1.0f, -11)), 0x3C00);  // tie to even
  EXPECT_EQ(float_to_half(1.0f + std::ldexp(3.0f, -11)), 0x3C02);  // tie to even (up)
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x7C00), std::numeric_limits<float>::infinity());
  // NaNs come out quiet with their payload and sign, as F16C's vcvtph2ps gives.
  EXPECT_EQ(std::bit_cast<uint32_t>(half_to_float(0x7C01)), 0x7FC02000u);  // signalling in
  EXPECT_EQ(std::bit_cast<uint32_t>(half_to_float(0xFE00)), 0xFFC00000u);  // quiet in
}

#if defined(__FLT16_MAX__)
// The compiler's own _Float16 conversions are an independent reference.
TEST(HalfConversion, AgreesWithCompilerFloat16) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    _Float16 x = std::bit_cast<_Float16>(static_cast<uint16_t>(h));
    float want = static_cast<float>(x);
    float got = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << h;
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(want)) << h;
    }
  }
  std::mt19937 rng(42);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns cover every exponent, including subnormal halves and overflow.
    uint32_t bits = rng();
    if (i % 2) bits = (bits & 0x87FFFFFFu) | 0x30000000u;  // bias towards the half range
    float f = std::bit_cast<float>(bits);
    uint16_t got = float_to_half(f);
    uint16_t want = std::bit_cast<uint16_t>(static_cast<_Float16>(f));
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(half_to_float(got))) << bits;
    } else {
      ASSERT_EQ(got, want) << std::hex << bits;
    }
  }
}
#endif

TEST(Bf16Conversion, RoundsToNearestEvenAndKeepsNaN) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie, even stays
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  // A NaN whose payload sits only in the low bits must not round into infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::bit_cast<float>(0xFFFFFFFFu)))));
}

// ---- finalize_avg -----------------------------------------------------------------------------

TEST(FinalizeAvg, DividesFloatsAndTruncatesIntegers) {
  std::vector<float> f = {3.0f, -3.0f, 1.0f};
  finalize_avg(DataType::kF32, f.data(), f.size(), 2);
  EXPECT_EQ(f, (std::vector<float>{1.5f, -1.5f, 0.5f}));
  std::vector<int32_t> i = {7, -7, 5};
  finalize_avg(DataType::kI32, i.data(), i.size(), 2);
  EXPECT_EQ(i, (std::vector<int32_t>{3, -3, 2}));
  std::vector<uint8_t> u = {255, 10};
  finalize_avg(DataType::kU8, u.data(), u.size(), 4);
  EXPECT_EQ(u, (std::vector<uint8_t>{63, 2}));
  std::vector<uint16_t> h = {float_to_half(3.0f), float_to_half(std::nanf(""))};
  finalize_avg(DataType::kF16, h.data(), h.size(), 3);
  EXPECT_EQ(half_to_float(h[0]), half_to_float(float_to_half(1.0f)));
  EXPECT_TRUE(std::isnan(half_to_float(h[1])));
  std::vector<uint16_t> bh = {float_to_bf16(5.0f)};
  finalize_avg(DataType::kBF16, bh.data(), 1, 1);  // one rank: unchanged
  EXPECT_EQ(bf16_to_float(bh[0]), 5.0f);
  std::vector<int64_t> l = {-9};
  finalize_avg(DataType::kI64, l.data(), 1, 4);
  EXPECT_EQ(l[0], -2);
}

TEST(ReduceIsa, ReportsAPath) {
  auto isa = reduce_isa();
  EXPECT_TRUE(isa == "avx2" || isa == "portable") << isa;
}

}  // namespace
}  // namespace gw::coll
