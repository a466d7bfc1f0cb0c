// What the store_test binary's files (store_test.cc, store_hostile_test.cc) share.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "core/store.h"

namespace gw::store_test {

// The bytes of `s`.
inline Bytes B(const std::string& s) { return Bytes(s.begin(), s.end()); }

// Milliseconds since `start`.
inline int64_t elapsed_ms(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace gw::store_test
