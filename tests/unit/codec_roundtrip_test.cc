// The local half of every codec: round-trip error bounds, exact top-k, the error-feedback
// invariant over many steps, shared-seed random-k, PowerSGD on a known-rank matrix, vector and
// portable kernels agreeing bit for bit, and corrupt encodings rejected.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "collectives/compress/codec.h"
#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/powersgd.h"
#include "tests/support/codec_test_util.h"

namespace gw::coll {
namespace {

namespace ck = codec_kernels;

using ::gw::testing::gaussian;
std::unique_ptr<Codec> make(const char* text) { return ::gw::testing::make_codec(text); }

std::vector<float> roundtrip(const Codec& c, const std::vector<float>& in,
                             std::vector<float>* residual, const CodecContext& ctx = {}) {
  std::vector<uint8_t> enc(c.encoded_size(in.size()));
  Status st = c.encode(in.data(), residual ? residual->data() : nullptr, in.size(), enc.data(),
                       enc.size(), ctx);
  EXPECT_TRUE(st.ok()) << st.to_string();
  std::vector<float> out(in.size(), 0.0f);
  st = c.decode_add(enc.data(), enc.size(), in.size(), out.data(), ctx);
  EXPECT_TRUE(st.ok()) << st.to_string();
  return out;
}

TEST(CodecRoundTrip, Fp16WithinHalfAnUlp) {
  auto c = make("fp16");
  auto in = gaussian(10007, 1, 10.0f);
  auto out = roundtrip(*c, in, nullptr);
  for (size_t i = 0; i < in.size(); ++i) {
    // Normal halves carry 11 significant bits: relative error <= 2^-11 (plus the subnormal step).
    EXPECT_LE(std::fabs(out[i] - in[i]), std::fabs(in[i]) * 0x1p-11f + 0x1p-25f) << i;
  }
  EXPECT_EQ(c->encoded_size(in.size()), in.size() * 2);
}

TEST(CodecRoundTrip, Bf16WithinHalfAnUlp) {
  auto c = make("bf16");
  auto in = gaussian(10007, 2, 1e6f);
  auto out = roundtrip(*c, in, nullptr);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_LE(std::fabs(out[i] - in[i]), std::fabs(in[i]) * 0x1p-8f) << i;
  }
}

TEST(CodecRoundTrip, Fp16OverflowBecomesInfinityNotGarbage) {
  auto c = make("fp16");
  std::vector<float> in = {70000.0f, -70000.0f, 65504.0f, 1.0f};
  auto out = roundtrip(*c, in, nullptr);
  EXPECT_TRUE(std::isinf(out[0]) && out[0] > 0);
  EXPECT_TRUE(std::isinf(out[1]) && out[1] < 0);
  EXPECT_EQ(out[2], 65504.0f);
  EXPECT_EQ(out[3], 1.0f);
}

TEST(CodecRoundTrip, SignKeepsSignsAndMeanMagnitudePerChunk) {
  auto c = make("sign,chunk=128");
  auto in = gaussian(1000, 3);
  auto out = roundtrip(*c, in, nullptr);
  for (size_t off = 0; off < in.size(); off += 128) {
    const size_t n = std::min<size_t>(128, in.size() - off);
    double mean = 0;
    for (size_t i = 0; i < n; ++i) mean += std::fabs(in[off + i]);
    mean /= n;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_EQ(std::signbit(out[off + i]), std::signbit(in[off + i]));
      EXPECT_NEAR(std::fabs(out[off + i]), mean, 1e-5 * mean);
    }
  }
  // ||v - s sign(v)||^2 = ||v||^2 - n s^2 per chunk: the error is never larger than the input.
  double err = 0, norm = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    err += (out[i] - in[i]) * (out[i] - in[i]);
    norm += in[i] * in[i];
  }
  EXPECT_LT(err, norm);
  EXPECT_EQ(c->encoded_size(1000), 8u * (4 + 16));
}

TEST(CodecRoundTrip, QsgdWithinOneLevelAndUnbiased) {
  auto c = make("qsgd:8,bucket=64");
  auto in = gaussian(640, 4);
  std::vector<double> mean(in.size(), 0.0);
  const int trials = 400;
  for (int t = 0; t < trials; ++t) {
    CodecContext ctx;
    ctx.step = t;
    auto out = roundtrip(*c, in, nullptr, ctx);
    for (size_t b = 0; b < in.size(); b += 64) {
      double sq = 0;
      for (size_t i = 0; i < 64; ++i) sq += in[b + i] * in[b + i];
      const double step = std::sqrt(sq) / 8;
      for (size_t i = 0; i < 64; ++i) {
        ASSERT_LE(std::fabs(out[b + i] - in[b + i]), step * (1 + 1e-5)) << b + i;
        mean[b + i] += out[b + i];
      }
    }
  }
  double max_bias = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    max_bias = std::max(max_bias, std::fabs(mean[i] / trials - in[i]));
  }
  // One level is ~1.0 here; the mean of 400 draws is within a few standard errors (<= 0.5/20).
  EXPECT_LT(max_bias, 0.12);
}

