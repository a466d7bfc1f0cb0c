// The AVX-512 (F, BW, DQ, VL) versions of the hottest codec kernels (codec_kernels.h): 16 lanes,
// mask registers for the sign bits and the top-k candidates (compress-store), with the same bits
// as the portable and AVX2 versions (tests/unit/codec_isa_test.cc compares them). Only called
// when cpu_has_avx512(); shorter tails go to the AVX2 versions.
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"

// GCC 12's avx512fintrin.h builds its masked conversions on _mm512_undefined_*(), which
// -Wmaybe-uninitialized flags at every use (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace gw::coll::codec_kernels::avx512 {

#define GW_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c,fma")))

namespace {

// Round to nearest even (x + 0x7FFF + the kept lsb), a NaN kept quiet instead: the rounded (or
// quieted) bits, of which the top 16 are the bf16 value (the AVX2 version's arithmetic, with the
// NaN test and the quieting as one class test and one masked OR).
GW_AVX512 inline __m512i bf16_round(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7FFF)), lsb);
  const __mmask16 nan = _mm512_fpclass_ps_mask(v, 0x81);  // quiet or signalling NaN
  return _mm512_mask_or_epi32(rounded, nan, x, _mm512_set1_epi32(0x400000));
}

GW_AVX512 inline __m512 bf16_unpack(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void store_word(uint64_t* words, size_t w, uint64_t x) {
  std::memcpy(reinterpret_cast<unsigned char*>(words) + 8 * w, &x, 8);
}

}  // namespace

GW_AVX512 void encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(in + i);
    if (residual) v = _mm512_add_ps(v, _mm512_loadu_ps(residual + i));
    __m256i h;
    __m512 back;
    if (bf16) {
      const __m512i r = bf16_round(v);
      h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16));
      back = _mm512_castsi512_ps(
          _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    } else {
      h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      back = _mm512_cvtph_ps(h);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
    if (residual) _mm512_storeu_ps(residual + i, _mm512_sub_ps(v, back));
  }
  avx2::encode_cast16(in + i, residual ? residual + i : nullptr, n - i, out + i, bf16);
}

GW_AVX512 void decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + i));
    __m512 f = bf16 ? bf16_unpack(h) : _mm512_cvtph_ps(h);
    if (add) f = _mm512_add_ps(f, _mm512_loadu_ps(acc + i));
    _mm512_storeu_ps(acc + i, f);
  }
  avx2::decode_cast16(in + i, n - i, acc + i, bf16, add);
}

// The scale is summed in the AVX2 version's 8 lanes and order (each 16 elements add their low
// then their high half), so that it has the same bits.
GW_AVX512 float sign_encode_chunk(const float* in, float* residual, size_t n, uint64_t* words) {
  const __m256 abs8 = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 acc = _mm256_setzero_ps();
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(in + i);
    if (residual) {
      v = _mm512_add_ps(v, _mm512_loadu_ps(residual + i));
      _mm512_storeu_ps(residual + i, v);
    }
    const __m512 a = _mm512_abs_ps(v);
    acc = _mm256_add_ps(acc, _mm512_castps512_ps256(a));
    acc = _mm256_add_ps(acc, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
  }
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(in + i);
    if (residual) {
      v = _mm256_add_ps(v, _mm256_loadu_ps(residual + i));
      _mm256_storeu_ps(residual + i, v);
    }
    acc = _mm256_add_ps(acc, _mm256_and_ps(v, abs8));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  for (size_t j = i; j < n; ++j) {
    const float v = residual ? in[j] + residual[j] : in[j];
    if (residual) residual[j] = v;
    lanes[j % 8] += std::fabs(v);
  }
  const float t0 = lanes[0] + lanes[4], t1 = lanes[1] + lanes[5], t2 = lanes[2] + lanes[6],
              t3 = lanes[3] + lanes[7];
  const float scale = n ? ((t0 + t2) + (t1 + t3)) / static_cast<float>(n) : 0.0f;
  const float* v = residual ? residual : in;
  const __m512i vs = _mm512_castps_si512(_mm512_set1_ps(scale));
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const size_t full = n / 64;
  for (size_t w = 0; w < full; ++w) {
    uint64_t bits = 0;
    for (int k = 0; k < 4; ++k) {
      const __m512 x = _mm512_loadu_ps(v + 64 * w + 16 * k);
      const __m512i xi = _mm512_castps_si512(x);
      bits |= static_cast<uint64_t>(_mm512_movepi32_mask(xi)) << (16 * k);
      if (residual) {
        // dec = scale with x's sign bit: vs | (x & sign), ternary-logic A | (B & C) = 0xF8.
        const __m512 dec = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(vs, xi, sign, 0xF8));
        _mm512_storeu_ps(residual + 64 * w + 16 * k, _mm512_sub_ps(x, dec));
      }
    }
    store_word(words, w, bits);
  }
  if (full * 64 < n) {
    uint64_t bits = 0;
    for (size_t j = full * 64; j < n; ++j) {
      if (std::signbit(v[j])) bits |= uint64_t{1} << (j - full * 64);
      if (residual) residual[j] = v[j] - std::copysign(scale, v[j]);
    }
    store_word(words, full, bits);
  }
  return scale;
}

