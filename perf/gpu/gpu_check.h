// Comparisons of the GPU codec kernels with the CPU ones (collectives/compress/codec_kernels.h) and
// a throughput bench, shared by the gtest cases (tests/gpudirect/) and gw-gpu-check (no gtest).
//
// Each check draws fresh random data (gaussians of random magnitude plus NaN with payloads,
// +-inf, denormals, -0, values at the f16 overflow and rounding boundaries), runs the kernel on
// the device and the CPU kernel on the host, and returns OK or kInternal naming the first
// mismatch. Every check needs a device: kUnsupported without one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace gw::cuda::check {

struct Case {
  size_t n = 0;         // elements
  size_t misalign = 0;  // pointers are offset by this many elements from a 256-byte boundary
  bool bf16 = false;    // casts
  bool ef = false;      // with a residual
  bool add = false;     // decodes
  size_t chunk = 2048;  // sign
  uint64_t seed = 1;
  std::string name() const;
};

Status cast_encode(const Case& c);
Status cast_decode(const Case& c);
Status sign_encode(const Case& c);
Status sign_decode(const Case& c);

// The cases gw-gpu-check and the gtest suite run: odd sizes, unaligned pointers, every variant.
std::vector<Case> cast_cases();
std::vector<Case> sign_cases();

struct BenchRow {
  std::string kernel;
  size_t bytes = 0;  // f32 input bytes (n * 4)
  double median_us = 0;
  double gbps_input = 0;    // bytes / median time
  double gbps_traffic = 0;  // bytes read + written by the kernel / median time
};
// Times each kernel on n = bytes / 4 elements for every size in `sizes` (median of `reps`
// after 3 warm-up runs, CUDA events on the default stream).
Result<std::vector<BenchRow>> bench(const std::vector<size_t>& sizes, int reps);

}  // namespace gw::cuda::check
