// The codec spec parser and the codecs' decoders fed a peer's payload (fuzz_targets.h).
#include <cmath>
#include <cstring>
#include <memory>
#include <string_view>

#include "collectives/compress/codec.h"
#include "collectives/compress/powersgd.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

constexpr size_t kGuard = 64;
constexpr uint32_t kGuardBits = 0x7fc0dead;  // a NaN pattern no decoder writes

// The byte codecs a peer's encoding is decoded by (powersgd is not a byte codec).
const char* const kSpecs[] = {"fp16",   "bf16",          "topk:0.1", "randomk:0.25,seed=3",
                              "sign",   "sign,chunk=64", "qsgd:4",   "qsgd:16,bucket=64",
                              "topk:1", "randomk:1"};

struct Guarded {
  explicit Guarded(size_t n) : buf(kGuard + n + kGuard) {
    for (float& f : buf) std::memcpy(&f, &kGuardBits, 4);
  }
  float* data() { return buf.data() + kGuard; }
  bool intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      uint32_t a, b;
      std::memcpy(&a, &buf[i], 4);
      std::memcpy(&b, &buf[buf.size() - 1 - i], 4);
      if (a != kGuardBits || b != kGuardBits) return false;
    }
    return true;
  }
  std::vector<float> buf;
};

const coll::Codec& codec(size_t i) {
  static std::vector<std::unique_ptr<coll::Codec>>* all = [] {
    auto* v = new std::vector<std::unique_ptr<coll::Codec>>();
    for (const char* s : kSpecs) {
      auto spec = coll::parse_codec_spec(s);
      check(spec.ok(), "codec fuzz: spec");
      auto c = coll::Codec::create(*spec);
      check(c.ok(), "codec fuzz: create");
      v->push_back(std::move(*c));
    }
    return v;
  }();
  return *(*all)[i % all->size()];
}

}  // namespace

int codec_spec(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto spec = coll::parse_codec_spec(text);
  if (!spec.ok()) return 0;
  const std::string canon = coll::format_codec_spec(*spec);
  auto again = coll::parse_codec_spec(canon);
  check(again.ok(), "codec spec: the canonical form parses");
  check(coll::format_codec_spec(*again) == canon, "codec spec: format/parse round trip");
  auto c = coll::Codec::create(*spec);
  if (c.ok()) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{1000}}) (void)(*c)->encoded_size(count);
  }
  return 0;
}

// data[0]: codec; data[1..2]: element count (1..4096); data[3]: mode; rest: the peer's bytes.
int codec_payload(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const uint8_t mode = data[3];
  const size_t count = 1 + ((static_cast<size_t>(data[1]) | (size_t{data[2]} << 8)) % 4096);
  const uint8_t* in = data + 4;
  const size_t in_size = size - 4;
  if ((data[0] & 0x80) != 0) {
    // PowerSGD's factors as a peer's allreduce delivers them: arbitrary floats (NaN, Inf,
    // denormals), orthogonalised and applied. Everything stays inside its buffer.
    const size_t r = 1 + data[0] % 4;
    coll::MatrixShape shape = coll::powersgd_shape(count, 0);
    Guarded p(shape.rows * r), q(shape.cols * r), m(count);
    std::memcpy(p.data(), in, std::min(in_size, shape.rows * r * sizeof(float)));
    if (in_size > shape.rows * r * sizeof(float)) {
      size_t left = in_size - shape.rows * r * sizeof(float);
      std::memcpy(q.data(), in + shape.rows * r * sizeof(float),
                  std::min(left, shape.cols * r * sizeof(float)));
    }
    for (size_t i = 0; i < shape.rows * r; ++i) {
      if (i * sizeof(float) >= in_size) p.data()[i] = 0;
    }
    for (size_t i = 0; i < shape.cols * r; ++i) {
      if (shape.rows * r * sizeof(float) + i * sizeof(float) >= in_size) q.data()[i] = 0;
    }
    for (size_t i = 0; i < count; ++i) m.data()[i] = 0;
    coll::orthogonalize(p.data(), shape.rows, r);
    coll::add_pq(p.data(), q.data(), shape, r, count, -1.0f, m.data());
    check(p.intact() && q.intact() && m.intact(), "powersgd: wrote outside a factor");
    return 0;
  }
  const coll::Codec& c = codec(data[0]);
  coll::CodecContext ctx;
  ctx.key_hash = 0x1234;
  ctx.step = mode;
  Guarded acc(count);
  for (size_t i = 0; i < count; ++i) acc.data()[i] = 1.0f;
  Status s = c.decode_add(in, in_size, count, acc.data(), ctx);
  check(acc.intact(), "codec: decode_add wrote outside the tensor");
  ++counter(s.ok() ? "codec.decoded" : "codec.refused");
  Guarded out(count);
  (void)c.decode(in, in_size, count, out.data(), ctx);
  check(out.intact(), "codec: decode wrote outside the tensor");
  // Two peers' encodings summed (the gather codecs' path), when the sizes fit one encoding.
  const size_t enc = c.encoded_size(count);
  if (in_size >= enc) {
    const uint8_t* encs[2] = {in, in + (in_size - enc)};
    coll::CodecContext ctxs[2] = {ctx, ctx};
    Guarded sum(count);
    (void)c.decode_sum(encs, enc, 2, count, sum.data(), ctxs);
    check(sum.intact(), "codec: decode_sum wrote outside the tensor");
    std::vector<uint8_t> re(enc + kGuard, 0xee);
    Guarded residual(count);
    for (size_t i = 0; i < count; ++i) residual.data()[i] = 0;
    (void)c.merge_encode(encs, 2, count, (mode & 1) ? residual.data() : nullptr, re.data(), enc,
                         ctx);
    check(residual.intact(), "codec: merge_encode wrote outside the residual");
    for (size_t i = enc; i < re.size(); ++i) check(re[i] == 0xee, "codec: merge_encode overran");
  }
  return 0;
}

