/* A stand-in for the CUDA driver (built with the soname libcuda.so.1) for tests on hosts without a
 * GPU. It exports every symbol gpudirect/cuda_driver.cc binds; cuInit succeeds and reports one
 * device. cuPointerGetAttribute reports as device (or managed) memory the ranges the test marks
 * with gw_fake_cuda_mark(), and host memory (CUDA_ERROR_INVALID_VALUE, as the real driver does for
 * memory it never saw) everywhere else. cuMemAlloc, the copies, cuMemFree, contexts, streams and
 * events work (the allocation block below); modules and kernel launches fail with
 * CUDA_ERROR_NOT_SUPPORTED.
 * A test dlopen()s it by path before gradwire looks for the driver: the dynamic loader then
 * resolves gradwire's dlopen("libcuda.so.1") to this library by its soname. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The allocation block (below): the live cuMemAlloc allocation holding ptr, for the calls above. */
struct FakeAlloc;
static struct FakeAlloc* fake_alloc_find(unsigned long long ptr);
static int fake_alloc_attribute(struct FakeAlloc* a, void* data, int attribute);
static void fake_alloc_range(struct FakeAlloc* a, unsigned long long* base, size_t* size);
static int fake_alloc_fd(struct FakeAlloc* a);

#define FAKE_SUCCESS 0
#define FAKE_INVALID_VALUE 1
#define FAKE_NOT_SUPPORTED 801
#define ATTR_MEMORY_TYPE 2
#define ATTR_IS_MANAGED 8
#define ATTR_BUFFER_ID 7
#define ATTR_DEVICE_ORDINAL 9
#define MEMORYTYPE_DEVICE 2

#define EXPORT __attribute__((visibility("default")))

struct Range {
  uintptr_t begin;
  uintptr_t end;
  int managed;
  int fd; /* the memfd whose offset 0 is `begin` (gw_fake_cuda_mark_dmabuf), else -1 */
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
    g_ranges[g_nranges].fd = -1;
    g_nranges++;
  }
}
/* Marks [p, p + bytes) as device memory that a dma-buf can export: `fd` is a memfd mapped at p
 * (its offset 0 is p; the driver keeps a duplicate). Its export is that memfd, so a NIC that
 * reaches the dma-buf (the verbs emulator maps it) reaches these very bytes. */
EXPORT void gw_fake_cuda_mark_dmabuf(const void* p, size_t bytes, int fd) {
  if (g_nranges < 16) {
    gw_fake_cuda_mark(p, bytes, 0);
    g_ranges[g_nranges - 1].fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  }
}
/* Forgets every range. */
EXPORT void gw_fake_cuda_clear(void) {
  for (int i = 0; i < g_nranges; i++) {
    if (g_ranges[i].fd >= 0) close(g_ranges[i].fd);
  }
  g_nranges = 0;
}
/* How many times cuPointerGetAttribute was called. */
EXPORT long gw_fake_cuda_queries(void) { return __atomic_load_n(&g_queries, __ATOMIC_RELAXED); }

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
  __atomic_fetch_add(&g_queries, 1, __ATOMIC_RELAXED); /* ranks' threads query at once */
  struct FakeAlloc* a = fake_alloc_find(ptr);
  if (a != NULL) return fake_alloc_attribute(a, data, attribute);
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
      if (attribute == ATTR_DEVICE_ORDINAL) {
        *(int*)data = 0;
        return FAKE_SUCCESS;
      }
      if (attribute == ATTR_BUFFER_ID) { /* marked ranges: ids apart from cuMemAlloc's */
        *(unsigned long long*)data = (1ull << 40) + (unsigned long long)i;
        return FAKE_SUCCESS;
      }
      return FAKE_NOT_SUPPORTED;
    }
  }
  return FAKE_INVALID_VALUE;
}

