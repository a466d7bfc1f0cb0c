/* A stand-in for the CUDA driver (built with the soname libcuda.so.1) for tests on hosts without a
 * GPU. It exports every symbol gpudirect/cuda_driver.cc binds; cuInit succeeds and reports one
 * device. cuPointerGetAttribute reports as device (or managed) memory the ranges the test marks
 * with gw_fake_cuda_mark(), and host memory (CUDA_ERROR_INVALID_VALUE, as the real driver does for
 * memory it never saw) everywhere else. Every other call fails with CUDA_ERROR_NOT_SUPPORTED.
 * A test dlopen()s it by path before gradwire looks for the driver: the dynamic loader then
 * resolves gradwire's dlopen("libcuda.so.1") to this library by its soname. */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define FAKE_SUCCESS 0
#define FAKE_INVALID_VALUE 1
#define FAKE_NOT_SUPPORTED 801
#define ATTR_MEMORY_TYPE 2
#define ATTR_IS_MANAGED 8
#define MEMORYTYPE_DEVICE 2

#define EXPORT __attribute__((visibility("default")))

struct Range {
  uintptr_t begin;
  uintptr_t end;
  int managed;
};
static struct Range g_ranges[16];
static int g_nranges;
static long g_queries;

/* Marks [p, p + bytes) as device memory (managed memory when managed != 0). */
EXPORT void gw_fake_cuda_mark(const void* p, size_t bytes, int managed) {
  if (g_nranges < 16) {
    g_ranges[g_nranges].begin = (uintptr_t)p;
    g_ranges[g_nranges].end = (uintptr_t)p + bytes;
    g_ranges[g_nranges].managed = managed;
    g_nranges++;
  }
}
/* Forgets every range. */
EXPORT void gw_fake_cuda_clear(void) { g_nranges = 0; }
/* How many times cuPointerGetAttribute was called. */
EXPORT long gw_fake_cuda_queries(void) { return g_queries; }

EXPORT int cuInit(unsigned flags) {
  (void)flags;
  return FAKE_SUCCESS;
}
EXPORT int cuDriverGetVersion(int* v) {
  *v = 12000;
  return FAKE_SUCCESS;
}
EXPORT int cuDeviceGetCount(int* n) {
  *n = 1;
  return FAKE_SUCCESS;
}
EXPORT int cuGetErrorString(int e, const char** s) {
  (void)e;
  *s = "fake driver";
  return FAKE_SUCCESS;
}
EXPORT int cuGetErrorName(int e, const char** s) {
  *s = e == FAKE_INVALID_VALUE ? "CUDA_ERROR_INVALID_VALUE" : "CUDA_ERROR_NOT_SUPPORTED";
  return FAKE_SUCCESS;
}
EXPORT int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  g_queries++;
  for (int i = 0; i < g_nranges; i++) {
    if (ptr >= g_ranges[i].begin && ptr < g_ranges[i].end) {
      if (attribute == ATTR_MEMORY_TYPE) {
        *(unsigned*)data = MEMORYTYPE_DEVICE;
        return FAKE_SUCCESS;
      }
      if (attribute == ATTR_IS_MANAGED) {
        *(unsigned*)data = (unsigned)g_ranges[i].managed;
        return FAKE_SUCCESS;
      }
      return FAKE_NOT_SUPPORTED;
    }
  }
  return FAKE_INVALID_VALUE;
}

/* The marked range holding ptr, as the allocation it belongs to. */
EXPORT int cuMemGetAddressRange_v2(unsigned long long* base, size_t* size, unsigned long long ptr) {
  for (int i = 0; i < g_nranges; i++) {
    if (ptr >= g_ranges[i].begin && ptr < g_ranges[i].end) {
      if (base) *base = g_ranges[i].begin;
      if (size) *size = g_ranges[i].end - g_ranges[i].begin;
      return FAKE_SUCCESS;
    }
  }
  return FAKE_INVALID_VALUE;
}

static long g_exports;
/* How many dma-bufs cuMemGetHandleForAddressRange exported. */
EXPORT long gw_fake_cuda_exports(void) { return g_exports; }

/* A dma-buf stand-in: a memfd named "gw-fake-dmabuf" of the range's size, for a range inside a
 * marked allocation (type 1 = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD). */
EXPORT int cuMemGetHandleForAddressRange(void* handle, unsigned long long ptr, size_t size,
                                         int type, unsigned long long flags) {
  if (handle == NULL || type != 1 || flags != 0 || size == 0) return FAKE_INVALID_VALUE;
  int inside = 0;
  for (int i = 0; i < g_nranges; i++) {
    if (ptr >= g_ranges[i].begin && ptr < g_ranges[i].end) inside = 1;
  }
  if (!inside) return FAKE_INVALID_VALUE;
  int fd = memfd_create("gw-fake-dmabuf", MFD_CLOEXEC);
  if (fd < 0) return FAKE_NOT_SUPPORTED;
  if (ftruncate(fd, (off_t)size) != 0) {
    close(fd);
    return FAKE_NOT_SUPPORTED;
  }
  *(int*)handle = fd;
  g_exports++;
  return FAKE_SUCCESS;
}

/* The rest: present (the loader binds them all) and unsupported. */
#define UNSUPPORTED(name) \
  EXPORT int name(void) { return FAKE_NOT_SUPPORTED; }
UNSUPPORTED(cuDeviceGet)
UNSUPPORTED(cuDeviceGetAttribute)
UNSUPPORTED(cuDeviceGetName)
UNSUPPORTED(cuDevicePrimaryCtxRetain)
UNSUPPORTED(cuDevicePrimaryCtxRelease_v2)
UNSUPPORTED(cuCtxSetCurrent)
UNSUPPORTED(cuCtxGetCurrent)
UNSUPPORTED(cuCtxPushCurrent_v2)
UNSUPPORTED(cuCtxPopCurrent_v2)
UNSUPPORTED(cuModuleLoadData)
UNSUPPORTED(cuModuleUnload)
UNSUPPORTED(cuModuleGetFunction)
UNSUPPORTED(cuLaunchKernel)
UNSUPPORTED(cuMemAlloc_v2)
UNSUPPORTED(cuMemFree_v2)
UNSUPPORTED(cuMemcpyHtoD_v2)
UNSUPPORTED(cuMemcpyDtoH_v2)
UNSUPPORTED(cuMemcpyHtoDAsync_v2)
UNSUPPORTED(cuMemcpyDtoHAsync_v2)
UNSUPPORTED(cuMemsetD8_v2)
UNSUPPORTED(cuMemHostAlloc)
UNSUPPORTED(cuMemFreeHost)
UNSUPPORTED(cuStreamCreate)
UNSUPPORTED(cuStreamDestroy_v2)
UNSUPPORTED(cuStreamQuery)
UNSUPPORTED(cuStreamSynchronize)
UNSUPPORTED(cuEventCreate)
UNSUPPORTED(cuEventDestroy_v2)
UNSUPPORTED(cuEventRecord)
UNSUPPORTED(cuEventQuery)
UNSUPPORTED(cuEventElapsedTime_v2)
