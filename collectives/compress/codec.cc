#include "collectives/compress/codec.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "collectives/compress/codec_kernels.h"

namespace gw::coll {

namespace ck = codec_kernels;

// ------------------------------------------------------------------------------------------
// Spec parsing.

namespace {

constexpr size_t kMaxChunk = size_t{1} << 20;
constexpr uint32_t kTopkMagic = 0x4B504F54;  // "TOPK"

struct NameKind {
  std::string_view name;
  CodecKind kind;
};
constexpr NameKind kNames[] = {
    {"none", CodecKind::kNone}, {"fp16", CodecKind::kFp16},         {"bf16", CodecKind::kBf16},
    {"topk", CodecKind::kTopK}, {"randomk", CodecKind::kRandomK},   {"sign", CodecKind::kSign},
    {"qsgd", CodecKind::kQsgd}, {"powersgd", CodecKind::kPowerSgd},
};

template <typename T>
bool parse_number(std::string_view s, T* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *out);
  return ec == std::errc() && ptr == end;
}

bool parse_bool01(std::string_view s, bool* out) {
  if (s == "1")
    *out = true;
  else if (s == "0")
    *out = false;
  else
    return false;
  return true;
}

}  // namespace

std::string_view codec_name(CodecKind kind) {
  for (const auto& n : kNames) {
    if (n.kind == kind) return n.name;
  }
  return "?";
}

Result<CodecSpec> parse_codec_spec(std::string_view text) {
  if (text.empty()) return invalid_arg("codec spec is empty (use \"none\" for no compression)");
  CodecSpec spec;
  std::string_view head = text.substr(0, text.find(','));
  std::string_view rest = head.size() < text.size() ? text.substr(head.size() + 1) : "";
  if (head.size() < text.size() && rest.empty()) {
    return invalid_arg("codec spec \"{}\": empty option after ','", text);
  }
  const size_t colon = head.find(':');
  const std::string_view name = head.substr(0, colon);
  const bool has_arg = colon != std::string_view::npos;
  const std::string_view arg = has_arg ? head.substr(colon + 1) : std::string_view();
  bool known = false;
  for (const auto& n : kNames) {
    if (n.name == name) {
      spec.kind = n.kind;
      known = true;
    }
  }
  if (!known) {
    return invalid_arg(
        "codec spec \"{}\": unknown codec \"{}\" (expected none, fp16, bf16, topk:RATIO, "
        "randomk:RATIO, sign, qsgd:LEVELS, powersgd:RANK)",
        text, name);
  }
  switch (spec.kind) {
    case CodecKind::kNone:
    case CodecKind::kFp16:
    case CodecKind::kBf16:
    case CodecKind::kSign:
      if (has_arg) return invalid_arg("codec spec \"{}\": {} takes no ':' argument", text, name);
      break;
    case CodecKind::kTopK:
    case CodecKind::kRandomK:
      if (!parse_number(arg, &spec.ratio) || !(spec.ratio > 0.0 && spec.ratio <= 1.0)) {
        return invalid_arg("codec spec \"{}\": {} needs a ratio in (0, 1], e.g. {}:0.01", text,
                           name, name);
      }
      break;
    case CodecKind::kQsgd:
      if (!parse_number(arg, &spec.levels) || spec.levels < 1 || spec.levels > 127) {
        return invalid_arg("codec spec \"{}\": qsgd needs LEVELS in 1..127, e.g. qsgd:16", text);
      }
      break;
    case CodecKind::kPowerSgd:
      if (!parse_number(arg, &spec.rank) || spec.rank < 1 || spec.rank > 64) {
        return invalid_arg("codec spec \"{}\": powersgd needs RANK in 1..64, e.g. powersgd:4",
                           text);
      }
      break;
  }
  spec.error_feedback = spec.kind != CodecKind::kNone && spec.kind != CodecKind::kFp16 &&
                        spec.kind != CodecKind::kBf16;

  std::vector<std::string_view> seen;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string_view opt = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (comma != std::string_view::npos && rest.empty()) {
      return invalid_arg("codec spec \"{}\": empty option after ','", text);
    }
    const size_t eq = opt.find('=');
    if (eq == std::string_view::npos || eq == 0) {
      return invalid_arg("codec spec \"{}\": option \"{}\" is not key=value", text, opt);
    }
    const std::string_view key = opt.substr(0, eq);
    const std::string_view value = opt.substr(eq + 1);
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      return invalid_arg("codec spec \"{}\": option \"{}\" given twice", text, key);
    }
    seen.push_back(key);
    auto bad = [&](std::string_view what) {
      return invalid_arg("codec spec \"{}\": option {}={} {}", text, key, value, what);
    };
    auto not_for = [&]() {
      return invalid_arg("codec spec \"{}\": option \"{}\" does not apply to {}", text, key, name);
    };
    if (key == "ef") {
      if (spec.kind == CodecKind::kNone) return not_for();
      if (!parse_bool01(value, &spec.error_feedback)) return bad("must be 0 or 1");
    } else if (key == "seed") {
      if (spec.kind != CodecKind::kRandomK && spec.kind != CodecKind::kQsgd) return not_for();
      if (!parse_number(value, &spec.seed)) return bad("must be an unsigned integer");
    } else if (key == "chunk") {
      if (spec.kind != CodecKind::kSign) return not_for();
      if (!parse_number(value, &spec.chunk) || spec.chunk == 0 || spec.chunk % 64 != 0 ||
          spec.chunk > kMaxChunk) {
        return bad("must be a multiple of 64 in 64..1048576");
      }
    } else if (key == "bucket") {
      if (spec.kind != CodecKind::kQsgd) return not_for();
      if (!parse_number(value, &spec.bucket) || spec.bucket == 0 || spec.bucket > kMaxChunk) {
        return bad("must be in 1..1048576");
      }
    } else if (key == "cols") {
      if (spec.kind != CodecKind::kPowerSgd) return not_for();
      if (!parse_number(value, &spec.cols) || spec.cols == 0) return bad("must be >= 1");
    } else if (key == "slice") {
      if (spec.kind != CodecKind::kFp16 && spec.kind != CodecKind::kBf16) return not_for();
      if (!parse_number(value, &spec.slice) ||
          (spec.slice != 0 && (spec.slice < 4096 || spec.slice > (size_t{1} << 31)))) {
        return bad("must be 0 (no slicing) or 4096..2147483648 elements");
      }
    } else if (key == "nonfinite") {
      if (spec.kind == CodecKind::kNone) return not_for();
      if (value == "skip") {
        spec.skip_nonfinite = true;
      } else if (value == "keep") {
        spec.skip_nonfinite = false;
      } else {
        return bad("must be skip or keep");
      }
    } else if (key == "warm") {
      if (spec.kind != CodecKind::kPowerSgd) return not_for();
      if (!parse_bool01(value, &spec.warm_start)) return bad("must be 0 or 1");
    } else {
      return invalid_arg(
          "codec spec \"{}\": unknown option \"{}\" (known: ef, seed, chunk, bucket, cols, warm, "
          "slice, nonfinite)",
          text, key);
    }
  }
  return spec;
}