/* The marked range holding ptr, as the allocation it belongs to. */
EXPORT int cuMemGetAddressRange_v2(unsigned long long* base, size_t* size, unsigned long long ptr) {
  struct FakeAlloc* a = fake_alloc_find(ptr);
  if (a != NULL) {
    fake_alloc_range(a, base, size);
    return FAKE_SUCCESS;
  }
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
EXPORT long gw_fake_cuda_exports(void) { return __atomic_load_n(&g_exports, __ATOMIC_RELAXED); }

/* The dma-buf of [ptr, ptr + size) (type 1 = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD): the memory
 * itself, as the real driver's is: a duplicate of the memfd an allocation's shadow lies in, or of
 * the one a range was marked with (gw_fake_cuda_mark_dmabuf), its offset 0 being ptr. A marked
 * range without a memfd has no dma-buf (CUDA_ERROR_NOT_SUPPORTED): a NIC could not reach it. */
EXPORT int cuMemGetHandleForAddressRange(void* handle, unsigned long long ptr, size_t size,
                                         int type, unsigned long long flags) {
  if (handle == NULL || type != 1 || flags != 0 || size == 0) return FAKE_INVALID_VALUE;
  int src = -1;
  struct FakeAlloc* a = fake_alloc_find(ptr);
  if (a != NULL) {
    unsigned long long base = 0;
    fake_alloc_range(a, &base, NULL);
    if (ptr != base) return FAKE_INVALID_VALUE;
    src = fake_alloc_fd(a);
  } else {
    int inside = 0;
    for (int i = 0; i < g_nranges; i++) {
      if (ptr >= g_ranges[i].begin && ptr < g_ranges[i].end) {
        inside = 1;
        if (ptr == g_ranges[i].begin) src = g_ranges[i].fd;
      }
    }
    if (!inside) return FAKE_INVALID_VALUE;
  }
  if (src < 0) return FAKE_NOT_SUPPORTED;
  struct stat st;
  if (fstat(src, &st) != 0 || (unsigned long long)st.st_size < size) return FAKE_INVALID_VALUE;
  int fd = fcntl(src, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return FAKE_NOT_SUPPORTED;
  *(int*)handle = fd;
  __atomic_fetch_add(&g_exports, 1, __ATOMIC_RELAXED);
  return FAKE_SUCCESS;
}

/* ==== Allocation, copies, address ranges and free (issue 27, direct mode) ====================
 * cuMemAlloc hands out "device memory" the CPU cannot touch: the address range is reserved with
 * PROT_NONE, so a collective that read or wrote a device pointer instead of staging it would
 * crash the test. The bytes live in a host shadow that only the copy calls (cuMemcpy*, cuMemsetD8)
 * reach. cuMemFree keeps the address range reserved and the next cuMemAlloc that fits takes the
 * same address again with a new buffer id (CU_POINTER_ATTRIBUTE_BUFFER_ID), as the real driver
 * may: a test can free and reallocate and get a reused address, deterministically. Copies from
 * and to a range marked with gw_fake_cuda_mark act on the marked (host) memory itself. Streams and
 * events are synchronous (every copy has finished when its call returns). Thread-safe. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_INVALID_DEVICE 101
#define ATTR_CONTEXT 1
#define ATTR_RANGE_START 11
#define ATTR_RANGE_SIZE 12
#define MAX_ALLOCS 64

struct FakeAlloc {
  uintptr_t base;              /* the reserved (PROT_NONE) address range */
  size_t size;                 /* the bytes asked for */
  size_t reserved;             /* the bytes reserved (whole pages) */
  unsigned char* shadow;       /* the bytes themselves; NULL once freed */
  unsigned long long id;       /* the buffer id, new for every cuMemAlloc */
  unsigned long long freed_at; /* when it was freed (a count), to reuse the latest first */
  int fd;                      /* the memfd the shadow maps (CUDA IPC names it) */
  int opened;                  /* 1: another process's allocation, opened by cuIpcOpenMemHandle */
};
static unsigned long long g_frees;
static struct FakeAlloc g_allocs[MAX_ALLOCS];
static int g_nallocs;
static unsigned long long g_next_id = 1;
static long g_live, g_copies, g_host_allocs;
static unsigned long long g_copied_bytes;
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_context; /* the one primary context's handle */

static struct FakeAlloc* fake_alloc_find(unsigned long long ptr) {
  struct FakeAlloc* found = NULL;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_nallocs; i++) {
    struct FakeAlloc* a = &g_allocs[i];
    if (a->shadow != NULL && ptr >= a->base && ptr < a->base + a->size) found = a;
  }
  pthread_mutex_unlock(&g_mu);
  return found;
}

