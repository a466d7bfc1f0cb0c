// randomk: the values at indices every rank draws from a shared seed.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"
#include "collectives/compress/topk_select.h"

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
    const size_t k = topk_count(spec_.ratio, count);
    bool invert = false;
    const std::vector<uint64_t>& bits = randomk_bitmap(spec_.seed, ctx, count, k, &invert);
    // One pass over memory, no index list: residual = in + residual, the chosen elements (the
    // bitmap's, 16 at a time as a vector mask) written out in index order and taken out of the
    // residual, branch-free (a gather after the pass would read and write back one evicted line
    // per index, and walking the bitmap bit by bit mispredicts on most words). The values go to
    // an aligned scratch when out is not 4-byte aligned.
    float* dst = reinterpret_cast<uintptr_t>(out) % alignof(float) == 0
                     ? reinterpret_cast<float*>(out)
                     : nullptr;
    thread_local std::vector<float> bounce;
    if (!dst) {
      bounce.resize(k);
      dst = bounce.data();
    }
    const size_t got = ck::gather_bits_take(in, residual, count, bits.data(), invert, dst);
    if (got != k) return internal_error("randomk encode: {} elements chosen, expected {}", got, k);
    if (dst != reinterpret_cast<float*>(out)) std::memcpy(out, dst, k * sizeof(float));
    return ok_status();
  }
  Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                    const CodecContext& ctx) const override {
    GW_RETURN_IF_ERROR(check_count(count, "randomk"));
    if (in_size != encoded_size(count)) {
      return invalid_arg("randomk decode: {} bytes for {} elements, expected {}", in_size, count,
                         encoded_size(count));
    }
    bool invert = false;
    const std::vector<uint64_t>& bits =
        randomk_bitmap(spec_.seed, ctx, count, topk_count(spec_.ratio, count), &invert);
    // The chosen indices straight from the bitmap, increasing: the encoder's order.
    size_t j = 0;
    for (size_t wi = 0; wi < bits.size(); ++wi) {
      uint64_t w = invert ? ~bits[wi] : bits[wi];
      if (wi + 1 == bits.size() && count % 64) w &= (uint64_t{1} << (count % 64)) - 1;
      while (w) {
        float v;  // memcpy: a peer's encoding need not be 4-byte aligned
        std::memcpy(&v, in + 4 * j++, sizeof(v));
        acc[wi * 64 + static_cast<size_t>(std::countr_zero(w))] += v;
        w &= w - 1;
      }
    }
    return ok_status();
  }
};

}  // namespace

std::unique_ptr<Codec> make_randomk_codec(const CodecSpec& spec) {
  return std::make_unique<RandomKCodec>(spec);
}

}  // namespace gw::coll
