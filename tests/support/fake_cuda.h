// The stand-in CUDA driver (tests/support/fake_cuda_driver.c, built as gw_fake_cuda with the
// soname libcuda.so.1) as a test loads it: dlopen'd by path before gradwire looks for the driver,
// so gradwire's dlopen("libcuda.so.1") resolves to it. Its hooks are null when it cannot be loaded.
#pragma once

#include <dlfcn.h>

#include <cstddef>

namespace gw::testing {

struct FakeCuda {
  void (*mark)(const void*, size_t, int) = nullptr;  // [p, p+bytes) is device (managed) memory
  // [p, p+bytes) is device memory whose dma-buf is `fd`, a memfd mapped at p (offset 0 is p)
  void (*mark_dmabuf)(const void*, size_t, int) = nullptr;
  void (*clear)() = nullptr;    // forget every marked range
  long (*queries)() = nullptr;  // cuPointerGetAttribute calls so far
  long (*exports)() = nullptr;  // dma-bufs exported so far
  // The allocation block: device memory the CPU cannot touch (PROT_NONE; a freed range is handed
  // out again at the same address with a new buffer id), and the driver's copies into and out of
  // it.
  int (*mem_alloc)(unsigned long long*, size_t) = nullptr;         // cuMemAlloc_v2
  int (*mem_free)(unsigned long long) = nullptr;                   // cuMemFree_v2
  int (*htod)(unsigned long long, const void*, size_t) = nullptr;  // cuMemcpyHtoD_v2
  int (*dtoh)(void*, unsigned long long, size_t) = nullptr;        // cuMemcpyDtoH_v2
  long (*live_allocs)() = nullptr;                                 // cuMemAlloc'd, not freed
  long (*copies)() = nullptr;                                      // copies so far
  long (*host_allocs)() = nullptr;                                 // cuMemHostAlloc'd, not freed
};

// Loads the library at `path` once per process and returns its hooks.
inline const FakeCuda& fake_cuda(const char* path) {
  static const FakeCuda f = [path] {
    FakeCuda d;
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return d;
    d.mark = reinterpret_cast<void (*)(const void*, size_t, int)>(dlsym(lib, "gw_fake_cuda_mark"));
    d.mark_dmabuf = reinterpret_cast<void (*)(const void*, size_t, int)>(
        dlsym(lib, "gw_fake_cuda_mark_dmabuf"));
    d.clear = reinterpret_cast<void (*)()>(dlsym(lib, "gw_fake_cuda_clear"));
    d.queries = reinterpret_cast<long (*)()>(dlsym(lib, "gw_fake_cuda_queries"));
    d.exports = reinterpret_cast<long (*)()>(dlsym(lib, "gw_fake_cuda_exports"));
    d.mem_alloc =
        reinterpret_cast<int (*)(unsigned long long*, size_t)>(dlsym(lib, "cuMemAlloc_v2"));
    d.mem_free = reinterpret_cast<int (*)(unsigned long long)>(dlsym(lib, "cuMemFree_v2"));
    d.htod = reinterpret_cast<int (*)(unsigned long long, const void*, size_t)>(
        dlsym(lib, "cuMemcpyHtoD_v2"));
    d.dtoh =
        reinterpret_cast<int (*)(void*, unsigned long long, size_t)>(dlsym(lib, "cuMemcpyDtoH_v2"));
    d.live_allocs = reinterpret_cast<long (*)()>(dlsym(lib, "gw_fake_cuda_live_allocs"));
    d.copies = reinterpret_cast<long (*)()>(dlsym(lib, "gw_fake_cuda_copies"));
    d.host_allocs = reinterpret_cast<long (*)()>(dlsym(lib, "gw_fake_cuda_host_allocs"));
    return d;
  }();
  return f;
}

}  // namespace gw::testing
