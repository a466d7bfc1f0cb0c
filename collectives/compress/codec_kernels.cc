#include "collectives/compress/codec_kernels.h"

#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <string_view>

#include "collectives/reduce.h"

namespace gw::coll::codec_kernels {

namespace {

// F16C through cpuid: clang 14 (the fuzz preset's compiler) has no __builtin_cpu_supports("f16c").
bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

bool have_avx2() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && cpu_has_f16c() && __builtin_cpu_supports("fma");
  }();
  return ok;
}

bool have_avx512() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return have_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return ok;
}

// The sign words follow the f32 scales in the encoding, so they are 4-byte aligned only: every
// access goes through memcpy (one unaligned mov), never a uint64_t load or store.
inline uint64_t load_word(const uint64_t* words, size_t w) {
  uint64_t x;
  std::memcpy(&x, reinterpret_cast<const unsigned char*>(words) + 8 * w, 8);
  return x;
}
inline void store_word(uint64_t* words, size_t w, uint64_t x) {
  std::memcpy(reinterpret_cast<unsigned char*>(words) + 8 * w, &x, 8);
}

// The 8-lane partial sums both paths use, reduced in the order the AVX2 path reduces them, so
// the sign scale is bit-identical between the two.
inline float hsum8(const float* s) {
  const float t0 = s[0] + s[4], t1 = s[1] + s[5], t2 = s[2] + s[6], t3 = s[3] + s[7];
  return (t0 + t2) + (t1 + t3);
}

// PowerSGD row kernels, written once and compiled twice (portable, and inlined into AVX2 wrappers
// below): 8 lanes per step, the lane loops vectorise to one AVX register or two SSE ones, with
// the same per-lane operations, so both give the same bits. No FMA: the avx2 wrappers' target
// leaves it out.
__attribute__((always_inline)) inline void pq_row_dots_body(const float* __restrict row,
                                                            const float* __restrict q, size_t ld,
                                                            size_t r, size_t n,
                                                            float* __restrict out) {
  // One sweep of the (L1-resident) row per factor column, 8 accumulators in registers.
  for (size_t j = 0; j < r; ++j) {
    const float* qj = q + j * ld;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int l = 0; l < 8; ++l) acc[l] += row[i + l] * qj[i + l];
    }
    for (; i < n; ++i) acc[0] += row[i] * qj[i];
    out[j] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
  }
}

__attribute__((always_inline)) inline void pq_row_axpy_in_body(const float* __restrict a,
                                                               const float* __restrict x, size_t ld,
                                                               size_t r, size_t n,
                                                               float* __restrict y) {
  // One sweep of the (L1-resident) row per factor column: the plain loop vectorises fully.
  for (size_t j = 0; j < r; ++j) {
    const float aj = a[j];
    const float* xj = x + j * ld;
    for (size_t c = 0; c < n; ++c) y[c] += aj * xj[c];
  }
}

__attribute__((always_inline)) inline void pq_row_axpy_out_body(const float* __restrict a,
                                                                const float* __restrict x,
                                                                size_t ld, size_t r, size_t n,
                                                                float* __restrict y) {
  for (size_t j = 0; j < r; ++j) {
    float* yj = y + j * ld;
    const float aj = a[j];
    for (size_t c = 0; c < n; ++c) yj[c] += aj * x[c];
  }
}

}  // namespace

namespace {

// The cap set by cap_isa (IsaCap as an int): one relaxed load per dispatched call.
std::atomic<int>& isa_cap() {
  static std::atomic<int> cap{static_cast<int>(IsaCap::kAvx512)};
  return cap;
}
bool cap_allows(IsaCap want) {
  return isa_cap().load(std::memory_order_relaxed) >= static_cast<int>(want);
}

}  // namespace

