// One trainer with CUDA device buffers, for the daemon's device tests (daemon_device_test.cc) and
// scripts/gpu_check.sh daemon: written against include/gradwire/gradwire.h and the CUDA driver
// API, loaded with dlopen("libcuda.so.1") as an application linked to CUDA would have it (the
// tests put the stand-in driver, tests/support/fake_cuda_driver.c, first on LD_LIBRARY_PATH; on a
// GPU machine it is the real one). GW_DAEMON in its environment picks daemon mode.
//
// usage: device_trainer --rank R --world N [--store HOST:PORT] [--timeout-ms MS] SCENARIO [ARGS]
// Scenarios:
//   suite COUNT   on device buffers of COUNT elements a rank: allreduce (float32 sum, int32 max in
//                 place), broadcast (float64, every root), allgather (int32), reduce_scatter
//                 (float32 sum), alltoall (int32), each result checked exactly; the send buffer
//                 freed and another allocated (at the same address where the allocator gives it)
//                 and the allreduce again; a host send buffer with a device receive buffer
//                 (staged); gw_iallreduce of device buffers (staged by the front end)
//   bench BYTES ITERS  allreduce float32 sum of BYTES, device buffers then malloc'd host buffers,
//                 ITERS timed calls each after 3 warm-up calls; prints the medians in ms and,
//                 as the machine's ceiling, the median time of one host memcpy of BYTES
//   die KILLER    rank KILLER makes two allreduces of device buffers, then SIGKILLs itself while
//                 its third one runs; the others call allreduce until it fails
// Output: "RESULT rank=R status=S elapsed_ms=T" and "ERROR ..." lines; exit 0 when every call
// succeeded with the right result, 1 on a wrong result, 2 on usage or no driver, 10 + gw_status_t
// on a failure.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradwire/gradwire.h"
#include "trainer_args.h"

namespace {

using CUdeviceptr = unsigned long long;

struct Cuda {
  int (*init)(unsigned);
  int (*device_get)(int*, int);
  int (*ctx_retain)(void**, int);
  int (*ctx_set)(void*);
  int (*alloc)(CUdeviceptr*, size_t);
  int (*free)(CUdeviceptr);
  int (*htod)(CUdeviceptr, const void*, size_t);
  int (*dtoh)(void*, CUdeviceptr, size_t);
};
Cuda g_cu;

bool load_cuda() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) return false;
  auto sym = [&](const char* n) { return dlsym(lib, n); };
  g_cu.init = reinterpret_cast<int (*)(unsigned)>(sym("cuInit"));
  g_cu.device_get = reinterpret_cast<int (*)(int*, int)>(sym("cuDeviceGet"));
  g_cu.ctx_retain = reinterpret_cast<int (*)(void**, int)>(sym("cuDevicePrimaryCtxRetain"));
  g_cu.ctx_set = reinterpret_cast<int (*)(void*)>(sym("cuCtxSetCurrent"));
  g_cu.alloc = reinterpret_cast<int (*)(CUdeviceptr*, size_t)>(sym("cuMemAlloc_v2"));
  g_cu.free = reinterpret_cast<int (*)(CUdeviceptr)>(sym("cuMemFree_v2"));
  g_cu.htod = reinterpret_cast<int (*)(CUdeviceptr, const void*, size_t)>(sym("cuMemcpyHtoD_v2"));
  g_cu.dtoh = reinterpret_cast<int (*)(void*, CUdeviceptr, size_t)>(sym("cuMemcpyDtoH_v2"));
  if (!g_cu.init || !g_cu.device_get || !g_cu.ctx_retain || !g_cu.ctx_set || !g_cu.alloc ||
      !g_cu.free || !g_cu.htod || !g_cu.dtoh) {
    return false;
  }
  int dev = 0;
  void* ctx = nullptr;
  return g_cu.init(0) == 0 && g_cu.device_get(&dev, 0) == 0 && g_cu.ctx_retain(&ctx, dev) == 0 &&
         g_cu.ctx_set(ctx) == 0;
}

