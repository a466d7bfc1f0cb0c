// What the microbenchmarks share: deterministic test data and the byte counters.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace gw::micro {

// Near-Gaussian floats (mean 0, deviation 1: the sum of four uniforms, rescaled), the same for a
// given seed: gradient-like data, so that top-k, sign and qsgd take their usual branches. A cheap
// generator: 16 Mi elements take milliseconds, which keeps the smoke test short.
inline std::vector<float> gaussian(size_t n, uint32_t seed) {
  uint64_t s = 0x9e3779b97f4a7c15ull * (seed + 1);
  auto next = [&s] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  std::vector<float> v(n);
  for (float& x : v) {
    const uint64_t r = next();
    const uint32_t sum = static_cast<uint32_t>(r & 0xFFFF) +
                         static_cast<uint32_t>((r >> 16) & 0xFFFF) +
                         static_cast<uint32_t>((r >> 32) & 0xFFFF) + static_cast<uint32_t>(r >> 48);
    // Four uniforms on [0, 65536): mean 131070, deviation 65536 / sqrt(3).
    x = (static_cast<float>(sum) - 131070.0f) * (1.7320508f / 65536.0f);
  }
  return v;
}

// The element counts every memory-bound benchmark runs: 1 Mi (4 MiB of f32, cache-sized on many
// machines) and 16 Mi (64 MiB, a large layer's gradient).
inline void element_counts(benchmark::internal::Benchmark* b) {
  b->Arg(int64_t{1} << 20)->Arg(int64_t{16} << 20);
}

}  // namespace gw::micro
