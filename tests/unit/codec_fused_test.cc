// The fused forms the compressed allreduce runs (one pass over the data instead of several): the
// fused top-k selection against a plain exact reference (including the re-scan and exact
// fallbacks), its one-pass kernel and the sign set-decode on the AVX2 and portable paths bit for
// bit, and every codec's decode / decode_sum / merge_encode giving the same bytes and values
// as the generic forms they replace, with the error-feedback invariant kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
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

// Largest magnitude first, ties by lower index, NaN below every number; returned increasing.
std::vector<uint32_t> reference_topk(const std::vector<float>& v, size_t k) {
  auto key = [](float x) { return std::isnan(x) ? -1.0f : std::fabs(x); };
  std::vector<uint32_t> idx(v.size());
  for (size_t i = 0; i < v.size(); ++i) idx[i] = static_cast<uint32_t>(i);
  std::stable_sort(idx.begin(), idx.end(),
                   [&](uint32_t a, uint32_t b) { return key(v[a]) > key(v[b]); });
  idx.resize(std::min(k, v.size()));
  std::sort(idx.begin(), idx.end());
  return idx;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

TEST(CodecFused, TopkSelectFusedIsExactAndLeavesVInResidual) {
  const size_t n = 140001;
  // Distributions that defeat the sampled threshold in different ways: a long tail of equal
  // values (re-scan), a few huge values hidden among zeros (exact fallback), layers of very
  // different scales (runs of the sample are correlated), and NaN / inf sprinkled in.
  std::vector<std::vector<float>> inputs;
  inputs.push_back(gaussian(n, 1));
  std::vector<float> plateau(n, 0.25f);
  for (size_t i = 0; i < n; i += 7) plateau[i] = 0.5f;
  inputs.push_back(plateau);
  std::vector<float> sparse(n, 0.0f);
  for (size_t i = 3; i < n; i += 1001) sparse[i] = static_cast<float>(i % 13) - 6.0f;
  inputs.push_back(sparse);
  auto layers = gaussian(n, 2);
  for (size_t i = 0; i < n / 3; ++i) layers[i] *= 1e-4f;
  for (size_t i = 2 * n / 3; i < n; ++i) layers[i] *= 1e3f;
  inputs.push_back(layers);
  // Magnitudes a few ulps apart (the selection's key digits differ only in the lowest bits), with
  // repeats, and both signs.
  std::vector<float> ulps(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = 0x3F800000u + static_cast<uint32_t>((i * 7919) % 3001);
    ulps[i] = (i % 2 ? -1.0f : 1.0f) * std::bit_cast<float>(bits);
  }
  inputs.push_back(ulps);
  auto odd = gaussian(n, 3);
  odd[10] = std::nanf("");
  odd[20] = INFINITY;
  odd[30] = -INFINITY;
  odd[40] = -0.0f;
  inputs.push_back(odd);
  for (size_t t = 0; t < inputs.size(); ++t) {
    const auto& g = inputs[t];
    for (size_t k : {size_t{1}, size_t{300}, size_t{3000}, size_t{40000}}) {
      // Without a residual: the public selection.
      EXPECT_EQ(topk_select(g.data(), n, k), reference_topk(g, k)) << t << " k " << k;
      // With a residual: v = g + r selected, and left in r; the input untouched.
      auto r = gaussian(n, 50 + static_cast<uint32_t>(t), 0.1f);
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = g[i] + r[i];
      auto in = g;
      const auto idx = topk_select_fused(in.data(), r.data(), n, k);
      EXPECT_EQ(idx, reference_topk(v, k)) << t << " k " << k;
      EXPECT_TRUE(same_bits(r, v)) << t;
      EXPECT_TRUE(same_bits(in, g)) << t;
    }
  }
}

TEST(CodecFused, OnePassKernelAndSignSetDecodeAgreeBitForBitAcrossPaths) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (size_t n : {size_t{0}, size_t{1}, size_t{31}, size_t{32}, size_t{1000}, size_t{4133}}) {
    auto in = gaussian(n, 21, 2.0f);
    if (n > 5) {
      in[1] = std::nanf("");
      in[2] = -0.0f;
      in[3] = INFINITY;
    }
    const auto r0 = gaussian(n, 22, 0.5f);
    for (bool with_res : {false, true}) {
      auto r1 = r0, r2 = r0;
      std::vector<uint32_t> c1, c2;
      std::vector<float> v1, v2;
      ck::portable::add_collect_abs_ge(in.data(), with_res ? r1.data() : nullptr, n, 1.5f, 7, &c1,
                                       &v1);
      ck::avx2::add_collect_abs_ge(in.data(), with_res ? r2.data() : nullptr, n, 1.5f, 7, &c2, &v2);
      EXPECT_EQ(c1, c2) << n;
      EXPECT_TRUE(same_bits(v1, v2)) << n;
      EXPECT_TRUE(same_bits(r1, r2)) << n;
      ASSERT_EQ(c1.size(), v1.size());
      for (size_t j = 0; j < c1.size(); ++j) {
        const size_t i = c1[j] - 7;
        const float v = with_res ? in[i] + r0[i] : in[i];
        EXPECT_EQ(std::bit_cast<uint32_t>(v1[j]), std::bit_cast<uint32_t>(v)) << i;
        EXPECT_GE(std::fabs(v), 1.5f);
      }
      // Every element at or above the threshold was collected (none missed between blocks).
      size_t want = 0;
      for (size_t i = 0; i < n; ++i) want += std::fabs(with_res ? in[i] + r0[i] : in[i]) >= 1.5f;
      EXPECT_EQ(c1.size(), want) << n;
    }
    // A NaN threshold collects nothing but still runs the pass.
    auto r = gaussian(n, 23), in3 = in;
    std::vector<uint32_t> none;
    ck::add_collect_abs_ge(in3.data(), r.data(), n, std::nanf(""), 0, &none, nullptr);
    EXPECT_TRUE(none.empty());
    // sign_decode_set: the same bits on both paths, and the values of 0 + decode_add.
    std::vector<uint64_t> w((n + 63) / 64);
    for (size_t j = 0; j < w.size(); ++j) w[j] = 0x9E3779B97F4A7C15ull * (j + 1);
    // No encoder writes a negative or NaN scale, but a decoder must treat one the same way on
    // every path (the GPU check on the H100 caught the AVX2 path OR-ing the sign in: a set bit
    // left -0.75 at -0.75 where the portable loop and the GPU give +0.75).
    for (float scale : {0.0f, 0.75f, -0.75f, std::bit_cast<float>(0xFFC12345u)}) {
      std::vector<float> s1(n, 5.0f), s2(n, 6.0f), ref(n, 0.0f), a1(n, 1.0f), a2(n, 1.0f);
      ck::portable::sign_decode_set(w.data(), scale, n, s1.data());
      ck::avx2::sign_decode_set(w.data(), scale, n, s2.data());
      ck::portable::sign_decode_add(w.data(), scale, n, ref.data());
      ck::portable::sign_decode_add(w.data(), scale, n, a1.data());
      ck::avx2::sign_decode_add(w.data(), scale, n, a2.data());
      EXPECT_TRUE(same_bits(s1, s2)) << n << " scale " << scale;
      EXPECT_TRUE(same_bits(s1, ref)) << n << " scale " << scale;
      EXPECT_TRUE(same_bits(a1, a2)) << n << " scale " << scale;
      for (size_t i = 0; i < n && scale == -0.75f; ++i) {
        const bool neg = (w[i / 64] >> (i % 64)) & 1u;
        ASSERT_EQ(s1[i], neg ? 0.75f : -0.75f) << i;
      }
    }
    // sign_decode_sum (the server's merge): the bits of a zero fill plus sign_decode_add of every
    // source in order, on both paths, for 1 to 5 sources whose words are 4-byte aligned only (as
    // in an encoding, where they follow the f32 scales), with zero, negative and NaN scales.
    const float scales[5] = {0.75f, -0.0f, 2.5f, std::bit_cast<float>(0xFFC12345u), 1e-3f};
    std::vector<std::vector<unsigned char>> raw(5);
    std::vector<const uint64_t*> srcs(5);
    for (size_t j = 0; j < 5; ++j) {
      raw[j].resize(4 + 8 * w.size());
      for (size_t k = 0; k < w.size(); ++k) {
        const uint64_t word = w[k] * (j + 3) ^ (0xD1B54A32D192ED03ull >> j);
        std::memcpy(raw[j].data() + 4 + 8 * k, &word, 8);
      }
      srcs[j] = reinterpret_cast<const uint64_t*>(raw[j].data() + 4);
    }
    for (size_t nsrc = 1; nsrc <= 5; ++nsrc) {
      const size_t first = nsrc == 5 ? 0 : 5 - nsrc;  // the NaN scale is in some sets, not all
      std::vector<float> ref(n, 0.0f), p1(n, 9.0f), p2(n, 9.0f);
      for (size_t j = first; j < first + nsrc && j < 5; ++j) {
        ck::portable::sign_decode_add(srcs[j], scales[j], n, ref.data());
      }
      const size_t m = std::min(nsrc, size_t{5} - first);
      ck::portable::sign_decode_sum(srcs.data() + first, scales + first, m, n, p1.data());
      ck::avx2::sign_decode_sum(srcs.data() + first, scales + first, m, n, p2.data());
      EXPECT_TRUE(same_bits(p1, ref)) << n << " sources " << m;
      EXPECT_TRUE(same_bits(p2, ref)) << n << " sources " << m;
    }
  }
}

