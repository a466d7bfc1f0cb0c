// Index selection: topk_select (exact top k by magnitude, no sort) and randomk_indices (codec.h).
#include "collectives/compress/topk_select.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

// The order key of a magnitude as an integer: the bits of |x| + 1 (non-negative floats order as
// their bit patterns), and 0 for NaN, below every number.
inline uint32_t mag_key(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
  return bits > 0x7F800000u ? 0u : bits + 1u;
}

// The bits of the magnitude whose key is `key` (mag_key's inverse for a number).
inline float key_value(uint32_t key) { return std::bit_cast<float>(key - 1u); }

// The k-th best (largest) of n keys, 1 <= k <= n, by a radix select: hist holds the histogram of
// the keys' top 11 bits (key >> 21, 2048 bins); the keys in the chosen bin (a small part) are
// compacted into sub (room for n) and their next 11 and last 10 bits resolved on that subset
// alone. *above gets how many keys are greater than the result. No sort, no data-dependent
// branch in the loops over the keys (a compaction advances by a comparison's result).
uint32_t select_key(const uint32_t* key, size_t n, size_t k, const uint32_t* hist, uint32_t* sub,
                    size_t* above) {
  *above = 0;
  // The bin of a histogram, from the top, that holds the k-th best key.
  auto pick = [&](const uint32_t* h, uint32_t bins) {
    uint32_t bin = bins;
    while (bin-- > 0) {
      if (*above + h[bin] >= k) break;
      *above += h[bin];
    }
    return bin;
  };
  uint32_t prefix = pick(hist, 2048) << 21;
  const size_t m = ck::select_compact(key, n, 21, prefix >> 21, sub);
  uint32_t h[2048];
  std::fill(h, h + 2048, 0u);
  for (size_t j = 0; j < m; ++j) ++h[(sub[j] >> 10) & 2047u];
  prefix |= pick(h, 2048) << 10;
  const size_t m2 = ck::select_compact(sub, m, 10, prefix >> 10, sub);  // in place: m2 <= j
  std::fill(h, h + 1024, 0u);
  for (size_t j = 0; j < m2; ++j) ++h[sub[j] & 1023u];
  return prefix | pick(h, 1024);
}

// The keys of v[0..n) into key, with the histogram of their top 11 bits into hist (2048 bins),
// split in four while counting so that equal bins in a row do not wait on each other.
void keys_and_hist(const float* v, size_t n, uint32_t* key, uint32_t* hist) {
  thread_local std::vector<uint32_t> h4;
  h4.assign(4 * 2048, 0);
  size_t j = 0;
  for (; j + 4 <= n; j += 4) {
    for (size_t l = 0; l < 4; ++l) {
      const uint32_t kj = mag_key(v[j + l]);
      key[j + l] = kj;
      ++h4[l * 2048 + (kj >> 21)];
    }
  }
  for (; j < n; ++j) {
    key[j] = mag_key(v[j]);
    ++h4[key[j] >> 21];
  }
  for (uint32_t b = 0; b < 2048; ++b) hist[b] = h4[b] + h4[2048 + b] + h4[4096 + b] + h4[6144 + b];
}

// Keeps the k best (largest magnitude, then lowest index) of the candidates idx (increasing) with
// their values val, in index order: select_key gives the exact k-th best key t, then one scan
// keeps everything above t and the first (lowest-index) ties at t. No sort, no nth_element. With
// restore (top-k's residual, from a pass that took out the candidates with |v| >= take_t), the
// residual is made right for the selection: restore[idx[j]] = val[j] for a candidate taken out
// but dropped, 0 for one kept but not taken out (both rare when take_t is near the k-th value).
void keep_best(std::vector<uint32_t>* idx, std::vector<float>* val, size_t k, float* restore,
               float take_t) {
  const size_t n = idx->size();
  if (n <= k) {
    if (restore) {
      for (size_t j = 0; j < n; ++j) {
        if (!(std::fabs((*val)[j]) >= take_t)) restore[(*idx)[j]] = 0.0f;
      }
    }
    return;
  }
  if (k == 0) {
    if (restore) {
      for (size_t j = 0; j < n; ++j) restore[(*idx)[j]] = (*val)[j];
    }
    idx->clear();
    val->clear();
    return;
  }
  // Scratch kept per thread: two fresh 4n-byte arrays per call would cost page faults each time.
  thread_local std::vector<uint32_t> key_buf, sub_buf;
  if (key_buf.size() < n) key_buf.resize(n);
  if (sub_buf.size() < n) sub_buf.resize(n);
  uint32_t* key = key_buf.data();
  uint32_t hist[2048];
  keys_and_hist(val->data(), n, key, hist);
  size_t above = 0;
  const uint32_t t = select_key(key, n, k, hist, sub_buf.data(), &above);
  const size_t ties = k - above;  // keys equal to t that make the cut, lowest index first
  const size_t w = ck::keep_best_scan(idx->data(), val->data(), key, n, t, ties, restore, take_t);
  idx->resize(w);
  val->resize(w);
}

}  // namespace