TEST(CodecRoundTrip, RandomkSendsExactlyTheChosenValues) {
  auto c = make("randomk:0.1,ef=0");
  auto in = gaussian(1000, 5);
  CodecContext ctx{fnv1a64("layer1"), 7, 0};
  auto out = roundtrip(*c, in, nullptr, ctx);
  auto idx = randomk_indices(0, ctx, 1000, 100);
  size_t nonzero = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool chosen = std::binary_search(idx.begin(), idx.end(), static_cast<uint32_t>(i));
    EXPECT_EQ(out[i], chosen ? in[i] : 0.0f) << i;
    nonzero += out[i] != 0.0f;
  }
  EXPECT_EQ(nonzero, 100u);
}

TEST(CodecRandomk, SameIndicesOnEveryRankDifferentPerStepAndKey) {
  const size_t n = 100000, k = 1000;
  CodecContext r0{fnv1a64("w"), 3, 0}, r1{fnv1a64("w"), 3, 1}, r5{fnv1a64("w"), 3, 5};
  auto a = randomk_indices(11, r0, n, k);
  EXPECT_EQ(a, randomk_indices(11, r1, n, k));
  EXPECT_EQ(a, randomk_indices(11, r5, n, k));
  ASSERT_EQ(a.size(), k);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  EXPECT_LT(a.back(), n);
  CodecContext next_step{fnv1a64("w"), 4, 0}, other_key{fnv1a64("b"), 3, 0};
  EXPECT_NE(a, randomk_indices(11, next_step, n, k));
  EXPECT_NE(a, randomk_indices(11, other_key, n, k));
  EXPECT_NE(a, randomk_indices(12, r0, n, k));
  // More than half: the complement path still gives k distinct in-range indices.
  auto big = randomk_indices(1, r0, 1000, 900);
  ASSERT_EQ(big.size(), 900u);
  EXPECT_EQ(std::adjacent_find(big.begin(), big.end()), big.end());
  EXPECT_LT(big.back(), 1000u);
  EXPECT_EQ(randomk_indices(1, r0, 77, 77).size(), 77u);
}

// Reference: the k largest magnitudes by a full sort, ties to the lower index.
std::vector<uint32_t> reference_topk(const std::vector<float>& v, size_t k) {
  std::vector<uint32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0u);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return std::fabs(v[a]) > std::fabs(v[b]); });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

TEST(CodecTopk, PicksExactlyTheKLargestMagnitudes) {
  for (size_t n : {1u, 10u, 1000u, 300000u, 1u << 20}) {
    for (double ratio : {0.001, 0.01, 0.3, 1.0}) {
      auto v = gaussian(n, static_cast<uint32_t>(n));
      const size_t k = topk_count(ratio, n);
      EXPECT_EQ(topk_select(v.data(), n, k), reference_topk(v, k)) << n << " " << ratio;
    }
  }
}

TEST(CodecTopk, HandlesTiesZerosAndSkewedData) {
  const size_t n = 1 << 19;
  std::vector<float> v(n, 0.0f);  // mostly zeros: the sampled threshold is 0, exact fallback
  for (size_t i = 0; i < n; i += 97) v[i] = (i % 3 == 0) ? -2.0f : 1.0f;
  for (size_t k : {10u, 1000u, 6000u}) EXPECT_EQ(topk_select(v.data(), n, k), reference_topk(v, k));
  std::vector<float> ties(n, 1.5f);  // all equal: lowest indices win
  auto t = topk_select(ties.data(), n, 100);
  ASSERT_EQ(t.size(), 100u);
  for (uint32_t i = 0; i < 100; ++i) EXPECT_EQ(t[i], i);
  auto heavy = gaussian(n, 9);
  for (size_t i = 0; i < n; i += 5000) heavy[i] *= 1e6f;  // a few huge outliers
  EXPECT_EQ(topk_select(heavy.data(), n, 5000), reference_topk(heavy, 5000));
}

