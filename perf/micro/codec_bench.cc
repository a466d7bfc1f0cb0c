// The codecs' encode (with error feedback) and decode, one thread, against memcpy of the same f32
// bytes in the same binary and run: the per-core ceiling a memory-bound codec is measured against
// (docs/perf.md, "Microbenchmarks"). Bytes are the f32 side: count * 4 per iteration.
#include <algorithm>
#include <cmath>
#include <cstring>
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

const bool registered = [] {
  benchmark::RegisterBenchmark("memcpy", bench_memcpy)->Apply(element_counts);
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
  return true;
}();

}  // namespace
}  // namespace gw::micro