std::string format_codec_spec(const CodecSpec& spec) {
  std::string out(codec_name(spec.kind));
  switch (spec.kind) {
    case CodecKind::kTopK:
    case CodecKind::kRandomK:
      out += fmt::format(":{}", spec.ratio);
      break;
    case CodecKind::kQsgd:
      out += fmt::format(":{}", spec.levels);
      break;
    case CodecKind::kPowerSgd:
      out += fmt::format(":{}", spec.rank);
      break;
    default:
      break;
  }
  if (spec.kind == CodecKind::kNone) return out;
  out += fmt::format(",ef={}", spec.error_feedback ? 1 : 0);
  if (spec.kind == CodecKind::kRandomK || spec.kind == CodecKind::kQsgd) {
    out += fmt::format(",seed={}", spec.seed);
  }
  if ((spec.kind == CodecKind::kFp16 || spec.kind == CodecKind::kBf16) &&
      spec.slice != kDefaultCastSlice) {
    out += fmt::format(",slice={}", spec.slice);
  }
  if (spec.kind == CodecKind::kSign) out += fmt::format(",chunk={}", spec.chunk);
  if (spec.kind == CodecKind::kQsgd) out += fmt::format(",bucket={}", spec.bucket);
  if (spec.kind == CodecKind::kPowerSgd) {
    if (spec.cols) out += fmt::format(",cols={}", spec.cols);
    out += fmt::format(",warm={}", spec.warm_start ? 1 : 0);
  }
  if (!spec.skip_nonfinite) out += ",nonfinite=keep";
  return out;
}

uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

// ------------------------------------------------------------------------------------------
// Selection helpers.