TEST(CodecTopk, NaNIsNeverPickedOverANumberAndNeverCrashes) {
  std::vector<float> v = gaussian(1000, 6);
  v[3] = std::nanf("");
  v[500] = std::nanf("");
  auto idx = topk_select(v.data(), v.size(), 10);
  EXPECT_EQ(idx.size(), 10u);
  EXPECT_FALSE(std::binary_search(idx.begin(), idx.end(), 3u));
}

TEST(CodecTopk, EncodeDecodeCarriesIndexValuePairs) {
  auto c = make("topk:0.01,ef=0");
  auto in = gaussian(50000, 7);
  auto out = roundtrip(*c, in, nullptr);
  const auto ref = reference_topk(in, 500);
  size_t nonzero = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const bool chosen = std::binary_search(ref.begin(), ref.end(), static_cast<uint32_t>(i));
    EXPECT_EQ(out[i], chosen ? in[i] : 0.0f);
    nonzero += out[i] != 0;
  }
  EXPECT_EQ(nonzero, 500u);
  EXPECT_EQ(c->encoded_size(50000), 8u + 500 * 8);
}

// What was sent plus the residual equals the sum of the gradients, step after step.
TEST(CodecErrorFeedback, SentPlusResidualEqualsSumOfGradients) {
  const size_t n = 4099;
  for (const char* spec : {"fp16,ef=1", "bf16,ef=1", "topk:0.01", "randomk:0.05", "sign,chunk=256",
                           "qsgd:4,bucket=100"}) {
    auto c = make(spec);
    std::vector<float> residual(n, 0.0f);
    std::vector<double> sum_in(n, 0.0), sum_sent(n, 0.0);
    for (int step = 0; step < 25; ++step) {
      auto g = gaussian(n, 100 + step, step % 2 ? 1.0f : 1e-3f);
      CodecContext ctx{fnv1a64("t"), static_cast<uint64_t>(step), 0};
      auto sent = roundtrip(*c, g, &residual, ctx);
      double worst = 0, scale = 0;
      for (size_t i = 0; i < n; ++i) {
        sum_in[i] += g[i];
        sum_sent[i] += sent[i];
        worst = std::max(worst, std::fabs(sum_sent[i] + residual[i] - sum_in[i]));
        scale = std::max(scale, std::fabs(sum_in[i]));
      }
      ASSERT_LE(worst, 1e-5 * (scale + 1)) << spec << " step " << step;
    }
    // The residual stays bounded (error feedback does not let it grow without limit).
    double rn = 0, gn = 0;
    for (size_t i = 0; i < n; ++i) {
      rn = std::max(rn, static_cast<double>(std::fabs(residual[i])));
      gn = std::max(gn, std::fabs(sum_in[i]));
    }
    EXPECT_LT(rn, 100.0) << spec;
  }
}

TEST(CodecErrorFeedback, SmallGradientsEventuallyGetThroughTopk) {
  // One coordinate is always 10x smaller than the 99 others and k = 1: every other coordinate
  // peaks at ~99 before it is sent, so coordinate 42 gets through after ~990 steps (never
  // without error feedback).
  auto c = make("topk:0.01");
  const size_t n = 100;
  std::vector<float> residual(n, 0.0f);
  double delivered = 0;
  for (int step = 0; step < 1500; ++step) {
    std::vector<float> g(n, 1.0f);
    g[42] = 0.1f;
    CodecContext ctx{1, static_cast<uint64_t>(step), 0};
    auto sent = roundtrip(*c, g, &residual, ctx);
    delivered += sent[42];
  }
  EXPECT_GT(delivered, 0.0);
}

