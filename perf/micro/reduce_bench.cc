// The reduction kernels (collectives/reduce.h), sum into (out aliases b, as a ring step reduces
// into its buffer), one thread, per dtype. Bytes: count * dtype size of the output per iteration.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/reduce.h"
#include "collectives/types.h"
#include "perf/micro/micro_util.h"

namespace gw::micro {
namespace {

using coll::DataType;

// Inputs that stay finite and small under repeated summing, in the dtype's bytes.
std::vector<uint8_t> fill(DataType t, size_t n, uint32_t seed) {
  const std::vector<float> g = gaussian(n, seed);
  std::vector<uint8_t> out(n * coll::dtype_size(t));
  for (size_t i = 0; i < n; ++i) {
    const float x = g[i] * 1e-3f;
    switch (t) {
      case DataType::kF32:
        std::memcpy(&out[4 * i], &x, 4);
        break;
      case DataType::kF64: {
        const double d = x;
        std::memcpy(&out[8 * i], &d, 8);
        break;
      }
      case DataType::kF16: {
        const uint16_t h = coll::float_to_half(x);
        std::memcpy(&out[2 * i], &h, 2);
        break;
      }
      case DataType::kBF16: {
        const uint16_t h = coll::float_to_bf16(x);
        std::memcpy(&out[2 * i], &h, 2);
        break;
      }
      case DataType::kI32: {
        const int32_t v = static_cast<int32_t>(g[i] * 1000);
        std::memcpy(&out[4 * i], &v, 4);
        break;
      }
      case DataType::kI64: {
        const int64_t v = static_cast<int64_t>(g[i] * 1000);
        std::memcpy(&out[8 * i], &v, 8);
        break;
      }
      case DataType::kU8:
        out[i] = static_cast<uint8_t>(i);
        break;
    }
  }
  return out;
}

void bench_sum_into(benchmark::State& state, DataType t) {
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<uint8_t> a = fill(t, n, 4);
  std::vector<uint8_t> b = fill(t, n, 5);
  for (auto _ : state) {
    coll::reduce(t, coll::ReduceOp::kSum, a.data(), b.data(), b.data(), n);
    benchmark::DoNotOptimize(b.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(b.size()));
  state.SetLabel(std::string(coll::reduce_isa()));
}

const bool registered = [] {
  for (int i = 0; i < coll::kNumDataTypes; ++i) {
    const auto t = static_cast<DataType>(i);
    benchmark::RegisterBenchmark(("reduce_sum_into/" + std::string(coll::dtype_name(t))).c_str(),
                                 [t](benchmark::State& s) { bench_sum_into(s, t); })
        ->Apply(element_counts);
  }
  return true;
}();

}  // namespace
}  // namespace gw::micro