namespace {

inline uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Magnitude with NaN ordered below everything, so comparisons stay a strict weak order.
inline float mag(float x) {
  const float a = std::fabs(x);
  return a == a ? a : -1.0f;
}

// The order key of a magnitude as an integer: the bits of |x| + 1 (non-negative floats order as
// their bit patterns), and 0 for NaN, below every number.
inline uint32_t mag_key(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
  return bits > 0x7F800000u ? 0u : bits + 1u;
}

// Keeps the k best (largest magnitude, then lowest index) of the candidates idx (increasing) with
// their values val, in index order. A radix select over the magnitude keys gives the exact k-th
// best key t: a histogram of the top 11 bits over every candidate, then the keys in the chosen
// bin (a small part: the candidates' magnitudes sit in a few binades just above the sampled
// threshold) are compacted and their next 11 and last 10 bits resolved on that subset alone. One
// scan then keeps everything above t and the first (lowest-index) ties at t. The hot loops have no
// data-dependent branches (the keep/compact decisions are additions), and the histogram is split
// in four so that equal bins in a row do not wait on each other. No sort, no nth_element.
void keep_best(std::vector<uint32_t>* idx, std::vector<float>* val, size_t k) {
  const size_t n = idx->size();
  if (n <= k) return;
  if (k == 0) {
    idx->clear();
    val->clear();
    return;
  }
  // Scratch kept per thread: two fresh 4n-byte arrays per call would cost page faults each time.
  thread_local std::vector<uint32_t> key_buf, sub_buf;
  if (key_buf.size() < n) key_buf.resize(n);
  if (sub_buf.size() < n) sub_buf.resize(n);
  uint32_t* key = key_buf.data();
  uint32_t* sub = sub_buf.data();
  // Picks the bin of a histogram from the top holding the k-th best key; `above` counts the keys
  // known to be greater than t.
  size_t above = 0;
  auto pick = [&](const uint32_t* hist, uint32_t bins) {
    uint32_t bin = bins;
    while (bin-- > 0) {
      if (above + hist[bin] >= k) break;
      above += hist[bin];
    }
    return bin;
  };
  std::vector<uint32_t> h4(4 * 2048, 0);
  const float* v = val->data();
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
  for (uint32_t b = 0; b < 2048; ++b) h4[b] += h4[2048 + b] + h4[4096 + b] + h4[6144 + b];
  uint32_t prefix = pick(h4.data(), 2048) << 21;
  // The keys in that bin, then the next two digits over them only.
  size_t m = 0;
  for (j = 0; j < n; ++j) {
    sub[m] = key[j];
    m += (key[j] >> 21) == (prefix >> 21);
  }
  uint32_t hist[2048];
  std::fill(hist, hist + 2048, 0u);
  for (j = 0; j < m; ++j) ++hist[(sub[j] >> 10) & 2047u];
  prefix |= pick(hist, 2048) << 10;
  size_t m2 = 0;
  for (j = 0; j < m; ++j) {
    sub[m2] = sub[j];
    m2 += (sub[j] >> 10) == (prefix >> 10);
  }
  std::fill(hist, hist + 1024, 0u);
  for (j = 0; j < m2; ++j) ++hist[sub[j] & 1023u];
  const uint32_t t = prefix | pick(hist, 1024);
  size_t ties = k - above;  // keys equal to t that make the cut, lowest index first
  size_t w = 0;
  uint32_t* ip = idx->data();
  float* vp = val->data();
  for (j = 0; j < n; ++j) {
    const uint32_t kj = key[j];
    const size_t eq = kj == t;
    const size_t keep = (kj > t) | (eq & (ties > 0));
    ip[w] = ip[j];  // w <= j: an in-place compaction
    vp[w] = vp[j];
    w += keep;
    ties -= eq & keep;
  }
  idx->resize(w);
  val->resize(w);
}

struct TopKSet {
  std::vector<uint32_t> idx;  // increasing
  std::vector<float> val;     // v[idx[j]]
};

// topk_select_fused (see codec.h), also returning the selected values.
// Fills *out (its vectors are cleared; their capacity is reused, so a caller that keeps one
// TopKSet across calls does not pay fresh pages for the candidates every time).
void topk_fused(const float* in, float* residual, size_t count, size_t k, TopKSet* out) {
  TopKSet& s = *out;
  s.idx.clear();
  s.val.clear();
  k = std::min(k, count);
  const float* v = residual ? residual : in;  // v = in + residual once the pass has run
  const float kNoThreshold = std::numeric_limits<float>::quiet_NaN();
  // Exact selection over everything (small inputs, k a large fraction, a misjudged sample).
  auto exact = [&](bool pass_done) {
    if (!pass_done && residual) {
      ck::add_collect_abs_ge(in, residual, count, kNoThreshold, 0, &s.idx, nullptr);
    }
    s.idx.resize(count);
    for (size_t i = 0; i < count; ++i) s.idx[i] = static_cast<uint32_t>(i);
    s.val.assign(v, v + count);
    keep_best(&s.idx, &s.val, k);
  };
  // Sampled in runs of 16 consecutive elements (one cache line), so the sample costs ~1000
  // random line reads, not 16384.
  constexpr size_t kRun = 16, kSample = 16384;
  if (count <= 4 * kSample || k * 4 >= count) return exact(false);
  thread_local std::vector<float> sample;
  sample.resize(kSample);
  uint64_t state = count;
  for (size_t j = 0; j < kSample; j += kRun) {
    const size_t base = splitmix64(&state) % (count - kRun + 1);
    for (size_t i = base; i < base + kRun; ++i) {
      sample[j + i - base] = mag(residual ? in[i] + residual[i] : in[i]);
    }
  }
  // Threshold: aim at ~1.25 k candidates plus a few standard deviations (and a margin for the
  // runs being correlated), so one pass almost always collects a superset of the top k without
  // collecting much more.
  const double expect = static_cast<double>(kSample) * static_cast<double>(k) / count;
  const size_t pos = static_cast<size_t>(expect * 1.25 + 6.0 * std::sqrt(expect) + 16.0);
  if (pos >= kSample) return exact(false);
  std::nth_element(sample.begin(), sample.begin() + static_cast<ptrdiff_t>(pos), sample.end(),
                   std::greater<float>());
  float threshold = sample[pos];
  if (!(threshold > 0.0f)) return exact(false);
  const size_t expect_cands = pos * (count / kSample) + 1024;
  s.idx.reserve(expect_cands);
  s.val.reserve(expect_cands);
  ck::add_collect_abs_ge(in, residual, count, threshold, 0, &s.idx, &s.val);
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
  keep_best(&s.idx, &s.val, k);
}

}  // namespace

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