// Every half and bfloat16 bit pattern decodes to the same f32 bits on both CPU paths; F16C
// quiets a signalling NaN, so the portable conversion does too (the GPU check on the H100 found
// the CUDA kernel keeping it signalling while the AVX2 path quieted it).
TEST(CodecFused, Cast16DecodeOfEveryBitPatternAgreesAcrossPaths) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for (bool bf16 : {false, true}) {
    for (bool add : {false, true}) {
      std::vector<float> p(all.size(), 0.25f), v(all.size(), 0.25f);
      ck::portable::decode_cast16(all.data(), all.size(), p.data(), bf16, add);
      ck::avx2::decode_cast16(all.data(), all.size(), v.data(), bf16, add);
      for (size_t h = 0; h < all.size(); ++h) {
        ASSERT_EQ(std::bit_cast<uint32_t>(p[h]), std::bit_cast<uint32_t>(v[h]))
            << std::hex << "half 0x" << h << " bf16 " << bf16 << " add " << add;
      }
    }
  }
}

// decode == clear + decode_add, merge_encode == decode-sum + encode: same bytes, same residuals,
// same values, for every byte codec.
TEST(CodecFused, FusedFormsGiveTheSameBytesAsTheGenericForms) {
  const size_t n = 70001;  // above the sampled top-k threshold size, not a multiple of anything
  for (const char* spec : {"fp16", "bf16,ef=1", "topk:0.01", "topk:0.01,ef=0", "randomk:0.05",
                           "sign", "sign,chunk=64,ef=0", "qsgd:8"}) {
    auto c = make(spec);
    const size_t e = c->encoded_size(n);
    const CodecContext ctx{fnv1a64("k"), 3, 1};
    const bool ef = c->spec().error_feedback;
    auto g = gaussian(n, 31);
    auto r1 = gaussian(n, 32, 0.3f);
    std::vector<uint8_t> e1(e);
    ASSERT_TRUE(c->encode(g.data(), ef ? r1.data() : nullptr, n, e1.data(), e, ctx).ok());

    std::vector<float> d1(n, 0.0f), d2(n, 123.0f);
    ASSERT_TRUE(c->decode_add(e1.data(), e, n, d1.data(), ctx).ok());
    ASSERT_TRUE(c->decode(e1.data(), e, n, d2.data(), ctx).ok());
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(d1[i], d2[i]) << spec << " at " << i;
    EXPECT_FALSE(c->decode(e1.data(), e - 1, n, d2.data(), ctx).ok()) << spec;

    if (c->aggregation() == Aggregation::kTwoPhase) {
      // Three senders' encodings of the same partition, merged with server error feedback.
      std::vector<std::vector<uint8_t>> encs(3, std::vector<uint8_t>(e));
      std::vector<const uint8_t*> ptrs;
      for (size_t j = 0; j < 3; ++j) {
        auto gj = gaussian(n, 40 + static_cast<uint32_t>(j));
        ASSERT_TRUE(c->encode(gj.data(), nullptr, n, encs[j].data(), e, ctx).ok());
        ptrs.push_back(encs[j].data());
      }
      auto s1 = gaussian(n, 45, 0.2f), s2 = s1;
      std::vector<float> sum(n, 0.0f);
      for (auto& enc : encs) ASSERT_TRUE(c->decode_add(enc.data(), e, n, sum.data(), ctx).ok());
      std::vector<uint8_t> m1(e), m2(e);
      ASSERT_TRUE(c->encode(sum.data(), ef ? s1.data() : nullptr, n, m1.data(), e, ctx).ok());
      ASSERT_TRUE(
          c->merge_encode(ptrs.data(), ptrs.size(), n, ef ? s2.data() : nullptr, m2.data(), e, ctx)
              .ok());
      EXPECT_EQ(m1, m2) << spec;
      EXPECT_TRUE(same_bits(s1, s2)) << spec;
      EXPECT_FALSE(
          c->merge_encode(ptrs.data(), ptrs.size(), n, nullptr, m2.data(), e - 1, ctx).ok())
          << spec;
    }
  }
}

