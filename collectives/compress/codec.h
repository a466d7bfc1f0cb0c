// Gradient codecs: the local half of gradient compression (encode, decode, error feedback).
//
// A codec spec string selects a codec and its options:
//   none | fp16 | bf16 | topk:RATIO | randomk:RATIO | sign | qsgd:LEVELS | powersgd:RANK
// followed by optional ",key=value" options:
//   ef=0|1        error feedback (residual accumulation); default 1 where it applies (all but
//                 none/fp16/bf16, where it is also accepted)
//   seed=N        randomk index seed / qsgd rounding seed (default 0)
//   chunk=N       sign: elements per scale (multiple of 64, default 2048)
//   bucket=N      qsgd: elements per norm (default 512)
//   cols=N        powersgd: matrix columns the flat gradient is viewed as (default ~sqrt(count))
//   warm=0|1      powersgd: warm start Q from the previous step (default 1)
//   slice=N       fp16/bf16: elements per slice of the pipelined allreduce (default 4194304; 0 =
//                 one allreduce of the whole tensor; otherwise 4096..2^31)
//   nonfinite=skip|keep
//                 with error feedback: a step whose input holds a NaN or an Inf on any rank is
//                 summed uncompressed (the result carries the NaN/Inf, for AMP's scaler to see)
//                 and leaves every residual and codec state as it was (skip, the default); keep
//                 feeds it to the codec like any step (the residuals then stay NaN for good)
// e.g. "topk:0.01", "sign", "powersgd:4,ef=1", "qsgd:16,seed=3". A malformed spec is kInvalidArg
// with a message that names the offending part.
//
// How each codec is aggregated across ranks (compress.h does it):
//   kSummable  encoded values add element-wise (fp16, bf16, randomk with a shared seed): one
//              allreduce of the encoded buffer in wire_dtype().
//   kGather    per-rank encodings differ in support or scale (topk, qsgd): allgather of the
//              encodings, then every rank decodes and sums them in rank order.
//   kTwoPhase  sign (1-bit Adam): worker encode with worker error feedback, exchange of chunks,
//              per-partition decode + sum + re-encode with server error feedback, allgather.
//   kLowRank   powersgd: P = MQ and Q = M^T P allreduced, P orthogonalised (see PowerSgd below).
//
// Thread-safety: a Codec is immutable after creation and may be used from several threads;
// the residual and output buffers passed to it belong to the caller. Nothing blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/types.h"
#include "core/status.h"

namespace gw::coll {

enum class CodecKind { kNone, kFp16, kBf16, kTopK, kRandomK, kSign, kQsgd, kPowerSgd };
enum class Aggregation { kSummable, kGather, kTwoPhase, kLowRank };

// fp16/bf16 tensors of at least two slices are reduced slice by slice, the casts overlapping the
// exchange (compress.h).
constexpr size_t kDefaultCastSlice = size_t{4} << 20;

struct CodecSpec {
  CodecKind kind = CodecKind::kNone;
  double ratio = 0;  // topk / randomk: fraction of elements kept, (0, 1]
  int levels = 0;    // qsgd: quantisation levels per sign, 1..127
  int rank = 0;      // powersgd: approximation rank, 1..64
  bool error_feedback = false;
  uint64_t seed = 0;                 // randomk / qsgd
  size_t chunk = 2048;               // sign: elements per scale
  size_t bucket = 512;               // qsgd: elements per norm
  size_t cols = 0;                   // powersgd: 0 = choose from the count
  bool warm_start = true;            // powersgd
  size_t slice = kDefaultCastSlice;  // fp16 / bf16: elements per pipelined slice, 0 = none
  bool skip_nonfinite = true;        // nonfinite=skip (see the top of this file)
};

// Parses a spec (see the top of this file). Whitespace is not allowed.
Result<CodecSpec> parse_codec_spec(std::string_view text);
// The canonical spec ("topk:0.01,ef=1"): parse_codec_spec(format_codec_spec(s)) == s.
std::string format_codec_spec(const CodecSpec& spec);
std::string_view codec_name(CodecKind kind);

// Per-call context an encoding may depend on. Every rank passes the same key_hash and step for
// the same tensor, so shared-seed codecs (randomk) pick the same elements everywhere.
struct CodecContext {
  uint64_t key_hash = 0;  // hash of the tensor key (fnv1a64)
  uint64_t step = 0;      // how many times this key was compressed before
  int rank = 0;           // this rank (qsgd's rounding stream differs per rank)
};

uint64_t fnv1a64(std::string_view text);

class Codec {
 public:
  // kInvalidArg when spec cannot be used (e.g. kNone, or kPowerSgd, which is not a byte codec).
  static Result<std::unique_ptr<Codec>> create(const CodecSpec& spec);
  virtual ~Codec() = default;