std::vector<uint32_t> randomk_indices(uint64_t seed, const CodecContext& ctx, size_t count,
                                      size_t k) {
  std::vector<uint32_t> idx;
  k = std::min(k, count);
  if (k == 0) return idx;
  // Rejection sampling into a bitmap; when k is more than half, pick the complement instead.
  const bool complement = k * 2 > count;
  const size_t want = complement ? count - k : k;
  std::vector<uint64_t> bits((count + 63) / 64, 0);
  uint64_t state = seed ^ (ctx.key_hash * 0x9e3779b97f4a7c15ull) ^ (ctx.step << 1);
  splitmix64(&state);
  size_t have = 0;
  while (have < want) {
    const size_t i = static_cast<size_t>(splitmix64(&state) % count);
    uint64_t& w = bits[i / 64];
    const uint64_t b = uint64_t{1} << (i % 64);
    if (!(w & b)) {
      w |= b;
      ++have;
    }
  }
  idx.reserve(k);
  for (size_t wi = 0; wi < bits.size(); ++wi) {
    uint64_t w = complement ? ~bits[wi] : bits[wi];
    if (complement && wi + 1 == bits.size() && count % 64) w &= (uint64_t{1} << (count % 64)) - 1;
    while (w) {
      idx.push_back(static_cast<uint32_t>(wi * 64 + std::countr_zero(w)));
      w &= w - 1;
    }
  }
  return idx;
}

// ------------------------------------------------------------------------------------------
// Codecs.

namespace {

Status check_out(size_t out_size, size_t need, std::string_view codec) {
  if (out_size < need) {
    return invalid_arg("{} encode: output buffer holds {} bytes, {} needed", codec, out_size, need);
  }
  return ok_status();
}

Status check_count(size_t count, std::string_view codec) {
  if (count > std::numeric_limits<uint32_t>::max()) {
    return invalid_arg("{}: {} elements exceed the codec's 32-bit index limit", codec, count);
  }
  return ok_status();
}

class CastCodec final : public Codec {
 public:
  explicit CastCodec(const CodecSpec& spec) : Codec(spec), bf16_(spec.kind == CodecKind::kBf16) {}
  Aggregation aggregation() const override { return Aggregation::kSummable; }
  DataType wire_dtype() const override { return bf16_ ? DataType::kBF16 : DataType::kF16; }
  size_t encoded_size(size_t count) const override { return count * 2; }
  Status encode(const float* in, float* residual, size_t count, uint8_t* out, size_t out_size,
                const CodecContext&) const override {
    GW_RETURN_IF_ERROR(check_out(out_size, encoded_size(count), codec_name(spec_.kind)));
    ck::encode_cast16(in, residual, count, reinterpret_cast<uint16_t*>(out), bf16_);
    return ok_status();
  }
  Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                    const CodecContext&) const override {
    if (in_size != encoded_size(count)) {
      return invalid_arg("{} decode: {} bytes for {} elements, expected {}", codec_name(spec_.kind),
                         in_size, count, encoded_size(count));
    }
    ck::decode_cast16(reinterpret_cast<const uint16_t*>(in), count, acc, bf16_, true);
    return ok_status();
  }

  Status decode(const uint8_t* in, size_t in_size, size_t count, float* out,
                const CodecContext&) const override {
    if (in_size != encoded_size(count)) {
      return invalid_arg("{} decode: {} bytes for {} elements, expected {}", codec_name(spec_.kind),
                         in_size, count, encoded_size(count));
    }
    ck::decode_cast16(reinterpret_cast<const uint16_t*>(in), count, out, bf16_, false);
    return ok_status();
  }

 private:
  bool bf16_;
};

class RandomKCodec final : public Codec {
 public:
  explicit RandomKCodec(const CodecSpec& spec) : Codec(spec) {}
  Aggregation aggregation() const override { return Aggregation::kSummable; }
  DataType wire_dtype() const override { return DataType::kF32; }
  size_t encoded_size(size_t count) const override {
    return topk_count(spec_.ratio, count) * sizeof(float);
  }
  Status encode(const float* in, float* residual, size_t count, uint8_t* out, size_t out_size,
                const CodecContext& ctx) const override {
    GW_RETURN_IF_ERROR(check_count(count, "randomk"));
    GW_RETURN_IF_ERROR(check_out(out_size, encoded_size(count), "randomk"));
    const auto idx = randomk_indices(spec_.seed, ctx, count, topk_count(spec_.ratio, count));
    float* vals = reinterpret_cast<float*>(out);
    if (residual) {
      ck::add_f32(in, count, residual);
      for (size_t j = 0; j < idx.size(); ++j) {
        vals[j] = residual[idx[j]];
        residual[idx[j]] = 0.0f;
      }
    } else {
      for (size_t j = 0; j < idx.size(); ++j) vals[j] = in[idx[j]];
    }
    return ok_status();
  }
  Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                    const CodecContext& ctx) const override {
    GW_RETURN_IF_ERROR(check_count(count, "randomk"));
    if (in_size != encoded_size(count)) {
      return invalid_arg("randomk decode: {} bytes for {} elements, expected {}", in_size, count,
                         encoded_size(count));
    }
    const auto idx = randomk_indices(spec_.seed, ctx, count, topk_count(spec_.ratio, count));
    for (size_t j = 0; j < idx.size(); ++j) {
      float v;  // memcpy: a peer's encoding need not be 4-byte aligned
      std::memcpy(&v, in + 4 * j, sizeof(v));
      acc[idx[j]] += v;
    }
    return ok_status();
  }
};