std::string_view isa() {
  return dispatch_avx512() ? "avx512" : dispatch_avx2() ? "avx2" : "portable";
}
bool cpu_has_avx2() { return have_avx2(); }
bool cpu_has_avx512() { return have_avx512(); }
void cap_isa(IsaCap cap) { isa_cap().store(static_cast<int>(cap), std::memory_order_relaxed); }
bool dispatch_avx2() { return have_avx2() && cap_allows(IsaCap::kAvx2); }
bool dispatch_avx512() { return have_avx512() && cap_allows(IsaCap::kAvx512); }

// ------------------------------------------------------------------------------------------
// Portable versions.
namespace portable {

void encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16) {
  for (size_t i = 0; i < n; ++i) {
    const float v = residual ? in[i] + residual[i] : in[i];
    const uint16_t h = bf16 ? float_to_bf16(v) : float_to_half(v);
    out[i] = h;
    if (residual) residual[i] = v - (bf16 ? bf16_to_float(h) : half_to_float(h));
  }
}

void decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add) {
  // A peer's encoding need not be 2-byte aligned (found by the codec_payload fuzz target under
  // UBSan): every element is loaded with memcpy.
  const auto* bytes = reinterpret_cast<const uint8_t*>(in);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 2 * i, sizeof(h));
    const float f = bf16 ? bf16_to_float(h) : half_to_float(h);
    acc[i] = add ? acc[i] + f : f;
  }
}

float sign_encode_chunk(const float* in, float* residual, size_t n, uint64_t* words) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (size_t i = 0; i < n; ++i) {
    const float v = residual ? in[i] + residual[i] : in[i];
    if (residual) residual[i] = v;
    lanes[i % 8] += std::fabs(v);
  }
  const float scale = n ? hsum8(lanes) / static_cast<float>(n) : 0.0f;
  const float* v = residual ? residual : in;
  std::memset(words, 0, ((n + 63) / 64) * sizeof(uint64_t));
  for (size_t i = 0; i < n; ++i) {
    const bool neg = std::signbit(v[i]);
    if (neg) store_word(words, i / 64, load_word(words, i / 64) | uint64_t{1} << (i % 64));
    if (residual) residual[i] = v[i] - std::copysign(scale, v[i]);
  }
  return scale;
}

void sign_decode_add(const uint64_t* words, float scale, size_t n, float* acc) {
  for (size_t i = 0; i < n; ++i) {
    const bool neg = (load_word(words, i / 64) >> (i % 64)) & 1u;
    acc[i] += neg ? -scale : scale;
  }
}

void sign_decode_set(const uint64_t* words, float scale, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const bool neg = (load_word(words, i / 64) >> (i % 64)) & 1u;
    out[i] = 0.0f + (neg ? -scale : scale);  // +0 for a zero scale, as 0 + decode gives
  }
}

void sign_decode_sum(const uint64_t* const* words, const float* scales, size_t nsrc, size_t n,
                     float* out) {
  for (size_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (size_t j = 0; j < nsrc; ++j) {
      const bool neg = (load_word(words[j], i / 64) >> (i % 64)) & 1u;
      s += neg ? -scales[j] : scales[j];
    }
    out[i] = s;
  }
}

void collect_abs_ge(const float* v, size_t n, float threshold, uint32_t offset,
                    std::vector<uint32_t>* out) {
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(v[i]) >= threshold) out->push_back(offset + static_cast<uint32_t>(i));
  }
}

void add_collect_abs_ge(const float* in, float* residual, size_t n, float threshold,
                        uint32_t offset, std::vector<uint32_t>* out, std::vector<float>* vals,
                        bool take, float take_threshold) {
  for (size_t i = 0; i < n; ++i) {
    const float v = residual ? in[i] + residual[i] : in[i];
    const bool hit = std::fabs(v) >= threshold;
    if (residual) residual[i] = take && hit && std::fabs(v) >= take_threshold ? 0.0f : v;
    if (hit) {
      out->push_back(offset + static_cast<uint32_t>(i));
      if (vals) vals->push_back(v);
    }
  }
}