void topk_fused(const float* in, float* residual, size_t count, size_t k, TopKSet* out, bool take) {
  take = take && residual != nullptr;
  TopKSet& s = *out;
  s.idx.clear();
  s.val.clear();
  k = std::min(k, count);
  const float* v = residual ? residual : in;  // v = in + residual once the pass has run
  const float kNoThreshold = std::numeric_limits<float>::quiet_NaN();
  auto zero_selected = [&] {
    if (take) {
      for (uint32_t i : s.idx) residual[i] = 0.0f;
    }
  };
  // Exact selection over everything (small inputs, k a large fraction, a misjudged sample).
  auto exact = [&](bool pass_done) {
    if (!pass_done && residual) {
      ck::add_collect_abs_ge(in, residual, count, kNoThreshold, 0, &s.idx, nullptr);
    }
    s.idx.resize(count);
    for (size_t i = 0; i < count; ++i) s.idx[i] = static_cast<uint32_t>(i);
    s.val.assign(v, v + count);
    keep_best(&s.idx, &s.val, k, nullptr, 0.0f);
    zero_selected();
  };
  // Sampled in runs of 16 consecutive elements (one cache line), so the sample costs ~500
  // random line reads, not 8192. From 4 Mi elements on, 4x the sample: the threshold's margin
  // (below) shrinks from ~1.9 k to ~1.5 k candidates, which saves more selection work than the
  // extra 1.5 k line reads cost (at 16 Mi: ~3% of the encode).
  constexpr size_t kRun = 16;
  const size_t kSample = count >= (size_t{1} << 22) ? 32768 : 8192;
  if (count <= 65536 || k * 4 >= count) return exact(false);
  thread_local std::vector<float> sample;
  thread_local std::vector<uint32_t> skey, ssub;
  sample.resize(kSample);
  skey.resize(kSample);
  ssub.resize(kSample);
  uint64_t state = count;
  for (size_t j = 0; j < kSample; j += kRun) {
    const size_t base = splitmix64(&state) % (count - kRun + 1);
    for (size_t i = 0; i < kRun; ++i) {
      sample[j + i] = residual ? in[base + i] + residual[base + i] : in[base + i];
    }
  }
  // Threshold: aim at ~1.15 k candidates plus a few standard deviations (and a margin for the
  // runs being correlated), so one pass almost always collects a superset of the top k without
  // collecting much more (at k = 1% of 1 Mi: ~1.9 k candidates, the k-th value ~6 deviations of
  // the sample's count inside them).
  const double expect = static_cast<double>(kSample) * static_cast<double>(k) / count;
  const size_t pos = static_cast<size_t>(expect * 1.15 + 5.0 * std::sqrt(expect) + 16.0);
  if (pos >= kSample) return exact(false);
  // The (pos + 1)-th best of the sample by a radix select over its keys (a comparison select,
  // nth_element, mispredicts a branch on most of the elements: it took ~20% of the encode).
  uint32_t hist[2048];
  keys_and_hist(sample.data(), kSample, skey.data(), hist);
  size_t above = 0;
  const uint32_t lo_key = select_key(skey.data(), kSample, pos + 1, hist, ssub.data(), &above);
  if (lo_key <= 1) return exact(false);  // +0 or NaN: no positive threshold
  float threshold = key_value(lo_key);
  // With take, the pass takes out of the residual (0) only the candidates at or above the
  // sample's estimate of the k-th value, and keep_best puts back the taken ones not sent and
  // takes out the sent ones not taken: random writes to about |taken - k| lines (the sample's
  // error, ~10% of k), not to the ~0.8 k candidates beyond k.
  const size_t hi_rank = std::max<size_t>(1, static_cast<size_t>(std::llround(expect)));
  const float take_t =
      key_value(select_key(skey.data(), kSample, hi_rank, hist, ssub.data(), &above));
  const size_t expect_cands = pos * (count / kSample) + 1024;
  s.idx.reserve(expect_cands);
  s.val.reserve(expect_cands);
  ck::add_collect_abs_ge(in, residual, count, threshold, 0, &s.idx, &s.val, take, take_t);
  const bool retried = s.idx.size() < k;
  if (take && retried) {
    for (size_t j = 0; j < s.idx.size(); ++j) residual[s.idx[j]] = s.val[j];  // v, materialised
  }
  // The sample misjudged the distribution: rescan v (now materialised) with a lower threshold a
  // few times, then give up and select exactly.
  for (int retry = 0; s.idx.size() < k && retry < 4; ++retry) {
    threshold *= 0.5f;
    s.idx.clear();
    s.val.clear();
    if (threshold > 0.0f) ck::collect_abs_ge(v, count, threshold, 0, &s.idx);
    for (uint32_t i : s.idx) s.val.push_back(v[i]);
  }
  if (s.idx.size() < k) {
    s.idx.clear();
    s.val.clear();
    return exact(true);
  }
  // Every element of the top k has |v| >= the k-th best candidate >= threshold: exact.
  if (!retried) return keep_best(&s.idx, &s.val, k, take ? residual : nullptr, take_t);
  keep_best(&s.idx, &s.val, k, nullptr, 0.0f);
  zero_selected();
}