// Layout: u32 magic, u32 k, k u32 indices, k f32 values.
class TopKCodec final : public Codec {
 public:
  explicit TopKCodec(const CodecSpec& spec) : Codec(spec) {}
  Aggregation aggregation() const override { return Aggregation::kGather; }
  size_t encoded_size(size_t count) const override {
    return 8 + topk_count(spec_.ratio, count) * 8;
  }
  Status encode(const float* in, float* residual, size_t count, uint8_t* out, size_t out_size,
                const CodecContext&) const override {
    GW_RETURN_IF_ERROR(check_count(count, "topk"));
    GW_RETURN_IF_ERROR(check_out(out_size, encoded_size(count), "topk"));
    const size_t k = topk_count(spec_.ratio, count);
    // Kept per thread: the candidates of a 100 MiB tensor take megabytes, which would be fresh
    // pages (faults) on every call. (The memory, about 16 bytes per candidate, ~2% of the
    // elements, stays with the thread.)
    thread_local TopKSet sel;
    topk_fused(in, residual, count, k, &sel);
    const uint32_t header[2] = {kTopkMagic, static_cast<uint32_t>(k)};
    std::memcpy(out, header, 8);
    std::memcpy(out + 8, sel.idx.data(), k * 4);
    std::memcpy(out + 8 + k * 4, sel.val.data(), k * 4);
    if (residual) {
      for (uint32_t i : sel.idx) residual[i] = 0.0f;
    }
    return ok_status();
  }
  Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                    const CodecContext&) const override {
    GW_ASSIGN_OR_RETURN(const size_t k, check_encoding(in, in_size, count));
    const uint8_t* ip = in + 8;
    const uint8_t* vp = in + 8 + k * 4;
    for (size_t j = 0; j < k; ++j) {
      uint32_t i;
      float val;
      std::memcpy(&i, ip + 4 * j, 4);
      std::memcpy(&val, vp + 4 * j, 4);
      if (i >= count) return invalid_arg("topk decode: index {} out of range {}", i, count);
      acc[i] += val;
    }
    return ok_status();
  }
  // Block by block (kBlock elements, in L1): every source's pairs that fall in the block are
  // added, in source order, to a zeroed block, which is then written out with streaming stores.
  // So the output is written once and never read (instead of cleared by the encode and then
  // read back for each of the p scattered adds), and the adds hit L1. The encoder writes its
  // indices increasing; an encoding whose indices are not strictly increasing is rejected.
  Status decode_sum(const uint8_t* const* encs, size_t in_size, size_t nenc, size_t count,
                    float* out, const CodecContext* ctxs) const override {
    constexpr size_t kBlock = 4096;
    auto from = [&](Status st, size_t j) {
      return st.with_context(fmt::format("encoding from rank {}", ctxs[j].rank));
    };
    size_t k = 0;
    for (size_t j = 0; j < nenc; ++j) {
      auto kj = check_encoding(encs[j], in_size, count);
      if (!kj.ok()) return from(kj.status(), j);
      k = *kj;
    }
    std::vector<size_t> cursor(nenc, 0);
    std::vector<int64_t> last(nenc, -1);
    alignas(64) float block[kBlock];
    for (size_t b = 0; b < count; b += kBlock) {
      const size_t len = std::min(kBlock, count - b);
      std::memset(block, 0, len * 4);
      for (size_t j = 0; j < nenc; ++j) {
        const uint8_t* ip = encs[j] + 8;
        const uint8_t* vp = encs[j] + 8 + k * 4;
        size_t c = cursor[j];
        for (; c < k; ++c) {
          uint32_t i;
          std::memcpy(&i, ip + 4 * c, 4);
          if (i >= b + len) break;
          if (static_cast<int64_t>(i) <= last[j]) {
            return from(
                invalid_arg("topk decode: index {} after {} (indices must increase)", i, last[j]),
                j);
          }
          last[j] = i;
          float val;
          std::memcpy(&val, vp + 4 * c, 4);
          block[i - b] += val;
        }
        cursor[j] = c;
      }
      ck::store_stream_f32(block, len, out + b);
    }
    for (size_t j = 0; j < nenc; ++j) {
      if (cursor[j] < k) {  // only an index >= count stops a cursor early
        uint32_t i;
        std::memcpy(&i, encs[j] + 8 + 4 * cursor[j], 4);
        return from(invalid_arg("topk decode: index {} out of range {}", i, count), j);
      }
    }
    return ok_status();
  }

 private:
  // k, once the size and the header are checked.
  Result<size_t> check_encoding(const uint8_t* in, size_t in_size, size_t count) const {
    GW_RETURN_IF_ERROR(check_count(count, "topk"));
    const size_t k = topk_count(spec_.ratio, count);
    if (in_size != encoded_size(count)) {
      return invalid_arg("topk decode: {} bytes for {} elements, expected {}", in_size, count,
                         encoded_size(count));
    }
    uint32_t header[2];
    std::memcpy(header, in, 8);
    if (header[0] != kTopkMagic || header[1] != k) {
      return invalid_arg("topk decode: bad header (magic {:#x}, k {}; expected k {})", header[0],
                         header[1], k);
    }
    return k;
  }
};

