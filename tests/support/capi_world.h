// Ranks as threads through the C ABI, for the collective tests that link libgradwire.so
// (header only): run_world() gives each thread its own communicator over a fresh TCP store, the
// ranks' errors are collected and reported by the test thread, and typed element access writes
// and reads small integers exactly in every gw_dtype_t.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/free_port.h"
#include "tests/support/test_env.h"

namespace gw::testing {

inline std::string last_error() { return gw_last_error(); }

inline size_t gw_dtype_bytes(gw_dtype_t d) {
  switch (d) {
    case GW_FLOAT32:
    case GW_INT32:
      return 4;
    case GW_FLOAT64:
    case GW_INT64:
      return 8;
    case GW_FLOAT16:
    case GW_BFLOAT16:
      return 2;
    case GW_UINT8:
      return 1;
  }
  return 1;
}

inline constexpr gw_dtype_t kAllDtypes[] = {GW_FLOAT32, GW_FLOAT64, GW_FLOAT16, GW_BFLOAT16,
                                            GW_INT32,   GW_INT64,   GW_UINT8};

// Element i of buf as dtype d, for integers 0..255 (exact in every dtype).
inline void put_elem(gw_dtype_t d, void* buf, size_t i, int v) {
  auto* b = static_cast<uint8_t*>(buf) + i * gw_dtype_bytes(d);
  const float f = static_cast<float>(v);
  uint32_t fb;
  std::memcpy(&fb, &f, 4);
  switch (d) {
    case GW_FLOAT32:
      std::memcpy(b, &f, 4);
      return;
    case GW_FLOAT64: {
      const double x = v;
      std::memcpy(b, &x, 8);
      return;
    }
    case GW_BFLOAT16: {
      const auto h = static_cast<uint16_t>(fb >> 16);
      std::memcpy(b, &h, 2);
      return;
    }
    case GW_FLOAT16: {
      uint16_t h = 0;
      if (v != 0) {
        const int e = static_cast<int>((fb >> 23) & 0xff) - 127 + 15;
        h = static_cast<uint16_t>((e << 10) | ((fb >> 13) & 0x3ff));
      }
      std::memcpy(b, &h, 2);
      return;
    }
    case GW_INT32: {
      const int32_t x = v;
      std::memcpy(b, &x, 4);
      return;
    }
    case GW_INT64: {
      const int64_t x = v;
      std::memcpy(b, &x, 8);
      return;
    }
    case GW_UINT8:
      *b = static_cast<uint8_t>(v);
      return;
  }
}

inline int get_elem(gw_dtype_t d, const void* buf, size_t i) {
  const auto* b = static_cast<const uint8_t*>(buf) + i * gw_dtype_bytes(d);
  switch (d) {
    case GW_FLOAT32: {
      float f;
      std::memcpy(&f, b, 4);
      return static_cast<int>(f);
    }
    case GW_FLOAT64: {
      double x;
      std::memcpy(&x, b, 8);
      return static_cast<int>(x);
    }
    case GW_BFLOAT16: {
      uint16_t h;
      std::memcpy(&h, b, 2);
      const uint32_t fb = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &fb, 4);
      return static_cast<int>(f);
    }
    case GW_FLOAT16: {
      uint16_t h;
      std::memcpy(&h, b, 2);
      if ((h & 0x7fff) == 0) return 0;
      const uint32_t fb = (static_cast<uint32_t>(((h >> 10) & 0x1f) - 15 + 127) << 23) |
                          (static_cast<uint32_t>(h & 0x3ff) << 13);
      float f;
      std::memcpy(&f, &fb, 4);
      return static_cast<int>(f);
    }
    case GW_INT32: {
      int32_t x;
      std::memcpy(&x, b, 4);
      return x;
    }
    case GW_INT64: {
      int64_t x;
      std::memcpy(&x, b, 8);
      return static_cast<int>(x);
    }
    case GW_UINT8:
      return *b;
  }
  return -1;
}

// The ranks' errors, collected by their threads.
struct RankErrors {
  std::mutex mu;
  std::vector<std::string> list;
  void add(int rank, const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    list.push_back("rank " + std::to_string(rank) + ": " + what);
  }
};

using WorldFn = std::function<void(gw_comm_t, int rank, int world, RankErrors&)>;

// Runs fn on `world` ranks (threads) in the environment as the caller left it, each with its own
// communicator over `transport` (nullptr: the environment's) and a store at a free port;
// destroy_inside: fn destroys it. Each rank's errors become test failures.
inline void run_world_in_env(int world, const char* transport, int timeout_ms, const WorldFn& fn,
                             bool destroy_inside = false) {
  const std::string addr = "127.0.0.1:" + std::to_string(free_port());
  RankErrors errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      gw_config_t cfg = GW_CONFIG_INIT;
      cfg.rank = r;
      cfg.world_size = world;
      cfg.store_addr = world > 1 ? addr.c_str() : nullptr;
      cfg.transport = transport;
      cfg.timeout_ms = timeout_ms;
      gw_comm_t comm = nullptr;
      if (gw_comm_init(&comm, &cfg) != GW_OK) {
        errors.add(r, "init: " + last_error());
        return;
      }
      fn(comm, r, world, errors);
      if (!destroy_inside && gw_comm_destroy(comm) != GW_OK) {
        errors.add(r, "destroy: " + last_error());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors.list) ADD_FAILURE() << e;
}

// run_world_in_env with the launcher and daemon variables cleared (CleanEnv).
inline void run_world(int world, const char* transport, int timeout_ms, const WorldFn& fn,
                      bool destroy_inside = false) {
  CleanEnv env;
  run_world_in_env(world, transport, timeout_ms, fn, destroy_inside);
}

}  // namespace gw::testing

// Records a failed C call (its text and gw_last_error) as the rank's error.
#define GW_CHECK_RANK(rank, errors, call)                                                    \
  do {                                                                                       \
    gw_status_t s_ = (call);                                                                 \
    if (s_ != GW_OK) (errors).add(rank, std::string(#call) + " failed: " + gw_last_error()); \
  } while (0)
