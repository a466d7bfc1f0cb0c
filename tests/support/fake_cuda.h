// The stand-in CUDA driver (tests/support/fake_cuda_driver.c, built as gw_fake_cuda with the
// soname libcuda.so.1) as a test loads it: dlopen'd by path before gradwire looks for the driver,
// so gradwire's dlopen("libcuda.so.1") resolves to it. Its hooks are null when it cannot be loaded.
#pragma once

#include <dlfcn.h>

#include <cstddef>

namespace gw::testing {

struct FakeCuda {
  void (*mark)(const void*, size_t, int) = nullptr;  // [p, p+bytes) is device (managed) memory
  void (*clear)() = nullptr;                         // forget every marked range
  long (*queries)() = nullptr;                       // cuPointerGetAttribute calls so far
  long (*exports)() = nullptr;                       // dma-bufs exported so far
};

// Loads the library at `path` once per process and returns its hooks.
inline const FakeCuda& fake_cuda(const char* path) {
  static const FakeCuda f = [path] {
    FakeCuda d;
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return d;
    d.mark = reinterpret_cast<void (*)(const void*, size_t, int)>(dlsym(lib, "gw_fake_cuda_mark"));
    d.clear = reinterpret_cast<void (*)()>(dlsym(lib, "gw_fake_cuda_clear"));
    d.queries = reinterpret_cast<long (*)()>(dlsym(lib, "gw_fake_cuda_queries"));
    d.exports = reinterpret_cast<long (*)()>(dlsym(lib, "gw_fake_cuda_exports"));
    return d;
  }();
  return f;
}

}  // namespace gw::testing