// Layout: nchunks f32 scales, then chunk/64 u64 words per chunk.
class SignCodec final : public Codec {
 public:
  explicit SignCodec(const CodecSpec& spec) : Codec(spec) {}
  Aggregation aggregation() const override { return Aggregation::kTwoPhase; }
  size_t encoded_size(size_t count) const override {
    const size_t nchunks = (count + spec_.chunk - 1) / spec_.chunk;
    return nchunks * (4 + spec_.chunk / 8);
  }
  Status encode(const float* in, float* residual, size_t count, uint8_t* out, size_t out_size,
                const CodecContext&) const override {
    GW_RETURN_IF_ERROR(check_out(out_size, encoded_size(count), "sign"));
    const size_t chunk = spec_.chunk;
    const size_t nchunks = (count + chunk - 1) / chunk;
    float* scales = reinterpret_cast<float*>(out);
    uint64_t* words = reinterpret_cast<uint64_t*>(out + nchunks * 4);
    for (size_t c = 0; c < nchunks; ++c) {
      const size_t off = c * chunk;
      const size_t n = std::min(chunk, count - off);
      uint64_t* w = words + c * (chunk / 64);
      if (n < chunk) std::memset(w, 0, chunk / 8);
      const float s = ck::sign_encode_chunk(in + off, residual ? residual + off : nullptr, n, w);
      std::memcpy(scales + c, &s, 4);
    }
    return ok_status();
  }
  Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                    const CodecContext&) const override {
    return decode_chunks(in, in_size, count, acc, ck::sign_decode_add);
  }
  // Each chunk is decoded into an L1 buffer and written out with streaming stores: the output
  // is written once and not read (no read-for-ownership of its cache lines).
  Status decode(const uint8_t* in, size_t in_size, size_t count, float* out,
                const CodecContext&) const override {
    std::vector<float> buf(std::min(spec_.chunk, count));
    return decode_chunks(in, in_size, count, out,
                         [&](const uint64_t* words, float scale, size_t n, float* dst) {
                           ck::sign_decode_set(words, scale, n, buf.data());
                           ck::store_stream_f32(buf.data(), n, dst);
                         });
  }
  // Applies `kernel` (decode-and-add or decode-and-set) to every chunk of an encoding.
  template <typename Kernel>
  Status decode_chunks(const uint8_t* in, size_t in_size, size_t count, float* out,
                       Kernel&& kernel) const {
    if (in_size != encoded_size(count)) {
      return invalid_arg("sign decode: {} bytes for {} elements, expected {}", in_size, count,
                         encoded_size(count));
    }
    const size_t chunk = spec_.chunk;
    const size_t nchunks = (count + chunk - 1) / chunk;
    const uint64_t* words = reinterpret_cast<const uint64_t*>(in + nchunks * 4);
    for (size_t c = 0; c < nchunks; ++c) {
      float s;
      std::memcpy(&s, in + 4 * c, 4);
      const size_t off = c * chunk;
      kernel(words + c * (chunk / 64), s, std::min(chunk, count - off), out + off);
    }
    return ok_status();
  }
  // Chunk by chunk: the decoded sum of one chunk stays in L1 and goes straight into the encode,
  // so the partition is read and written once (its server residual), not once per sender.
  Status merge_encode(const uint8_t* const* encs, size_t nenc, size_t count, float* residual,
                      uint8_t* out, size_t out_size, const CodecContext&) const override {
    GW_RETURN_IF_ERROR(check_out(out_size, encoded_size(count), "sign"));
    const size_t chunk = spec_.chunk;
    const size_t nchunks = (count + chunk - 1) / chunk;
    const size_t words_per_chunk = chunk / 64;
    std::vector<float> sum(chunk), src_scales(nenc);
    std::vector<const uint64_t*> src_words(nenc);
    float* scales = reinterpret_cast<float*>(out);
    uint64_t* words = reinterpret_cast<uint64_t*>(out + nchunks * 4);
    for (size_t c = 0; c < nchunks; ++c) {
      const size_t off = c * chunk;
      const size_t n = std::min(chunk, count - off);
      for (size_t j = 0; j < nenc; ++j) {
        std::memcpy(&src_scales[j], encs[j] + 4 * c, 4);
        src_words[j] =
            reinterpret_cast<const uint64_t*>(encs[j] + nchunks * 4) + c * words_per_chunk;
      }
      // Summed from +0 in sender order, as the generic form's zero fill and decode_add do, so
      // the bits (and a zero's sign) are the same.
      ck::sign_decode_sum(src_words.data(), src_scales.data(), nenc, n, sum.data());
      uint64_t* ow = words + c * words_per_chunk;
      if (n < chunk) std::memset(ow, 0, chunk / 8);
      const float s = ck::sign_encode_chunk(sum.data(), residual ? residual + off : nullptr, n, ow);
      std::memcpy(scales + c, &s, 4);
    }
    return ok_status();
  }
};

