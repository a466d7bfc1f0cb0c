// The codecs' encode (with error feedback) and decode, one thread, against memcpy of the same f32
// bytes in the same binary and run: the per-core ceiling a memory-bound codec is measured against
// (docs/perf.md, "Microbenchmarks"). Bytes are the f32 side: count * 4 per iteration.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/compress/codec.h"
#include "collectives/compress/codec_kernels.h"
#include "perf/micro/micro_util.h"

namespace gw::micro {
namespace {

// Every byte codec, each with error feedback on (fp16/bf16 take ef=1 too: their residual is the
// cast's rounding error). powersgd is not a byte codec (its cost is matrix products, not a pass).
const char* const kCodecs[] = {"fp16,ef=1",    "bf16,ef=1", "sign",    "topk:0.01",
                               "randomk:0.01", "qsgd:8",    "qsgd:127"};

std::unique_ptr<coll::Codec> make_codec(const std::string& text) {
  auto spec = coll::parse_codec_spec(text);
  if (!spec.ok()) return nullptr;
  auto codec = coll::Codec::create(*spec);
  if (!codec.ok()) return nullptr;
  return std::move(*codec);
}

void bench_memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> src = gaussian(n, 1), dst(n, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n * 4);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) * 4);
}

// Restores the widest dispatch when a benchmark that narrowed it returns.
struct IsaCapScope {
  explicit IsaCapScope(coll::codec_kernels::IsaCap cap) { coll::codec_kernels::cap_isa(cap); }
  ~IsaCapScope() { coll::codec_kernels::cap_isa(coll::codec_kernels::IsaCap::kAvx512); }
};

void bench_encode(benchmark::State& state, const std::string& text,
                  coll::codec_kernels::IsaCap cap = coll::codec_kernels::IsaCap::kAvx512) {
  IsaCapScope scope(cap);
  auto codec = make_codec(text);
  if (!codec) return state.SkipWithError(("bad codec spec " + text).c_str());
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> in = gaussian(n, 2), residual(n, 0.0f);
  std::vector<uint8_t> out(codec->encoded_size(n));
  float* res = codec->spec().error_feedback ? residual.data() : nullptr;
  coll::CodecContext ctx{coll::fnv1a64("micro"), 0, 0};
  // The same gradient every step: every codec's error feedback is a contraction, so the residual
  // settles at a bounded level (codec_error_feedback_test) and the steps time encodes of finite
  // values. (Before qsgd shrank its output under error feedback, qsgd:8's residual grew ~1.15x a
  // step and the benchmark restarted it every 32 steps.) The residual is checked after the loop.
  for (auto _ : state) {
    Status st = codec->encode(in.data(), res, n, out.data(), out.size(), ctx);
    if (!st.ok()) return state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
    ++ctx.step;
  }
  if (res &&
      !std::all_of(residual.begin(), residual.end(), [](float x) { return std::isfinite(x); })) {
    return state.SkipWithError(
        ("the residual of " + text + " overflowed: error feedback diverged").c_str());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) * 4);
  state.SetLabel(std::string(coll::codec_kernels::isa()));
}

// decode (overwrite), the form the compressed allreduce uses for one rank's encoding.
void bench_decode(benchmark::State& state, const std::string& text) {
  auto codec = make_codec(text);
  if (!codec) return state.SkipWithError(("bad codec spec " + text).c_str());
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<float> in = gaussian(n, 3), out(n, 0.0f);
  std::vector<uint8_t> enc(codec->encoded_size(n));
  coll::CodecContext ctx{coll::fnv1a64("micro"), 0, 0};
  Status st = codec->encode(in.data(), nullptr, n, enc.data(), enc.size(), ctx);
  if (!st.ok()) return state.SkipWithError(st.message().c_str());
  for (auto _ : state) {
    st = codec->decode(enc.data(), enc.size(), n, out.data(), ctx);
    if (!st.ok()) return state.SkipWithError(st.message().c_str());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n) * 4);
  state.SetLabel(std::string(coll::codec_kernels::isa()));
}

using SelectCompact = size_t (*)(const uint32_t*, size_t, uint32_t, uint32_t, uint32_t*);
using KeepBestScan = size_t (*)(uint32_t*, float*, const uint32_t*, size_t, uint32_t, size_t,
                                float*, float);

