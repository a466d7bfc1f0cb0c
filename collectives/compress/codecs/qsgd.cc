// qsgd: stochastic quantisation to a few levels per bucket norm.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"
#include "collectives/compress/qsgd_kernels.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

// Layout: nbuckets f32 scales (the bucket's norm; with error feedback the norm / (1 + omega), so
// that the residual contracts), then count int8 levels in [-levels, levels] (qsgd_kernels.h).
class QsgdCodec final : public Codec {
 public:
  explicit QsgdCodec(const CodecSpec& spec) : Codec(spec) {}
  Aggregation aggregation() const override { return Aggregation::kGather; }
  size_t encoded_size(size_t count) const override {
    return (count + spec_.bucket - 1) / spec_.bucket * 4 + count;
  }
  // One pass over memory: per bucket, v = in + residual is squared (the norm), then formed again
  // from L1, quantised and the residual written (qsgd_kernels.h).
  Status encode(const float* in, float* residual, size_t count, uint8_t* out, size_t out_size,
                const CodecContext& ctx) const override {
    GW_RETURN_IF_ERROR(check_out(out_size, encoded_size(count), "qsgd"));
    ck::qsgd_encode(in, residual, count, spec_.bucket, spec_.levels, rounding_key(ctx), out);
    return ok_status();
  }
  Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                    const CodecContext&) const override {
    return decode_into(in, in_size, count, acc, true);
  }
  Status decode(const uint8_t* in, size_t in_size, size_t count, float* out,
                const CodecContext&) const override {
    return decode_into(in, in_size, count, out, false);
  }

 private:
  Status decode_into(const uint8_t* in, size_t in_size, size_t count, float* acc, bool add) const {
    if (in_size != encoded_size(count)) {
      return invalid_arg("qsgd decode: {} bytes for {} elements, expected {}", in_size, count,
                         encoded_size(count));
    }
    const size_t at = ck::qsgd_decode(in, count, spec_.bucket, spec_.levels, acc, add);
    if (at != count) {
      const size_t nb = (count + spec_.bucket - 1) / spec_.bucket;
      return invalid_arg("qsgd decode: level {} at element {} outside +-{}",
                         static_cast<int8_t>(in[nb * 4 + at]), at, spec_.levels);
    }
    return ok_status();
  }
  // The key of this call's rounding draws: it differs per rank, tensor and step (and seed).
  uint32_t rounding_key(const CodecContext& ctx) const {
    uint64_t state = spec_.seed ^ (ctx.key_hash * 0x9e3779b97f4a7c15ull) ^ (ctx.step << 20) ^
                     (static_cast<uint64_t>(ctx.rank) << 48);
    const uint64_t k = splitmix64(&state);
    return static_cast<uint32_t>(k ^ (k >> 32));
  }
};

}  // namespace

std::unique_ptr<Codec> make_qsgd_codec(const CodecSpec& spec) {
  return std::make_unique<QsgdCodec>(spec);
}

}  // namespace gw::coll
