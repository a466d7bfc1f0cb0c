// The conversions the CUDA kernels use (gpudirect/cast16_math.h, integer and exact float
// arithmetic, so the host result is the device result) against the CPU kernels' ones
// (collectives/reduce.h): every half and bf16 pattern, and floats across every range.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "collectives/reduce.h"
#include "gpudirect/cast16_math.h"

namespace gw::cuda {
namespace {

TEST(Cast16Math, EveryHalfAndBf16WidensLikeTheCpu) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const auto x = static_cast<uint16_t>(h);
    ASSERT_EQ(cast16::bits_of(cast16::from_half(x)), cast16::bits_of(coll::half_to_float(x)))
        << std::hex << h;
    ASSERT_EQ(cast16::bits_of(cast16::from_bf16(x)), cast16::bits_of(coll::bf16_to_float(x)))
        << std::hex << h;
  }
}

void expect_narrow_same(uint32_t u) {
  const float f = cast16::float_of(u);
  ASSERT_EQ(cast16::to_half(f), coll::float_to_half(f)) << std::hex << u;
  ASSERT_EQ(cast16::to_bf16(f), coll::float_to_bf16(f)) << std::hex << u;
}

TEST(Cast16Math, NarrowsLikeTheCpuAtEveryBoundary) {
  // Around each boundary of float_to_half's cases, both signs: zero, 2^-25, the subnormal
  // range, the smallest normal, 65520 (overflow), inf, NaN.
  for (uint32_t base : {0x00000000u, 0x33000000u, 0x33800000u, 0x38000000u, 0x387FC000u,
                        0x38800000u, 0x477FE000u, 0x477FF000u, 0x7F800000u, 0x7FC00000u}) {
    for (uint32_t d = 0; d < 8192; ++d) {
      for (uint32_t s : {0u, 0x80000000u}) {
        expect_narrow_same((base + d) ^ s);
        expect_narrow_same((base - d) ^ s);
      }
    }
  }
}

TEST(Cast16Math, NarrowsLikeTheCpuOnEveryExponent) {
  // Every exponent, every low-bit pattern class (ties, just above and below), plus random bits.
  std::mt19937 rng(42);
  for (uint32_t e = 0; e < 256; ++e) {
    for (uint32_t low : {0x0000u, 0x0FFFu, 0x1000u, 0x1001u, 0x2000u, 0x3000u, 0x7FFFu, 0x8000u,
                         0x8001u, 0x18000u}) {
      for (int k = 0; k < 64; ++k) {
        const uint32_t m = (rng() & 0x7FFFFFu & ~0x1FFFFu) | low;
        expect_narrow_same((e << 23) | (m & 0x7FFFFFu));
        expect_narrow_same(0x80000000u | (e << 23) | (m & 0x7FFFFFu));
      }
    }
  }
  for (int i = 0; i < 4000000; ++i) expect_narrow_same(rng());
}

TEST(Cast16Math, EveryF16SubnormalResultExhaustively) {
  // All floats that round into the f16 subnormal range, at a stride that hits every result and
  // both neighbours of every tie: 2^-25 .. 2^-14 is [0x33000000, 0x38800000).
  for (uint32_t u = 0x33000000u; u < 0x38800000u; u += 61) expect_narrow_same(u);
}

}  // namespace
}  // namespace gw::cuda
