// Error feedback stays bounded and trains: for every codec that takes a residual, the residual
// fed the same gradient step after step stops growing (error feedback needs a contraction; QSGD
// with few levels is one only once its output is shrunk, qsgd_kernels.h), and a small
// least-squares model trained over four simulated workers with qsgd+EF reaches the loss of
// uncompressed training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "collectives/compress/codec.h"
#include "collectives/compress/qsgd_kernels.h"
#include "tests/support/codec_test_util.h"

namespace gw::coll {
namespace {

using ::gw::testing::gaussian;

double norm2(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

struct EfCase {
  const char* spec;
  // The codec's contraction delta (E||v - decode(encode(v))||^2 <= (1 - delta) ||v||^2), from
  // its definition: the residual of a repeated gradient g is then at most about 2/delta ||g||.
  double delta;
};

// Every byte codec that accepts ef=1, with the options that change its contraction: top-k and
// random-k keep k of n (delta = k/n), sign keeps ||v||_1^2 / n of ||v||^2 per chunk (delta >=
// 1/chunk), qsgd sends C(v) / (1 + omega) (delta = qsgd_ef_shrink), the casts lose < 2^-8.
std::vector<EfCase> ef_cases() {
  namespace ck = codec_kernels;
  return {
      {"fp16,ef=1", 0.5},
      {"bf16,ef=1", 0.5},
      {"topk:0.01", 0.01},
      {"topk:0.3", 0.3},
      {"randomk:0.01", 0.01},
      {"randomk:0.5", 0.5},
      {"sign", 1.0 / 2048},
      {"sign,chunk=64", 1.0 / 64},
      {"qsgd:1", ck::qsgd_ef_shrink(512, 1)},
      {"qsgd:2", ck::qsgd_ef_shrink(512, 2)},
      {"qsgd:4", ck::qsgd_ef_shrink(512, 4)},
      {"qsgd:8", ck::qsgd_ef_shrink(512, 8)},
      {"qsgd:8,bucket=7", ck::qsgd_ef_shrink(7, 8)},
      {"qsgd:16,bucket=4096", ck::qsgd_ef_shrink(4096, 16)},
      {"qsgd:127", ck::qsgd_ef_shrink(512, 127)},
      {"qsgd:8,bucket=1048576", ck::qsgd_ef_shrink(70001, 8)},
  };
}

// One gradient, encoded 1000 times with error feedback: the residual stays finite, below 3/delta
// times the gradient's norm, and the second 500 steps do not go above the first 500's largest
// (a residual that grows by a constant factor per step, as qsgd:8's did by ~1.15x, overflows to
// Inf within a few hundred steps and fails all three).
void expect_residual_bounded(const EfCase& c) {
  SCOPED_TRACE(c.spec);
  const size_t n = 70001;  // the sampled top-k path; not a multiple of any bucket or chunk
  auto codec = ::gw::testing::make_codec(c.spec);
  ASSERT_TRUE(codec->spec().error_feedback);
  // A gradient with a spread of scales: most elements small, a few large.
  auto g = gaussian(n, 41);
  for (size_t i = 0; i < n; i += 97) g[i] *= 30.0f;
  const double gnorm = norm2(g);
  std::vector<float> res(n, 0.0f);
  std::vector<uint8_t> enc(codec->encoded_size(n));
  double half_max[2] = {0, 0};  // the largest ||residual|| of steps 0-499 and 500-999
  for (uint64_t step = 0; step < 1000; ++step) {
    const CodecContext ctx{fnv1a64("ef"), step, 0};
    ASSERT_TRUE(codec->encode(g.data(), res.data(), n, enc.data(), enc.size(), ctx).ok());
    const double e = norm2(res);
    ASSERT_TRUE(std::isfinite(e)) << "step " << step;
    ASSERT_LE(e, 3.0 / c.delta * gnorm) << "step " << step;
    half_max[step / 500] = std::max(half_max[step / 500], e);
  }
  // A contraction reaches its level in a few 1/delta steps: well within the first 500 for every
  // case but sign's 2048-element chunks (delta = 1/2048 at worst), which the bound above covers
  // alone (its residual was still rising slowly at 1000 steps, at ~230x ||g||).
  if (4.0 / c.delta <= 500) {
    EXPECT_LE(half_max[1], 1.25 * half_max[0] + 1e-6 * gnorm)
        << "first 500 steps " << half_max[0] << ", last 500 " << half_max[1];
  }
}

TEST(CodecErrorFeedback, ResidualOfARepeatedGradientStaysBoundedForEveryCodec) {
  for (const EfCase& c : ef_cases()) expect_residual_bounded(c);
}

// Least squares, min ||A x - b||^2 / (2m), rows split over 4 workers; each step every worker
// encodes its shard's gradient with its own residual, the encodings are decoded and summed in
// rank order (the gather codecs' path, Codec::decode_sum) and averaged, and x takes a gradient
// step. After 300 steps, from a loss of 0.49, the uncompressed run is at its noise floor (0.0036)
// and qsgd+EF within a stated factor of it: qsgd:8 (512-element buckets) 1.25x (measured 1.11x:
// each worker's own gradient is not 0 at the optimum, so the rounding noise stays), bucket=64
// 1.05x (1.01x), qsgd:4 2x (1.71x), qsgd:127 1.01x (1.0003x). Without the shrink (the code
// before it) qsgd:8 ended at a loss of 1e46 and qsgd:4 at NaN (omega 2 and 5.7); bucket=64 (omega
// 1) and qsgd:127 (omega 0.008) were contractions already.
double train_least_squares(const char* spec, int steps) {
  constexpr int kWorkers = 4;
  constexpr size_t d = 512, rows_per = 512, m = kWorkers * rows_per;
  constexpr float lr = 0.4f;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> a(m * d), b(m), xs(d);
  for (float& v : a) v = nd(rng);
  for (float& v : xs) v = nd(rng) / std::sqrt(static_cast<float>(d));
  for (size_t r = 0; r < m; ++r) {
    double s = 0;
    for (size_t j = 0; j < d; ++j) s += static_cast<double>(a[r * d + j]) * xs[j];
    b[r] = static_cast<float>(s) + 0.1f * nd(rng);
  }
  auto codec = spec ? ::gw::testing::make_codec(spec) : nullptr;
  std::vector<float> x(d, 0.0f), grad(d), sum(d);
  std::vector<std::vector<float>> res(kWorkers, std::vector<float>(d, 0.0f));
  std::vector<std::vector<uint8_t>> enc(kWorkers);
  std::vector<double> resid(rows_per);
  for (int step = 0; step < steps; ++step) {
    std::fill(sum.begin(), sum.end(), 0.0f);
    std::vector<const uint8_t*> encs;
    std::vector<CodecContext> ctxs;
    for (int w = 0; w < kWorkers; ++w) {
      const float* aw = a.data() + w * rows_per * d;
      for (size_t r = 0; r < rows_per; ++r) {
        double s = 0;
        for (size_t j = 0; j < d; ++j) s += static_cast<double>(aw[r * d + j]) * x[j];
        resid[r] = s - b[w * rows_per + r];
      }
      std::fill(grad.begin(), grad.end(), 0.0f);
      for (size_t r = 0; r < rows_per; ++r) {
        const float k = static_cast<float>(resid[r] / rows_per);
        for (size_t j = 0; j < d; ++j) grad[j] += k * aw[r * d + j];
      }
      if (!codec) {
        for (size_t j = 0; j < d; ++j) sum[j] += grad[j];
        continue;
      }
      const CodecContext ctx{fnv1a64("w"), static_cast<uint64_t>(step), w};
      enc[w].resize(codec->encoded_size(d));
      EXPECT_TRUE(
          codec->encode(grad.data(), res[w].data(), d, enc[w].data(), enc[w].size(), ctx).ok());
      encs.push_back(enc[w].data());
      ctxs.push_back(ctx);
    }
    if (codec) {
      EXPECT_TRUE(
          codec->decode_sum(encs.data(), enc[0].size(), kWorkers, d, sum.data(), ctxs.data()).ok());
    }
    for (size_t j = 0; j < d; ++j) x[j] -= lr * sum[j] / kWorkers;
  }
  double loss = 0;
  for (size_t r = 0; r < m; ++r) {
    double s = 0;
    for (size_t j = 0; j < d; ++j) s += static_cast<double>(a[r * d + j]) * x[j];
    loss += (s - b[r]) * (s - b[r]);
  }
  return loss / (2.0 * m);
}

TEST(CodecErrorFeedback, LeastSquaresTrainedWithQsgdAndErrorFeedbackConverges) {
  const int steps = 300;
  const double start = train_least_squares(nullptr, 0);
  const double plain = train_least_squares(nullptr, steps);
  ASSERT_LT(plain, 0.01 * start) << "the uncompressed run itself did not converge";
  const struct {
    const char* spec;
    double factor;
  } cases[] = {{"qsgd:8", 1.25}, {"qsgd:8,bucket=64", 1.05}, {"qsgd:4", 2.0}, {"qsgd:127", 1.01}};
  for (const auto& c : cases) {
    const double loss = train_least_squares(c.spec, steps);
    EXPECT_TRUE(std::isfinite(loss)) << c.spec;
    EXPECT_LE(loss, c.factor * plain)
        << c.spec << ": loss " << loss << ", uncompressed " << plain << ", at the start " << start;
  }
}

}  // namespace
}  // namespace gw::coll
