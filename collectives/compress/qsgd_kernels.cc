#include "collectives/compress/qsgd_kernels.h"

#include <immintrin.h>

// GCC 12's avx512fintrin.h builds its masked conversions on _mm512_undefined_*(), which
// -Wmaybe-uninitialized flags at every use (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"

namespace gw::coll::codec_kernels {

namespace {

constexpr uint32_t kGolden = 0x9E3779B9u;

// The 64 lanes of a bucket's sum of squares in f32 (lane = index in the bucket mod 64), folded
// to 16 as (l + l+16) + (l+32 + l+48) and those reduced in the order the vector paths reduce
// their registers, so that every path gets the same norm. (64 lanes, not 16: four independent
// accumulators, so the sum runs at the adder's throughput instead of its latency.)
inline float sum64(const float* l) {
  float f[16], t[8], u[4];
  for (int j = 0; j < 16; ++j) f[j] = (l[j] + l[j + 16]) + (l[j + 32] + l[j + 48]);
  for (int j = 0; j < 8; ++j) t[j] = f[j] + f[j + 8];
  for (int j = 0; j < 4; ++j) u[j] = t[j] + t[j + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

inline float v_at(const float* x, const float* r, size_t i) { return r ? x[i] + r[i] : x[i]; }

struct Scale {
  float norm;  // the bucket's scale field: its norm, times qsgd_ef_shrink with error feedback
  float inv;   // levels / the norm itself
  float step;  // the decoded size of one level: field / levels
};
// The scale of bucket v[0, n) from its f32 sum of squares (sum64). A bucket whose f32 sum is not
// finite (an element beyond ~1.8e19, or a NaN/Inf) is summed again in f64, in element order, so
// that finite inputs always get a finite norm where one exists. With error feedback (r set) the
// field is the norm times qsgd_ef_shrink(n, levels): the levels are drawn against the norm, the
// decode (and so the residual) uses the field.
inline Scale bucket_scale(float sum, const float* x, const float* r, size_t n, int levels) {
  const float s = static_cast<float>(levels);
  float norm = std::sqrt(sum);
  if (!std::isfinite(norm)) {
    double sq = 0;
    for (size_t i = 0; i < n; ++i) sq += static_cast<double>(v_at(x, r, i)) * v_at(x, r, i);
    norm = static_cast<float>(std::sqrt(sq));
  }
  const float field = r ? norm * qsgd_ef_shrink(n, levels) : norm;
  return {field, norm > 0 && std::isfinite(norm) ? s / norm : 0.0f, field / s};
}

// The squares of v = x (+ r) for elements [from, n) of a bucket added to lanes[i % 64]: the
// scalar steps every path's tail shares. r is not written: the quantising pass forms v again from
// L1 (a load and an add cost less than storing v and storing the residual over it).
inline void square_tail(const float* x, const float* r, size_t from, size_t n, float* lanes) {
  for (size_t i = from; i < n; ++i) {
    const float v = v_at(x, r, i);
    lanes[i % 64] += v * v;
  }
}

// One element (j of the bucket at off), the reference every vector lane reproduces: its signed
// level, and with r set the residual v - level * step (one rounding). The level is trunc(t), t =
// fma(v, inv, +-u) with u carrying v's sign: -fma(|v|, inv, u), exactly, for a negative v, so its
// magnitude is floor(a + u) (one rounding), which is floor(a) + 1 with probability frac(a):
// unbiased. |t| is capped at levels (an f32 norm may be a few ulps below an element, or the
// scale infinite), and a NaN t (a NaN v, or 0 * an infinite scale) gives 0.
inline int8_t quantise(float v, const Scale& sc, int levels, uint32_t key, size_t off, size_t j,
                       float* r) {
  const float s = static_cast<float>(levels);
  const float t = std::fma(v, sc.inv, std::copysign(qsgd_uniform(key, off, j), v));
  const int q = std::isnan(t) ? 0 : static_cast<int>(std::copysign(std::fmin(std::fabs(t), s), t));
  if (r) *r = std::fma(-static_cast<float>(q), sc.step, v);
  return static_cast<int8_t>(q);
}

// The scalar decode of elements [i, end) of one bucket; returns end or the first bad index.
inline size_t decode_scalar(const int8_t* q, size_t i, size_t end, int levels, float step,
                            float* acc, bool add) {
  for (; i < end; ++i) {
    const int lv = q[i];
    if (lv > levels || lv < -levels) return i;
    const float dec = static_cast<float>(lv) * step;
    acc[i] = (add ? acc[i] : 0.0f) + dec;
  }
  return end;
}

// While a bucket is quantised (compute from L1), the lines kAhead elements further on are
// fetched, one line of the input and one of the residual per 16 elements: the quantisation then
// overlaps the memory traffic instead of following it. (Measured at 16 Mi and 1 Mi elements: 4 KiB
// elements ahead, two 16 KiB streams into a 32 KiB L1, evicted lines before their use and ran
// 10-15% slower than 1 Ki.)
constexpr size_t kAhead = 1024;
inline void prefetch_ahead(const float* x, const float* r) {
  __builtin_prefetch(x, 0, 3);
  if (r) __builtin_prefetch(r, 1, 3);
}

inline void store_norm(uint8_t* out, size_t b, float norm) { std::memcpy(out + 4 * b, &norm, 4); }
inline float load_norm(const uint8_t* in, size_t b) {
  float norm;
  std::memcpy(&norm, in + 4 * b, 4);
  return norm;
}

}  // namespace

// ------------------------------------------------------------------------------------------
namespace portable {

void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket, int levels,
                 uint32_t key, uint8_t* out) {
  const size_t nb = (count + bucket - 1) / bucket;
  auto* q = reinterpret_cast<int8_t*>(out + nb * 4);
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, n = std::min(bucket, count - off);
    const float* x = in + off;
    float* r = residual ? residual + off : nullptr;
    float lanes[64] = {};
    square_tail(x, r, 0, n, lanes);
    const Scale sc = bucket_scale(sum64(lanes), x, r, n, levels);
    store_norm(out, b, sc.norm);
    for (size_t j = 0; j < n; ++j) {
      q[off + j] = quantise(v_at(x, r, j), sc, levels, key, off, j, r ? r + j : nullptr);
    }
  }
}

size_t qsgd_decode(const uint8_t* in, size_t count, size_t bucket, int levels, float* acc,
                   bool add) {
  const size_t nb = (count + bucket - 1) / bucket;
  const auto* q = reinterpret_cast<const int8_t*>(in + nb * 4);
  const float s = static_cast<float>(levels);
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, end = off + std::min(bucket, count - off);
    const size_t at = decode_scalar(q, off, end, levels, load_norm(in, b) / s, acc, add);
    if (at != end) return at;
  }
  return count;
}

}  // namespace portable

