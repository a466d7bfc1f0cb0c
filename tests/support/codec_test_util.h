// Helpers the codec tests share.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "collectives/compress/codec.h"

namespace gw::testing {

// n normally distributed values, reproducible from the seed.
inline std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

// The codec of a spec that must parse (a failure is reported against the calling test).
inline std::unique_ptr<coll::Codec> make_codec(const char* text) {
  auto spec = coll::parse_codec_spec(text);
  EXPECT_TRUE(spec.ok()) << text;
  auto c = coll::Codec::create(*spec);
  EXPECT_TRUE(c.ok()) << text << ": " << c.status().to_string();
  return std::move(c).value();
}

}  // namespace gw::testing