size_t gather_bits_take(const float* in, float* residual, size_t n, const uint64_t* bits,
                        bool invert, float* out) {
  return gather_bits_tail(in, residual, 0, n, bits, invert, out);
}

void pq_row_dots(const float* row, const float* q, size_t ld, size_t r, size_t n, float* out) {
  pq_row_dots_body(row, q, ld, r, n, out);
}
void pq_row_axpy_in(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y) {
  pq_row_axpy_in_body(a, x, ld, r, n, y);
}
void pq_row_axpy_out(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y) {
  pq_row_axpy_out_body(a, x, ld, r, n, y);
}

void store_stream_f32(const float* src, size_t n, float* dst) {
  if (n) std::memcpy(dst, src, n * 4);
}

size_t select_compact(const uint32_t* key, size_t n, uint32_t shift, uint32_t want, uint32_t* sub) {
  size_t m = 0;
  for (size_t j = 0; j < n; ++j) {
    sub[m] = key[j];
    m += (key[j] >> shift) == want;
  }
  return m;
}

size_t keep_best_scan(uint32_t* idx, float* val, const uint32_t* key, size_t n, uint32_t t,
                      size_t ties, float* restore, float take_t) {
  size_t w = 0;
  for (size_t j = 0; j < n; ++j) {
    const uint32_t kj = key[j];
    const size_t eq = kj == t;
    const size_t keep = (kj > t) | (eq & (ties > 0));
    const uint32_t ij = idx[j];
    const float vj = val[j];
    idx[w] = ij;  // w <= j: an in-place compaction
    val[w] = vj;
    w += keep;
    ties -= eq & keep;
    if (restore) {
      const bool taken = std::fabs(vj) >= take_t;
      if (taken != (keep != 0)) restore[ij] = keep ? 0.0f : vj;
    }
  }
  return w;
}

}  // namespace portable

// ------------------------------------------------------------------------------------------
// AVX2 + F16C versions.
namespace avx2 {

#define GW_AVX2 __attribute__((target("avx2,f16c,fma")))

GW_AVX2 static inline __m128i bf16_pack(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7FFF)), lsb);
  const __m256i mag = _mm256_and_si256(x, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
  const __m256i quiet = _mm256_or_si256(x, _mm256_set1_epi32(0x400000));
  const __m256i r = _mm256_srli_epi32(_mm256_blendv_epi8(rounded, quiet, nan), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

GW_AVX2 static inline __m256 bf16_unpack(__m128i h) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

GW_AVX2 void encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
    __m128i h;
    __m256 back;
    if (bf16) {
      h = bf16_pack(v);
      back = bf16_unpack(h);
    } else {
      h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      back = _mm256_cvtph_ps(h);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
    if (residual) _mm256_storeu_ps(residual + i, _mm256_sub_ps(v, back));
  }
  portable::encode_cast16(in + i, residual ? residual + i : nullptr, n - i, out + i, bf16);
}

GW_AVX2 void decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    __m256 f = bf16 ? bf16_unpack(h) : _mm256_cvtph_ps(h);
    if (add) f = _mm256_add_ps(f, _mm256_loadu_ps(acc + i));
    _mm256_storeu_ps(acc + i, f);
  }
  portable::decode_cast16(in + i, n - i, acc + i, bf16, add);
}

