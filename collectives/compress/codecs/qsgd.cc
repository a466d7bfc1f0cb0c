// qsgd: stochastic quantisation to a few levels per bucket norm.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

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

std::unique_ptr<Codec> make_qsgd_codec(const CodecSpec& spec) {
  return std::make_unique<QsgdCodec>(spec);
}

}  // namespace gw::coll
