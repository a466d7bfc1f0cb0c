// QSGD's CPU kernels: the whole encoding (bucket norms and int8 levels, error feedback fused in
// the same pass) and its decode, in a portable, an AVX2 and an AVX-512 version, chosen once at
// run time (codec_kernels::isa()). The three give the same bytes and the same floats (tests
// compare them): the norm is an f32 sum in 64 fixed lanes (again in f64 when that overflows), the
// rounding draw a hash of the element's place in its bucket.
//
// The encoding of count elements in buckets of `bucket` (codecs/qsgd.cc, docs/compression.md):
// nb = ceil(count / bucket) f32 fields (scales), then count int8 levels in [-levels, levels].
// Element j of bucket b (which starts at element off) with v = in + residual, norm = ||v of b||2,
// inv = levels / norm (0 when the norm is 0 or not finite), u = qsgd_uniform(key, off, j), is sent
// as trunc(t) with t = fma(v, inv, u with v's sign), |t| capped at levels, 0 for a NaN t: sign(v) *
// min(floor(|v| * inv + u), levels) with one rounding. The bucket's f32 field is its norm, or with
// error feedback (a residual) field = norm * qsgd_ef_shrink(n, levels) (n: the bucket's elements),
// rounded once; the levels are the same either way. It decodes as level * field / levels. The
// residual becomes fma(-level, field / levels, v). Only the bytes' layout is the format; which of
// the two nearest levels a value rounds to (the draw) and how far the field is shrunk are the
// encoder's choice (a decoder reads the field as it is).
//
// Thread-safe, never block; the buffers belong to the caller. in and residual must not overlap.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

namespace gw::coll::codec_kernels {

// The stochastic rounding draw of element j of the bucket that starts at element off: a uniform in
// [0, 1) with 16 bits, one half of h = mix32(key + m * 0x9E3779B9), m = off + (j / 32) * 16 + j %
// 16: the low half for j % 32 < 16, the high half for the others (one hash gives two elements'
// draws, 16 lanes apart, so a 16-lane vector hashes once per 32 elements). m is distinct per
// (bucket, j / 32 * 16 + j % 16) within 2^32 elements. mix32 is one xorshift-multiply-xorshift
// round (one multiply: the draw is on the encoder's critical path, and rounding needs uniform,
// not cryptographic, draws).
inline uint32_t qsgd_mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  return x;
}
inline float qsgd_uniform(uint32_t key, uint64_t off, uint64_t j) {
  const uint32_t m = static_cast<uint32_t>(off + (j / 32) * 16 + j % 16);
  const uint32_t h = qsgd_mix32(key + m * 0x9E3779B9u);
  const uint32_t half = (j / 16) % 2 ? h >> 16 : h & 0xFFFFu;
  return static_cast<float>(half) * (1.0f / 65536.0f);
}

// Error feedback needs a contraction, E||v - C(v)||^2 <= (1 - delta) ||v||^2, and QSGD with few
// levels is not one: its variance factor omega (E||C(v) - v||^2 <= omega ||v||^2; Alistarh et al.,
// QSGD, Lemma 3.1: omega = min(n / s^2, sqrt(n) / s) for n elements and s levels; n / (4 s^2)
// here, since every element's rounding variance is at most step^2 / 4) exceeds 1 (qsgd:8 with
// 512-element buckets: 2), so with a residual the error grows without bound (about 1.15x a step
// with a repeated gradient). Sending C(v) / (1 + omega) instead is a contraction with delta = 1 /
// (1 + omega) (Stich and Karimireddy, "The error-feedback framework", 2019;
// Beznosikov et al., "On biased compression", 2020): E||v - C/(1+w)||^2 = ||v||^2 (1 - 2/(1+w)) +
// E||C||^2 / (1+w)^2 <= ||v||^2 w / (1+w), as E||C||^2 <= (1+w) ||v||^2. Returns 1 / (1 + omega)
// for a bucket of n elements, omega = min(n / (4 levels^2), sqrt(n) / levels), the same f32 on
// every path.
inline float qsgd_ef_shrink(size_t n, int levels) {
  const double s = levels, d = static_cast<double>(n);
  const double omega = std::min(d / (4.0 * s * s), std::sqrt(d) / s);
  return static_cast<float>(1.0 / (1.0 + omega));
}

// Writes the encoding of in (+ residual) into out (its size is the caller's check); with a
// residual, residual = v - decode(out) (rounded once) in the same pass. bucket >= 1, 1 <= levels <=
// 127.
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