GW_AVX2 float sign_encode_chunk(const float* in, float* residual, size_t n, uint64_t* words) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (residual) {
      v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
      _mm256_storeu_ps(residual + i, v);
    }
    acc = _mm256_add_ps(acc, _mm256_and_ps(v, abs_mask));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (size_t j = i; j < n; ++j) {
    const float v = residual ? in[j] + residual[j] : in[j];
    if (residual) residual[j] = v;
    lanes[j % 8] += std::fabs(v);
  }
  const float scale = n ? hsum8(lanes) / static_cast<float>(n) : 0.0f;
  const float* v = residual ? residual : in;
  const __m256 vs = _mm256_set1_ps(scale);
  const size_t nwords = (n + 63) / 64;
  for (size_t w = 0; w < nwords; ++w) {
    const size_t base = w * 64;
    if (base + 64 <= n) {
      uint64_t bits = 0;
      for (int k = 0; k < 8; ++k) {
        const __m256 x = _mm256_loadu_ps(v + base + 8 * k);
        bits |= static_cast<uint64_t>(_mm256_movemask_ps(x)) << (8 * k);
        if (residual) {
          const __m256 dec = _mm256_or_ps(vs, _mm256_and_ps(x, sign_mask));
          _mm256_storeu_ps(residual + base + 8 * k, _mm256_sub_ps(x, dec));
        }
      }
      store_word(words, w, bits);
    } else {
      uint64_t bits = 0;
      for (size_t j = base; j < n; ++j) {
        if (std::signbit(v[j])) bits |= uint64_t{1} << (j - base);
        if (residual) residual[j] = v[j] - std::copysign(scale, v[j]);
      }
      store_word(words, w, bits);
    }
  }
  return scale;
}

// Lane l of group g (0..3) holds bit 8g + l of a 32-bit run of sign bits in its sign bit, via a
// per-lane shift (bit b moves to bit 31) and a mask: one broadcast per 32 elements, then three
// operations per 8, instead of a byte extract and a compare per 8.
GW_AVX2 static inline __m256 sign_lanes(__m256i bits32, int g) {
  const __m256i shift =
      _mm256_sub_epi32(_mm256_set1_epi32(31 - 8 * g), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_sllv_epi32(bits32, shift), sign));
}

// The 32 sign bits of elements [32h, 32h + 32) (the words are 4-byte aligned only).
inline uint32_t load_bits32(const uint64_t* words, size_t h) {
  uint32_t x;
  std::memcpy(&x, reinterpret_cast<const unsigned char*>(words) + 4 * h, 4);
  return x;
}

// dst[i] = base[i] + decode with base = dst (kAdd) or +0 (set: a zero scale gives +0, as the
// portable 0 + decode does). Add and set share this one loop.
template <bool kAdd>
GW_AVX2 static inline void sign_decode_into(const uint64_t* words, float scale, size_t n,
                                            float* dst) {
  const __m256 vs = _mm256_set1_ps(scale);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i b = _mm256_set1_epi32(static_cast<int>(load_bits32(words, i / 32)));
    for (int g = 0; g < 4; ++g) {
      // XOR, not OR: a set bit negates the scale, as the portable loop and the GPU do, also for
      // a negative or NaN scale (which no encoder writes, but a decoder must treat alike).
      const __m256 dec = _mm256_xor_ps(vs, sign_lanes(b, g));
      const __m256 base = kAdd ? _mm256_loadu_ps(dst + i + 8 * g) : _mm256_setzero_ps();
      _mm256_storeu_ps(dst + i + 8 * g, _mm256_add_ps(base, dec));
    }
  }
  for (; i < n; ++i) {
    const bool neg = (load_word(words, i / 64) >> (i % 64)) & 1u;
    dst[i] = (kAdd ? dst[i] : 0.0f) + (neg ? -scale : scale);
  }
}

GW_AVX2 void sign_decode_sum(const uint64_t* const* words, const float* scales, size_t nsrc,
                             size_t n, float* out) {
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                     _mm256_setzero_ps()};
    for (size_t j = 0; j < nsrc; ++j) {
      const __m256i b = _mm256_set1_epi32(static_cast<int>(load_bits32(words[j], i / 32)));
      const __m256 vs = _mm256_set1_ps(scales[j]);
      for (int g = 0; g < 4; ++g)
        acc[g] = _mm256_add_ps(acc[g], _mm256_xor_ps(vs, sign_lanes(b, g)));
    }
    for (int g = 0; g < 4; ++g) _mm256_storeu_ps(out + i + 8 * g, acc[g]);
  }
  for (; i < n; ++i) {
    float s = 0.0f;
    for (size_t j = 0; j < nsrc; ++j) {
      const bool neg = (load_word(words[j], i / 64) >> (i % 64)) & 1u;
      s += neg ? -scales[j] : scales[j];
    }
    out[i] = s;
  }
}