static int fake_alloc_attribute(struct FakeAlloc* a, void* data, int attribute) {
  switch (attribute) {
    case ATTR_CONTEXT:
      *(void**)data = &g_context;
      return FAKE_SUCCESS;
    case ATTR_MEMORY_TYPE:
      *(unsigned*)data = MEMORYTYPE_DEVICE;
      return FAKE_SUCCESS;
    case ATTR_IS_MANAGED:
      *(unsigned*)data = 0;
      return FAKE_SUCCESS;
    case ATTR_DEVICE_ORDINAL:
      *(int*)data = 0;
      return FAKE_SUCCESS;
    case ATTR_BUFFER_ID:
      *(unsigned long long*)data = a->id;
      return FAKE_SUCCESS;
    case ATTR_RANGE_START:
      *(unsigned long long*)data = a->base;
      return FAKE_SUCCESS;
    case ATTR_RANGE_SIZE:
      *(size_t*)data = a->size;
      return FAKE_SUCCESS;
    default:
      return FAKE_NOT_SUPPORTED;
  }
}

static int fake_alloc_fd(struct FakeAlloc* a) { return a->fd; }

static void fake_alloc_range(struct FakeAlloc* a, unsigned long long* base, size_t* size) {
  if (base) *base = a->base;
  if (size) *size = a->size;
}

/* Where the CPU may touch [ptr, ptr + bytes) of device memory: the shadow of an allocation, the
 * marked memory itself, or NULL when the range is not (wholly) device memory. */
static unsigned char* device_view(unsigned long long ptr, size_t bytes) {
  struct FakeAlloc* a = fake_alloc_find(ptr);
  if (a != NULL) {
    if (bytes > a->size - (ptr - a->base)) return NULL;
    return a->shadow + (ptr - a->base);
  }
  for (int i = 0; i < g_nranges; i++) {
    if (ptr >= g_ranges[i].begin && ptr < g_ranges[i].end) {
      return bytes <= g_ranges[i].end - ptr ? (unsigned char*)(uintptr_t)ptr : NULL;
    }
  }
  return NULL;
}