TEST(CodecKernels, VectorAndPortablePathsAgreeBitForBit) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  auto in = gaussian(4133, 8, 3.0f);
  in[5] = std::nanf("");
  in[6] = INFINITY;
  in[7] = -0.0f;
  in[8] = 1e-6f;  // fp16 subnormal
  in[9] = 1e5f;   // fp16 overflow
  for (bool bf16 : {false, true}) {
    auto r1 = gaussian(in.size(), 9, 0.01f), r2 = r1;
    std::vector<uint16_t> o1(in.size()), o2(in.size());
    ck::portable::encode_cast16(in.data(), r1.data(), in.size(), o1.data(), bf16);
    ck::avx2::encode_cast16(in.data(), r2.data(), in.size(), o2.data(), bf16);
    EXPECT_EQ(o1, o2) << bf16;
    EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * 4)) << bf16;
    std::vector<float> d1(in.size(), 1.0f), d2 = d1;
    ck::portable::decode_cast16(o1.data(), o1.size(), d1.data(), bf16, true);
    ck::avx2::decode_cast16(o1.data(), o1.size(), d2.data(), bf16, true);
    EXPECT_EQ(0, std::memcmp(d1.data(), d2.data(), d1.size() * 4)) << bf16;
  }
  auto v = gaussian(2048 + 37, 10);
  v[100] = -0.0f;
  for (size_t n : {2085u, 64u, 63u, 1u}) {
    auto r1 = gaussian(n, 11, 0.1f), r2 = r1;
    std::vector<uint64_t> w1((n + 63) / 64), w2(w1.size());
    const float s1 = ck::portable::sign_encode_chunk(v.data(), r1.data(), n, w1.data());
    const float s2 = ck::avx2::sign_encode_chunk(v.data(), r2.data(), n, w2.data());
    EXPECT_EQ(std::bit_cast<uint32_t>(s1), std::bit_cast<uint32_t>(s2)) << n;
    EXPECT_EQ(w1, w2) << n;
    EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), n * 4)) << n;
    std::vector<float> a1(n, 0.5f), a2 = a1;
    ck::portable::sign_decode_add(w1.data(), s1, n, a1.data());
    ck::avx2::sign_decode_add(w1.data(), s1, n, a2.data());
    EXPECT_EQ(0, std::memcmp(a1.data(), a2.data(), n * 4)) << n;
  }
  std::vector<uint32_t> c1, c2;
  ck::portable::collect_abs_ge(v.data(), v.size(), 1.5f, 10, &c1);
  ck::avx2::collect_abs_ge(v.data(), v.size(), 1.5f, 10, &c2);
  EXPECT_EQ(c1, c2);
  EXPECT_FALSE(c1.empty());
}

TEST(CodecDecode, CorruptOrTruncatedEncodingsAreRejected) {
  const size_t n = 1000;
  auto in = gaussian(n, 12);
  std::vector<float> acc(n, 0.0f);
  for (const char* spec : {"fp16", "bf16", "topk:0.01", "randomk:0.1", "sign", "qsgd:4"}) {
    auto c = make(spec);
    std::vector<uint8_t> enc(c->encoded_size(n));
    ASSERT_TRUE(c->encode(in.data(), nullptr, n, enc.data(), enc.size(), {}).ok());
    EXPECT_EQ(c->decode_add(enc.data(), enc.size() - 1, n, acc.data(), {}).code(),
              Code::kInvalidArg)
        << spec;
    EXPECT_EQ(c->encode(in.data(), nullptr, n, enc.data(), enc.size() - 1, {}).code(),
              Code::kInvalidArg)
        << spec;
  }
  auto topk = make("topk:0.01");
  std::vector<uint8_t> enc(topk->encoded_size(n));
  ASSERT_TRUE(topk->encode(in.data(), nullptr, n, enc.data(), enc.size(), {}).ok());
  auto bad = enc;
  const uint32_t huge = 5000;
  std::memcpy(bad.data() + 8, &huge, 4);
  Status st = topk->decode_add(bad.data(), bad.size(), n, acc.data(), {});
  EXPECT_EQ(st.code(), Code::kInvalidArg);
  EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.message();
  bad = enc;
  bad[0] ^= 0xFF;
  EXPECT_EQ(topk->decode_add(bad.data(), bad.size(), n, acc.data(), {}).code(), Code::kInvalidArg);
  auto qsgd = make("qsgd:4");
  std::vector<uint8_t> q(qsgd->encoded_size(n));
  ASSERT_TRUE(qsgd->encode(in.data(), nullptr, n, q.data(), q.size(), {}).ok());
  q.back() = 100;  // level beyond +-4
  EXPECT_EQ(qsgd->decode_add(q.data(), q.size(), n, acc.data(), {}).code(), Code::kInvalidArg);
}

