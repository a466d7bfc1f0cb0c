// f32 <-> f16 / bf16 conversions shared by the CUDA kernels (codec_kernels.cu) and the host
// (tests compare them with collectives/reduce.h's on every half and on many floats).
//
// Round to nearest even; a NaN stays a quiet NaN with the top of its payload and its sign, as
// x86 F16C does, which is what the CPU codec kernels produce. Integer and exact float arithmetic
// only, so the GPU gives the same bits as the CPU (the hardware cvt would turn every NaN into
// the canonical 0x7FFF). Compiled by nvcc and by the host compiler: no library calls.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define GW_HD __host__ __device__ __forceinline__
#else
#define GW_HD inline
#endif

namespace gw::cuda::cast16 {

GW_HD uint32_t bits_of(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

GW_HD float float_of(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

GW_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);  // never contracted, never flushed
#else
  return a + b;
#endif
}

GW_HD uint16_t to_half(float f) {
  const uint32_t x = bits_of(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // rounds to (or is) inf
  if (a >= 0x38800000u) {  // a normal half: rebias, round the 13 dropped bits to even
    const uint32_t r = a - 0x38000000u;
    return static_cast<uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
  }
  // Below 2^-14: 0.5 + |f| has an ulp of 2^-24 (the half subnormal step), so the exact float
  // addition rounds |f| to even in units of 2^-24; 1024 (2^-14) comes out as the smallest normal.
  const uint32_t k = bits_of(add_rn(float_of(a), 0.5f)) - 0x3F000000u;
  return static_cast<uint16_t>(sign | k);
}

GW_HD float from_half(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7FFFu;
  if (em > 0x7C00u) return float_of(sign | 0x7FC00000u | ((em & 0x3FFu) << 13));  // quiet, as F16C
  if (em == 0x7C00u) return float_of(sign | 0x7F800000u);
  if (em >= 0x0400u) return float_of(sign | ((em << 13) + 0x38000000u));
  // Subnormal or zero: em * 2^-24 is exact.
  return float_of(sign | bits_of(static_cast<float>(em) * 5.9604644775390625e-8f));
}

GW_HD uint16_t to_bf16(float f) {
  const uint32_t x = bits_of(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

GW_HD float from_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

}  // namespace gw::cuda::cast16