// ------------------------------------------------------------------------------------------
namespace avx2 {

#define GW_AVX2 __attribute__((target("avx2,f16c,fma")))

GW_AVX2 static inline __m256i mix32(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7FEB352D));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
}

// The draws of 8 elements from 8 hashes' halves (placed at bits 7..22: 1 + half / 2^16 as a
// float in [1, 2), minus 1, exactly half / 2^16).
GW_AVX2 static inline __m256 draw_lo(__m256i h) {
  const __m256i bits =
      _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(h, 7), _mm256_set1_epi32(0x7FFF80)),
                      _mm256_set1_epi32(0x3F800000));
  return _mm256_sub_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(1.0f));
}
GW_AVX2 static inline __m256 draw_hi(__m256i h) {
  const __m256i bits =
      _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(h, 9), _mm256_set1_epi32(0x7FFF80)),
                      _mm256_set1_epi32(0x3F800000));
  return _mm256_sub_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(1.0f));
}

struct Quant8 {
  __m256 inv, step, vs, neg_vs;
};
// quantise() on 8 lanes: the signed levels, the residual stored when r is set.
GW_AVX2 static inline __m256i quant8(const float* xp, float* r, __m256 u, const Quant8& c) {
  __m256 x = _mm256_loadu_ps(xp);
  if (r) x = _mm256_add_ps(x, _mm256_loadu_ps(r));
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  __m256 t = _mm256_fmadd_ps(x, c.inv, _mm256_or_ps(u, _mm256_and_ps(x, sign)));
  t = _mm256_and_ps(t, _mm256_cmp_ps(t, t, _CMP_ORD_Q));  // NaN: +0
  t = _mm256_min_ps(_mm256_max_ps(t, c.neg_vs), c.vs);    // cap |t| at levels
  const __m256i q = _mm256_cvttps_epi32(t);
  if (r) _mm256_storeu_ps(r, _mm256_fnmadd_ps(_mm256_cvtepi32_ps(q), c.step, x));
  return q;
}

