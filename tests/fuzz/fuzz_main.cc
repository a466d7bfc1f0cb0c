// The libFuzzer entry of one target of fuzz_targets.h, chosen at build time (GW_FUZZ_TARGET).
#include "tests/fuzz/fuzz_targets.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return gw::fuzz::GW_FUZZ_TARGET(data, size);
}
