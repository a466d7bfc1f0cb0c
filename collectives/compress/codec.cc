// The Codec base class's generic fused forms and the factory. The parts: codec_spec.cc (spec
// strings), topk_select.cc (top-k and randomk index selection), codecs/*.cc (one codec each),
// powersgd.cc (PowerSGD's linear algebra and its protocol).
#include "collectives/compress/codec.h"

#include <algorithm>
#include <vector>

#include "collectives/compress/codecs/codecs.h"

namespace gw::coll {

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
      return make_cast_codec(spec);
    case CodecKind::kTopK:
      if (!(spec.ratio > 0 && spec.ratio <= 1)) return invalid_arg("topk: ratio must be in (0, 1]");
      return make_topk_codec(spec);
    case CodecKind::kRandomK:
      if (!(spec.ratio > 0 && spec.ratio <= 1)) {
        return invalid_arg("randomk: ratio must be in (0, 1]");
      }
      return make_randomk_codec(spec);
    case CodecKind::kSign:
      if (spec.chunk == 0 || spec.chunk % 64 || spec.chunk > kMaxChunk) {
        return invalid_arg("sign: chunk must be a multiple of 64 in 64..1048576");
      }
      return make_sign_codec(spec);
    case CodecKind::kQsgd:
      if (spec.levels < 1 || spec.levels > 127 || spec.bucket == 0 || spec.bucket > kMaxChunk) {
        return invalid_arg("qsgd: levels must be 1..127 and bucket 1..1048576");
      }
      return make_qsgd_codec(spec);
    case CodecKind::kNone:
      return invalid_arg("codec \"none\" has no encoding (send the tensor as it is)");
    case CodecKind::kPowerSgd:
      return invalid_arg(
          "powersgd is a low-rank scheme, not a byte codec: use the compressed "
          "allreduce");
  }
  return invalid_arg("unknown codec kind {}", static_cast<int>(spec.kind));
}

}  // namespace gw::coll