// Layout: nbuckets f32 norms, then count int8 levels in [-levels, levels].
class QsgdCodec final : public Codec {
 public:
  explicit QsgdCodec(const CodecSpec& spec) : Codec(spec) {}
  Aggregation aggregation() const override { return Aggregation::kGather; }
  size_t encoded_size(size_t count) const override {
    return (count + spec_.bucket - 1) / spec_.bucket * 4 + count;
  }
  Status encode(const float* in, float* residual, size_t count, uint8_t* out, size_t out_size,
                const CodecContext& ctx) const override {
    GW_RETURN_IF_ERROR(check_out(out_size, encoded_size(count), "qsgd"));
    const size_t bucket = spec_.bucket;
    const size_t nb = (count + bucket - 1) / bucket;
    const float s = static_cast<float>(spec_.levels);
    int8_t* q = reinterpret_cast<int8_t*>(out + nb * 4);
    uint64_t state = spec_.seed ^ (ctx.key_hash * 0x9e3779b97f4a7c15ull) ^ (ctx.step << 20) ^
                     (static_cast<uint64_t>(ctx.rank) << 48);
    splitmix64(&state);
    if (residual) ck::add_f32(in, count, residual);
    const float* v = residual ? residual : in;
    for (size_t b = 0; b < nb; ++b) {
      const size_t off = b * bucket;
      const size_t n = std::min(bucket, count - off);
      double sq = 0;
      for (size_t i = 0; i < n; ++i) sq += static_cast<double>(v[off + i]) * v[off + i];
      const float norm = static_cast<float>(std::sqrt(sq));
      std::memcpy(out + 4 * b, &norm, 4);
      const float inv = norm > 0 && std::isfinite(norm) ? s / norm : 0.0f;
      const float step = norm / s;
      for (size_t i = 0; i < n; ++i) {
        const float x = v[off + i];
        float a = std::fabs(x) * inv;
        if (!(a >= 0.0f)) a = 0.0f;  // NaN
        if (a > s) a = s;
        const float l = std::floor(a);
        const float u = static_cast<float>(splitmix64(&state) >> 40) * (1.0f / 16777216.0f);
        int lv = static_cast<int>(l) + (u < a - l ? 1 : 0);
        if (lv > spec_.levels) lv = spec_.levels;
        const int sq_level = std::signbit(x) ? -lv : lv;
        q[off + i] = static_cast<int8_t>(sq_level);
        if (residual) residual[off + i] = x - static_cast<float>(sq_level) * step;
      }
    }
    return ok_status();
  }
  Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                    const CodecContext&) const override {
    if (in_size != encoded_size(count)) {
      return invalid_arg("qsgd decode: {} bytes for {} elements, expected {}", in_size, count,
                         encoded_size(count));
    }
    const size_t bucket = spec_.bucket;
    const size_t nb = (count + bucket - 1) / bucket;
    const int8_t* q = reinterpret_cast<const int8_t*>(in + nb * 4);
    const float s = static_cast<float>(spec_.levels);
    for (size_t b = 0; b < nb; ++b) {
      float norm;
      std::memcpy(&norm, in + 4 * b, 4);
      const float step = norm / s;
      const size_t off = b * bucket;
      const size_t n = std::min(bucket, count - off);
      for (size_t i = 0; i < n; ++i) {
        const int lv = q[off + i];
        if (lv > spec_.levels || lv < -spec_.levels) {
          return invalid_arg("qsgd decode: level {} at element {} outside +-{}", lv, off + i,
                             spec_.levels);
        }
        acc[off + i] += static_cast<float>(lv) * step;
      }
    }
    return ok_status();
  }
};

}  // namespace

Status Codec::decode(const uint8_t* in, size_t in_size, size_t count, float* out,
                     const CodecContext& ctx) const {
  std::fill(out, out + count, 0.0f);
  return decode_add(in, in_size, count, out, ctx);
}

Status Codec::decode_sum(const uint8_t* const* encs, size_t in_size, size_t nenc, size_t count,
                         float* out, const CodecContext* ctxs) const {
  std::fill(out, out + count, 0.0f);
  for (size_t j = 0; j < nenc; ++j) {
    Status st = decode_add(encs[j], in_size, count, out, ctxs[j]);
    if (!st.ok()) return st.with_context(fmt::format("encoding from rank {}", ctxs[j].rank));
  }
  return ok_status();
}

Status Codec::merge_encode(const uint8_t* const* encs, size_t nenc, size_t count, float* residual,
                           uint8_t* out, size_t out_size, const CodecContext& ctx) const {
  std::vector<float> sum(count, 0.0f);
  for (size_t j = 0; j < nenc; ++j) {
    GW_RETURN_IF_ERROR(decode_add(encs[j], encoded_size(count), count, sum.data(), ctx));
  }
  return encode(sum.data(), residual, count, out, out_size, ctx);
}

Result<std::unique_ptr<Codec>> Codec::create(const CodecSpec& spec) {
  switch (spec.kind) {
    case CodecKind::kFp16:
    case CodecKind::kBf16:
      return std::unique_ptr<Codec>(new CastCodec(spec));
    case CodecKind::kTopK:
      if (!(spec.ratio > 0 && spec.ratio <= 1)) return invalid_arg("topk: ratio must be in (0, 1]");
      return std::unique_ptr<Codec>(new TopKCodec(spec));
    case CodecKind::kRandomK:
      if (!(spec.ratio > 0 && spec.ratio <= 1)) {
        return invalid_arg("randomk: ratio must be in (0, 1]");
      }
      return std::unique_ptr<Codec>(new RandomKCodec(spec));
    case CodecKind::kSign:
      if (spec.chunk == 0 || spec.chunk % 64 || spec.chunk > kMaxChunk) {
        return invalid_arg("sign: chunk must be a multiple of 64 in 64..1048576");
      }
      return std::unique_ptr<Codec>(new SignCodec(spec));
    case CodecKind::kQsgd:
      if (spec.levels < 1 || spec.levels > 127 || spec.bucket == 0 || spec.bucket > kMaxChunk) {
        return invalid_arg("qsgd: levels must be 1..127 and bucket 1..1048576");
      }
      return std::unique_ptr<Codec>(new QsgdCodec(spec));
    case CodecKind::kNone:
      return invalid_arg("codec \"none\" has no encoding (send the tensor as it is)");
    case CodecKind::kPowerSgd:
      return invalid_arg(
          "powersgd is a low-rank scheme, not a byte codec: use the compressed "
          "allreduce");
  }
  return invalid_arg("unknown codec kind {}", static_cast<int>(spec.kind));
}

