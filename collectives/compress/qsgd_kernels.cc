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

// The 16 lanes of a bucket's sum of squares in f32 (lane = index in the bucket mod 16), reduced
// in the order the vector paths reduce their registers, so that every path gets the same norm.
inline float sum16(const float* l) {
  float t[8], u[4];
  for (int j = 0; j < 8; ++j) t[j] = l[j] + l[j + 8];
  for (int j = 0; j < 4; ++j) u[j] = t[j] + t[j + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

struct Scale {
  float norm, inv, step;
};
// The scale of bucket v[0, n) from its f32 lane sums. A bucket whose f32 sum is not finite (an
// element beyond ~1.8e19, or a NaN/Inf) is summed again in f64, in element order, so that finite
// inputs always get a finite norm where one exists.
inline Scale bucket_scale(const float* lanes, const float* v, size_t n, float s) {
  float norm = std::sqrt(sum16(lanes));
  if (!std::isfinite(norm)) {
    double sq = 0;
    for (size_t i = 0; i < n; ++i) sq += static_cast<double>(v[i]) * v[i];
    norm = static_cast<float>(std::sqrt(sq));
  }
  return {norm, norm > 0 && std::isfinite(norm) ? s / norm : 0.0f, norm / s};
}

// One element, the reference every vector lane reproduces: its signed level, and with r set the
// residual v - level * step. floor(a + u) is floor(a) + 1 with probability frac(a): unbiased.
inline int8_t quantise(float v, const Scale& sc, float s, int levels, uint32_t key, uint64_t i,
                       float* r) {
  float a = std::fabs(v) * sc.inv;
  if (!(a >= 0.0f)) a = 0.0f;  // NaN
  if (a > s) a = s;
  int lv = static_cast<int>(a + qsgd_uniform(key, i));  // >= 0: truncation is floor
  if (lv > levels) lv = levels;
  const float sq = std::signbit(v) ? -static_cast<float>(lv) : static_cast<float>(lv);
  if (r) *r = v - sq * sc.step;
  return static_cast<int8_t>(std::signbit(v) ? -lv : lv);
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
// overlaps the memory traffic instead of following it.
constexpr size_t kAhead = 4096;
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
  const float s = static_cast<float>(levels);
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, n = std::min(bucket, count - off);
    const float* x = in + off;
    float* r = residual ? residual + off : nullptr;
    float lanes[16] = {};
    for (size_t i = 0; i < n; ++i) {
      const float v = r ? x[i] + r[i] : x[i];
      if (r) r[i] = v;
      lanes[i % 16] += v * v;
    }
    const float* v = r ? r : x;
    const Scale sc = bucket_scale(lanes, v, n, s);
    store_norm(out, b, sc.norm);
    for (size_t i = 0; i < n; ++i) {
      q[off + i] = quantise(v[i], sc, s, levels, key, off + i, r ? r + i : nullptr);
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

GW_AVX2 void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket, int levels,
                         uint32_t key, uint8_t* out) {
  const size_t nb = (count + bucket - 1) / bucket;
  auto* q = reinterpret_cast<int8_t*>(out + nb * 4);
  const float s = static_cast<float>(levels);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 vs = _mm256_set1_ps(s), zero = _mm256_setzero_ps();
  const __m256 u_scale = _mm256_set1_ps(1.0f / 16777216.0f);
  const __m256i lim = _mm256_set1_epi32(levels);
  const __m256i lane_g = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                            _mm256_set1_epi32(static_cast<int>(kGolden)));
  const __m256i step8_g = _mm256_set1_epi32(static_cast<int>(8 * kGolden));
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, n = std::min(bucket, count - off);
    const float* x = in + off;
    float* r = residual ? residual + off : nullptr;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
      if (r) {
        v0 = _mm256_add_ps(v0, _mm256_loadu_ps(r + i));
        v1 = _mm256_add_ps(v1, _mm256_loadu_ps(r + i + 8));
        _mm256_storeu_ps(r + i, v0);
        _mm256_storeu_ps(r + i + 8, v1);
      }
      acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(v0, v0));
      acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(v1, v1));
    }
    alignas(32) float lanes[16];
    _mm256_store_ps(lanes, acc0);
    _mm256_store_ps(lanes + 8, acc1);
    for (; i < n; ++i) {
      const float v = r ? x[i] + r[i] : x[i];
      if (r) r[i] = v;
      lanes[i % 16] += v * v;
    }
    const float* v = r ? r : x;
    const Scale sc = bucket_scale(lanes, v, n, s);
    store_norm(out, b, sc.norm);
    const __m256 inv = _mm256_set1_ps(sc.inv), step = _mm256_set1_ps(sc.step);
    __m256i h = _mm256_add_epi32(
        _mm256_set1_epi32(static_cast<int>(key + static_cast<uint32_t>(off) * kGolden)), lane_g);
    i = 0;
    const size_t ahead_end = count - std::min(count, off + kAhead);  // see prefetch_ahead
    for (; i + 8 <= n; i += 8, h = _mm256_add_epi32(h, step8_g)) {
      if (i < ahead_end && i % 16 == 0) {
        prefetch_ahead(x + kAhead + i, r ? r + kAhead + i : nullptr);
      }
      const __m256 x8 = _mm256_loadu_ps(v + i);
      __m256 a = _mm256_mul_ps(_mm256_and_ps(x8, abs_mask), inv);
      a = _mm256_min_ps(_mm256_max_ps(a, zero), vs);  // max first: a NaN becomes 0
      const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(mix32(h), 8)), u_scale);
      const __m256i lv = _mm256_min_epi32(_mm256_cvttps_epi32(_mm256_add_ps(a, u)), lim);
      const __m256 sq = _mm256_xor_ps(_mm256_cvtepi32_ps(lv), _mm256_and_ps(x8, sign_mask));
      if (r) _mm256_storeu_ps(r + i, _mm256_sub_ps(x8, _mm256_mul_ps(sq, step)));
      const __m256i qi = _mm256_cvttps_epi32(sq);
      const __m128i w =
          _mm_packs_epi32(_mm256_castsi256_si128(qi), _mm256_extracti128_si256(qi, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + off + i), _mm_packs_epi16(w, w));
    }
    for (; i < n; ++i)
      q[off + i] = quantise(v[i], sc, s, levels, key, off + i, r ? r + i : nullptr);
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

