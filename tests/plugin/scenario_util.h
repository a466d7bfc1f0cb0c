// What nccl_plugin_peer's scenario files share (daemon_scenarios.cc, file_scenarios.cc,
// bench_scenarios.cc): the failure line, a handle from hex, a bounded connect.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test::scenario {

using Clock = std::chrono::steady_clock;

// Says why on stderr; the scenario's exit status (1).
inline int fail(const std::string& why) {
  std::fprintf(stderr, "nccl_plugin_peer: %s\n", why.c_str());
  return 1;
}

inline bool unhex(const std::string& hex, uint8_t* out) {
  if (hex.size() != 2 * NCCL_NET_HANDLE_MAXSIZE) return false;
  for (size_t i = 0; i < NCCL_NET_HANDLE_MAXSIZE; ++i) {
    out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

// Connects to `handle` until a comm, an error or 15 s: the result, *sc the comm.
inline ncclResult_t connect_to(NetApi& api, void* ctx, uint8_t* handle, void** sc) {
  *sc = nullptr;
  ncclResult_t r = ncclSuccess;
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (r == ncclSuccess && *sc == nullptr && Clock::now() < deadline) {
    r = api.connect(ctx, 0, handle, sc);
    if (*sc == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return r;
}

}  // namespace gw::plugin_test::scenario