EXPORT int cuMemAlloc_v2(unsigned long long* ptr, size_t bytes) {
  if (ptr == NULL || bytes == 0) return FAKE_INVALID_VALUE;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t reserved = (bytes + page - 1) / page * page;
  /* The shadow lies in a memfd, so that another process may open it (CUDA IPC, below). */
  const int fd = memfd_create("gw-fake-device", MFD_CLOEXEC);
  if (fd < 0) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
  unsigned char* shadow = MAP_FAILED;
  if (ftruncate(fd, (off_t)reserved) == 0) {
    shadow = mmap(NULL, reserved, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  if (shadow == MAP_FAILED) {
    close(fd);
    return 2;
  }
  pthread_mutex_lock(&g_mu);
  struct FakeAlloc* slot = NULL;
  /* A freed range that fits comes back: the smallest, and of those the one freed last. */
  for (int i = 0; i < g_nallocs; i++) {
    struct FakeAlloc* a = &g_allocs[i];
    if (a->shadow != NULL || a->reserved < bytes) continue;
    if (slot == NULL || a->reserved < slot->reserved ||
        (a->reserved == slot->reserved && a->freed_at > slot->freed_at)) {
      slot = a;
    }
  }
  if (slot == NULL && g_nallocs < MAX_ALLOCS) {
    void* range =
        mmap(NULL, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (range != MAP_FAILED) {
      slot = &g_allocs[g_nallocs++];
      slot->base = (uintptr_t)range;
      slot->reserved = reserved;
    }
  }
  if (slot == NULL) {
    pthread_mutex_unlock(&g_mu);
    munmap(shadow, reserved);
    close(fd);
    return 2;
  }
  slot->size = bytes;
  slot->shadow = shadow;
  slot->fd = fd;
  slot->opened = 0;
  slot->id = g_next_id++;
  g_live++;
  *ptr = slot->base;
  pthread_mutex_unlock(&g_mu);
  return FAKE_SUCCESS;
}

EXPORT int cuMemFree_v2(unsigned long long ptr) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_nallocs; i++) {
    if (g_allocs[i].shadow != NULL && g_allocs[i].base == ptr && !g_allocs[i].opened) {
      munmap(g_allocs[i].shadow, g_allocs[i].reserved);
      close(g_allocs[i].fd);
      g_allocs[i].shadow = NULL;
      g_allocs[i].freed_at = ++g_frees;
      g_live--;
      pthread_mutex_unlock(&g_mu);
      return FAKE_SUCCESS;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return FAKE_INVALID_VALUE;
}

static int copy(void* dst, const void* src, size_t bytes) {
  if (dst == NULL || src == NULL) return FAKE_INVALID_VALUE;
  memmove(dst, src, bytes);
  pthread_mutex_lock(&g_mu);
  g_copies++;
  g_copied_bytes += bytes;
  pthread_mutex_unlock(&g_mu);
  return FAKE_SUCCESS;
}
EXPORT int cuMemcpyHtoD_v2(unsigned long long dst, const void* src, size_t bytes) {
  return copy(device_view(dst, bytes), src, bytes);
}
EXPORT int cuMemcpyDtoH_v2(void* dst, unsigned long long src, size_t bytes) {
  return copy(dst, device_view(src, bytes), bytes);
}
EXPORT int cuMemcpyHtoDAsync_v2(unsigned long long dst, const void* src, size_t bytes, void* s) {
  (void)s;
  return cuMemcpyHtoD_v2(dst, src, bytes);
}
EXPORT int cuMemcpyDtoHAsync_v2(void* dst, unsigned long long src, size_t bytes, void* s) {
  (void)s;
  return cuMemcpyDtoH_v2(dst, src, bytes);
}
EXPORT int cuMemsetD8_v2(unsigned long long dst, unsigned char value, size_t bytes) {
  unsigned char* p = device_view(dst, bytes);
  if (p == NULL) return FAKE_INVALID_VALUE;
  memset(p, value, bytes);
  return FAKE_SUCCESS;
}
EXPORT int cuMemHostAlloc(void** p, size_t bytes, unsigned flags) {
  (void)flags;
  if (p == NULL) return FAKE_INVALID_VALUE;
  *p = malloc(bytes == 0 ? 1 : bytes);
  if (*p == NULL) return 2;
  pthread_mutex_lock(&g_mu);
  g_host_allocs++;
  pthread_mutex_unlock(&g_mu);
  return FAKE_SUCCESS;
}
EXPORT int cuMemFreeHost(void* p) {
  free(p);
  pthread_mutex_lock(&g_mu);
  g_host_allocs--;
  pthread_mutex_unlock(&g_mu);
  return FAKE_SUCCESS;
}

/* Allocations not freed yet; copies (and their bytes) so far; page-locked buffers not freed. */
EXPORT long gw_fake_cuda_live_allocs(void) { return g_live; }
EXPORT long gw_fake_cuda_copies(void) { return g_copies; }
EXPORT unsigned long long gw_fake_cuda_copied_bytes(void) { return g_copied_bytes; }
EXPORT long gw_fake_cuda_host_allocs(void) { return g_host_allocs; }

/* One device (ordinal 0) with one primary context; a per-thread stack of current contexts. */
static __thread void* t_ctx[8];
static __thread int t_depth;
EXPORT int cuDeviceGet(int* dev, int ordinal) {
  if (ordinal != 0) return FAKE_INVALID_DEVICE;
  *dev = 0;
  return FAKE_SUCCESS;
}
EXPORT int cuDeviceGetAttribute(int* v, int attribute, int dev) {
  if (dev != 0) return FAKE_INVALID_DEVICE;
  *v = attribute == 16 ? 1 : attribute == 75 ? 9 : 0; /* 1 SM, compute capability 9.0 */
  return FAKE_SUCCESS;
}
EXPORT int cuDeviceGetName(char* name, int len, int dev) {
  if (dev != 0 || len <= 0) return FAKE_INVALID_VALUE;
  strncpy(name, "gradwire stand-in GPU", (size_t)len - 1);
  name[len - 1] = '\0';
  return FAKE_SUCCESS;
}
EXPORT int cuDevicePrimaryCtxRetain(void** ctx, int dev) {
  if (dev != 0) return FAKE_INVALID_DEVICE;
  *ctx = &g_context;
  return FAKE_SUCCESS;
}
EXPORT int cuDevicePrimaryCtxRelease_v2(int dev) {
  return dev == 0 ? FAKE_SUCCESS : FAKE_INVALID_DEVICE;
}
EXPORT int cuCtxSetCurrent(void* ctx) {
  if (t_depth == 0) t_depth = 1;
  t_ctx[t_depth - 1] = ctx;
  return FAKE_SUCCESS;
}
EXPORT int cuCtxGetCurrent(void** ctx) {
  *ctx = t_depth > 0 ? t_ctx[t_depth - 1] : NULL;
  return FAKE_SUCCESS;
}
EXPORT int cuCtxPushCurrent_v2(void* ctx) {
  if (t_depth == 8) return FAKE_NOT_SUPPORTED;
  t_ctx[t_depth++] = ctx;
  return FAKE_SUCCESS;
}
EXPORT int cuCtxPopCurrent_v2(void** ctx) {
  if (t_depth == 0) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
  void* top = t_ctx[--t_depth];
  if (ctx) *ctx = top;
  return FAKE_SUCCESS;
}
EXPORT int cuStreamCreate(void** s, unsigned flags) {
  (void)flags;
  *s = malloc(1);
  return *s ? FAKE_SUCCESS : 2;
}
EXPORT int cuStreamDestroy_v2(void* s) {
  free(s);
  return FAKE_SUCCESS;
}
EXPORT int cuStreamQuery(void* s) {
  (void)s;
  return FAKE_SUCCESS;
}
EXPORT int cuStreamSynchronize(void* s) {
  (void)s;
  return FAKE_SUCCESS;
}
EXPORT int cuEventCreate(void** e, unsigned flags) {
  (void)flags;
  *e = malloc(1);
  return *e ? FAKE_SUCCESS : 2;
}
EXPORT int cuEventDestroy_v2(void* e) {
  free(e);
  return FAKE_SUCCESS;
}
EXPORT int cuEventRecord(void* e, void* s) {
  (void)e;
  (void)s;
  return FAKE_SUCCESS;
}
EXPORT int cuEventQuery(void* e) {
  (void)e;
  return FAKE_SUCCESS;
}
EXPORT int cuEventElapsedTime_v2(float* ms, void* a, void* b) {
  (void)a;
  (void)b;
  *ms = 0.0f;
  return FAKE_SUCCESS;
}
/* ==== end of the allocation block ============================================================ */

/* The rest: present (the loader binds them all) and unsupported. */
#define UNSUPPORTED(name) \
  EXPORT int name(void) { return FAKE_NOT_SUPPORTED; }
UNSUPPORTED(cuModuleLoadData)
UNSUPPORTED(cuModuleUnload)
UNSUPPORTED(cuModuleGetFunction)
UNSUPPORTED(cuLaunchKernel)

/* ==== CUDA IPC across processes (issue 27, daemon mode) =======================================
 * cuIpcGetMemHandle names an allocation by its process and the memfd its shadow lies in
 * ("GWFAKIPC", pid, fd, size, buffer id); cuIpcOpenMemHandle_v2 in another process (gradwired)
 * opens /proc/<pid>/fd/<fd> (same user), reserves a PROT_NONE range of its own for the device
 * address and maps the memfd as that range's shadow, so the copies above reach the exporter's
 * bytes; cuIpcCloseMemHandle unmaps it (the range stays reserved, as after cuMemFree). */
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>

static long g_ipc_open;
/* IPC openings held in this process now (gradwired's imports). */
EXPORT long gw_fake_cuda_ipc_open(void) { return g_ipc_open; }

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
  struct FakeAlloc* a = fake_alloc_find(ptr);
  if (handle == NULL || a == NULL || a->base != ptr || a->opened) return FAKE_INVALID_VALUE;
  struct FakeIpcHandle h;
  memset(&h, 0, sizeof(h));
  memcpy(h.magic, "GWFAKIPC", 8);
  h.pid = (int32_t)getpid();
  h.fd = a->fd;
  h.size = a->size;
  h.buffer_id = a->id;
  memcpy(handle, &h, sizeof(h));
  return FAKE_SUCCESS;
}

EXPORT int cuIpcOpenMemHandle_v2(unsigned long long* ptr, const void* handle, unsigned flags) {
  (void)flags;
  struct FakeIpcHandle h;
  memcpy(&h, handle, sizeof(h));
  if (ptr == NULL || memcmp(h.magic, "GWFAKIPC", 8) != 0 || h.size == 0) return FAKE_INVALID_VALUE;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h.pid, (int)h.fd);
  const int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return FAKE_INVALID_VALUE; /* the exporter is gone */
  struct stat st;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t reserved = (h.size + page - 1) / page * page;
  unsigned char* shadow = MAP_FAILED;
  if (fstat(fd, &st) == 0 && (size_t)st.st_size == reserved) {
    shadow = mmap(NULL, reserved, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  void* range = mmap(NULL, reserved, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  pthread_mutex_lock(&g_mu);
  struct FakeAlloc* slot = NULL;
  if (shadow != MAP_FAILED && range != MAP_FAILED && g_nallocs < MAX_ALLOCS) {
    slot = &g_allocs[g_nallocs++];
  }
  if (slot == NULL) {
    pthread_mutex_unlock(&g_mu);
    if (shadow != MAP_FAILED) munmap(shadow, reserved);
    if (range != MAP_FAILED) munmap(range, reserved);
    close(fd);
    return FAKE_INVALID_VALUE;
  }
  slot->base = (uintptr_t)range;
  slot->reserved = reserved;
  slot->size = (size_t)h.size;
  slot->shadow = shadow;
  slot->id = h.buffer_id;
  slot->fd = fd;
  slot->opened = 1;
  g_ipc_open++;
  *ptr = slot->base;
  pthread_mutex_unlock(&g_mu);
  return FAKE_SUCCESS;
}

EXPORT int cuIpcCloseMemHandle(unsigned long long ptr) {
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_nallocs; i++) {
    struct FakeAlloc* a = &g_allocs[i];
    if (a->shadow != NULL && a->base == ptr && a->opened) {
      munmap(a->shadow, a->reserved);
      close(a->fd);
      a->shadow = NULL;
      a->opened = 0;
      a->freed_at = ++g_frees;
      g_ipc_open--;
      pthread_mutex_unlock(&g_mu);
      return FAKE_SUCCESS;
    }
  }
  pthread_mutex_unlock(&g_mu);
  return FAKE_INVALID_VALUE;
}