GW_AVX2 void sign_decode_add(const uint64_t* words, float scale, size_t n, float* acc) {
  sign_decode_into<true>(words, scale, n, acc);
}

GW_AVX2 void sign_decode_set(const uint64_t* words, float scale, size_t n, float* out) {
  sign_decode_into<false>(words, scale, n, out);
}

GW_AVX2 void collect_abs_ge(const float* v, size_t n, float threshold, uint32_t offset,
                            std::vector<uint32_t>* out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 t = _mm256_set1_ps(threshold);
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    uint32_t mask = 0;
    for (int k = 0; k < 4; ++k) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(v + i + 8 * k), abs_mask);
      mask |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(a, t, _CMP_GE_OQ))) << (8 * k);
    }
    while (mask) {
      const int b = std::countr_zero(mask);
      out->push_back(offset + static_cast<uint32_t>(i + b));
      mask &= mask - 1;
    }
  }
  portable::collect_abs_ge(v + i, n - i, threshold, offset + static_cast<uint32_t>(i), out);
}

// Lane positions of the set bits of every 8-bit mask, packed to the front (the rest 0): the
// shuffle that compresses the selected lanes of a vector to its low end.
struct CompressTable {
  alignas(64) uint8_t pos[256][8];
  constexpr CompressTable() : pos{} {
    for (int m = 0; m < 256; ++m) {
      int w = 0;
      for (int b = 0; b < 8; ++b) {
        if ((m >> b) & 1) pos[m][w++] = static_cast<uint8_t>(b);
      }
    }
  }
};
constexpr CompressTable kCompress;

// The candidates of each 8 elements are written with one compressing shuffle and two stores, and
// the write position advances by their count, with no branch on the data: at top-k's ~2%
// candidate rate a branch per 32 elements is taken a third of the time and mispredicts about as
// often, which cost ~2.5 ms per 100 MiB on top of the ~5.7 ms the memory traffic takes. The
// stores go to a block buffer in L1 (each writes 8 lanes, of which only the first popcount
// count) and every block's candidates are appended to the vectors.
GW_AVX2 void add_collect_abs_ge(const float* in, float* residual, size_t n, float threshold,
                                uint32_t offset, std::vector<uint32_t>* out,
                                std::vector<float>* vals, bool take, float take_threshold) {
  constexpr size_t kBlock = 1024;
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 t = _mm256_set1_ps(threshold);
  const __m256 tt = _mm256_set1_ps(take_threshold);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  alignas(32) uint32_t bidx[kBlock + 8];
  alignas(32) float bval[kBlock + 8];
  size_t i = 0;
  while (i + 8 <= n) {
    const size_t end = std::min(n & ~size_t{7}, i + kBlock);
    size_t w = 0;
    for (; i < end; i += 8) {
      __m256 v = _mm256_loadu_ps(in + i);
      if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
      const __m256 a = _mm256_and_ps(v, abs_mask);
      const __m256 hit = _mm256_cmp_ps(a, t, _CMP_GE_OQ);
      if (residual) {
        const __m256 gone = _mm256_and_ps(hit, _mm256_cmp_ps(a, tt, _CMP_GE_OQ));
        _mm256_storeu_ps(residual + i, take ? _mm256_andnot_ps(gone, v) : v);
      }
      const unsigned m = static_cast<unsigned>(_mm256_movemask_ps(hit));
      const __m256i perm =
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.pos[m])));
      const __m256i base = _mm256_set1_epi32(static_cast<int>(offset + static_cast<uint32_t>(i)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bidx + w),
                          _mm256_add_epi32(_mm256_permutevar8x32_epi32(iota, perm), base));
      if (vals) _mm256_storeu_ps(bval + w, _mm256_permutevar8x32_ps(v, perm));
      w += static_cast<size_t>(std::popcount(m));
    }
    out->insert(out->end(), bidx, bidx + w);
    if (vals) vals->insert(vals->end(), bval, bval + w);
  }
  portable::add_collect_abs_ge(in + i, residual ? residual + i : nullptr, n - i, threshold,
                               offset + static_cast<uint32_t>(i), out, vals, take, take_threshold);
}