GW_AVX512 void qsgd_encode(const float* in, float* residual, size_t count, size_t bucket,
                           int levels, uint32_t key, uint8_t* out) {
  const size_t nb = (count + bucket - 1) / bucket;
  auto* q = reinterpret_cast<int8_t*>(out + nb * 4);
  const float s = static_cast<float>(levels);
  const __m512i sign_mask = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 vs = _mm512_set1_ps(s), zero = _mm512_setzero_ps();
  const __m512 u_scale = _mm512_set1_ps(1.0f / 16777216.0f);
  const __m512i lim = _mm512_set1_epi32(levels);
  const __m512i lane_g =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(static_cast<int>(kGolden)));
  const __m512i step16_g = _mm512_set1_epi32(static_cast<int>(16 * kGolden));
  for (size_t b = 0; b < nb; ++b) {
    const size_t off = b * bucket, n = std::min(bucket, count - off);
    const float* x = in + off;
    float* r = residual ? residual + off : nullptr;
    __m512 acc = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
      __m512 v = _mm512_loadu_ps(x + i);
      if (r) {
        v = _mm512_add_ps(v, _mm512_loadu_ps(r + i));
        _mm512_storeu_ps(r + i, v);
      }
      acc = _mm512_add_ps(acc, _mm512_mul_ps(v, v));
    }
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc);
    for (; i < n; ++i) {
      const float v = r ? x[i] + r[i] : x[i];
      if (r) r[i] = v;
      lanes[i % 16] += v * v;
    }
    const float* v = r ? r : x;
    const Scale sc = bucket_scale(lanes, v, n, s);
    store_norm(out, b, sc.norm);
    const __m512 inv = _mm512_set1_ps(sc.inv), step = _mm512_set1_ps(sc.step);
    __m512i h = _mm512_add_epi32(
        _mm512_set1_epi32(static_cast<int>(key + static_cast<uint32_t>(off) * kGolden)), lane_g);
    i = 0;
    const size_t ahead_end = count - std::min(count, off + kAhead);  // see prefetch_ahead
    for (; i + 16 <= n; i += 16, h = _mm512_add_epi32(h, step16_g)) {
      if (i < ahead_end) prefetch_ahead(x + kAhead + i, r ? r + kAhead + i : nullptr);
      const __m512 x16 = _mm512_loadu_ps(v + i);
      __m512 a = _mm512_mul_ps(_mm512_abs_ps(x16), inv);
      a = _mm512_min_ps(_mm512_max_ps(a, zero), vs);  // max first: a NaN becomes 0
      const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(mix32(h), 8)), u_scale);
      const __m512i lv = _mm512_min_epi32(_mm512_cvttps_epi32(_mm512_add_ps(a, u)), lim);
      const __m512 sq = _mm512_castsi512_ps(
          _mm512_xor_si512(_mm512_castps_si512(_mm512_cvtepi32_ps(lv)),
                           _mm512_and_si512(_mm512_castps_si512(x16), sign_mask)));
      if (r) _mm512_storeu_ps(r + i, _mm512_sub_ps(x16, _mm512_mul_ps(sq, step)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(q + off + i),
                       _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(sq)));
    }
    for (; i < n; ++i)
      q[off + i] = quantise(v[i], sc, s, levels, key, off + i, r ? r + i : nullptr);
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
  if (cpu_has_avx512()) return avx512::qsgd_encode(in, residual, count, bucket, levels, key, out);
  if (cpu_has_avx2()) return avx2::qsgd_encode(in, residual, count, bucket, levels, key, out);
  portable::qsgd_encode(in, residual, count, bucket, levels, key, out);
}

size_t qsgd_decode(const uint8_t* in, size_t count, size_t bucket, int levels, float* acc,
                   bool add) {
  if (cpu_has_avx512()) return avx512::qsgd_decode(in, count, bucket, levels, acc, add);
  if (cpu_has_avx2()) return avx2::qsgd_decode(in, count, bucket, levels, acc, add);
  return portable::qsgd_decode(in, count, bucket, levels, acc, add);
}

}  // namespace gw::coll::codec_kernels