GW_AVX2 void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket, int levels,
                         uint32_t key, uint8_t* out) {
  const size_t nb = (count + bucket - 1) / bucket;
  auto* q = reinterpret_cast<int8_t*>(out + nb * 4);
  const float s = static_cast<float>(levels);
  const __m256i lane_g = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                            _mm256_set1_epi32(static_cast<int>(kGolden)));
  const __m256i g8 = _mm256_set1_epi32(static_cast<int>(8 * kGolden));
  const __m256i g16 = _mm256_set1_epi32(static_cast<int>(16 * kGolden));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, n = std::min(bucket, count - off);
    const float* x = in + off;
    float* r = residual ? residual + off : nullptr;
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
      for (int k = 0; k < 8; ++k) {
        __m256 v = _mm256_loadu_ps(x + i + 8 * k);
        if (r) v = _mm256_add_ps(v, _mm256_loadu_ps(r + i + 8 * k));
        acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(v, v));
      }
    }
    alignas(32) float lanes[64];
    for (int k = 0; k < 8; ++k) _mm256_store_ps(lanes + 8 * k, acc[k]);
    square_tail(x, r, i, n, lanes);
    const Scale sc = bucket_scale(sum64(lanes), x, r, n, levels);
    store_norm(out, b, sc.norm);
    const Quant8 c{_mm256_set1_ps(sc.inv), _mm256_set1_ps(sc.step), _mm256_set1_ps(s),
                   _mm256_set1_ps(-s)};
    // m = off + j / 2 at the start of every 32 elements (qsgd_uniform).
    __m256i h0 = _mm256_add_epi32(
        _mm256_set1_epi32(static_cast<int>(key + static_cast<uint32_t>(off) * kGolden)), lane_g);
    i = 0;
    const size_t ahead_end = count - std::min(count, off + kAhead);  // see prefetch_ahead
    for (; i + 32 <= n; i += 32, h0 = _mm256_add_epi32(h0, g16)) {
      if (i < ahead_end) {
        prefetch_ahead(x + kAhead + i, r ? r + kAhead + i : nullptr);
        prefetch_ahead(x + kAhead + i + 16, r ? r + kAhead + i + 16 : nullptr);
      }
      const __m256i ha = mix32(h0), hb = mix32(_mm256_add_epi32(h0, g8));
      const __m256i q0 = quant8(x + i, r ? r + i : nullptr, draw_lo(ha), c);
      const __m256i q1 = quant8(x + i + 8, r ? r + i + 8 : nullptr, draw_lo(hb), c);
      const __m256i q2 = quant8(x + i + 16, r ? r + i + 16 : nullptr, draw_hi(ha), c);
      const __m256i q3 = quant8(x + i + 24, r ? r + i + 24 : nullptr, draw_hi(hb), c);
      const __m256i bytes =
          _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + off + i),
                          _mm256_permutevar8x32_epi32(bytes, order));
    }
    for (; i < n; ++i)
      q[off + i] = quantise(v_at(x, r, i), sc, levels, key, off, i, r ? r + i : nullptr);
  }
}

GW_AVX2 size_t qsgd_decode(const uint8_t* in, size_t count, size_t bucket, int levels, float* acc,
                           bool add) {
  const size_t nb = (count + bucket - 1) / bucket;
  const auto* q = reinterpret_cast<const int8_t*>(in + nb * 4);
  const float s = static_cast<float>(levels);
  const __m256i lim = _mm256_set1_epi32(levels);
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, end = off + std::min(bucket, count - off);
    const float st = load_norm(in, b) / s;
    const __m256 step = _mm256_set1_ps(st);
    size_t i = off;
    for (; i + 8 <= end; i += 8) {
      const __m256i l =
          _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + i)));
      if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(_mm256_abs_epi32(l), lim)) != 0) break;
      const __m256 dec = _mm256_mul_ps(_mm256_cvtepi32_ps(l), step);
      const __m256 base = add ? _mm256_loadu_ps(acc + i) : _mm256_setzero_ps();
      _mm256_storeu_ps(acc + i, _mm256_add_ps(base, dec));
    }
    const size_t at = decode_scalar(q, i, end, levels, st, acc, add);
    if (at != end) return at;
  }
  return count;
}

#undef GW_AVX2

}  // namespace avx2

// ------------------------------------------------------------------------------------------
namespace avx512 {

#define GW_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c,fma")))

GW_AVX512 static inline __m512i mix32(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7FEB352D));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
}