// Eight elements at a time: the chosen lanes (a byte of the bitmap) are compressed to the front
// with kCompress's shuffle and written with a masked store of their count (never past the last
// output), the write position advanced by their count, no branch on the data.
GW_AVX2 size_t gather_bits_take(const float* in, float* residual, size_t n, const uint64_t* bits,
                                bool invert, float* out) {
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(bits);  // little-endian words
  const unsigned flip = invert ? 0xFFu : 0u;
  size_t w = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (residual) v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
    const unsigned m = (bytes[i / 8] ^ flip) & 0xFFu;
    const __m256i perm =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.pos[m])));
    const __m256 packed = _mm256_permutevar8x32_ps(v, perm);
    const int cnt = std::popcount(m);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(cnt), lanes);
    _mm256_maskstore_ps(out + w, keep, packed);
    if (residual) {
      // Lane l is chosen when bit l of m is set: zero it.
      const __m256i bit = _mm256_sllv_epi32(_mm256_set1_epi32(1), lanes);
      const __m256i chosen =
          _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(m)), bit), bit);
      _mm256_storeu_ps(residual + i, _mm256_andnot_ps(_mm256_castsi256_ps(chosen), v));
    }
    w += static_cast<size_t>(cnt);
  }
  return w + gather_bits_tail(in, residual, i, n, bits, invert, out + w);
}

// The compaction of 8 keys at a time: the matching lanes moved to the front with kCompress's
// shuffle and the whole register stored at the write position, which advances by their count (no
// branch on the data). sub has room for n and m <= j, so the store (lanes [m, m + 8)) stays within
// [0, j + 8), whose keys were loaded already: in place works.
GW_AVX2 size_t select_compact(const uint32_t* key, size_t n, uint32_t shift, uint32_t want,
                              uint32_t* sub) {
  const __m256i w = _mm256_set1_epi32(static_cast<int>(want));
  const __m128i sh = _mm_cvtsi32_si128(static_cast<int>(shift));
  size_t m = 0, j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + j));
    const __m256i hit = _mm256_cmpeq_epi32(_mm256_srl_epi32(k, sh), w);
    const unsigned mask = static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(hit)));
    const __m256i perm = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.pos[mask])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sub + m), _mm256_permutevar8x32_epi32(k, perm));
    m += static_cast<size_t>(std::popcount(mask));
  }
  return m + portable::select_compact(key + j, n - j, shift, want, sub + m);
}

