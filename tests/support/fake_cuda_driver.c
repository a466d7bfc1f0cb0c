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
static int fake_alloc_attribute(void* data, int attribute, unsigned long long ptr);
EXPORT int cuPointerGetAttribute(void* data, int attribute, unsigned long long ptr) {
  g_queries++;
  if (fake_alloc_attribute(data, attribute, ptr) == FAKE_SUCCESS) return FAKE_SUCCESS;
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
static int fake_alloc_range(unsigned long long* base, size_t* size, unsigned long long ptr);
EXPORT int cuMemGetAddressRange_v2(unsigned long long* base, size_t* size, unsigned long long ptr) {
  if (fake_alloc_range(base, size, ptr) == FAKE_SUCCESS) return FAKE_SUCCESS;
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
UNSUPPORTED(cuDeviceGetAttribute)
UNSUPPORTED(cuDeviceGetName)
UNSUPPORTED(cuCtxPushCurrent_v2)
UNSUPPORTED(cuCtxPopCurrent_v2)
UNSUPPORTED(cuModuleLoadData)
UNSUPPORTED(cuModuleUnload)
UNSUPPORTED(cuModuleGetFunction)
UNSUPPORTED(cuLaunchKernel)
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

/* ---- Device memory that other processes can open (gradwired's imports) ---------------------
 * cuMemAlloc_v2 backs each allocation with a memfd mapped PROT_NONE, so that the CPU cannot touch
 * "device" memory by mistake (a fault, as on a GPU), and the copies (cuMemcpyHtoD/DtoH) go through
 * pread/pwrite on the memfd. cuIpcGetMemHandle names the allocation by its process and descriptor
 * ("GWFAKIPC", pid, fd, size, buffer id); cuIpcOpenMemHandle_v2 in another process opens
 * /proc/<pid>/fd/<fd> (same user), maps it PROT_NONE as well, and its copies use that descriptor.
 * Allocations and openings both count as "device" ranges for cuPointerGetAttribute and
 * cuMemGetAddressRange; every allocation has a buffer id of its own (CU_POINTER_ATTRIBUTE_
 * BUFFER_ID), so a freed and reused address is seen as another allocation. Contexts are a token. */
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define ATTR_BUFFER_ID 7
#define FAKE_MAX_ALLOCS 64

struct FakeAlloc {
  uintptr_t base;
  size_t size;
  int fd;
  int opened; /* 1: an IPC opening in this process, 0: an allocation of its own */
  unsigned long long buffer_id;
};
static struct FakeAlloc g_allocs[FAKE_MAX_ALLOCS];
static unsigned long long g_next_buffer_id = 1;
static long g_ipc_open;
static int g_ctx_token;

/* IPC openings currently held in this process (gradwired's imports). */
EXPORT long gw_fake_cuda_ipc_open(void) { return g_ipc_open; }

static struct FakeAlloc* fake_alloc_of(unsigned long long ptr) {
  for (int i = 0; i < FAKE_MAX_ALLOCS; i++) {
    struct FakeAlloc* a = &g_allocs[i];
    if (a->size != 0 && ptr >= a->base && ptr < a->base + a->size) return a;
  }
  return NULL;
}

static int fake_alloc_attribute(void* data, int attribute, unsigned long long ptr) {
  struct FakeAlloc* a = fake_alloc_of(ptr);
  if (a == NULL) return FAKE_INVALID_VALUE;
  if (attribute == ATTR_MEMORY_TYPE) {
    *(unsigned*)data = MEMORYTYPE_DEVICE;
  } else if (attribute == ATTR_IS_MANAGED) {
    *(unsigned*)data = 0;
  } else if (attribute == ATTR_BUFFER_ID) {
    *(unsigned long long*)data = a->buffer_id;
  } else {
    return FAKE_NOT_SUPPORTED;
  }
  return FAKE_SUCCESS;
}

static int fake_alloc_range(unsigned long long* base, size_t* size, unsigned long long ptr) {
  struct FakeAlloc* a = fake_alloc_of(ptr);
  if (a == NULL) return FAKE_INVALID_VALUE;
  if (base) *base = a->base;
  if (size) *size = a->size;
  return FAKE_SUCCESS;
}

static int fake_map(int fd, size_t size, int opened, unsigned long long id,
                    unsigned long long* out) {
  struct FakeAlloc* slot = NULL;
  for (int i = 0; i < FAKE_MAX_ALLOCS && slot == NULL; i++) {
    if (g_allocs[i].size == 0) slot = &g_allocs[i];
  }
  if (slot == NULL) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  void* p = mmap(NULL, size, PROT_NONE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return 2;
  slot->base = (uintptr_t)p;
  slot->size = size;
  slot->fd = fd;
  slot->opened = opened;
  slot->buffer_id = id;
  *out = (unsigned long long)(uintptr_t)p;
  return FAKE_SUCCESS;
}

static void fake_unmap(struct FakeAlloc* a) {
  munmap((void*)a->base, a->size);
  close(a->fd);
  memset(a, 0, sizeof(*a));
}

EXPORT int cuDeviceGet(int* dev, int ordinal) {
  if (ordinal != 0) return FAKE_INVALID_VALUE;
  *dev = 0;
  return FAKE_SUCCESS;
}
EXPORT int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  (void)dev;
  *ctx = &g_ctx_token;
  return FAKE_SUCCESS;
}
EXPORT int cuDevicePrimaryCtxRelease_v2(int dev) {
  (void)dev;
  return FAKE_SUCCESS;
}
EXPORT int cuCtxSetCurrent(void* ctx) {
  (void)ctx;
  return FAKE_SUCCESS;
}
EXPORT int cuCtxGetCurrent(void** ctx) {
  *ctx = &g_ctx_token;
  return FAKE_SUCCESS;
}

EXPORT int cuMemAlloc_v2(unsigned long long* ptr, size_t bytes) {
  if (ptr == NULL || bytes == 0) return FAKE_INVALID_VALUE;
  int fd = memfd_create("gw-fake-device", MFD_CLOEXEC);
  if (fd < 0) return 2;
  if (ftruncate(fd, (off_t)bytes) != 0) {
    close(fd);
    return 2;
  }
  int r = fake_map(fd, bytes, 0, g_next_buffer_id++, ptr);
  if (r != FAKE_SUCCESS) close(fd);
  return r;
}

EXPORT int cuMemFree_v2(unsigned long long ptr) {
  struct FakeAlloc* a = fake_alloc_of(ptr);
  if (a == NULL || a->base != ptr || a->opened) return FAKE_INVALID_VALUE;
  fake_unmap(a);
  return FAKE_SUCCESS;
}

/* Copies: device memory through its memfd; memory a test marked as device is plain memory. */
static int fake_copy(unsigned long long dev, void* host, size_t bytes, int to_device) {
  struct FakeAlloc* a = fake_alloc_of(dev);
  if (a == NULL) {
    if (to_device) {
      memcpy((void*)(uintptr_t)dev, host, bytes);
    } else {
      memcpy(host, (const void*)(uintptr_t)dev, bytes);
    }
    return FAKE_SUCCESS;
  }
  if (dev + bytes > a->base + a->size) return FAKE_INVALID_VALUE;
  off_t at = (off_t)(dev - a->base);
  size_t done = 0;
  while (done < bytes) {
    ssize_t n = to_device ? pwrite(a->fd, (const char*)host + done, bytes - done, at + done)
                          : pread(a->fd, (char*)host + done, bytes - done, at + done);
    if (n <= 0) return FAKE_INVALID_VALUE;
    done += (size_t)n;
  }
  return FAKE_SUCCESS;
}
EXPORT int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
  return fake_copy(dst, (void*)src, bytes, 1);
}
EXPORT int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
  return fake_copy(src, dst, bytes, 0);
}