// Device memory of `bytes`, with its host copy `host` (bytes / sizeof(T) elements).
template <typename T>
struct Dev {
  explicit Dev(size_t n) : host(n) {
    if (g_cu.alloc(&ptr, n * sizeof(T) + 64) != 0) ptr = 0;
  }
  ~Dev() {
    if (ptr) g_cu.free(ptr);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  void* p() const { return reinterpret_cast<void*>(ptr); }
  bool up() { return g_cu.htod(ptr, host.data(), host.size() * sizeof(T)) == 0; }
  bool down() { return g_cu.dtoh(host.data(), ptr, host.size() * sizeof(T)) == 0; }
  CUdeviceptr ptr = 0;
  std::vector<T> host;
};

using gw_trainer::now_ms;
using gw_trainer::report;

int wrong(const char* what, size_t i, double got, double want) {
  std::printf("ERROR rank=%d %s: element %zu is %.17g, expected %.17g\n", gw_trainer::report_rank(),
              what, i, got, want);
  std::printf("RESULT rank=%d status=wrong elapsed_ms=0\n", gw_trainer::report_rank());
  std::fflush(stdout);
  return 1;
}

int no_device(const char* what) {
  std::printf("ERROR rank=%d %s: a device copy or allocation failed\n", gw_trainer::report_rank(),
              what);
  std::fflush(stdout);
  return 2;
}

#define CALL(what, expr)                                  \
  do {                                                    \
    const gw_status_t st_ = (expr);                       \
    if (st_ != GW_OK) return report(what, st_, now_ms()); \
  } while (0)
#define CHECK(what, i, got, want) \
  if ((got) != (want)) return wrong(what, i, got, want)

int run_suite(gw_comm_t comm, int rank, int world, size_t n) {
  const double tri = world * (world + 1) / 2.0;
  {  // allreduce float32 sum, two buffers
    Dev<float> s(n), r(n);
    for (size_t i = 0; i < n; ++i) s.host[i] = static_cast<float>(rank + 1 + i % 7);
    if (!s.ptr || !r.ptr || !s.up()) return no_device("allreduce");
    CALL("allreduce float32", gw_allreduce(comm, s.p(), r.p(), n, GW_FLOAT32, GW_SUM));
    if (!r.down()) return no_device("allreduce");
    for (size_t i = 0; i < n; ++i) CHECK("allreduce float32", i, r.host[i], tri + world * (i % 7));
    // The send buffer freed and another allocated (often at the same address): the next call
    // must not use the old one's import.
    const CUdeviceptr old = s.ptr;
    g_cu.free(s.ptr);
    s.ptr = 0;
    if (g_cu.alloc(&s.ptr, n * sizeof(float) + 64) != 0) return no_device("reallocation");
    std::printf("REALLOCATED rank=%d same_address=%d\n", rank, s.ptr == old ? 1 : 0);
    for (size_t i = 0; i < n; ++i) s.host[i] = static_cast<float>(2 * (rank + 1));
    if (!s.up()) return no_device("allreduce after reallocation");
    CALL("allreduce after reallocation", gw_allreduce(comm, s.p(), r.p(), n, GW_FLOAT32, GW_SUM));
    if (!r.down()) return no_device("allreduce after reallocation");
    for (size_t i = 0; i < n; ++i) CHECK("allreduce after reallocation", i, r.host[i], 2 * tri);
    // A host send buffer, a device receive buffer: staged.
    std::vector<float> h(n, static_cast<float>(rank));
    CALL("allreduce host to device", gw_allreduce(comm, h.data(), r.p(), n, GW_FLOAT32, GW_SUM));
    if (!r.down()) return no_device("allreduce host to device");
    for (size_t i = 0; i < n; ++i) CHECK("allreduce host to device", i, r.host[i], tri - world);
    // The i-form: staged by the front end (not imported).
    gw_request_t req = nullptr;
    CALL("iallreduce of device buffers",
         gw_iallreduce(comm, s.p(), r.p(), n, GW_FLOAT32, GW_SUM, &req));
    CALL("iallreduce of device buffers: wait", gw_wait(req, 60000));
    if (!r.down()) return no_device("iallreduce");
    for (size_t i = 0; i < n; ++i) CHECK("iallreduce of device buffers", i, r.host[i], 2 * tri);
  }
  {  // allreduce int32 max, in place
    Dev<int32_t> b(n);
    for (size_t i = 0; i < n; ++i) b.host[i] = static_cast<int32_t>((rank * 31 + i) % 97);
    if (!b.ptr || !b.up()) return no_device("allreduce int32");
    CALL("allreduce int32 max in place", gw_allreduce(comm, b.p(), b.p(), n, GW_INT32, GW_MAX));
    if (!b.down()) return no_device("allreduce int32");
    for (size_t i = 0; i < n; ++i) {
      int32_t want = 0;
      for (int q = 0; q < world; ++q)
        want = std::max(want, static_cast<int32_t>((q * 31 + i) % 97));
      CHECK("allreduce int32 max in place", i, b.host[i], want);
    }
  }
  for (int root = 0; root < world; ++root) {  // broadcast float64
    Dev<double> b(n);
    for (size_t i = 0; i < n; ++i) b.host[i] = rank == root ? root * 1000.0 + i : -1.0;
    if (!b.ptr || !b.up()) return no_device("broadcast");
    CALL("broadcast float64", gw_broadcast(comm, b.p(), n, GW_FLOAT64, root));
    if (!b.down()) return no_device("broadcast");
    for (size_t i = 0; i < n; ++i) CHECK("broadcast float64", i, b.host[i], root * 1000.0 + i);
  }
  {  // allgather int32
    Dev<int32_t> s(n), r(n * world);
    for (size_t i = 0; i < n; ++i) s.host[i] = static_cast<int32_t>(rank * 100000 + i);
    if (!s.ptr || !r.ptr || !s.up()) return no_device("allgather");
    CALL("allgather int32", gw_allgather(comm, s.p(), r.p(), n, GW_INT32));
    if (!r.down()) return no_device("allgather");
    for (int q = 0; q < world; ++q) {
      for (size_t i = 0; i < n; ++i) {
        CHECK("allgather int32", q * n + i, r.host[q * n + i],
              static_cast<int32_t>(q * 100000 + i));
      }
    }
  }
  {  // reduce_scatter float32 sum
    Dev<float> s(n * world), r(n);
    for (int b = 0; b < world; ++b) {
      for (size_t i = 0; i < n; ++i)
        s.host[b * n + i] = static_cast<float>((rank + 1) * ((b * 7 + i) % 1000));
    }
    if (!s.ptr || !r.ptr || !s.up()) return no_device("reduce_scatter");
    CALL("reduce_scatter float32", gw_reduce_scatter(comm, s.p(), r.p(), n, GW_FLOAT32, GW_SUM));
    if (!r.down()) return no_device("reduce_scatter");
    for (size_t i = 0; i < n; ++i) {
      CHECK("reduce_scatter float32", i, r.host[i], ((rank * 7 + i) % 1000) * tri);
    }
  }
  {  // alltoall int32
    Dev<int32_t> s(n * world), r(n * world);
    for (int d = 0; d < world; ++d) {
      for (size_t i = 0; i < n; ++i)
        s.host[d * n + i] = static_cast<int32_t>(rank * 100 + d + (i % 1000) * 10000);
    }
    if (!s.ptr || !r.ptr || !s.up()) return no_device("alltoall");
    CALL("alltoall int32", gw_alltoall(comm, s.p(), r.p(), n, GW_INT32));
    if (!r.down()) return no_device("alltoall");
    for (int q = 0; q < world; ++q) {
      for (size_t i = 0; i < n; ++i) {
        CHECK("alltoall int32", q * n + i, r.host[q * n + i],
              static_cast<int32_t>(q * 100 + rank + (i % 1000) * 10000));
      }
    }
  }
  std::printf("RESULT rank=%d status=0 elapsed_ms=0\n", rank);
  return 0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int run_bench(gw_comm_t comm, int rank, size_t bytes, int iters) {
  const size_t n = bytes / 4;
  Dev<float> d(n);
  std::vector<float> h(n, 1.0f), h2(n);
  for (auto& v : d.host) v = 1.0f;
  if (!d.ptr || !d.up()) return no_device("bench");
  std::vector<double> dev_ms, host_ms, copy_ms;
  for (int i = 0; i < 3 + iters; ++i) {
    const double t0 = now_ms();
    CALL("bench device allreduce", gw_allreduce(comm, d.p(), d.p(), n, GW_FLOAT32, GW_SUM));
    if (i >= 3) dev_ms.push_back(now_ms() - t0);
  }
  for (int i = 0; i < 3 + iters; ++i) {
    const double t0 = now_ms();
    CALL("bench host allreduce", gw_allreduce(comm, h.data(), h.data(), n, GW_FLOAT32, GW_SUM));
    if (i >= 3) host_ms.push_back(now_ms() - t0);
  }
  for (int i = 0; i < iters; ++i) {
    const double t0 = now_ms();
    std::memcpy(h2.data(), h.data(), n * 4);
    copy_ms.push_back(now_ms() - t0);
  }
  std::printf("BENCH rank=%d bytes=%zu device_ms=%.2f host_ms=%.2f memcpy_ms=%.2f\n", rank, bytes,
              median(dev_ms), median(host_ms), median(copy_ms));
  std::printf("RESULT rank=%d status=0 elapsed_ms=0\n", rank);
  return 0;
}

int run_die(gw_comm_t comm, int rank, int killer) {
  const size_t n = size_t{1} << 18;
  Dev<float> s(n), r(n);
  for (auto& v : s.host) v = 1.0f;
  if (!s.ptr || !r.ptr || !s.up()) return no_device("die");
  return gw_trainer::die_while_others_allreduce(comm, rank, killer, s.p(), r.p(), n);
}

}  // namespace

int main(int argc, char** argv) {
  return gw_trainer::trainer_main(
      argc, argv, "suite COUNT | die KILLER",
      [] {
        if (load_cuda()) return 0;
        std::printf("ERROR rank=%d no CUDA driver (libcuda.so.1) or no device\n",
                    gw_trainer::report_rank());
        return 2;
      },
      [](const gw_trainer::Scenario& sc) {
        const int n = sc.argc;
        char** a = sc.argv;
        if (sc.name == "suite" && n == 1) {
          return run_suite(sc.comm, sc.rank, sc.world, std::strtoull(a[0], nullptr, 10));
        }
        if (sc.name == "bench" && n == 2) {
          return run_bench(sc.comm, sc.rank, std::strtoull(a[0], nullptr, 10), std::atoi(a[1]));
        }
        if (sc.name == "die" && n == 1) return run_die(sc.comm, sc.rank, std::atoi(a[0]));
        return -1;
      });
}