// The draws of 16 elements from 16 hashes' halves, as in the AVX2 version ((A & B) | C is
// ternary-logic 0xEA).
GW_AVX512 static inline __m512 draw_bits(__m512i shifted) {
  const __m512i bits = _mm512_ternarylogic_epi32(shifted, _mm512_set1_epi32(0x7FFF80),
                                                 _mm512_set1_epi32(0x3F800000), 0xEA);
  return _mm512_sub_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(1.0f));
}

// sum64() of the lanes in four registers (lanes 0-15, 16-31, 32-47, 48-63), the same adds in
// the same order.
GW_AVX512 static inline float sum64_regs(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
  const __m512 f = _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3));
  const __m256 t = _mm256_add_ps(_mm512_castps512_ps256(f),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(f), 1)));
  const __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  // (u0 + u2) + (u1 + u3)
  const __m128 w = _mm_add_ps(u, _mm_movehl_ps(u, u));  // w0 = u0 + u2, w1 = u1 + u3
  return _mm_cvtss_f32(_mm_add_ss(w, _mm_movehdup_ps(w)));
}

struct Quant16 {
  __m512 inv, step, vs;
};
// quantise() on 16 lanes: the signed levels, the residual stored when r is set. The cap is one
// range operation (the smaller magnitude of t and levels, with t's sign), and
// the conversion is masked to the ordered lanes (a NaN gives 0).
GW_AVX512 static inline __m512i quant16(const float* xp, float* r, __m512 u, const Quant16& c) {
  __m512 x = _mm512_loadu_ps(xp);
  if (r) x = _mm512_add_ps(x, _mm512_loadu_ps(r));
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  // u | (x & sign): ternary-logic C | (A & B) = 0xEA.
  const __m512 us = _mm512_castsi512_ps(
      _mm512_ternarylogic_epi32(_mm512_castps_si512(x), sign, _mm512_castps_si512(u), 0xEA));
  __m512 t = _mm512_fmadd_ps(x, c.inv, us);
  const __mmask16 ord = _mm512_cmp_ps_mask(t, t, _CMP_ORD_Q);
  t = _mm512_range_ps(t, c.vs, 0x2);  // min by magnitude (imm 0b10), sign of t (0b00 << 2)
  const __m512i q = _mm512_maskz_cvttps_epi32(ord, t);
  if (r) _mm512_storeu_ps(r, _mm512_fnmadd_ps(_mm512_cvtepi32_ps(q), c.step, x));
  return q;
}