// decode_sum == zero fill + decode_add of every source in order, bit for bit, for every byte codec
// (top-k's blocked form across its 4096-element block edges, on a misaligned output), and a bad
// source is refused with its rank named.
TEST(CodecFused, DecodeSumGivesTheBitsOfAZeroFillAndDecodeAddInOrder) {
  for (size_t n : {size_t{70001}, size_t{4096 * 20}, size_t{4096 * 20 + 1}}) {
    for (const char* spec : {"topk:0.01", "topk:0.3", "topk:0.01,ef=0", "qsgd:8", "sign"}) {
      auto c = make(spec);
      const size_t e = c->encoded_size(n);
      std::vector<std::vector<uint8_t>> encs(4, std::vector<uint8_t>(e));
      std::vector<const uint8_t*> ptrs;
      std::vector<CodecContext> ctxs;
      for (int j = 0; j < 4; ++j) {
        const CodecContext ctx{fnv1a64("k"), 2, j};
        auto g = gaussian(n, 60 + static_cast<uint32_t>(j));
        if (j == 2) g[4095] = g[4096] = 1e6f;  // both sides of a block edge, in every top-k
        ASSERT_TRUE(c->encode(g.data(), nullptr, n, encs[j].data(), e, ctx).ok()) << spec;
        ptrs.push_back(encs[j].data());
        ctxs.push_back(ctx);
      }
      std::vector<float> ref(n, 0.0f);
      for (int j = 0; j < 4; ++j) {
        ASSERT_TRUE(c->decode_add(ptrs[j], e, n, ref.data(), ctxs[j]).ok()) << spec;
      }
      std::vector<float> buf(n + 1, 7.0f);
      float* out = buf.data() + 1;  // 4-byte aligned only: the streaming stores' head path
      ASSERT_TRUE(c->decode_sum(ptrs.data(), e, 4, n, out, ctxs.data()).ok()) << spec;
      ASSERT_EQ(0, std::memcmp(out, ref.data(), n * 4)) << spec << " n " << n;
      EXPECT_EQ(buf[0], 7.0f) << spec;  // nothing written before out
      // One source truncated: refused, naming it.
      auto st = c->decode_sum(ptrs.data(), e - 1, 4, n, out, ctxs.data());
      EXPECT_EQ(st.code(), Code::kInvalidArg) << spec;
    }
  }
  // Top-k: an index out of range, and indices that do not increase, in rank 3's encoding.
  const size_t n = 70001;
  auto c = make("topk:0.01");
  const size_t e = c->encoded_size(n), k = topk_count(0.01, n);
  std::vector<std::vector<uint8_t>> encs(4, std::vector<uint8_t>(e));
  std::vector<const uint8_t*> ptrs;
  std::vector<CodecContext> ctxs;
  for (int j = 0; j < 4; ++j) {
    const CodecContext ctx{1, 0, j};
    auto g = gaussian(n, 70 + static_cast<uint32_t>(j));
    ASSERT_TRUE(c->encode(g.data(), nullptr, n, encs[j].data(), e, ctx).ok());
    ptrs.push_back(encs[j].data());
    ctxs.push_back(ctx);
  }
  std::vector<float> out(n);
  const uint32_t too_big = static_cast<uint32_t>(n);
  std::memcpy(encs[3].data() + 8 + 4 * (k - 1), &too_big, 4);
  auto st = c->decode_sum(ptrs.data(), e, 4, n, out.data(), ctxs.data());
  EXPECT_EQ(st.code(), Code::kInvalidArg);
  EXPECT_NE(st.message().find("out of range"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("rank 3"), std::string::npos) << st.message();
  uint32_t first;
  std::memcpy(&first, encs[3].data() + 8, 4);
  std::memcpy(encs[3].data() + 8 + 4 * (k - 1), &first, 4);  // repeats the first index last
  st = c->decode_sum(ptrs.data(), e, 4, n, out.data(), ctxs.data());
  EXPECT_EQ(st.code(), Code::kInvalidArg);
  EXPECT_NE(st.message().find("must increase"), std::string::npos) << st.message();
}

// The invariant through the fused path: what was sent plus the residual equals the sum of the
// gradients, step after step (top-k through encode and decode_sum, as the allreduce runs it).
TEST(CodecFused, ErrorFeedbackInvariantHoldsThroughEncodeAndDecodeSum) {
  const size_t n = 100003;
  auto c = make("topk:0.01");
  std::vector<float> residual(n, 0.0f);
  std::vector<double> sum_in(n, 0.0), sum_sent(n, 0.0);
  const size_t e = c->encoded_size(n);
  std::vector<uint8_t> enc(e);
  for (int step = 0; step < 12; ++step) {
    auto g = gaussian(n, 200 + static_cast<uint32_t>(step), step % 3 ? 1.0f : 1e-3f);
    auto x = g;
    const CodecContext ctx{1, static_cast<uint64_t>(step), 0};
    ASSERT_TRUE(c->encode(x.data(), residual.data(), n, enc.data(), e, ctx).ok());
    const uint8_t* src = enc.data();
    ASSERT_TRUE(c->decode_sum(&src, e, 1, n, x.data(), &ctx).ok());
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; ++i) {
      sum_in[i] += g[i];
      sum_sent[i] += x[i];
      worst = std::max(worst, std::fabs(sum_sent[i] + residual[i] - sum_in[i]));
      scale = std::max(scale, std::fabs(sum_in[i]));
    }
    ASSERT_LE(worst, 1e-5 * (scale + 1)) << "step " << step;
  }
}