struct FakeIpcHandle {
  char magic[8]; /* "GWFAKIPC" */
  int32_t pid;
  int32_t fd;
  uint64_t size;
  uint64_t buffer_id;
  char pad[32];
};
_Static_assert(sizeof(struct FakeIpcHandle) == 64, "CUipcMemHandle is 64 bytes");

EXPORT int cuIpcGetMemHandle(void* handle, unsigned long long ptr) {
  struct FakeAlloc* a = fake_alloc_of(ptr);
  if (handle == NULL || a == NULL || a->base != ptr || a->opened) return FAKE_INVALID_VALUE;
  struct FakeIpcHandle h;
  memset(&h, 0, sizeof(h));
  memcpy(h.magic, "GWFAKIPC", 8);
  h.pid = (int32_t)getpid();
  h.fd = a->fd;
  h.size = a->size;
  h.buffer_id = a->buffer_id;
  memcpy(handle, &h, sizeof(h));
  return FAKE_SUCCESS;
}

EXPORT int cuIpcOpenMemHandle_v2(unsigned long long* ptr, const void* handle, unsigned flags) {
  (void)flags;
  struct FakeIpcHandle h;
  memcpy(&h, handle, sizeof(h));
  if (memcmp(h.magic, "GWFAKIPC", 8) != 0 || h.size == 0) return FAKE_INVALID_VALUE;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return FAKE_INVALID_VALUE; /* the exporter is gone */
  struct stat st;
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != h.size) {
    close(fd);
    return FAKE_INVALID_VALUE;
  }
  int r = fake_map(fd, (size_t)h.size, 1, h.buffer_id, ptr);
  if (r != FAKE_SUCCESS) {
    close(fd);
    return r;
  }
  g_ipc_open++;
  return FAKE_SUCCESS;
}

EXPORT int cuIpcCloseMemHandle(unsigned long long ptr) {
  struct FakeAlloc* a = fake_alloc_of(ptr);
  if (a == NULL || a->base != ptr || !a->opened) return FAKE_INVALID_VALUE;
  fake_unmap(a);
  g_ipc_open--;
  return FAKE_SUCCESS;
}