TEST(CodecPowerSgd, KnownRankMatrixIsReproducedExactly) {
  // M = A B^T with rank 3; one power iteration at rank 3 from a generic Q recovers M.
  const size_t rows = 40, cols = 30, r = 3, count = rows * cols;
  auto a = gaussian(rows * r, 13), b = gaussian(cols * r, 14);
  std::vector<float> m(count, 0.0f);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t c = 0; c < cols; ++c) {
      for (size_t j = 0; j < r; ++j) m[i * cols + c] += a[i * r + j] * b[c * r + j];
    }
  }
  const MatrixShape shape = powersgd_shape(count, cols);
  ASSERT_EQ(shape.rows, rows);
  auto q = gaussian(cols * r, 15);
  std::vector<float> p(rows * r), q2(cols * r);
  matmul_mq(m.data(), count, shape, q.data(), r, p.data());
  orthogonalize(p.data(), rows, r);
  for (size_t j = 0; j < r; ++j) {  // P has orthonormal columns
    for (size_t l = 0; l <= j; ++l) {
      double d = 0;
      for (size_t i = 0; i < rows; ++i) d += p[j * rows + i] * p[l * rows + i];
      EXPECT_NEAR(d, j == l ? 1.0 : 0.0, 1e-5);
    }
  }
  matmul_mtp(m.data(), count, shape, p.data(), r, q2.data());
  std::vector<float> diff = m;
  add_pq(p.data(), q2.data(), shape, r, count, -1.0f, diff.data());
  double err = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    err = std::max(err, static_cast<double>(std::fabs(diff[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(m[i])));
  }
  EXPECT_LT(err, 1e-4 * norm);
}

// A rank-13 gradient compressed at rank 64 (powersgd:64): P = M Q has 51 columns that are
// round-off once the first 13 are projected out. A single float32 Gram-Schmidt pass normalised
// that round-off into basis vectors that are not orthogonal to the others, and M P P^T went as
// far as 0.82 relative error. With a second pass and a relative threshold the reconstruction
// from one power iteration is exact to float precision.
TEST(CodecPowerSgd, RankDeficientGradientAtHighRankIsReproduced) {
  const size_t rows = 64, cols = 64, true_rank = 13, r = 64, count = rows * cols;
  auto a = gaussian(rows * true_rank, 21), b = gaussian(cols * true_rank, 22);
  std::vector<float> m(count, 0.0f);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t c = 0; c < cols; ++c) {
      for (size_t j = 0; j < true_rank; ++j) {
        m[i * cols + c] += a[i * true_rank + j] * b[c * true_rank + j];
      }
    }
  }
  const MatrixShape shape = powersgd_shape(count, cols);
  ASSERT_EQ(shape.rows, rows);
  for (uint32_t seed : {31u, 32u, 33u, 34u}) {
    auto q = gaussian(cols * r, seed);
    std::vector<float> p(rows * r), q2(cols * r);
    matmul_mq(m.data(), count, shape, q.data(), r, p.data());
    orthogonalize(p.data(), rows, r);
    // Every column is unit length or zero, and the non-zero ones are orthonormal.
    size_t kept = 0;
    for (size_t j = 0; j < r; ++j) {
      double nj = 0;
      for (size_t i = 0; i < rows; ++i) nj += double(p[j * rows + i]) * p[j * rows + i];
      if (nj == 0) continue;
      ++kept;
      EXPECT_NEAR(nj, 1.0, 1e-5) << "column " << j;
      for (size_t l = 0; l < j; ++l) {
        double d = 0;
        for (size_t i = 0; i < rows; ++i) d += double(p[j * rows + i]) * p[l * rows + i];
        EXPECT_NEAR(d, 0.0, 1e-4) << "columns " << j << ", " << l;
      }
    }
    EXPECT_GE(kept, true_rank);
    matmul_mtp(m.data(), count, shape, p.data(), r, q2.data());
    std::vector<float> diff = m;
    add_pq(p.data(), q2.data(), shape, r, count, -1.0f, diff.data());
    double err = 0, norm = 0;
    for (size_t i = 0; i < count; ++i) {
      err += double(diff[i]) * diff[i];
      norm += double(m[i]) * m[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-4) << "seed " << seed;
  }
}

TEST(CodecPowerSgd, RankDeficientInputStaysFinite) {
  std::vector<float> p(20 * 2, 0.0f);
  for (size_t i = 0; i < 20; ++i) p[i] = p[20 + i] = static_cast<float>(i);  // equal columns
  orthogonalize(p.data(), 20, 2);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_TRUE(std::isfinite(p[i]));
    EXPECT_EQ(p[20 + i], 0.0f);  // the dependent column collapses to zero
  }
  std::vector<float> z(10, 0.0f);
  orthogonalize(z.data(), 10, 1);
  for (float x : z) EXPECT_EQ(x, 0.0f);
  const MatrixShape s = powersgd_shape(10, 0);
  EXPECT_EQ(s.cols, 4u);
  EXPECT_EQ(s.rows, 3u);
  EXPECT_EQ(powersgd_shape(0, 0).rows, 0u);
}

}  // namespace
}  // namespace gw::coll
