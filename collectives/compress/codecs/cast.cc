// fp16 / bf16: the values cast to half precision, summed in the wire type.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

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

}  // namespace

std::unique_ptr<Codec> make_cast_codec(const CodecSpec& spec) {
  return std::make_unique<CastCodec>(spec);
}

}  // namespace gw::coll