// Top-k's pass: the candidates of every 16 elements are compressed to the front of a register
// and stored whole into an L1 block buffer, the write position advanced by their count (no branch
// on the data).
GW_AVX512 void add_collect_abs_ge(const float* in, float* residual, size_t n, float threshold,
                                  uint32_t offset, std::vector<uint32_t>* out,
                                  std::vector<float>* vals, bool take, float take_threshold) {
  constexpr size_t kBlock = 2048;
  const __m512 t = _mm512_set1_ps(threshold);
  const __m512 tt = _mm512_set1_ps(take_threshold);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  alignas(64) uint32_t bidx[kBlock + 16];
  alignas(64) float bval[kBlock + 16];
  size_t i = 0;
  while (i + 16 <= n) {
    const size_t end = std::min(n & ~size_t{15}, i + kBlock);
    size_t w = 0;
    for (; i < end; i += 16) {
      __m512 v = _mm512_loadu_ps(in + i);
      if (residual) v = _mm512_add_ps(v, _mm512_loadu_ps(residual + i));
      const __m512 a = _mm512_abs_ps(v);
      const __mmask16 m = _mm512_cmp_ps_mask(a, t, _CMP_GE_OQ);
      if (residual) {
        const __mmask16 gone = _mm512_mask_cmp_ps_mask(m, a, tt, _CMP_GE_OQ);
        _mm512_storeu_ps(residual + i,
                         take ? _mm512_maskz_mov_ps(static_cast<__mmask16>(~gone), v) : v);
      }
      const __m512i idx = _mm512_add_epi32(
          iota, _mm512_set1_epi32(static_cast<int>(offset + static_cast<uint32_t>(i))));
      // Compressed in a register and stored whole (a compress-store to memory is slower).
      _mm512_storeu_si512(bidx + w, _mm512_maskz_compress_epi32(m, idx));
      if (vals) _mm512_storeu_ps(bval + w, _mm512_maskz_compress_ps(m, v));
      w += static_cast<size_t>(std::popcount(static_cast<unsigned>(m)));
    }
    out->insert(out->end(), bidx, bidx + w);
    if (vals) vals->insert(vals->end(), bval, bval + w);
  }
  avx2::add_collect_abs_ge(in + i, residual ? residual + i : nullptr, n - i, threshold,
                           offset + static_cast<uint32_t>(i), out, vals, take, take_threshold);
}