// Top-k's selection steps alone, on one path: over n candidates (what a top-k:0.01 encode keeps
// from its pass: ~20 k at 1 Mi elements, ~250 k at 16 Mi), the radix select's first compaction
// (the keys of the bin that holds the k-th best, k = n / 1.9) and the keep-the-best scan with the
// residual fix-up, after a copy of the candidates' indices and values (the scan works in place;
// the copy, 8 bytes per candidate, is timed with it). Items are candidates.
void bench_select_steps(benchmark::State& state, SelectCompact compact, KeepBestScan scan,
                        bool runs) {
  if (!runs) return state.SkipWithError("this CPU lacks the path");
  const size_t n = static_cast<size_t>(state.range(0));
  const std::vector<float> g = gaussian(n, 4);
  std::vector<uint32_t> key(n), idx(n), sub(n), idx_w(n);
  std::vector<float> val(n), val_w(n), restore(50 * n, 0.0f);
  for (size_t j = 0; j < n; ++j) {
    // Candidate magnitudes: a Gaussian's tail beyond ~2.2 deviations, as the pass collects them.
    val[j] = std::copysign(2.2f + std::fabs(g[j]) * 0.4f, g[j]);
    const uint32_t bits = std::bit_cast<uint32_t>(std::fabs(val[j]));
    key[j] = bits + 1u;  // topk_select.cc's order key
    idx[j] = static_cast<uint32_t>(j * 50);
  }
  const size_t k = static_cast<size_t>(static_cast<double>(n) / 1.9);
  std::vector<uint32_t> sorted = key;
  std::nth_element(sorted.begin(), sorted.begin() + static_cast<std::ptrdiff_t>(k - 1),
                   sorted.end(), std::greater<>());
  const uint32_t t = sorted[k - 1];
  const size_t above =
      static_cast<size_t>(std::count_if(key.begin(), key.end(), [t](uint32_t x) { return x > t; }));
  const float take_t = std::bit_cast<float>(t - 1u) * 1.02f;
  for (auto _ : state) {
    std::memcpy(idx_w.data(), idx.data(), n * 4);
    std::memcpy(val_w.data(), val.data(), n * 4);
    const size_t m = compact(key.data(), n, 21, t >> 21, sub.data());
    const size_t w =
        scan(idx_w.data(), val_w.data(), key.data(), n, t, k - above, restore.data(), take_t);
    benchmark::DoNotOptimize(m);
    benchmark::DoNotOptimize(w);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}

const bool registered = [] {
  // memcpy/67108864 (256 MiB each way) leaves the last-level cache of every machine here (a
  // 64 MiB copy still ran 1.3x faster than DRAM on an EPYC guest): the memory-bound ceiling the
  // scripts hold the shm collectives to (perf/zero_copy.sh, compare_peers.sh).
  benchmark::RegisterBenchmark("memcpy", bench_memcpy)
      ->Apply(element_counts)
      ->Arg(int64_t{64} << 20);
  for (const char* c : kCodecs) {
    const std::string text = c;
    benchmark::RegisterBenchmark(("encode/" + text).c_str(), [text](benchmark::State& s) {
      bench_encode(s, text);
    })->Apply(element_counts);
    benchmark::RegisterBenchmark(("decode/" + text).c_str(), [text](benchmark::State& s) {
      bench_decode(s, text);
    })->Apply(element_counts);
  }
  // Top-k's encode with the dispatch capped at each path (encode/topk:0.01@portable, @avx2,
  // @avx512), interleaved with the rest: the vector selection steps against the portable ones in
  // the same run. A cap above what the CPU has runs the widest it has (the label says which).
  namespace ck = coll::codec_kernels;
  for (auto [name, cap] :
       {std::pair{"portable", ck::IsaCap::kPortable}, std::pair{"avx2", ck::IsaCap::kAvx2},
        std::pair{"avx512", ck::IsaCap::kAvx512}}) {
    const std::string text = "topk:0.01";
    benchmark::RegisterBenchmark(("encode/" + text + "@" + name).c_str(), [text, cap = cap](
                                                                              benchmark::State& s) {
      bench_encode(s, text, cap);
    })->Apply(element_counts);
  }
  benchmark::RegisterBenchmark("topk_steps@portable",
                               [](benchmark::State& s) {
                                 bench_select_steps(s, ck::portable::select_compact,
                                                    ck::portable::keep_best_scan, true);
                               })
      ->Arg(20000)
      ->Arg(250000);
  benchmark::RegisterBenchmark("topk_steps@avx2",
                               [](benchmark::State& s) {
                                 bench_select_steps(s, ck::avx2::select_compact,
                                                    ck::avx2::keep_best_scan, ck::cpu_has_avx2());
                               })
      ->Arg(20000)
      ->Arg(250000);
  benchmark::RegisterBenchmark("topk_steps@avx512",
                               [](benchmark::State& s) {
                                 bench_select_steps(s, ck::avx512::select_compact,
                                                    ck::avx512::keep_best_scan,
                                                    ck::cpu_has_avx512());
                               })
      ->Arg(20000)
      ->Arg(250000);
  return true;
}();

}  // namespace
}  // namespace gw::micro
