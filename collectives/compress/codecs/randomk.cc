// randomk: the values at indices every rank draws from a shared seed.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

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
    if (residual) {
      // One pass over memory: block by block (in L1), residual = in + residual, then the block's
      // chosen elements are taken out (indices increase), instead of a gather over the whole
      // residual after the pass, which would read and write back one evicted line per index.
      constexpr size_t kBlock = 4096;
      size_t j = 0;
      for (size_t b = 0; b < count; b += kBlock) {
        const size_t end = std::min(count, b + kBlock);
        ck::add_f32(in + b, end - b, residual + b);
        for (; j < idx.size() && idx[j] < end; ++j) {
          std::memcpy(out + 4 * j, &residual[idx[j]], 4);
          residual[idx[j]] = 0.0f;
        }
      }
    } else {
      for (size_t j = 0; j < idx.size(); ++j) std::memcpy(out + 4 * j, &in[idx[j]], 4);
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

}  // namespace

std::unique_ptr<Codec> make_randomk_codec(const CodecSpec& spec) {
  return std::make_unique<RandomKCodec>(spec);
}

}  // namespace gw::coll
