// Shared by the libFuzzer entry (daemon_proto_fuzz.cc) and its gtest driver
// (daemon_proto_fuzz_test.cc): the decoders of daemon/protocol.h on arbitrary bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gw::daemon::fuzz {

// The input's first byte picks the decoder: 0 hello, 1 welcome, 2 submissions (64-byte entries),
// 3 completions (128-byte entries), 4 ring counters, 5 a control request (daemon/control.h),
// 6 a control answer (the next byte picks the command it answers), 7 a daemon's transport offer
// (daemon/transport_offer.h); the rest is its input.
enum Target : uint8_t {
  kHello = 0,
  kWelcome = 1,
  kSubmission = 2,
  kCompletion = 3,
  kRing = 4,
  kControlRequest = 5,
  kControlResponse = 6,
  kOffer = 7,
  kTargets = 8
};

// Valid inputs of every target (encoded hellos, welcomes, submissions of every opcode...).
std::vector<std::vector<uint8_t>> seeds();

// How many inputs each decoder accepted and refused so far (the driver checks both happen).
struct Counts {
  uint64_t accepted = 0;
  uint64_t refused = 0;
};
Counts counts();

}  // namespace gw::daemon::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