GW_AVX512 void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket,
                           int levels, uint32_t key, uint8_t* out) {
  const size_t nb = (count + bucket - 1) / bucket;
  auto* q = reinterpret_cast<int8_t*>(out + nb * 4);
  const float s = static_cast<float>(levels);
  const __m512i lane_g =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(kGolden)));
  const __m512i g16 = _mm512_set1_epi32(static_cast<int>(16 * kGolden));
  const __m512i g32 = _mm512_set1_epi32(static_cast<int>(32 * kGolden));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, n = std::min(bucket, count - off);
    const float* x = in + off;
    float* r = residual ? residual + off : nullptr;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    size_t i = 0;
    auto step = [&](size_t at, __m512& acc) GW_AVX512 {
      __m512 v = _mm512_loadu_ps(x + at);
      if (r) v = _mm512_add_ps(v, _mm512_loadu_ps(r + at));
      acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
    };
    for (; i + 64 <= n; i += 64) {
      step(i, acc0);
      step(i + 16, acc1);
      step(i + 32, acc2);
      step(i + 48, acc3);
    }
    float sum;
    if (i == n) {
      sum = sum64_regs(acc0, acc1, acc2, acc3);
    } else {
      alignas(64) float lanes[64];
      _mm512_store_ps(lanes, acc0);
      _mm512_store_ps(lanes + 16, acc1);
      _mm512_store_ps(lanes + 32, acc2);
      _mm512_store_ps(lanes + 48, acc3);
      square_tail(x, r, i, n, lanes);
      sum = sum64(lanes);
    }
    const Scale sc = bucket_scale(sum, x, r, n, levels);
    store_norm(out, b, sc.norm);
    const Quant16 c{_mm512_set1_ps(sc.inv), _mm512_set1_ps(sc.step), _mm512_set1_ps(s)};
    // m = off + j / 2 at the start of every 32 elements (qsgd_uniform).
    __m512i h = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(key + static_cast<uint32_t>(off) * kGolden)), lane_g);
    i = 0;
    const size_t ahead_end = count - std::min(count, off + kAhead);  // see prefetch_ahead
    for (; i + 64 <= n; i += 64, h = _mm512_add_epi32(h, g32)) {
      if (i < ahead_end) {
        for (size_t k = 0; k < 64; k += 16) {
          prefetch_ahead(x + kAhead + i + k, r ? r + kAhead + i + k : nullptr);
        }
      }
      const __m512i ha = mix32(h), hb = mix32(_mm512_add_epi32(h, g16));
      const __m512i q0 =
          quant16(x + i, r ? r + i : nullptr, draw_bits(_mm512_slli_epi32(ha, 7)), c);
      const __m512i q1 =
          quant16(x + i + 16, r ? r + i + 16 : nullptr, draw_bits(_mm512_srli_epi32(ha, 9)), c);
      const __m512i q2 =
          quant16(x + i + 32, r ? r + i + 32 : nullptr, draw_bits(_mm512_slli_epi32(hb, 7)), c);
      const __m512i q3 =
          quant16(x + i + 48, r ? r + i + 48 : nullptr, draw_bits(_mm512_srli_epi32(hb, 9)), c);
      // Two saturating packs leave q_k's 4-byte groups interleaved (dword 4l + k is q_k[4l,
      // 4l + 4)); one permute puts them in order. (Four vpmovdb cost more.)
      const __m512i bytes =
          _mm512_packs_epi16(_mm512_packs_epi32(q0, q1), _mm512_packs_epi32(q2, q3));
      _mm512_storeu_si512(q + off + i, _mm512_permutexvar_epi32(order, bytes));
    }
    if (i + 32 <= n) {
      const __m512i ha = mix32(h);
      const __m512i q0 =
          quant16(x + i, r ? r + i : nullptr, draw_bits(_mm512_slli_epi32(ha, 7)), c);
      const __m512i q1 =
          quant16(x + i + 16, r ? r + i + 16 : nullptr, draw_bits(_mm512_srli_epi32(ha, 9)), c);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + off + i), _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + off + i + 16), _mm512_cvtepi32_epi8(q1));
      i += 32;
    }
    for (; i < n; ++i)
      q[off + i] = quantise(v_at(x, r, i), sc, levels, key, off, i, r ? r + i : nullptr);
  }
}

GW_AVX512 size_t qsgd_decode(const uint8_t* in, size_t count, size_t bucket, int levels, float* acc,
                             bool add) {
  const size_t nb = (count + bucket - 1) / bucket;
  const auto* q = reinterpret_cast<const int8_t*>(in + nb * 4);
  const float s = static_cast<float>(levels);
  const __m512i lim = _mm512_set1_epi32(levels);
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, end = off + std::min(bucket, count - off);
    const float st = load_norm(in, b) / s;
    const __m512 step = _mm512_set1_ps(st);
    size_t i = off;
    for (; i + 16 <= end; i += 16) {
      const __m512i l =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + i)));
      if (_mm512_cmpgt_epi32_mask(_mm512_abs_epi32(l), lim) != 0) break;
      const __m512 dec = _mm512_mul_ps(_mm512_cvtepi32_ps(l), step);
      const __m512 base = add ? _mm512_loadu_ps(acc + i) : _mm512_setzero_ps();
      _mm512_storeu_ps(acc + i, _mm512_add_ps(base, dec));
    }
    const size_t at = decode_scalar(q, i, end, levels, st, acc, add);
    if (at != end) return at;
  }
  return count;
}

#undef GW_AVX512

}  // namespace avx512

// ------------------------------------------------------------------------------------------
void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket, int levels,
                 uint32_t key, uint8_t* out) {
  if (dispatch_avx512()) return avx512::qsgd_encode(in, residual, count, bucket, levels, key, out);
  if (dispatch_avx2()) return avx2::qsgd_encode(in, residual, count, bucket, levels, key, out);
  portable::qsgd_encode(in, residual, count, bucket, levels, key, out);
}

size_t qsgd_decode(const uint8_t* in, size_t count, size_t bucket, int levels, float* acc,
                   bool add) {
  if (dispatch_avx512()) return avx512::qsgd_decode(in, count, bucket, levels, acc, add);
  if (dispatch_avx2()) return avx2::qsgd_decode(in, count, bucket, levels, acc, add);
  return portable::qsgd_decode(in, count, bucket, levels, acc, add);
}

}  // namespace gw::coll::codec_kernels