// Random-k's pass: 16 elements at a time, their 16 bits of the bitmap as the mask; the chosen
// values are compressed in a register and written with a masked store of their count, the
// residual with the chosen lanes zeroed (no branch on the data).
GW_AVX512 size_t gather_bits_take(const float* in, float* residual, size_t n, const uint64_t* bits,
                                  bool invert, float* out) {
  const uint16_t* halves = reinterpret_cast<const uint16_t*>(bits);  // little-endian words
  const unsigned flip = invert ? 0xFFFFu : 0u;
  size_t w = 0;
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m512 v = _mm512_loadu_ps(in + i);
    if (residual) v = _mm512_add_ps(v, _mm512_loadu_ps(residual + i));
    uint16_t h;
    std::memcpy(&h, halves + i / 16, 2);
    const __mmask16 m = static_cast<__mmask16>((h ^ flip) & 0xFFFFu);
    const unsigned cnt = static_cast<unsigned>(std::popcount(static_cast<unsigned>(m)));
    _mm512_mask_storeu_ps(out + w, static_cast<__mmask16>((1u << cnt) - 1u),
                          _mm512_maskz_compress_ps(m, v));
    if (residual)
      _mm512_storeu_ps(residual + i, _mm512_maskz_mov_ps(static_cast<__mmask16>(~m), v));
    w += cnt;
  }
  return w + gather_bits_tail(in, residual, i, n, bits, invert, out + w);
}

// The keys whose top bits match, compressed 16 at a time (in a register, stored whole: sub has
// room for n, and the store at m <= j stays below j + 16).
GW_AVX512 size_t select_compact(const uint32_t* key, size_t n, uint32_t shift, uint32_t want,
                                uint32_t* sub) {
  const __m512i w = _mm512_set1_epi32(static_cast<int>(want));
  const __m128i sh = _mm_cvtsi32_si128(static_cast<int>(shift));
  size_t m = 0, j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i k = _mm512_loadu_si512(key + j);
    const __mmask16 hit = _mm512_cmpeq_epi32_mask(_mm512_srl_epi32(k, sh), w);
    _mm512_storeu_si512(sub + m, _mm512_maskz_compress_epi32(hit, k));
    m += static_cast<size_t>(std::popcount(static_cast<unsigned>(hit)));
  }
  return m + portable::select_compact(key + j, n - j, shift, want, sub + m);
}

// 16 candidates at a time: the kept lanes (key > t, and the first of the ties while any are left:
// equal keys are rare, so they take a scalar step) compressed in registers and stored whole at
// the write position (<= j: the lanes it overwrites were loaded already). The residual fix-up
// (a minority of lanes) is a scalar loop over the differing lanes' bits.
GW_AVX512 size_t keep_best_scan(uint32_t* idx, float* val, const uint32_t* key, size_t n,
                                uint32_t t, size_t ties, float* restore, float take_t) {
  const __m512i tv = _mm512_set1_epi32(static_cast<int>(t));
  const __m512 tt = _mm512_set1_ps(take_t);
  size_t w = 0, j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m512i k = _mm512_loadu_si512(key + j);
    const __m512i iv = _mm512_loadu_si512(idx + j);
    const __m512 vv = _mm512_loadu_ps(val + j);
    unsigned keep = _mm512_cmpgt_epu32_mask(k, tv);
    unsigned eq = _mm512_cmpeq_epu32_mask(k, tv);
    while (eq != 0 && ties > 0) {  // the lowest lanes first: the lower indices win the ties
      keep |= eq & (0u - eq);
      eq &= eq - 1;
      --ties;
    }
    const __mmask16 km = static_cast<__mmask16>(keep);
    _mm512_storeu_si512(idx + w, _mm512_maskz_compress_epi32(km, iv));
    _mm512_storeu_ps(val + w, _mm512_maskz_compress_ps(km, vv));
    if (restore) {
      const unsigned taken = _mm512_cmp_ps_mask(_mm512_abs_ps(vv), tt, _CMP_GE_OQ);
      unsigned diff = (taken ^ keep) & 0xFFFFu;
      if (diff != 0) {
        alignas(64) uint32_t li[16];
        alignas(64) float lv[16];
        _mm512_store_si512(li, iv);
        _mm512_store_ps(lv, vv);
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

#undef GW_AVX512

}  // namespace gw::coll::codec_kernels::avx512