  const CodecSpec& spec() const { return spec_; }
  virtual Aggregation aggregation() const = 0;
  // kSummable codecs: the element type the encoded buffer is reduced in.
  virtual DataType wire_dtype() const { return DataType::kU8; }
  // Bytes of the encoding of `count` elements (the same on every rank for equal counts).
  virtual size_t encoded_size(size_t count) const = 0;

  // Encodes v = in + residual (residual may be null: no error feedback) into out, which holds
  // encoded_size(count) bytes. With a residual, sets residual = v - decode(out), so that what
  // was sent plus the residual equals the input plus the previous residual. in and residual must
  // not overlap. Fails only on bad arguments (sizes, count beyond the codec's limit).
  virtual Status encode(const float* in, float* residual, size_t count, uint8_t* out,
                        size_t out_size, const CodecContext& ctx) const = 0;
  // acc[i] += decode(in)[i] for i < count. Every field read from `in` is bounds-checked: a
  // corrupt or truncated encoding ends in kInvalidArg, never an out-of-range access.
  virtual Status decode_add(const uint8_t* in, size_t in_size, size_t count, float* acc,
                            const CodecContext& ctx) const = 0;

  // The fused forms the compressed allreduce uses, so that no 100 MiB pass is made twice. Each
  // has a generic default in terms of encode / decode_add; codecs that can fuse override it and
  // give the same bytes and values as the default (a decoded zero may come out as -0).
  //
  // out[i] = decode(in)[i] (overwrites; out is not read). Bounds-checked as decode_add.
  virtual Status decode(const uint8_t* in, size_t in_size, size_t count, float* out,
                        const CodecContext& ctx) const;
  // out[i] = ((+0 + decode(encs[0])[i]) + decode(encs[1])[i]) + ... over nenc encodings of
  // in_size bytes each, decoded with ctxs[j]: the bits of a zero fill followed by decode_add of
  // every source in order, but out is only written, never read (the gather codecs' decode-and-sum
  // of every rank's encoding). Bounds-checked as decode_add; on an error out is unspecified and
  // the message names the source.
  virtual Status decode_sum(const uint8_t* const* encs, size_t in_size, size_t nenc, size_t count,
                            float* out, const CodecContext* ctxs) const;
  // A server step (sign's 1-bit Adam): v = sum over j < nenc of decode(encs[j]) + residual;
  // encodes v into out, and with a residual sets residual = v - decode(out). Each encs[j] holds
  // encoded_size(count) bytes; residual may be null (no error feedback).
  virtual Status merge_encode(const uint8_t* const* encs, size_t nenc, size_t count,
                              float* residual, uint8_t* out, size_t out_size,
                              const CodecContext& ctx) const;

 protected:
  explicit Codec(const CodecSpec& spec) : spec_(spec) {}
  CodecSpec spec_;
};

// Exactly the k = max(1, round(ratio * count)) indices of the largest |v[i]| (ties broken by the
// lower index, NaN below every number), in increasing order. Runs in O(count) expected with no
// sort: the threshold comes from a sample, one vectorised pass collects the candidates (in index
// order), nth_element on their magnitudes gives the exact k-th magnitude, and one scan of the
// candidates keeps the k best in index order.
std::vector<uint32_t> topk_select(const float* v, size_t count, size_t k);
// The same selection on v = in + residual, made in one pass over the data that also stores v into
// residual (when set). topk_select(v, count, k) == topk_select_fused(v, nullptr, count, k).
std::vector<uint32_t> topk_select_fused(const float* in, float* residual, size_t count, size_t k);
size_t topk_count(double ratio, size_t count);
// The k distinct indices (increasing) that randomk picks for this context: identical on every
// rank for the same key_hash, step and seed.
std::vector<uint32_t> randomk_indices(uint64_t seed, const CodecContext& ctx, size_t count,
                                      size_t k);

// PowerSGD (kLowRank) is not a byte codec: its linear algebra and its protocol are in
// powersgd.h.

}  // namespace gw::coll
