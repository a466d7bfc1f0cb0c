// Every vector path of the codec kernels against the portable one, bit for bit: QSGD's whole
// encoding and decode (qsgd_kernels.h), and the AVX-512 versions of the codec_kernels.h kernels.
// Sizes cover the vector tails; the inputs include zeros of both signs, NaN, Inf and values whose
// squares overflow f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "collectives/compress/codec.h"
#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/qsgd_kernels.h"

namespace gw::coll {
namespace {

namespace ck = codec_kernels;

std::vector<float> data(size_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  if (specials && n > 40) {
    v[1] = 0.0f;
    v[2] = -0.0f;
    v[5] = std::numeric_limits<float>::quiet_NaN();
    v[n - 3] = std::numeric_limits<float>::infinity();
    v[n / 2] = 3e20f;        // its square overflows f32: the norm is summed again in f64
    v[n / 2 + 1] = -1e-40f;  // subnormal
  }
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  // memcmp may not be given an empty vector's data() (null): UBSan's nonnull check.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

using QsgdEncode = void (*)(const float*, float*, size_t, size_t, int, uint32_t, uint8_t*);
using QsgdDecode = size_t (*)(const uint8_t*, size_t, size_t, int, float*, bool);

void expect_qsgd_path_matches(QsgdEncode enc, QsgdDecode dec, const char* name) {
  for (size_t count : {size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{100}, size_t{1000},
                       size_t{4099}, size_t{70000}}) {
    for (size_t bucket : {size_t{7}, size_t{64}, size_t{512}, size_t{100000}}) {
      for (int levels : {1, 8, 127}) {
        for (bool specials : {false, true}) {
          SCOPED_TRACE(testing::Message() << name << " count " << count << " bucket " << bucket
                                          << " levels " << levels << " specials " << specials);
          const auto in = data(count, static_cast<uint32_t>(count + bucket + levels), specials);
          const auto res0 = data(count, 7, false);
          const size_t size = (count + bucket - 1) / bucket * 4 + count;
          std::vector<uint8_t> want(size), got(size);
          auto want_res = res0, got_res = res0;
          ck::portable::qsgd_encode(in.data(), want_res.data(), count, bucket, levels, 99,
                                    want.data());
          enc(in.data(), got_res.data(), count, bucket, levels, 99, got.data());
          ASSERT_EQ(want, got);
          ASSERT_TRUE(same_bits(want_res, got_res));
          ck::portable::qsgd_encode(in.data(), nullptr, count, bucket, levels, 5, want.data());
          enc(in.data(), nullptr, count, bucket, levels, 5, got.data());
          ASSERT_EQ(want, got);
          for (bool add : {false, true}) {
            auto want_acc = res0, got_acc = res0;
            ASSERT_EQ(
                ck::portable::qsgd_decode(want.data(), count, bucket, levels, want_acc.data(), add),
                count);
            ASSERT_EQ(dec(want.data(), count, bucket, levels, got_acc.data(), add), count);
            ASSERT_TRUE(same_bits(want_acc, got_acc));
          }
          // A level outside +-levels: both stop at the same element.
          auto bad = want;
          const size_t at = count * 2 / 3;
          bad[size - count + at] = static_cast<uint8_t>(levels + 1);
          std::vector<float> acc(count, 0.0f);
          EXPECT_EQ(ck::portable::qsgd_decode(bad.data(), count, bucket, levels, acc.data(), true),
                    at);
          EXPECT_EQ(dec(bad.data(), count, bucket, levels, acc.data(), true), at);
        }
      }
    }
  }
}

TEST(CodecIsa, QsgdAvx2MatchesPortable) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  expect_qsgd_path_matches(ck::avx2::qsgd_encode, ck::avx2::qsgd_decode, "avx2");
}

TEST(CodecIsa, QsgdAvx512MatchesPortable) {
  if (!ck::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 (F, BW, DQ, VL) on this CPU";
  expect_qsgd_path_matches(ck::avx512::qsgd_encode, ck::avx512::qsgd_decode, "avx512");
}

TEST(CodecIsa, QsgdLevelsAreUnbiasedAndBounded) {
  // One bucket of equal magnitudes: a = levels * |v| / norm is the same for all, so the mean
  // level over many elements is a (the rounding draw is uniform), and no level exceeds levels.
  const size_t n = 1 << 16;
  std::vector<float> in(n, 0.37f);
  in[0] = -0.37f;
  std::vector<uint8_t> out(4 + n);
  ck::qsgd_encode(in.data(), nullptr, n, n, 100, 1234, out.data());
  float norm;
  std::memcpy(&norm, out.data(), 4);
  const double a = 100.0 * 0.37 / norm;
  double sum = 0;
  for (size_t i = 1; i < n; ++i) {
    const int lv = static_cast<int8_t>(out[4 + i]);
    ASSERT_GE(lv, static_cast<int>(std::floor(a)));
    ASSERT_LE(lv, static_cast<int>(std::floor(a)) + 1);
    sum += lv;
  }
  EXPECT_NEAR(sum / (n - 1), a, 0.01);
  EXPECT_LE(static_cast<int8_t>(out[4]), 0);
}

// The encoding against its definition (qsgd_kernels.h), element by element, with the bucket's
// norm as the encoder wrote it (checked against an f64 norm): level = sign(v) *
// min(floor(fma(|v|, levels / norm, u)), levels), u = qsgd_uniform(key, bucket start, index in
// the bucket), 0 for a NaN. Without a residual the field is the norm; with one (error feedback)
// the levels are the same, the field is norm * qsgd_ef_shrink(bucket's n, levels) rounded once,
// and residual = fma(-level, field / levels, v). The dispatching entry point (the widest path
// here) is what is checked; the paths' agreement is the tests above. Buckets and counts that are
// not multiples of the vector widths (16, 32, 64), zeros of both signs, NaN, Inf, subnormals.
TEST(CodecIsa, QsgdEncodingFollowsItsDefinition) {
  for (size_t count : {size_t{1}, size_t{33}, size_t{100}, size_t{1000}, size_t{5003}}) {
    for (size_t bucket : {size_t{7}, size_t{64}, size_t{100}, size_t{512}}) {
      for (int levels : {1, 8, 127}) {
        SCOPED_TRACE(testing::Message()
                     << "count " << count << " bucket " << bucket << " levels " << levels);
        const auto in = data(count, static_cast<uint32_t>(3 * count + bucket), true);
        const auto res0 = data(count, 11, false);
        std::vector<float> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = in[i] + res0[i];
        const size_t nb = (count + bucket - 1) / bucket;
        std::vector<uint8_t> plain(nb * 4 + count), out(nb * 4 + count);
        auto res = res0;
        const uint32_t key = 0xC0FFEEu + static_cast<uint32_t>(levels);
        ck::qsgd_encode(v.data(), nullptr, count, bucket, levels, key, plain.data());
        ck::qsgd_encode(in.data(), res.data(), count, bucket, levels, key, out.data());
        ASSERT_EQ(std::memcmp(plain.data() + nb * 4, out.data() + nb * 4, count), 0)
            << "error feedback changed the levels";
        for (size_t b = 0; b < nb; ++b) {
          const size_t off = b * bucket, n = std::min(bucket, count - off);
          float norm, field;
          std::memcpy(&norm, plain.data() + 4 * b, 4);
          std::memcpy(&field, out.data() + 4 * b, 4);
          double sq = 0;
          for (size_t j = 0; j < n; ++j) sq += static_cast<double>(v[off + j]) * v[off + j];
          if (std::isfinite(sq)) {
            ASSERT_NEAR(norm, std::sqrt(sq), 1e-5 * std::sqrt(sq)) << "bucket " << b;
          } else {
            ASSERT_FALSE(std::isfinite(norm)) << "bucket " << b;
          }
          const float want_field = norm * ck::qsgd_ef_shrink(n, levels);
          ASSERT_EQ(std::memcmp(&field, &want_field, 4), 0) << "bucket " << b;
          const float s = static_cast<float>(levels);
          const float inv = norm > 0 && std::isfinite(norm) ? s / norm : 0.0f;
          for (size_t j = 0; j < n; ++j) {
            const float x = v[off + j];
            // |t| = |v| * inv + u with one rounding; its floor, at most levels, with v's sign.
            const float t = std::fma(std::fabs(x), inv, ck::qsgd_uniform(key, off, j));
            const int lv = std::isnan(t) ? 0 : t >= s ? levels : static_cast<int>(std::floor(t));
            const int want = std::signbit(x) ? -lv : lv;
            ASSERT_EQ(static_cast<int8_t>(plain[nb * 4 + off + j]), want) << "element " << off + j;
            const float want_res = std::fma(-static_cast<float>(want), field / s, x);
            ASSERT_EQ(std::memcmp(&res[off + j], &want_res, 4), 0)
                << "element " << off + j << ": " << res[off + j] << " vs " << want_res;
          }
        }
      }
    }
  }
}

// The shrink with error feedback, 1 / (1 + omega), omega = min(n / (4 levels^2), sqrt(n) /
// levels): qsgd:8 with 512-element buckets sends a third of C(v) (omega = 2), qsgd:127 almost all
// of it, and a one-element bucket with 127 levels nearly all.
TEST(CodecIsa, QsgdErrorFeedbackShrinkIsOneOverOnePlusOmega) {
  EXPECT_FLOAT_EQ(ck::qsgd_ef_shrink(512, 8), 1.0f / 3.0f);
  EXPECT_FLOAT_EQ(ck::qsgd_ef_shrink(512, 127), static_cast<float>(1.0 / (1.0 + 512.0 / 64516.0)));
  EXPECT_FLOAT_EQ(ck::qsgd_ef_shrink(512, 1), static_cast<float>(1.0 / (1.0 + std::sqrt(512.0))));
  EXPECT_FLOAT_EQ(ck::qsgd_ef_shrink(1, 127), static_cast<float>(1.0 / (1.0 + 1.0 / 64516.0)));
  for (size_t n : {size_t{1}, size_t{7}, size_t{512}, size_t{1} << 20}) {
    for (int levels : {1, 2, 8, 127}) {
      const float f = ck::qsgd_ef_shrink(n, levels);
      EXPECT_GT(f, 0.0f);
      EXPECT_LE(f, 1.0f);
    }
  }
}

// The draws: every element of a tensor gets its own (hash input, half) pair, so no two elements
// share a draw, whatever the bucket size; and they are uniform on [0, 1) in steps of 2^-16.
TEST(CodecIsa, QsgdDrawsAreDistinctPerElementAndUniform) {
  for (size_t bucket : {size_t{1}, size_t{7}, size_t{16}, size_t{17}, size_t{33}, size_t{512}}) {
    const size_t count = 4096 + 5;
    std::vector<uint64_t> seen;
    for (size_t off = 0; off < count; off += bucket) {
      for (size_t j = 0; j < std::min(bucket, count - off); ++j) {
        seen.push_back((off + (j / 32) * 16 + j % 16) * 2 + (j / 16) % 2);
      }
    }
    std::sort(seen.begin(), seen.end());
    ASSERT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "bucket " << bucket;
  }
  double sum = 0;
  int below_quarter = 0;
  const size_t n = 1 << 16;
  for (size_t j = 0; j < n; ++j) {
    const float u = ck::qsgd_uniform(77, 512 * (j / 512), j % 512);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    ASSERT_EQ(u * 65536.0f, std::floor(u * 65536.0f));
    sum += u;
    below_quarter += u < 0.25f;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_NEAR(static_cast<double>(below_quarter) / n, 0.25, 0.01);
}

// Top-k's selection kernels: a vector path's compactions against the portable ones, with ties at
// the threshold (kept lowest index first, as many as asked), runs of equal top bits, keys with the
// top bit set (unsigned order), NaN values (never taken), lengths around the vector widths, and
// the residual fix-up.
using SelectCompact = size_t (*)(const uint32_t*, size_t, uint32_t, uint32_t, uint32_t*);
using KeepBestScan = size_t (*)(uint32_t*, float*, const uint32_t*, size_t, uint32_t, size_t,
                                float*, float);

void expect_topk_selection_matches(SelectCompact compact, KeepBestScan scan) {
  std::mt19937 rng(17);
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{15}, size_t{16},
                   size_t{17}, size_t{47}, size_t{1000}, size_t{20001}}) {
    SCOPED_TRACE(testing::Message() << "n " << n);
    std::vector<uint32_t> key(n), idx(n);
    std::vector<float> val(n);
    for (size_t j = 0; j < n; ++j) {
      key[j] = (rng() % 8) << 21 | (rng() % 4) << 10 | rng() % 3;  // many equal keys
      if (j % 11 == 3) key[j] |= 0x80000000u;  // above every other key as unsigned
      idx[j] = static_cast<uint32_t>(3 * j + 1);
      val[j] = (rng() % 2 ? -1.0f : 1.0f) * static_cast<float>(rng() % 100) / 10.0f;
      if (j % 37 == 5) val[j] = std::numeric_limits<float>::quiet_NaN();
    }
    for (uint32_t want : {0u, 3u, 7u, 9u, 0x400u + 3u}) {
      std::vector<uint32_t> a(n + 16, 1), b(n + 16, 1);
      const size_t ma = ck::portable::select_compact(key.data(), n, 21, want, a.data());
      const size_t mb = compact(key.data(), n, 21, want, b.data());
      ASSERT_EQ(ma, mb) << "want " << want;
      ASSERT_TRUE(std::equal(a.begin(), a.begin() + ma, b.begin())) << "want " << want;
      // In place, the second step of the radix select.
      const size_t ia = ck::portable::select_compact(a.data(), ma, 10, want * 4 + 1, a.data());
      const size_t ib = compact(b.data(), mb, 10, want * 4 + 1, b.data());
      ASSERT_EQ(ia, ib);
      ASSERT_TRUE(std::equal(a.begin(), a.begin() + ia, b.begin()));
    }
    for (uint32_t t : {0u, (3u << 21) | (2u << 10) | 1u, 8u << 21, 0x80000000u | (5u << 21)}) {
      for (size_t ties : {size_t{0}, size_t{1}, size_t{5}, n}) {
        for (bool fix : {false, true}) {
          auto ia = idx, ib = idx;
          auto va = val, vb = val;
          std::vector<float> ra(3 * n + 1, 0.5f), rb = ra;
          const size_t wa = ck::portable::keep_best_scan(ia.data(), va.data(), key.data(), n, t,
                                                         ties, fix ? ra.data() : nullptr, 4.0f);
          const size_t wb =
              scan(ib.data(), vb.data(), key.data(), n, t, ties, fix ? rb.data() : nullptr, 4.0f);
          ASSERT_EQ(wa, wb) << "t " << t << " ties " << ties;
          ia.resize(wa);
          ib.resize(wb);
          va.resize(wa);
          vb.resize(wb);
          ASSERT_EQ(ia, ib) << "t " << t << " ties " << ties;
          ASSERT_TRUE(same_bits(va, vb));
          ASSERT_TRUE(same_bits(ra, rb)) << "t " << t << " ties " << ties;
          // The definition: every key above t, then the first `ties` equal ones.
          size_t above = 0, eq = 0;
          for (uint32_t k : key) {
            above += k > t;
            eq += k == t;
          }
          ASSERT_EQ(wa, above + std::min(ties, eq));
        }
      }
    }
  }
}

TEST(CodecIsa, TopkSelectionKernelsAvx512MatchPortable) {
  if (!ck::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 (F, BW, DQ, VL) on this CPU";
  expect_topk_selection_matches(ck::avx512::select_compact, ck::avx512::keep_best_scan);
}

TEST(CodecIsa, TopkSelectionKernelsAvx2MatchPortable) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  expect_topk_selection_matches(ck::avx2::select_compact, ck::avx2::keep_best_scan);
}

// Restores the widest dispatch when a test that narrowed it ends (also on a failed assertion).
struct IsaCapGuard {
  ~IsaCapGuard() { ck::cap_isa(ck::IsaCap::kAvx512); }
};

// The whole top-k and qsgd encodings with the dispatch capped at each path this CPU has: the same
// bytes and residuals as the portable path (top-k's sampled pass with take and its fix-ups, its
// exact selection, and ties; qsgd with error feedback), and isa() names the path taken.
TEST(CodecIsa, TopkAndQsgdEncodeTheSameBytesUnderEveryIsaCap) {
  IsaCapGuard guard;
  std::vector<ck::IsaCap> caps = {ck::IsaCap::kPortable};
  if (ck::cpu_has_avx2()) caps.push_back(ck::IsaCap::kAvx2);
  if (ck::cpu_has_avx512()) caps.push_back(ck::IsaCap::kAvx512);
  const char* const names[] = {"portable", "avx2", "avx512"};
  for (size_t n : {size_t{70001}, size_t{(1 << 20) + 3}}) {
    auto g = data(n, static_cast<uint32_t>(n), true);
    for (size_t i = 100; i < 200; ++i) g[i] = 2.5f;  // ties at a large magnitude
    for (const char* spec : {"topk:0.01", "topk:0.3", "topk:0.01,ef=0", "qsgd:8"}) {
      SCOPED_TRACE(testing::Message() << spec << " n " << n);
      auto parsed = parse_codec_spec(spec);
      ASSERT_TRUE(parsed.ok());
      auto codec = Codec::create(*parsed);
      ASSERT_TRUE(codec.ok());
      const bool ef = (*codec)->spec().error_feedback;
      std::vector<uint8_t> want;
      std::vector<float> want_res;
      for (ck::IsaCap cap : caps) {
        ck::cap_isa(cap);
        ASSERT_EQ(ck::isa(), names[static_cast<int>(cap)]);
        auto res = data(n, 3, false);
        std::vector<uint8_t> out((*codec)->encoded_size(n));
        for (uint64_t step = 0; step < 2; ++step) {  // the second step sees a residual
          const CodecContext ctx{fnv1a64("t"), step, 1};
          ASSERT_TRUE(
              (*codec)
                  ->encode(g.data(), ef ? res.data() : nullptr, n, out.data(), out.size(), ctx)
                  .ok());
        }
        if (cap == ck::IsaCap::kPortable) {
          want = out;
          want_res = res;
        } else {
          ASSERT_EQ(want, out) << names[static_cast<int>(cap)];
          ASSERT_TRUE(same_bits(want_res, res)) << names[static_cast<int>(cap)];
        }
      }
    }
  }
}

TEST(CodecIsa, CastAvx512MatchesPortable) {
  if (!ck::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 (F, BW, DQ, VL) on this CPU";
  for (size_t n : {size_t{1}, size_t{8}, size_t{15}, size_t{16}, size_t{33}, size_t{1000}}) {
    for (bool bf16 : {false, true}) {
      auto in = data(n, static_cast<uint32_t>(n), true);
      if (n > 40) {  // a signalling NaN and a negative NaN with a payload: both come out quiet
        const uint32_t snan = 0x7F800001u, nan_payload = 0xFFBFFFFFu;
        std::memcpy(&in[7], &snan, 4);
        std::memcpy(&in[n - 9], &nan_payload, 4);
      }
      auto want_res = data(n, 3, false), got_res = want_res;
      std::vector<uint16_t> want(n), got(n);
      ck::portable::encode_cast16(in.data(), want_res.data(), n, want.data(), bf16);
      ck::avx512::encode_cast16(in.data(), got_res.data(), n, got.data(), bf16);
      ASSERT_EQ(want, got) << n << " bf16 " << bf16;
      ASSERT_TRUE(same_bits(want_res, got_res)) << n << " bf16 " << bf16;
      for (bool add : {false, true}) {
        auto want_acc = data(n, 4, false), got_acc = want_acc;
        ck::portable::decode_cast16(want.data(), n, want_acc.data(), bf16, add);
        ck::avx512::decode_cast16(want.data(), n, got_acc.data(), bf16, add);
        ASSERT_TRUE(same_bits(want_acc, got_acc)) << n << " bf16 " << bf16 << " add " << add;
      }
    }
  }
}

TEST(CodecIsa, SignEncodeAvx512MatchesPortable) {
  if (!ck::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 (F, BW, DQ, VL) on this CPU";
  for (size_t n : {size_t{1}, size_t{8}, size_t{17}, size_t{64}, size_t{100}, size_t{2048},
                   size_t{2047}, size_t{4096}}) {
    for (bool ef : {false, true}) {
      const auto in = data(n, static_cast<uint32_t>(n) + 11, n > 64);
      auto want_res = data(n, 5, false), got_res = want_res;
      std::vector<uint64_t> want((n + 63) / 64), got(want.size());
      const float ws = ck::portable::sign_encode_chunk(in.data(), ef ? want_res.data() : nullptr, n,
                                                       want.data());
      const float gs =
          ck::avx512::sign_encode_chunk(in.data(), ef ? got_res.data() : nullptr, n, got.data());
      ASSERT_EQ(std::memcmp(&ws, &gs, 4), 0) << n << " ef " << ef;
      ASSERT_EQ(want, got) << n << " ef " << ef;
      ASSERT_TRUE(same_bits(want_res, got_res)) << n << " ef " << ef;
    }
  }
}

TEST(CodecIsa, TopkCollectAvx512MatchesPortable) {
  if (!ck::cpu_has_avx512()) GTEST_SKIP() << "no AVX-512 (F, BW, DQ, VL) on this CPU";
  for (size_t n : {size_t{5}, size_t{16}, size_t{31}, size_t{5000}, size_t{70001}}) {
    for (float threshold : {0.0f, 1.5f, 2.5f, std::numeric_limits<float>::quiet_NaN()}) {
      const auto in = data(n, static_cast<uint32_t>(n) + 21, n > 64);
      auto want_res = data(n, 6, false), got_res = want_res;
      std::vector<uint32_t> wi, gi;
      std::vector<float> wv, gv;
      ck::portable::add_collect_abs_ge(in.data(), want_res.data(), n, threshold, 7, &wi, &wv);
      ck::avx512::add_collect_abs_ge(in.data(), got_res.data(), n, threshold, 7, &gi, &gv);
      ASSERT_EQ(wi, gi) << n << " threshold " << threshold;
      ASSERT_TRUE(same_bits(wv, gv)) << n;
      ASSERT_TRUE(same_bits(want_res, got_res)) << n;
      // take: the candidates leave the residual (0), on every path.
      auto take_res = data(n, 6, false), take_res2 = take_res, take_res3 = take_res;
      std::vector<uint32_t> ti, ti2, ti3;
      std::vector<float> tv, tv2, tv3;
      ck::portable::add_collect_abs_ge(in.data(), take_res.data(), n, threshold, 0, &ti, &tv, true);
      ck::avx512::add_collect_abs_ge(in.data(), take_res2.data(), n, threshold, 0, &ti2, &tv2,
                                     true);
      ck::avx2::add_collect_abs_ge(in.data(), take_res3.data(), n, threshold, 0, &ti3, &tv3, true);
      ASSERT_EQ(ti, ti2);
      ASSERT_EQ(ti, ti3);
      ASSERT_TRUE(same_bits(take_res, take_res2)) << n;
      ASSERT_TRUE(same_bits(take_res, take_res3)) << n;
      for (size_t j = 0; j < ti.size(); ++j) {
        ASSERT_EQ(take_res[ti[j]], 0.0f);
        take_res[ti[j]] = tv[j];
      }
      ASSERT_TRUE(same_bits(take_res, want_res)) << n;
      wi.clear();
      gi.clear();
      ck::portable::add_collect_abs_ge(in.data(), nullptr, n, threshold, 0, &wi, nullptr);
      ck::avx512::add_collect_abs_ge(in.data(), nullptr, n, threshold, 0, &gi, nullptr);
      ASSERT_EQ(wi, gi) << n << " threshold " << threshold;
    }
  }
}

// Top-k's pass with a take threshold above the collect threshold: every path takes out (0) only
// the candidates with |v| >= the take threshold, and collects the same candidates and values.
TEST(CodecIsa, TopkCollectWithTakeThresholdAgreesAcrossPaths) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (size_t n : {size_t{5}, size_t{16}, size_t{31}, size_t{5000}, size_t{70001}}) {
    const auto in = data(n, static_cast<uint32_t>(n) + 23, n > 64);
    const auto r0 = data(n, 8, false);
    std::vector<float> res[3] = {r0, r0, r0};
    std::vector<uint32_t> idx[3];
    std::vector<float> val[3];
    ck::portable::add_collect_abs_ge(in.data(), res[0].data(), n, 1.0f, 3, &idx[0], &val[0], true,
                                     2.0f);
    ck::avx2::add_collect_abs_ge(in.data(), res[1].data(), n, 1.0f, 3, &idx[1], &val[1], true,
                                 2.0f);
    const int paths = ck::cpu_has_avx512() ? 3 : 2;
    if (paths == 3) {
      ck::avx512::add_collect_abs_ge(in.data(), res[2].data(), n, 1.0f, 3, &idx[2], &val[2], true,
                                     2.0f);
    }
    for (int p = 1; p < paths; ++p) {
      ASSERT_EQ(idx[0], idx[p]) << n << " path " << p;
      ASSERT_TRUE(same_bits(val[0], val[p])) << n << " path " << p;
      ASSERT_TRUE(same_bits(res[0], res[p])) << n << " path " << p;
    }
    for (size_t i = 0; i < n; ++i) {
      const float v = in[i] + r0[i];
      const float want = std::fabs(v) >= 2.0f ? 0.0f : v;
      ASSERT_EQ(std::memcmp(&res[0][i], &want, 4), 0) << n << " at " << i;
    }
  }
}

// Random-k's pass: the chosen values (set bits, or clear bits with invert) in index order, the
// residual with them 0, the same bits on every path, and the count returned.
TEST(CodecIsa, GatherBitsTakeAgreesAcrossPathsAndWithItsDefinition) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(5);
  for (size_t n :
       {size_t{0}, size_t{5}, size_t{16}, size_t{63}, size_t{64}, size_t{1000}, size_t{70001}}) {
    std::vector<uint64_t> bits((n + 63) / 64 + 1);
    for (auto& w : bits) w = rng() & rng();  // about a quarter of the bits
    const auto in = data(n, static_cast<uint32_t>(n) + 31, n > 64);
    const auto r0 = data(n, 9, false);
    for (bool invert : {false, true}) {
      for (bool with_res : {false, true}) {
        std::vector<float> v(n), want_out, want_res(n);
        for (size_t i = 0; i < n; ++i) {
          v[i] = with_res ? in[i] + r0[i] : in[i];
          const bool chosen = ((bits[i / 64] >> (i % 64)) & 1u) != invert;
          if (chosen) want_out.push_back(v[i]);
          want_res[i] = chosen ? 0.0f : v[i];
        }
        const int paths = ck::cpu_has_avx512() ? 3 : 2;
        for (int p = 0; p < paths; ++p) {
          std::vector<float> out(want_out.size() + 16, 7.0f), res = r0;
          float* rp = with_res ? res.data() : nullptr;
          const size_t got =
              p == 0 ? ck::portable::gather_bits_take(in.data(), rp, n, bits.data(), invert,
                                                      out.data())
              : p == 1
                  ? ck::avx2::gather_bits_take(in.data(), rp, n, bits.data(), invert, out.data())
                  : ck::avx512::gather_bits_take(in.data(), rp, n, bits.data(), invert, out.data());
          ASSERT_EQ(got, want_out.size()) << n << " path " << p;
          // Nothing written past the last chosen value.
          for (size_t j = got; j < out.size(); ++j) ASSERT_EQ(out[j], 7.0f) << n << " path " << p;
          out.resize(got);
          ASSERT_TRUE(same_bits(out, want_out)) << n << " path " << p << " invert " << invert;
          if (with_res) {
            ASSERT_TRUE(same_bits(res, want_res)) << n << " path " << p;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gw::coll