size_t topk_count(double ratio, size_t count) {
  if (count == 0) return 0;
  const double k = std::round(ratio * static_cast<double>(count));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, count);
}

std::vector<uint32_t> topk_select(const float* v, size_t count, size_t k) {
  return topk_select_fused(v, nullptr, count, k);
}

std::vector<uint32_t> topk_select_fused(const float* in, float* residual, size_t count, size_t k) {
  TopKSet s;
  topk_fused(in, residual, count, k, &s);
  return std::move(s.idx);
}

const std::vector<uint64_t>& randomk_bitmap(uint64_t seed, const CodecContext& ctx, size_t count,
                                            size_t k, bool* invert) {
  // Kept per thread: a fresh count/8-byte bitmap per call would be fresh pages (faults) each time.
  thread_local std::vector<uint64_t> bits;
  k = std::min(k, count);
  // Rejection sampling into a bitmap; when k is more than half, pick the complement instead.
  const bool complement = k * 2 > count;
  *invert = complement;
  const size_t want = complement ? count - k : k;
  bits.assign((count + 63) / 64, 0);
  if (k == 0) return bits;
  uint64_t state = seed ^ (ctx.key_hash * 0x9e3779b97f4a7c15ull) ^ (ctx.step << 1);
  splitmix64(&state);
  size_t have = 0;
  // Drawn 16 at a time with their bitmap words prefetched, so that the misses overlap; the set is
  // the same (the first `want` distinct draws; the rest of the last batch is dropped).
  constexpr int kBatch = 16;
  size_t batch[kBatch];
  while (have < want) {
    for (int d = 0; d < kBatch; ++d) {
      batch[d] = static_cast<size_t>(splitmix64(&state) % count);
      __builtin_prefetch(&bits[batch[d] / 64], 1, 3);
    }
    for (int d = 0; d < kBatch && have < want; ++d) {
      const size_t i = batch[d];
      uint64_t& w = bits[i / 64];
      const uint64_t b = uint64_t{1} << (i % 64);
      if (!(w & b)) {
        w |= b;
        ++have;
      }
    }
  }
  return bits;
}

std::vector<uint32_t> randomk_indices(uint64_t seed, const CodecContext& ctx, size_t count,
                                      size_t k) {
  bool complement = false;
  const std::vector<uint64_t>& bits = randomk_bitmap(seed, ctx, count, k, &complement);
  std::vector<uint32_t> idx(std::min(k, count));
  size_t j = 0;
  for (size_t wi = 0; wi < bits.size() && j < idx.size(); ++wi) {
    uint64_t w = complement ? ~bits[wi] : bits[wi];
    if (complement && wi + 1 == bits.size() && count % 64) w &= (uint64_t{1} << (count % 64)) - 1;
    while (w) {
      idx[j++] = static_cast<uint32_t>(wi * 64 + std::countr_zero(w));
      w &= w - 1;
    }
  }
  return idx;
}

}  // namespace gw::coll
