// Compressed pushes (docs/parameter-server.md, "Compressed pushes"): the worker encodes each
// partition of a Push/PushPull with the store's codec and keeps, per (key, partition), the
// residual of error feedback (what the codec dropped is added to that partition's next push); the
// server decodes the encoding into a scratch buffer and applies it as a raw push of the key's
// dtype. Pulls and inits are never encoded. The codecs work on f32: keys of float64, float16 and
// bfloat16 are converted at the worker, and the residual also keeps what the conversions lose
// (see PushEncoder::encode), so error feedback still adds up to what was pushed.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collectives/compress/codec.h"
#include "core/status.h"
#include "kv/wire.h"

namespace gw::kv {

// The context both sides give the codec for one push of (key, partition): randomk's shared
// indices and qsgd's rounding stream depend on it. step: how many pushes of that partition this
// worker encoded before (carried in the frame's aux).
coll::CodecContext push_context(uint64_t key, uint32_t partition, uint64_t step, uint32_t worker);

class PushEncoder {
 public:
  // spec: a store's codec (check_codec_spec).
  static Result<std::unique_ptr<PushEncoder>> create(const std::string& spec, uint32_t worker);
  const coll::Codec& codec() const { return *codec_; }

  // Encodes n f32 elements of (key, partition) plus that partition's residual, updating the
  // residual (when the codec's spec has error feedback). *step: the step sent in the frame.
  Result<std::shared_ptr<std::vector<uint8_t>>> encode(uint64_t key, uint32_t partition,
                                                       const float* v, size_t n, uint64_t* step);
  // The same for n elements of `dtype` (encodable_dtype), converted to f32 for the codec. With
  // error feedback the residual is measured against what the server will apply: for float64 it
  // also takes what the conversion to f32 dropped, for float16 and bfloat16 what rounding the
  // decoded values back into the key's dtype will drop (the worker decodes its own encoding to
  // know). So, as for f32 keys, what the server applied plus the residual is what was pushed.
  Result<std::shared_ptr<std::vector<uint8_t>>> encode(uint64_t key, uint32_t partition,
                                                       const void* v, coll::DataType dtype,
                                                       size_t n, uint64_t* step);
  // The residual of (key, partition) now (empty before its first push, or without error
  // feedback). For tests and the docs' figure.
  std::vector<float> residual(uint64_t key, uint32_t partition) const;

 private:
  struct State {
    std::vector<float> residual;
    uint64_t step = 0;
  };
  PushEncoder(std::unique_ptr<coll::Codec> codec, uint32_t worker)
      : codec_(std::move(codec)), worker_(worker) {}
  // The residual of st for n values (sized, zeroed on a size change), or null where the codec
  // has no error feedback. Under mu_.
  float* residual_of(State& st, size_t n) const;
  std::unique_ptr<coll::Codec> codec_;
  const uint32_t worker_;
  mutable std::mutex mu_;
  std::map<std::pair<uint64_t, uint32_t>, State> states_;
};

// The dtypes a store with a codec takes: float32, float64, float16, bfloat16 (the codecs' f32 holds
// the 16-bit ones exactly; float64 loses its low bits to the conversion, which error feedback
// carries). Integers are refused: a codec's rounding has no meaning for them.
bool encodable_dtype(coll::DataType dtype);

// The server's half: h is an encoded Push/PushPull that passed check_request with `codec`; decodes
// its payload (h->count values) into *scratch in h->dtype (rounded to nearest even for float16 and
// bfloat16) and turns *h into the raw push of them (flags 0, payload = count x the dtype's size).
// A corrupt encoding is kInvalidArg naming the frame.
Status decode_push(const coll::Codec& codec, Header* h, const uint8_t* payload,
                   std::vector<uint8_t>* scratch);

}  // namespace gw::kv
