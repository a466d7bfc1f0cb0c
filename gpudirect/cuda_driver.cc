#include "gpudirect/cuda_driver.h"

#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace gw::cuda {

namespace {

// Looks up `name` (the first of the names that exists) into `*slot`.
template <typename Fn>
bool bind(void* lib, Fn* slot, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (void* sym = dlsym(lib, n)) {
      *slot = reinterpret_cast<Fn>(sym);
      return true;
    }
  }
  return false;
}

Result<const Driver*> load(const char* library) {
  // RTLD_LOCAL: the driver's symbols must not satisfy anyone else's references by accident.
  void* lib = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return unsupported("no CUDA driver: {} not found ({})", library, why ? why : "dlopen failed");
  }
  auto d = std::make_unique<Driver>();
  d->library = library;
  const char* missing = nullptr;
#define GW_BIND(field, ...) \
  if (!missing && !bind(lib, &d->field, {__VA_ARGS__})) missing = #field
  GW_BIND(cuInit, "cuInit");
  GW_BIND(cuDriverGetVersion, "cuDriverGetVersion");
  GW_BIND(cuGetErrorString, "cuGetErrorString");
  GW_BIND(cuGetErrorName, "cuGetErrorName");
  GW_BIND(cuDeviceGetCount, "cuDeviceGetCount");
  GW_BIND(cuDeviceGet, "cuDeviceGet");
  GW_BIND(cuDeviceGetAttribute, "cuDeviceGetAttribute");
  GW_BIND(cuDeviceGetName, "cuDeviceGetName");
  GW_BIND(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  GW_BIND(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  GW_BIND(cuCtxSetCurrent, "cuCtxSetCurrent");
  GW_BIND(cuCtxGetCurrent, "cuCtxGetCurrent");
  GW_BIND(cuCtxPushCurrent, "cuCtxPushCurrent_v2");
  GW_BIND(cuCtxPopCurrent, "cuCtxPopCurrent_v2");
  GW_BIND(cuModuleLoadData, "cuModuleLoadData");
  GW_BIND(cuModuleUnload, "cuModuleUnload");
  GW_BIND(cuModuleGetFunction, "cuModuleGetFunction");
  GW_BIND(cuLaunchKernel, "cuLaunchKernel");
  GW_BIND(cuMemAlloc, "cuMemAlloc_v2");
  GW_BIND(cuMemFree, "cuMemFree_v2");
  GW_BIND(cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  GW_BIND(cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  GW_BIND(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
  GW_BIND(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
  GW_BIND(cuMemsetD8, "cuMemsetD8_v2");
  GW_BIND(cuMemHostAlloc, "cuMemHostAlloc");
  GW_BIND(cuMemFreeHost, "cuMemFreeHost");
  GW_BIND(cuStreamCreate, "cuStreamCreate");
  GW_BIND(cuStreamDestroy, "cuStreamDestroy_v2");
  GW_BIND(cuStreamQuery, "cuStreamQuery");
  GW_BIND(cuStreamSynchronize, "cuStreamSynchronize");
  GW_BIND(cuEventCreate, "cuEventCreate");
  GW_BIND(cuEventDestroy, "cuEventDestroy_v2");
  GW_BIND(cuEventRecord, "cuEventRecord");
  GW_BIND(cuEventQuery, "cuEventQuery");
  // _v2 (CUDA 12.8+) and the original have the same signature; older drivers only have the latter.
  GW_BIND(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime");
  GW_BIND(cuPointerGetAttribute, "cuPointerGetAttribute");
#undef GW_BIND
  // Optional entries: a driver without them still serves everything else.
  (void)bind(lib, &d->cuMemGetAddressRange, {"cuMemGetAddressRange_v2"});
  (void)bind(lib, &d->cuMemGetHandleForAddressRange, {"cuMemGetHandleForAddressRange"});
  (void)bind(lib, &d->cuIpcGetMemHandle, {"cuIpcGetMemHandle"});
  (void)bind(lib, &d->cuIpcOpenMemHandle, {"cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle"});
  (void)bind(lib, &d->cuIpcCloseMemHandle, {"cuIpcCloseMemHandle"});
  if (missing) {
    dlclose(lib);
    return unsupported("no usable CUDA driver: {} lacks {} (driver too old?)", library, missing);
  }
  const CUresult r = d->cuInit(0);
  if (r != kCudaSuccess) {
    const std::string text = error_text(*d, r);
    dlclose(lib);
    return unsupported("no usable CUDA driver: cuInit failed: {}", text);
  }
  int count = 0;
  if (d->cuDeviceGetCount(&count) != kCudaSuccess || count <= 0) {
    dlclose(lib);
    return unsupported("no CUDA device: the driver ({}) sees none", library);
  }
  d->cuDriverGetVersion(&d->version);
  // The library stays loaded for the life of the process: tables and modules point into it.
  return static_cast<const Driver*>(d.release());
}

}  // namespace

Result<const Driver*> load_driver(const char* library) {
  if (library == nullptr || *library == '\0') return invalid_arg("load_driver: empty library name");
  Result<const Driver*> d = load(library);
  if (d.ok()) {
    // A loaded driver lives as long as the process (see load); kept reachable here, as driver()'s
    // is by its static, so that leak checkers see it is meant to.
    static std::mutex mu;
    static auto* kept = new std::vector<const Driver*>();  // never destroyed, as the drivers
    std::lock_guard<std::mutex> lock(mu);
    kept->push_back(*d);
  }
  return d;
}

Result<const Driver*> driver() {
  static const Result<const Driver*> loaded = load("libcuda.so.1");
  return loaded;
}

std::string error_text(const Driver& d, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (d.cuGetErrorName(r, &name) != kCudaSuccess || name == nullptr) name = "CUDA_ERROR_UNKNOWN";
  if (d.cuGetErrorString(r, &text) != kCudaSuccess || text == nullptr) text = "no description";
  return fmt::format("{} ({}, code {})", name, text, r);
}

Status cuda_error(const Driver& d, CUresult r, std::string_view what) {
  constexpr CUresult kOutOfMemory = 2;
  const Code code = r == kOutOfMemory             ? Code::kNoMemory
                    : r == kCudaErrorInvalidValue ? Code::kInvalidArg
                                                  : Code::kSystem;
  return Status(code, fmt::format("{}: {}", what, error_text(d, r)));
}

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  auto d = driver();
  if (!d.ok()) return false;
  unsigned type = 0;
  const CUresult r =
      (*d)->cuPointerGetAttribute(&type, kPointerAttrMemoryType, reinterpret_cast<CUdeviceptr>(p));
  return r == kCudaSuccess && (type == kMemoryTypeDevice || type == kMemoryTypeUnified);
}

namespace {

// How many objects the dynamic linker has ever loaded into this process (glibc's dlpi_adds), or
// -1 where it does not say: a cheap way to know that nothing was loaded since the last look.
int64_t objects_ever_loaded() {
  int64_t adds = -1;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t size, void* data) -> int {
        if (size >= offsetof(dl_phdr_info, dlpi_adds) + sizeof(info->dlpi_adds)) {
          *static_cast<int64_t*>(data) = static_cast<int64_t>(info->dlpi_adds);
        }
        return 1;  // the first object carries the counter
      },
      &adds);
  return adds;
}

std::atomic<int64_t> g_searches{0};

}  // namespace

int64_t resident_driver_searches() { return g_searches.load(std::memory_order_relaxed); }

const Driver* resident_driver() {
  static std::atomic<const Driver*> table{nullptr};
  static std::atomic<bool> unusable{false};
  // The load count at the last look that found no libcuda: until another object is loaded,
  // libcuda cannot have appeared. dlopen(RTLD_NOLOAD) of a name that is not loaded searches the
  // library path (7 failed opens and the ld.so.cache mapped and unmapped: about 20 us here), and
  // this runs on every collective call.
  static std::atomic<int64_t> absent_at{-2};
  static std::mutex mu;
  if (const Driver* d = table.load(std::memory_order_acquire)) return d;
  if (unusable.load(std::memory_order_acquire)) return nullptr;
  const int64_t loaded = objects_ever_loaded();
  if (loaded >= 0 && absent_at.load(std::memory_order_acquire) == loaded) return nullptr;
  g_searches.fetch_add(1, std::memory_order_relaxed);
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (lib == nullptr) {  // nobody in this process uses CUDA (yet)
    absent_at.store(loaded, std::memory_order_release);
    return nullptr;
  }
  dlclose(lib);  // drops the reference RTLD_NOLOAD took; the library stays mapped
  std::lock_guard<std::mutex> lock(mu);
  if (const Driver* d = table.load(std::memory_order_acquire)) return d;
  auto d = driver();
  // driver() caches its first answer: when that was made before the application mapped the
  // library, load a table of our own now that it is there.
  if (!d.ok()) d = load_driver("libcuda.so.1");
  if (!d.ok()) {
    unusable.store(true, std::memory_order_release);
    return nullptr;
  }
  table.store(*d, std::memory_order_release);
  return *d;
}

MemoryKind resident_memory_kind(const void* p) {
  if (p == nullptr) return MemoryKind::kHost;
  const Driver* d = resident_driver();
  if (d == nullptr) return MemoryKind::kHost;
  const auto ptr = reinterpret_cast<CUdeviceptr>(p);
  unsigned type = 0;
  // Host memory the driver never saw is CUDA_ERROR_INVALID_VALUE: host.
  if (d->cuPointerGetAttribute(&type, kPointerAttrMemoryType, ptr) != kCudaSuccess ||
      (type != kMemoryTypeDevice && type != kMemoryTypeUnified)) {
    return MemoryKind::kHost;
  }
  unsigned managed = 0;
  if (d->cuPointerGetAttribute(&managed, kPointerAttrIsManaged, ptr) == kCudaSuccess &&
      managed != 0) {
    return MemoryKind::kManaged;
  }
  return MemoryKind::kDevice;
}

namespace {

// Polls `query` (cuStreamQuery or cuEventQuery of one object) until it is no longer
// CUDA_ERROR_NOT_READY or `timeout_ms` has passed.
template <typename Query>
Status poll_done(const Driver& d, Query query, int64_t timeout_ms, std::string_view what) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto deadline = start + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const CUresult r = query();
    if (r == kCudaSuccess) return ok_status();
    if (r != kCudaErrorNotReady) return cuda_error(d, r, what);
    const auto now = clock::now();
    if (now >= deadline) {
      return timeout_error("{}: GPU work not finished after {} ms", what, timeout_ms);
    }
    // Kernels of a few µs finish while spinning; longer ones are polled every 50 µs.
    if (now - start > std::chrono::microseconds(200)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::yield();
    }
  }
}

}  // namespace

Status stream_wait(const Driver& d, CUstream stream, int64_t timeout_ms) {
  return poll_done(
      d, [&] { return d.cuStreamQuery(stream); }, timeout_ms, "stream wait");
}

Status event_wait(const Driver& d, CUevent event, int64_t timeout_ms) {
  return poll_done(
      d, [&] { return d.cuEventQuery(event); }, timeout_ms, "event wait");
}

}  // namespace gw::cuda
