// Gradient-like test data for the compression tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

namespace gw::testing {

// gradient(n, rank, step): n standard normal floats, seeded by stride * rank + step, so each
// rank's gradient differs and every run gives the same ones. Each test file keeps the stride it
// was written with (its tolerances were set on those values).
class Gradients {
 public:
  explicit constexpr Gradients(uint32_t stride) : stride_(stride) {}

  std::vector<float> operator()(size_t n, int rank, int step) const {
    std::mt19937 gen(
        static_cast<uint32_t>(stride_ * static_cast<uint32_t>(rank) + static_cast<uint32_t>(step)));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = d(gen);
    return v;
  }

 private:
  uint32_t stride_;
};

}  // namespace gw::testing
