// gw-gpu-check: runs every GPU-vs-CPU codec comparison of gpu_check.h, then the throughput
// bench, and prints a table. Exit status: 0 all checks passed, 1 a mismatch or a CUDA error,
// 2 usage, 3 no GPU (nothing was checked). No gtest, no CLI11: it builds on a GPU host that has
// only a compiler, cmake and nvcc (cmake -S perf/gpu).
//
//   gw-gpu-check [--quick] [--no-bench] [--max-mib N] [--reps N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "collectives/compress/codec_kernels.h"
#include "gpudirect/cuda_driver.h"
#include "gpudirect/fatbin.h"
#include "gpudirect/gpu_codecs.h"
#include "perf/gpu/gpu_check.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: gw-gpu-check [--quick] [--no-bench] [--max-mib N] [--reps N]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  namespace check = gw::cuda::check;
  bool quick = false, bench = true;
  size_t max_mib = 1024;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--no-bench") {
      bench = false;
    } else if ((a == "--max-mib" || a == "--reps") && i + 1 < argc) {
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || v < 1 || v > 65536) return usage();
      if (a == "--reps") {
        reps = static_cast<int>(v);
      } else {
        max_mib = static_cast<size_t>(v);
      }
    } else {
      return usage();
    }
  }

  const auto fatbin = gw::cuda::codec_fatbin();
  if (fatbin.empty()) {
    std::printf("SKIP: gw-gpu-check was built without CUDA kernels (no nvcc at configure time)\n");
    return 3;
  }
  std::printf("gw-gpu-check: CPU kernels %s, fatbin %zu bytes:",
              std::string(gw::coll::codec_kernels::isa()).c_str(), fatbin.size());
  if (auto entries = gw::cuda::parse_fatbin(fatbin); entries.ok()) {
    for (const auto& e : *entries) {
      std::printf(" %s_%u", e.kind == gw::cuda::FatbinEntry::kElf ? "sm" : "compute", e.arch);
    }
    std::printf("\n");
  } else {
    std::printf(" unreadable: %s\n", entries.status().to_string().c_str());
    return 1;
  }
  auto d = gw::cuda::driver();
  if (!d.ok()) {
    std::printf("SKIP: %s\n", d.status().to_string().c_str());
    return 3;
  }
  if (gw::Status st = gw::cuda::codecs_available(); !st.ok()) {
    std::printf("FAIL: %s\n", st.to_string().c_str());
    return 1;
  }
  char name[256] = {};
  gw::cuda::CUdevice dev;
  int major = 0, minor = 0, sms = 0;
  (*d)->cuDeviceGet(&dev, 0);
  (*d)->cuDeviceGetName(name, sizeof name - 1, dev);
  (*d)->cuDeviceGetAttribute(&major, gw::cuda::kAttrCcMajor, dev);
  (*d)->cuDeviceGetAttribute(&minor, gw::cuda::kAttrCcMinor, dev);
  (*d)->cuDeviceGetAttribute(&sms, gw::cuda::kAttrMultiprocessorCount, dev);
  std::printf("device 0: %s, sm_%d%d, %d SMs, driver %d\n", name, major, minor, sms, (*d)->version);

  int failures = 0, run = 0;
  auto report = [&](const char* what, const check::Case& c, const gw::Status& st) {
    ++run;
    if (!st.ok()) {
      ++failures;
      std::printf("FAIL %s %s: %s\n", what, c.name().c_str(), st.to_string().c_str());
    }
  };
  for (const check::Case& c : check::cast_cases()) {
    if (quick && c.n > 100000) continue;
    report("cast_encode", c, check::cast_encode(c));
    report("cast_decode", c, check::cast_decode(c));
  }
  for (const check::Case& c : check::sign_cases()) {
    if (quick && c.n > 100000) continue;
    report("sign_encode", c, check::sign_encode(c));
    report("sign_decode", c, check::sign_decode(c));
  }
  std::printf("correctness: %d checks, %d failed\n", run, failures);

  if (bench && failures == 0) {
    std::vector<size_t> sizes;
    for (size_t b = size_t{1} << 20; b <= max_mib << 20; b *= 4) sizes.push_back(b);
    auto rows = check::bench(sizes, reps);
    if (!rows.ok()) {
      std::printf("FAIL bench: %s\n", rows.status().to_string().c_str());
      ++failures;
    } else {
      std::printf("\n%-16s %10s %12s %14s %16s\n", "kernel", "input", "median_us", "GB/s_of_input",
                  "GB/s_rd+wr");
      for (const auto& r : *rows) {
        std::printf("%-16s %7zu MiB %12.1f %14.1f %16.1f\n", r.kernel.c_str(), r.bytes >> 20,
                    r.median_us, r.gbps_input, r.gbps_traffic);
      }
    }
  }
  std::printf("%s\n", failures == 0 ? "PASS" : "FAIL");
  return failures == 0 ? 0 : 1;
}
