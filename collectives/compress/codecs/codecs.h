// The codecs' factories (one file each in codecs/) and what they share. Internal to
// collectives/compress/: the public entry point is Codec::create (codec.h), which checks the
// spec's options first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>

#include "collectives/compress/codec.h"
#include "core/status.h"

namespace gw::coll {

// The largest sign chunk and qsgd bucket (elements).
inline constexpr size_t kMaxChunk = size_t{1} << 20;

std::unique_ptr<Codec> make_cast_codec(const CodecSpec& spec);     // fp16, bf16
std::unique_ptr<Codec> make_randomk_codec(const CodecSpec& spec);  // ratio in (0, 1]
std::unique_ptr<Codec> make_topk_codec(const CodecSpec& spec);     // ratio in (0, 1]
std::unique_ptr<Codec> make_sign_codec(const CodecSpec& spec);     // chunk checked
std::unique_ptr<Codec> make_qsgd_codec(const CodecSpec& spec);     // levels, bucket checked

// The seeded generator of randomk's indices, topk's sample and qsgd's rounding.
inline uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline Status check_out(size_t out_size, size_t need, std::string_view codec) {
  if (out_size < need) {
    return invalid_arg("{} encode: output buffer holds {} bytes, {} needed", codec, out_size, need);
  }
  return ok_status();
}

inline Status check_count(size_t count, std::string_view codec) {
  if (count > std::numeric_limits<uint32_t>::max()) {
    return invalid_arg("{}: {} elements exceed the codec's 32-bit index limit", codec, count);
  }
  return ok_status();
}

}  // namespace gw::coll
