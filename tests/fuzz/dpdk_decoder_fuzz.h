// Shared by the libFuzzer entry (dpdk_decoder_fuzz.cc) and its gtest driver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "dpdk/engine.h"

namespace gw::dpdk::fuzz {

// Two engines over an in-memory switch with an open connection (b sends to a) and a receive
// posted on a into a buffer with guard bytes on both sides. Frames the switch forwarded while
// the fixture exchanged a few messages are kept as a seed corpus.
struct Fixture {
  std::shared_ptr<Engine> a, b;
  std::vector<std::vector<uint8_t>> seeds;
  bool guards_intact() const;
  static Fixture& get();
};

// Recomputes the IPv4 and UDP checksums of a frame in place where its lengths allow, so mutated
// frames get past the checksums and reach the protocol logic.
void fix_checksums(std::vector<uint8_t>& frame);

}  // namespace gw::dpdk::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