// 8 candidates at a time, as the AVX-512 version does 16: the kept lanes (key > t as unsigned,
// and the first of the ties while any are left, lowest lane first: equal keys are rare, so they
// take a scalar step) compressed with kCompress's shuffle and stored whole at the write position
// (<= j); the residual fix-up loops over the few lanes where kept and taken differ.
GW_AVX2 size_t keep_best_scan(uint32_t* idx, float* val, const uint32_t* key, size_t n, uint32_t t,
                              size_t ties, float* restore, float take_t) {
  const __m256i bias = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  const __m256i tv = _mm256_set1_epi32(static_cast<int>(t));
  const __m256i tb = _mm256_xor_si256(tv, bias);  // unsigned order as signed: flip the top bit
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 tt = _mm256_set1_ps(take_t);
  size_t w = 0, j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256i k = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(key + j));
    const __m256i iv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + j));
    const __m256 vv = _mm256_loadu_ps(val + j);
    unsigned keep = static_cast<unsigned>(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_xor_si256(k, bias), tb))));
    unsigned eq =
        static_cast<unsigned>(_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(k, tv))));
    while (eq != 0 && ties > 0) {  // the lowest lanes first: the lower indices win the ties
      keep |= eq & (0u - eq);
      eq &= eq - 1;
      --ties;
    }
    const __m256i perm = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kCompress.pos[keep])));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx + w), _mm256_permutevar8x32_epi32(iv, perm));
    _mm256_storeu_ps(val + w, _mm256_permutevar8x32_ps(vv, perm));
    if (restore) {
      const unsigned taken = static_cast<unsigned>(
          _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(vv, abs_mask), tt, _CMP_GE_OQ)));
      unsigned diff = taken ^ keep;
      if (diff != 0) {
        alignas(32) uint32_t li[8];
        alignas(32) float lv[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(li), iv);
        _mm256_store_ps(lv, vv);
        for (; diff != 0; diff &= diff - 1) {
          const int l = std::countr_zero(diff);
          restore[li[l]] = (keep >> l) & 1u ? 0.0f : lv[l];
        }
      }
    }
    w += static_cast<size_t>(std::popcount(keep));
  }
  // The tail continues the same compaction: portable's scan of [j, n) writes from w on.
  if (j < n) {
    std::memmove(idx + w, idx + j, (n - j) * 4);
    std::memmove(val + w, val + j, (n - j) * 4);
    w += portable::keep_best_scan(idx + w, val + w, key + j, n - j, t, ties, restore, take_t);
  }
  return w;
}

// No fma in this target: the compiler must not contract a * b + c, or the bits would differ from
// the portable path.
#define GW_AVX2_NOFMA __attribute__((target("avx2")))
GW_AVX2_NOFMA void pq_row_dots(const float* row, const float* q, size_t ld, size_t r, size_t n,
                               float* out) {
  pq_row_dots_body(row, q, ld, r, n, out);
}
GW_AVX2_NOFMA void pq_row_axpy_in(const float* a, const float* x, size_t ld, size_t r, size_t n,
                                  float* y) {
  pq_row_axpy_in_body(a, x, ld, r, n, y);
}
GW_AVX2_NOFMA void pq_row_axpy_out(const float* a, const float* x, size_t ld, size_t r, size_t n,
                                   float* y) {
  pq_row_axpy_out_body(a, x, ld, r, n, y);
}
#undef GW_AVX2_NOFMA

#undef GW_AVX2

__attribute__((target("avx2"))) void store_stream_f32(const float* src, size_t n, float* dst) {
  size_t i = 0;
  // Plain stores up to the first 32-byte boundary (a float pointer is 4-byte aligned at least).
  while (i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31) != 0) {
    dst[i] = src[i];
    ++i;
  }
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
  for (; i < n; ++i) dst[i] = src[i];
  _mm_sfence();
}

}  // namespace avx2

// ------------------------------------------------------------------------------------------
// Dispatch.

void encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16) {
  if (dispatch_avx512()) return avx512::encode_cast16(in, residual, n, out, bf16);
  if (dispatch_avx2()) return avx2::encode_cast16(in, residual, n, out, bf16);
  portable::encode_cast16(in, residual, n, out, bf16);
}
void decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add) {
  if (dispatch_avx512()) return avx512::decode_cast16(in, n, acc, bf16, add);
  if (dispatch_avx2()) return avx2::decode_cast16(in, n, acc, bf16, add);
  portable::decode_cast16(in, n, acc, bf16, add);
}
float sign_encode_chunk(const float* in, float* residual, size_t n, uint64_t* words) {
  if (dispatch_avx512()) return avx512::sign_encode_chunk(in, residual, n, words);
  if (dispatch_avx2()) return avx2::sign_encode_chunk(in, residual, n, words);
  return portable::sign_encode_chunk(in, residual, n, words);
}
void sign_decode_add(const uint64_t* words, float scale, size_t n, float* acc) {
  if (dispatch_avx2()) return avx2::sign_decode_add(words, scale, n, acc);
  portable::sign_decode_add(words, scale, n, acc);
}
void sign_decode_set(const uint64_t* words, float scale, size_t n, float* out) {
  if (dispatch_avx2()) return avx2::sign_decode_set(words, scale, n, out);
  portable::sign_decode_set(words, scale, n, out);
}
void sign_decode_sum(const uint64_t* const* words, const float* scales, size_t nsrc, size_t n,
                     float* out) {
  if (dispatch_avx2()) return avx2::sign_decode_sum(words, scales, nsrc, n, out);
  portable::sign_decode_sum(words, scales, nsrc, n, out);
}
void collect_abs_ge(const float* v, size_t n, float threshold, uint32_t offset,
                    std::vector<uint32_t>* out) {
  if (dispatch_avx2()) return avx2::collect_abs_ge(v, n, threshold, offset, out);
  portable::collect_abs_ge(v, n, threshold, offset, out);
}
void add_collect_abs_ge(const float* in, float* residual, size_t n, float threshold,
                        uint32_t offset, std::vector<uint32_t>* out, std::vector<float>* vals,
                        bool take, float take_threshold) {
  if (dispatch_avx512()) {
    return avx512::add_collect_abs_ge(in, residual, n, threshold, offset, out, vals, take,
                                      take_threshold);
  }
  if (dispatch_avx2()) {
    return avx2::add_collect_abs_ge(in, residual, n, threshold, offset, out, vals, take,
                                    take_threshold);
  }
  portable::add_collect_abs_ge(in, residual, n, threshold, offset, out, vals, take, take_threshold);
}
size_t gather_bits_take(const float* in, float* residual, size_t n, const uint64_t* bits,
                        bool invert, float* out) {
  if (dispatch_avx512()) return avx512::gather_bits_take(in, residual, n, bits, invert, out);
  if (dispatch_avx2()) return avx2::gather_bits_take(in, residual, n, bits, invert, out);
  return portable::gather_bits_take(in, residual, n, bits, invert, out);
}

void pq_row_dots(const float* row, const float* q, size_t ld, size_t r, size_t n, float* out) {
  if (dispatch_avx2()) return avx2::pq_row_dots(row, q, ld, r, n, out);
  portable::pq_row_dots(row, q, ld, r, n, out);
}
void pq_row_axpy_in(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y) {
  if (dispatch_avx2()) return avx2::pq_row_axpy_in(a, x, ld, r, n, y);
  portable::pq_row_axpy_in(a, x, ld, r, n, y);
}
void pq_row_axpy_out(const float* a, const float* x, size_t ld, size_t r, size_t n, float* y) {
  if (dispatch_avx2()) return avx2::pq_row_axpy_out(a, x, ld, r, n, y);
  portable::pq_row_axpy_out(a, x, ld, r, n, y);
}

size_t select_compact(const uint32_t* key, size_t n, uint32_t shift, uint32_t want, uint32_t* sub) {
  if (dispatch_avx512()) return avx512::select_compact(key, n, shift, want, sub);
  if (dispatch_avx2()) return avx2::select_compact(key, n, shift, want, sub);
  return portable::select_compact(key, n, shift, want, sub);
}
size_t keep_best_scan(uint32_t* idx, float* val, const uint32_t* key, size_t n, uint32_t t,
                      size_t ties, float* restore, float take_t) {
  if (dispatch_avx512()) return avx512::keep_best_scan(idx, val, key, n, t, ties, restore, take_t);
  if (dispatch_avx2()) return avx2::keep_best_scan(idx, val, key, n, t, ties, restore, take_t);
  return portable::keep_best_scan(idx, val, key, n, t, ties, restore, take_t);
}
void store_stream_f32(const float* src, size_t n, float* dst) {
  if (dispatch_avx2()) return avx2::store_stream_f32(src, n, dst);
  portable::store_stream_f32(src, n, dst);
}

void add_f32(const float* __restrict src, size_t n, float* __restrict dst) {
  for (size_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace gw::coll::codec_kernels
