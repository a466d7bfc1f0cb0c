// The top-k selection with its values, for the topk codec (codecs/topk.cc); the index-only forms
// are in codec.h. Internal to collectives/compress/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/compress/codec.h"

namespace gw::coll {

struct TopKSet {
  std::vector<uint32_t> idx;  // increasing
  std::vector<float> val;     // v[idx[j]]
};

// topk_select_fused (see codec.h), also returning the selected values.
// Fills *out (its vectors are cleared; their capacity is reused, so a caller that keeps one
// TopKSet across calls does not pay fresh pages for the candidates every time). With take (and a
// residual), the residual ends as v with the selected elements 0 (what error feedback keeps after
// sending them), written in the same pass.
void topk_fused(const float* in, float* residual, size_t count, size_t k, TopKSet* out,
                bool take = false);

// randomk_indices' draw (codec.h) as a bitmap of count bits (bit i % 64 of word i / 64): the
// chosen indices are its set bits, or with *invert its clear bits below count (k more than half
// of count draws the complement). The same set as randomk_indices. The vector is the calling
// thread's, valid until its next call.
const std::vector<uint64_t>& randomk_bitmap(uint64_t seed, const CodecContext& ctx, size_t count,
                                            size_t k, bool* invert);

}  // namespace gw::coll
