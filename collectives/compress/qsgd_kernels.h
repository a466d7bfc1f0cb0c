// QSGD's CPU kernels: the whole encoding (bucket norms and int8 levels, error feedback fused in
// the same pass) and its decode, in a portable, an AVX2 and an AVX-512 version, chosen once at
// run time (codec_kernels::isa()). The three give the same bytes and the same floats (tests
// compare them): the norm is an f32 sum in 16 fixed lanes (again in f64 when that overflows), the
// rounding draw a hash of the element's index.
//
// The encoding of count elements in buckets of `bucket` (codecs/qsgd.cc, docs/compression.md):
// nb = ceil(count / bucket) f32 norms, then count int8 levels in [-levels, levels]. Element i of
// bucket b with v = in + residual, norm = ||v of b||2, a = min(|v| * levels / norm, levels) (0 for
// a NaN, or when the norm is 0 or not finite) is sent as sign(v) * (floor(a) + (u_i < a -
// floor(a))) with u_i = qsgd_uniform(key, i), and decodes as level * norm / levels.
//
// Thread-safe, never block; the buffers belong to the caller. in and residual must not overlap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace gw::coll::codec_kernels {

// The stochastic rounding draw of element i (its index modulo 2^32) for a call's key: a uniform
// in [0, 1) with 24 bits, (mix32(key + i * 0x9E3779B9) >> 8) / 2^24, where mix32 is one
// xorshift-multiply-xorshift round (one multiply: the draw is on the encoder's critical path, and
// rounding needs uniform, not cryptographic, draws).
inline uint32_t qsgd_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  return x;
}
inline float qsgd_uniform(uint32_t key, uint64_t i) {
  const uint32_t h = qsgd_mix32(key + static_cast<uint32_t>(i) * 0x9E3779B9u);
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}

// Writes the encoding of in (+ residual) into out (its size is the caller's check); with a
// residual, residual = v - decode(out) in the same pass. bucket >= 1, 1 <= levels <= 127.
void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket, int levels,
                 uint32_t key, uint8_t* out);
// acc[i] += decode (add) or acc[i] = +0 + decode (!add) for i < count, in element order. Returns
// count, or the index of the first level outside [-levels, levels] (acc is then written up to
// that element only).
size_t qsgd_decode(const uint8_t* in, size_t count, size_t bucket, int levels, float* acc,
                   bool add);

// The versions, exposed for tests (avx2: only when cpu_has_avx2(); avx512: cpu_has_avx512()).
#define GW_QSGD_KERNEL_VARIANTS                                                               \
  void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket, int levels, \
                   uint32_t key, uint8_t* out);                                               \
  size_t qsgd_decode(const uint8_t* in, size_t count, size_t bucket, int levels, float* acc,  \
                     bool add);
namespace portable {
GW_QSGD_KERNEL_VARIANTS
}  // namespace portable
namespace avx2 {
GW_QSGD_KERNEL_VARIANTS
}  // namespace avx2
namespace avx512 {
GW_QSGD_KERNEL_VARIANTS
}  // namespace avx512
#undef GW_QSGD_KERNEL_VARIANTS

}  // namespace gw::coll::codec_kernels
