// gw-gpu-allreduce-check: gw_allreduce_compressed on GPU memory against the same call on host
// memory, on a machine with a GPU. Forks N ranks (before any CUDA call) that share the GPU, joins
// them through the C ABI over tcp on loopback, and for every codec and dtype below runs three
// steps of the same gradients twice: once from a host buffer and once from a cuMemAlloc'd copy,
// under different tensor keys. The bytes sent must be equal, and the results identical bit for
// bit (fp16/bf16 run their casts and error feedback on the GPU, sign's worker side too, the
// others are staged through host memory; see gpudirect/device_compression.cc), except sign's: the
// GPU sums a chunk's scale in another order (gpu_codecs.h), so there every rank's result must be
// the same bits and within the scale tolerance of the host path's. Then times 64 MiB fp16 (without
// and with error feedback) and sign calls, each way. Also the plain gw_allreduce / gw_broadcast
// on a device buffer (staged by the library in direct mode, issue 27): equal to the host result,
// and a 64 MiB sum timed against the caller staging it.
//
//   gw-gpu-allreduce-check [--np N]    (default 2; prints PASS or FAIL last; exit 0 or 1)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "gpudirect/cast16_math.h"
#include "gpudirect/cuda_driver.h"
#include "gpudirect/device_buffer.h"
#include "gpudirect/gpu_codecs.h"
#include "gradwire/gradwire.h"

namespace {

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

std::vector<float> gradient(size_t n, int rank, int step) {
  std::mt19937 gen(static_cast<uint32_t>(7919 * rank + 31 * step + 1));
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  if (n > 8) {        // values the casts must treat alike on both sides
    v[1] = 70000.0f;  // fp16 overflow
    v[2] = 1e-8f;     // fp16 subnormal
    v[3] = -0.0f;
  }
  return v;
}

struct Case {
  const char* spec;
  gw_dtype_t dtype;
};

// sign's GPU result (`dev`) against the host path's (`host`), n floats each: every rank must hold
// the same bits (a hash, min and max over the ranks), and each element the host's value within the
// scale tolerance: the GPU's worker scales may differ from the CPU's by sign_scale_tolerance (a
// few 1e-4 relative at most; in practice ~1e-7), which moves the server's sums and scales by as
// little, and flips the sign of a server sum only where it is that close to zero (allowed for 0.1%
// of the elements). "" when it holds, else what failed.
std::string sign_problem(gw_comm_t comm, const std::vector<unsigned char>& dev,
                         const std::vector<unsigned char>& host, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char b : dev) h = (h ^ b) * 1099511628211ull;
  int64_t mine = static_cast<int64_t>(h >> 1), lo = 0, hi = 0;
  if (gw_allreduce(comm, &mine, &lo, 1, GW_INT64, GW_MIN) != GW_OK ||
      gw_allreduce(comm, &mine, &hi, 1, GW_INT64, GW_MAX) != GW_OK) {
    return std::string("hash exchange: ") + gw_last_error();
  }
  if (lo != hi) return "the ranks' GPU results differ";
  size_t flips = 0;
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    float d, e;
    std::memcpy(&d, dev.data() + 4 * i, 4);
    std::memcpy(&e, host.data() + 4 * i, 4);
    if (std::signbit(d) != std::signbit(e)) {
      ++flips;
      continue;
    }
    const double rel = std::fabs(static_cast<double>(d) - e) / std::max(1e-30, std::fabs(1.0 * e));
    worst = std::max(worst, rel);
  }
  if (flips > n / 1000 + 1 || worst > 1e-3) {
    return "vs the host path: " + std::to_string(flips) + " sign flips of " + std::to_string(n) +
           ", worst relative difference " + std::to_string(worst);
  }
  return "";
}

