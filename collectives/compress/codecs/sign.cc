// sign (1-bit Adam's codec): one bit per element and a scale per chunk.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

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

}  // namespace

std::unique_ptr<Codec> make_sign_codec(const CodecSpec& spec) {
  return std::make_unique<SignCodec>(spec);
}

}  // namespace gw::coll
