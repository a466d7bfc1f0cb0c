// topk: the k values of largest magnitude with their indices.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/codecs/codecs.h"
#include "collectives/compress/topk_select.h"

namespace gw::coll {

namespace ck = codec_kernels;

namespace {

constexpr uint32_t kTopkMagic = 0x4B504F54;  // "TOPK"

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
    topk_fused(in, residual, count, k, &sel, /*take=*/true);
    const uint32_t header[2] = {kTopkMagic, static_cast<uint32_t>(k)};
    std::memcpy(out, header, 8);
    std::memcpy(out + 8, sel.idx.data(), k * 4);
    std::memcpy(out + 8 + k * 4, sel.val.data(), k * 4);
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

}  // namespace

std::unique_ptr<Codec> make_topk_codec(const CodecSpec& spec) {
  return std::make_unique<TopKCodec>(spec);
}

}  // namespace gw::coll
