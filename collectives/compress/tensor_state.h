// Compressor::TensorState: what the compressor keeps per tensor key (compress.cc, and
// powersgd.cc for the low-rank form). Internal to collectives/compress/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/compress/codec.h"
#include "collectives/compress/compress.h"

namespace gw::coll {

struct Compressor::TensorState {
  std::string key;
  std::string spec_text;  // canonical
  CodecSpec spec;
  size_t count = 0;
  DataType dtype = DataType::kF32;
  std::unique_ptr<Codec> codec;        // null for none / powersgd
  std::vector<float> residual;         // worker error feedback (count)
  std::vector<float> server_residual;  // sign: this rank's partition
  std::vector<float> q;                // powersgd: r vectors of cols (warm start)
  uint64_t key_hash = 0;
  uint64_t step = 0;
  uint64_t nonfinite_logged = 0;  // steps skipped for a NaN/Inf input
  bool external = false;  // encoded and decoded by the caller (allreduce_cast_encoded_sliced)
  bool hier = false;      // run in the hierarchical form: the residual is in `inter`
  // Hierarchical form: this rank's inter-host part (its shard, or the whole tensor on a leader),
  // at offset `inter_offset` of the tensor; null until first used, and on non-leaders.
  std::unique_ptr<TensorState> inter;
  size_t inter_offset = 0;
};

}  // namespace gw::coll