std::vector<std::vector<uint8_t>> codec_spec_seeds() {
  return text_seeds({"none", "fp16", "bf16,slice=0", "topk:0.01", "randomk:0.5,seed=9",
                     "sign,chunk=128", "qsgd:16,seed=3,bucket=256",
                     "powersgd:4,ef=1,cols=64,warm=0", "topk:0.01,ef=0", "fp16,slice=4096",
                     "topk:1e-300", "qsgd:127", "powersgd:64"});
}

std::vector<std::vector<uint8_t>> codec_payload_seeds() {
  std::vector<std::vector<uint8_t>> out;
  // Honest encodings of a ramp, for every codec and a few counts.
  for (size_t ci = 0; ci < std::size(kSpecs); ++ci) {
    for (size_t count : {size_t{1}, size_t{100}, size_t{1000}}) {
      const coll::Codec& c = codec(ci);
      std::vector<float> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = std::sin(static_cast<float>(i)) * 3.0f;
      std::vector<uint8_t> enc(c.encoded_size(count));
      coll::CodecContext ctx;
      ctx.key_hash = 0x1234;
      if (!c.encode(v.data(), nullptr, count, enc.data(), enc.size(), ctx).ok()) continue;
      std::vector<uint8_t> s{static_cast<uint8_t>(ci), static_cast<uint8_t>(count - 1),
                             static_cast<uint8_t>((count - 1) >> 8), 0};
      s.insert(s.end(), enc.begin(), enc.end());
      out.push_back(s);
    }
  }
  // A top-k block with indices out of range and repeated: the honest block of 100 elements is
  // {u32 magic, u32 k = 10, k u32 indices, k f32 values}; these overwrite its first indices.
  for (const auto& seed : std::vector<std::vector<uint8_t>>(out)) {
    if (seed[0] != 2 || seed[1] != 99) continue;
    std::vector<uint8_t> bad = seed;
    uint32_t huge = 0xfffffff0u;
    if (bad.size() >= 4 + 12) std::memcpy(bad.data() + 4 + 8, &huge, 4);
    out.push_back(bad);
    std::vector<uint8_t> rep = seed;
    if (rep.size() >= 4 + 16) std::memcpy(rep.data() + 4 + 12, rep.data() + 4 + 8, 4);
    out.push_back(rep);
  }
  // A sign block with a NaN scale (the scales lead the block), and a truncated one.
  for (const auto& seed : std::vector<std::vector<uint8_t>>(out)) {
    if (seed[0] != 4 || seed[1] != 99) continue;
    std::vector<uint8_t> nan = seed;
    const float q = std::nanf("");
    if (nan.size() >= 8) std::memcpy(nan.data() + 4, &q, 4);
    out.push_back(nan);
    out.emplace_back(seed.begin(), seed.begin() + seed.size() / 2);
  }
  // PowerSGD factors: NaN, Inf, zero columns, truncated.
  std::vector<uint8_t> p{0x81, 0xff, 0x01, 0};
  for (float f : {1.0f, std::nanf(""), INFINITY, 0.0f, -2.0f, 1e-38f, 3.0f}) {
    uint8_t b[4];
    std::memcpy(b, &f, 4);
    p.insert(p.end(), b, b + 4);
  }
  out.push_back(p);
  return out;
}

}  // namespace gw::fuzz