int run_rank(int rank, int np, const std::string& store) {
  auto fail = [&](const std::string& what) {
    std::fprintf(stderr, "rank %d: FAIL %s\n", rank, what.c_str());
    return 1;
  };
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = np;
  cfg.store_addr = store.c_str();
  cfg.transport = "tcp";
  cfg.timeout_ms = 60000;
  gw_comm_t comm = nullptr;
  if (gw_comm_init(&comm, &cfg) != GW_OK) return fail(std::string("init: ") + gw_last_error());
  auto drv = gw::cuda::driver();
  if (!drv.ok()) return fail(drv.status().message());
  int failures = 0;
  // The slice=... cases cut 262147 elements into 64 slices (4096) and into 53 whose offsets are
  // not 16-byte aligned (5001: the kernels' scalar path), with the residual carried over steps.
  const Case cases[] = {{"fp16", GW_FLOAT32},
                        {"bf16", GW_FLOAT32},
                        {"fp16,ef=1", GW_FLOAT32},
                        {"bf16,slice=4096", GW_FLOAT32},
                        {"fp16,ef=1,slice=4096", GW_FLOAT32},
                        {"bf16,ef=1,slice=5001", GW_FLOAT32},
                        {"sign", GW_FLOAT32},
                        {"sign,chunk=256,ef=0", GW_FLOAT32},
                        {"topk:0.01", GW_FLOAT32},
                        {"fp16", GW_FLOAT16},
                        {"none", GW_FLOAT32}};
  for (size_t n : {size_t{1}, size_t{1000}, size_t{262147}}) {
    for (const Case& c : cases) {
      const size_t elem = c.dtype == GW_FLOAT16 ? 2 : 4;
      const std::string tag =
          std::string(c.spec) + (elem == 2 ? " f16" : " f32") + " n=" + std::to_string(n);
      auto dev = gw::cuda::DeviceBuffer::allocate(0, n * elem);
      if (!dev.ok()) return fail(tag + ": " + dev.status().message());
      for (int step = 0; step < 3; ++step) {
        const std::vector<float> g = gradient(n, rank, step);
        std::vector<unsigned char> host(n * elem);
        if (elem == 4) {
          std::memcpy(host.data(), g.data(), n * 4);
        } else {
          for (size_t i = 0; i < n; ++i) {
            const uint16_t h = gw::cuda::cast16::to_half(g[i] * 1e-3f);
            std::memcpy(host.data() + 2 * i, &h, 2);
          }
        }
        if (!dev->upload(host.data(), host.size()).ok()) return fail(tag + ": upload");
        gw_comm_stats_t s0{}, s1{}, s2{};
        gw_comm_stats(comm, &s0);
        if (gw_allreduce_compressed(comm, host.data(), n, c.dtype, c.spec, ("h " + tag).c_str()) !=
            GW_OK) {
          return fail(tag + " host: " + gw_last_error());
        }
        gw_comm_stats(comm, &s1);
        if (gw_allreduce_compressed(comm, dev->get(), n, c.dtype, c.spec, ("d " + tag).c_str()) !=
            GW_OK) {
          return fail(tag + " device: " + gw_last_error());
        }
        gw_comm_stats(comm, &s2);
        std::vector<unsigned char> back(host.size());
        if (!dev->download(back.data(), back.size()).ok()) return fail(tag + ": download");
        if (std::string_view(c.spec).starts_with("sign") && elem == 4) {
          const std::string problem = sign_problem(comm, back, host, n);
          if (!problem.empty()) {
            std::fprintf(stderr, "rank %d: FAIL %s step %d: %s\n", rank, tag.c_str(), step,
                         problem.c_str());
            ++failures;
          }
        } else if (std::memcmp(back.data(), host.data(), host.size()) != 0) {
          size_t i = 0;
          while (i < host.size() && back[i] == host[i]) ++i;
          std::fprintf(stderr, "rank %d: FAIL %s step %d: device result differs at byte %zu\n",
                       rank, tag.c_str(), step, i);
          ++failures;
        }
        if (s2.bytes_sent - s1.bytes_sent != s1.bytes_sent - s0.bytes_sent) {
          std::fprintf(stderr, "rank %d: FAIL %s step %d: bytes sent %llu (device) vs %llu\n", rank,
                       tag.c_str(), step,
                       static_cast<unsigned long long>(s2.bytes_sent - s1.bytes_sent),
                       static_cast<unsigned long long>(s1.bytes_sent - s0.bytes_sent));
          ++failures;
        }
      }
    }
  }
  // A key used on the GPU may not be reused for a host buffer (its residual is on the GPU).
  {
    auto dev = gw::cuda::DeviceBuffer::allocate(0, 64 * 4);
    std::vector<float> h(64, 1.0f);
    if (!dev.ok() || !dev->upload(h.data(), 256).ok()) return fail("alloc");
    if (gw_allreduce_compressed(comm, dev->get(), 64, GW_FLOAT32, "fp16", "mixed") != GW_OK) {
      return fail(std::string("mixed device: ") + gw_last_error());
    }
    if (gw_allreduce_compressed(comm, h.data(), 64, GW_FLOAT32, "fp16", "mixed") !=
        GW_ERR_INVALID_ARG) {
      std::fprintf(stderr, "rank %d: FAIL host reuse of a GPU key was not refused\n", rank);
      ++failures;
    }
  }
  // The plain collectives on device memory (issue 27, direct mode): staged through page-locked
  // host memory by the library, results equal to host buffers'. Then 64 MiB float32 sums timed:
  // the library staging a device buffer vs the caller staging it (copy down, host allreduce,
  // copy up), medians of 7 after a warm-up, rank 0's figures.
  {
    const size_t n = size_t{16} << 20;
    auto dev = gw::cuda::DeviceBuffer::allocate(0, n * 4);
    if (!dev.ok()) return fail("alloc");
    std::vector<float> h(n), back(n);
    for (size_t i = 0; i < n; ++i) h[i] = static_cast<float>((i * 7 + rank) % 100);
    std::vector<float> want = h;
    if (!dev->upload(h.data(), n * 4).ok()) return fail("upload");
    if (gw_allreduce(comm, want.data(), want.data(), n, GW_FLOAT32, GW_SUM) != GW_OK ||
        gw_allreduce(comm, dev->get(), dev->get(), n, GW_FLOAT32, GW_SUM) != GW_OK) {
      return fail(std::string("allreduce: ") + gw_last_error());
    }
    if (!dev->download(back.data(), n * 4).ok()) return fail("download");
    if (std::memcmp(back.data(), want.data(), n * 4) != 0) {
      std::fprintf(stderr, "rank %d: FAIL device allreduce differs from host allreduce\n", rank);
      ++failures;
    }
    if (gw_broadcast(comm, dev->get(), n, GW_FLOAT32, np - 1) != GW_OK) {
      return fail(std::string("broadcast: ") + gw_last_error());
    }
    char path[512] = {0};
    gw_comm_describe(comm, "device_memory", path, sizeof(path), nullptr);
    auto time_ms = [&](auto&& fn) {
      std::vector<double> ms;
      for (int i = 0; i < 8; ++i) {
        gw_barrier(comm);
        const auto t0 = std::chrono::steady_clock::now();
        if (!fn()) return -1.0;
        const auto t1 = std::chrono::steady_clock::now();
        if (i > 0) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    const double lib_ms = time_ms(
        [&] { return gw_allreduce(comm, dev->get(), dev->get(), n, GW_FLOAT32, GW_SUM) == GW_OK; });
    const double caller_ms = time_ms([&] {
      return dev->download(back.data(), n * 4).ok() &&
             gw_allreduce(comm, back.data(), back.data(), n, GW_FLOAT32, GW_SUM) == GW_OK &&
             dev->upload(back.data(), n * 4).ok();
    });
    if (lib_ms < 0 || caller_ms < 0) return fail(std::string("timing: ") + gw_last_error());
    if (rank == 0) {
      std::printf("plain collectives on device memory: ok (%d ranks; %s)\n", np, path);
      std::printf(
          "64 MiB float32 allreduce, device buffer: library staging %.1f ms, caller "
          "staging (pageable) %.1f ms (medians of 7, rank 0)\n",
          lib_ms, caller_ms);
      std::fflush(stdout);
    }
  }
  // Timing: a 64 MiB float32 tensor (4 slices of the default 4 Mi elements), fp16 without and
  // with error feedback (casts default to ef=0) and sign (error feedback on), GPU tensor vs host
  // tensor (the host figure excludes the copies a caller would need to get the tensor to the
  // host). The four kinds of call take
  // turns, so that a slow stretch of the machine (loopback tcp varies by a third from run to run)
  // falls on all of them alike; the first two rounds warm up.
  {
    const size_t n = size_t{16} << 20;
    std::vector<float> h = gradient(n, rank, 9);
    auto dev = gw::cuda::DeviceBuffer::allocate(0, n * 4);
    if (!dev.ok() || !dev->upload(h.data(), n * 4).ok()) return fail("alloc 64 MiB");
    const char* specs[] = {"fp16", "fp16,ef=1", "sign"};
    constexpr int kSpecs = 3, kRounds = 13, kWarm = 2;
    std::vector<double> ms[kSpecs][2];  // [spec][0: GPU tensor, 1: host tensor]
    for (int it = 0; it < kRounds; ++it) {
      for (int c = 0; c < kSpecs; ++c) {
        for (int side = 0; side < 2; ++side) {
          const std::string k = std::string(side == 0 ? "td " : "th ") + specs[c];
          void* p = side == 0 ? dev->get() : static_cast<void*>(h.data());
          gw_barrier(comm);
          const auto t0 = std::chrono::steady_clock::now();
          if (gw_allreduce_compressed(comm, p, n, GW_FLOAT32, specs[c], k.c_str()) != GW_OK) {
            return fail(std::string("timed ") + k + ": " + gw_last_error());
          }
          const auto t1 = std::chrono::steady_clock::now();
          if (it >= kWarm)
            ms[c][side].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
      }
    }
    for (int c = 0; c < kSpecs; ++c) {
      for (auto& v : ms[c]) std::sort(v.begin(), v.end());
      if (rank == 0) {
        std::printf(
            "64 MiB f32, %s, %d ranks over tcp: GPU tensor %.1f ms, host tensor %.1f ms "
            "(medians of %d, rank 0; GPU min %.1f max %.1f, host min %.1f max %.1f)\n",
            specs[c], np, ms[c][0][ms[c][0].size() / 2], ms[c][1][ms[c][1].size() / 2],
            kRounds - kWarm, ms[c][0].front(), ms[c][0].back(), ms[c][1].front(), ms[c][1].back());
      }
    }
  }
  gw_comm_destroy(comm);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int np = 2;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--np") == 0 && i + 1 < argc) {
      np = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: gw-gpu-allreduce-check [--np N]\n");
      return 2;
    }
  }
  if (np < 1 || np > 8) {
    std::fprintf(stderr, "gw-gpu-allreduce-check: --np must be 1..8\n");
    return 2;
  }
  const int port = free_port();
  if (port < 0) return 2;
  const std::string store = "127.0.0.1:" + std::to_string(port);
  std::vector<pid_t> pids;
  for (int r = 0; r < np; ++r) {  // fork before any CUDA call: a CUDA context does not survive it
    const pid_t pid = fork();
    if (pid == 0) {
      const int rc = run_rank(r, np, store);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  int bad = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  for (pid_t pid : pids) {
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        for (pid_t p : pids) kill(p, SIGKILL);
        std::fprintf(stderr, "gw-gpu-allreduce-check: ranks still running after 240 s\n");
        waitpid(pid, &status, 0);
        status = 1 << 8;
        break;
      }
      usleep(20000);
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) bad = 1;
  }
  std::printf("%s\n", bad ? "FAIL" : "PASS");
  return bad;
}