// ------------------------------------------------------------------------------------------
// PowerSGD linear algebra.

MatrixShape powersgd_shape(size_t count, size_t cols_hint) {
  MatrixShape s;
  if (count == 0) return s;
  s.cols = cols_hint ? std::min(cols_hint, count)
                     : static_cast<size_t>(std::ceil(std::sqrt(static_cast<double>(count))));
  s.rows = (count + s.cols - 1) / s.cols;
  return s;
}

// Row by row, each row (cols floats) read once and kept in L1 while all r factor columns pass
// over it (codec_kernels::pq_row_*: vectorised, the same bits on every path).

void matmul_mq(const float* m, size_t count, MatrixShape shape, const float* q, size_t r,
               float* out) {
  std::vector<float> dots(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    ck::pq_row_dots(m + off, q, shape.cols, r, std::min(shape.cols, count - off), dots.data());
    for (size_t j = 0; j < r; ++j) out[j * shape.rows + i] = dots[j];
  }
}

void matmul_mtp(const float* m, size_t count, MatrixShape shape, const float* p, size_t r,
                float* out) {
  std::fill(out, out + shape.cols * r, 0.0f);
  std::vector<float> a(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    for (size_t j = 0; j < r; ++j) a[j] = p[j * shape.rows + i];
    ck::pq_row_axpy_out(a.data(), m + off, shape.cols, r, n, out);
  }
}

// Modified Gram-Schmidt, twice ("twice is enough": the second pass removes what round-off left of
// the earlier directions). A column whose remainder is at the level of float round-off of its
// original length lies in the span of the earlier ones; normalising it would turn round-off into
// a basis vector that is not orthogonal to the rest, so it becomes zero instead (rank-deficient
// gradients compressed at a high rank hit this on every step).
void orthogonalize(float* a, size_t rows, size_t r) {
  // Squared-length threshold: (64 float epsilons * sqrt(rows))^2 of the original.
  const double eps = 64.0 * std::numeric_limits<float>::epsilon();
  const double keep = eps * eps * static_cast<double>(std::max<size_t>(rows, 1));
  for (size_t j = 0; j < r; ++j) {
    float* aj = a + j * rows;
    double orig = 0;
    for (size_t i = 0; i < rows; ++i) orig += static_cast<double>(aj[i]) * aj[i];
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t l = 0; l < j; ++l) {
        const float* al = a + l * rows;
        double d = 0;
        for (size_t i = 0; i < rows; ++i) d += static_cast<double>(al[i]) * aj[i];
        if (d == 0) continue;  // also skips the zeroed columns
        for (size_t i = 0; i < rows; ++i) {
          aj[i] = static_cast<float>(aj[i] - d * static_cast<double>(al[i]));
        }
      }
    }
    double nn = 0;
    for (size_t i = 0; i < rows; ++i) nn += static_cast<double>(aj[i]) * aj[i];
    if (!(orig > 0) || !(nn > keep * orig) || !std::isfinite(nn)) {
      std::fill(aj, aj + rows, 0.0f);
      continue;
    }
    const float inv = static_cast<float>(1.0 / std::sqrt(nn));
    for (size_t i = 0; i < rows; ++i) aj[i] *= inv;
  }
}

void add_matmul_mq(const float* x, float* m, size_t count, MatrixShape shape, const float* q,
                   size_t r, float* out) {
  std::vector<float> dots(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    if (x) ck::add_f32(x + off, n, m + off);  // the row stays in L1 for the dots below
    ck::pq_row_dots(m + off, q, shape.cols, r, n, dots.data());
    for (size_t j = 0; j < r; ++j) out[j * shape.rows + i] = dots[j];
  }
}

void residual_and_decode_pq(const float* p, const float* q_local, const float* q_sum,
                            MatrixShape shape, size_t r, size_t count, float* residual,
                            float* out) {
  std::vector<float> neg(r), pos(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    for (size_t j = 0; j < r; ++j) {
      neg[j] = -1.0f * p[j * shape.rows + i];
      pos[j] = 1.0f * p[j * shape.rows + i];
    }
    if (residual) ck::pq_row_axpy_in(neg.data(), q_local, shape.cols, r, n, residual + off);
    std::fill(out + off, out + off + n, 0.0f);
    ck::pq_row_axpy_in(pos.data(), q_sum, shape.cols, r, n, out + off);
  }
}

void add_pq(const float* p, const float* q, MatrixShape shape, size_t r, size_t count, float sign,
            float* m) {
  std::vector<float> a(r);
  for (size_t i = 0; i < shape.rows; ++i) {
    const size_t off = i * shape.cols;
    const size_t n = std::min(shape.cols, count - off);
    for (size_t j = 0; j < r; ++j) a[j] = sign * p[j * shape.rows + i];
    ck::pq_row_axpy_in(a.data(), q, shape.cols, r, n, m + off);
  }
}

}  // namespace gw::coll