TEST(CodecFused, PowerSgdRowKernelsAgreeBitForBitAcrossPaths) {
  if (!ck::cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  for (size_t n : {size_t{1}, size_t{7}, size_t{8}, size_t{61}, size_t{1000}}) {
    for (size_t r : {size_t{1}, size_t{4}, size_t{17}, size_t{40}}) {
      const size_t ld = n + 3;
      auto row = gaussian(n, 71), q = gaussian(ld * r, 72), a = gaussian(r, 73);
      std::vector<float> d1(r), d2(r);
      ck::portable::pq_row_dots(row.data(), q.data(), ld, r, n, d1.data());
      ck::avx2::pq_row_dots(row.data(), q.data(), ld, r, n, d2.data());
      EXPECT_TRUE(same_bits(d1, d2)) << n << " " << r;
      // The documented order: 8 lanes, tail into lane 0, fixed pairwise reduction.
      for (size_t j = 0; j < r; ++j) {
        float l[8] = {};
        size_t i = 0;
        for (; i + 8 <= n; i += 8) {
          for (int k = 0; k < 8; ++k) l[k] += row[i + k] * q[j * ld + i + k];
        }
        for (; i < n; ++i) l[0] += row[i] * q[j * ld + i];
        const float want = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
        EXPECT_EQ(std::bit_cast<uint32_t>(d1[j]), std::bit_cast<uint32_t>(want)) << j;
      }
      auto y1 = gaussian(n, 74), y2 = y1, want = y1;
      ck::portable::pq_row_axpy_in(a.data(), q.data(), ld, r, n, y1.data());
      ck::avx2::pq_row_axpy_in(a.data(), q.data(), ld, r, n, y2.data());
      for (size_t j = 0; j < r; ++j) {
        for (size_t c = 0; c < n; ++c) want[c] += a[j] * q[j * ld + c];
      }
      EXPECT_TRUE(same_bits(y1, y2)) << n << " " << r;
      EXPECT_TRUE(same_bits(y1, want)) << n << " " << r;
      auto z1 = gaussian(ld * r, 75), z2 = z1, zw = z1;
      ck::portable::pq_row_axpy_out(a.data(), row.data(), ld, r, n, z1.data());
      ck::avx2::pq_row_axpy_out(a.data(), row.data(), ld, r, n, z2.data());
      for (size_t j = 0; j < r; ++j) {
        for (size_t c = 0; c < n; ++c) zw[j * ld + c] += a[j] * row[c];
      }
      EXPECT_TRUE(same_bits(z1, z2)) << n << " " << r;
      EXPECT_TRUE(same_bits(z1, zw)) << n << " " << r;
    }
  }
}

// PowerSGD's two fused passes give the same bits as the separate calls they replace.
TEST(CodecFused, PowerSgdFusedPassesMatchTheSeparateCalls) {
  for (size_t count : {size_t{1}, size_t{1000}, size_t{12347}}) {
    const MatrixShape shape = powersgd_shape(count, 0);
    const size_t r = std::min<size_t>(3, std::min(shape.rows, shape.cols));
    auto x = gaussian(count, 61), m0 = gaussian(count, 62, 0.3f);
    auto q = gaussian(shape.cols * r, 63), q_sum = gaussian(shape.cols * r, 64);
    // m += x; P = M Q.
    auto m1 = m0, m2 = m0;
    std::vector<float> p1(shape.rows * r), p2(shape.rows * r);
    ck::add_f32(x.data(), count, m1.data());
    matmul_mq(m1.data(), count, shape, q.data(), r, p1.data());
    add_matmul_mq(x.data(), m2.data(), count, shape, q.data(), r, p2.data());
    EXPECT_TRUE(same_bits(m1, m2)) << count;
    EXPECT_TRUE(same_bits(p1, p2)) << count;
    std::vector<float> p3(shape.rows * r);
    auto m3 = m0;
    add_matmul_mq(nullptr, m3.data(), count, shape, q.data(), r, p3.data());
    EXPECT_TRUE(same_bits(m3, m0)) << count;
    // residual -= P Q_local^T; out = P Q_sum^T.
    auto res1 = m1, res2 = m1;
    std::vector<float> out1(count, 9.0f), out2(count, -9.0f);
    add_pq(p1.data(), q.data(), shape, r, count, -1.0f, res1.data());
    std::fill(out1.begin(), out1.end(), 0.0f);
    add_pq(p1.data(), q_sum.data(), shape, r, count, 1.0f, out1.data());
    residual_and_decode_pq(p1.data(), q.data(), q_sum.data(), shape, r, count, res2.data(),
                           out2.data());
    EXPECT_TRUE(same_bits(res1, res2)) << count;
    EXPECT_TRUE(same_bits(out1, out2)) << count;
    std::vector<float> out3(count, 1.0f);
    residual_and_decode_pq(p1.data(), nullptr, q_sum.data(), shape, r, count, nullptr, out3.data());
    EXPECT_TRUE(same_bits(out1, out3)) << count;
  }
}

// The sampled top-k (a pass that takes out only the candidates above the sample's estimate of the
// k-th value, the rest fixed up after the selection) and random-k's bitmap pass give exactly the
// encoding and residual of the plain definition: v = in + residual; the chosen values in index
// order; the residual v with them 0.
TEST(CodecFused, TopkAndRandomkEncodeAsTheirDefinitionBitForBit) {
  const size_t n = (size_t{1} << 20) + 3;  // the sampled top-k path, odd tails
  for (const char* spec :
       {"topk:0.01", "topk:0.001", "randomk:0.01", "randomk:0.7", "randomk:0.01,ef=0"}) {
    auto c = make(spec);
    const bool topk = spec[0] == 't';
    const bool ef = c->spec().error_feedback;
    for (int step = 0; step < 3; ++step) {
      const CodecContext ctx{fnv1a64("w"), static_cast<uint64_t>(step), 0};
      const auto g = gaussian(n, 60 + static_cast<uint32_t>(step));
      auto r = gaussian(n, 70 + static_cast<uint32_t>(step), 0.3f);
      std::vector<float> v(n);
      for (size_t i = 0; i < n; ++i) v[i] = ef ? g[i] + r[i] : g[i];
      const size_t k = topk_count(c->spec().ratio, n);
      const auto idx = topk ? reference_topk(v, k) : randomk_indices(c->spec().seed, ctx, n, k);
      ASSERT_EQ(idx.size(), k) << spec;
      std::vector<uint8_t> want(c->encoded_size(n));
      size_t at = 0;
      if (topk) {
        const uint32_t header[2] = {0x4B504F54u, static_cast<uint32_t>(k)};
        std::memcpy(want.data(), header, 8);
        std::memcpy(want.data() + 8, idx.data(), k * 4);
        at = 8 + k * 4;
      }
      auto want_res = v;
      for (size_t j = 0; j < k; ++j) {
        std::memcpy(want.data() + at + 4 * j, &v[idx[j]], 4);
        want_res[idx[j]] = 0.0f;
      }
      // Written at an odd offset too (a peer's buffer need not be aligned).
      for (size_t shift : {size_t{0}, size_t{1}}) {
        std::vector<uint8_t> buf(want.size() + 1);
        auto res = r;
        ASSERT_TRUE(
            c->encode(g.data(), ef ? res.data() : nullptr, n, buf.data() + shift, want.size(), ctx)
                .ok());
        ASSERT_EQ(0, std::memcmp(buf.data() + shift, want.data(), want.size()))
            << spec << " step " << step << " shift " << shift;
        if (ef) {
          ASSERT_TRUE(same_bits(res, want_res)) << spec << " step " << step;
        }
      }
    }
  }
}

}  // namespace
}  // namespace gw::coll
