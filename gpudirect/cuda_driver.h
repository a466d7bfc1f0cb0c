// The CUDA driver API, loaded at run time with dlopen("libcuda.so.1").
//
// gradwire never links libcuda or libcudart: every binary must start on a host without a GPU or
// without the NVIDIA driver. The few driver types and enums used here are declared below (same
// ABI as cuda.h, in namespace gw::cuda so that a translation unit may include cuda.h as well).
// Symbols are looked up by their versioned names (cuMemAlloc_v2, ...), which is what cuda.h's
// macros map the plain names to.
//
// driver() loads the library and calls cuInit(0) once (thread-safe, lazy); the result, success or
// failure, is cached for the life of the process. Without the library, without a device or when
// cuInit fails it is kUnsupported with a message that says which, never a crash.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace gw::cuda {

// Driver ABI types (cuda.h: CUresult, CUdevice, CUdeviceptr, opaque handles).
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUstream_st;
struct CUevent_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUstream = CUstream_st*;
using CUevent = CUevent_st*;

inline constexpr CUresult kCudaSuccess = 0;
inline constexpr CUresult kCudaErrorNoDevice = 100;
inline constexpr CUresult kCudaErrorInvalidValue = 1;
inline constexpr CUresult kCudaErrorNotReady = 600;
inline constexpr int kAttrMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
inline constexpr int kAttrCcMajor = 75;              // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
inline constexpr int kAttrCcMinor = 76;              // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
inline constexpr int kPointerAttrMemoryType = 2;     // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
inline constexpr int kPointerAttrIsManaged = 8;      // CU_POINTER_ATTRIBUTE_IS_MANAGED
inline constexpr int kPointerAttrDeviceOrdinal = 9;  // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
inline constexpr unsigned kMemoryTypeDevice = 2;     // CU_MEMORYTYPE_DEVICE
inline constexpr unsigned kMemoryTypeUnified = 4;    // CU_MEMORYTYPE_UNIFIED
inline constexpr unsigned kStreamNonBlocking = 1;    // CU_STREAM_NON_BLOCKING
inline constexpr unsigned kEventDefault = 0;
inline constexpr unsigned kEventDisableTiming = 2;    // CU_EVENT_DISABLE_TIMING
inline constexpr unsigned kMemHostAllocPortable = 1;  // CU_MEMHOSTALLOC_PORTABLE
inline constexpr int kMemRangeHandleDmaBufFd = 1;     // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

// CUDA IPC (gradwired's imports of trainers' allocations).
inline constexpr int kPointerAttrBufferId = 7;           // CU_POINTER_ATTRIBUTE_BUFFER_ID (u64)
inline constexpr size_t kIpcHandleBytes = 64;            // sizeof(CUipcMemHandle)
inline constexpr unsigned kIpcLazyEnablePeerAccess = 1;  // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS

// The function table. Every entry is non-null in a table that driver() returned, except the
// optional ones marked below (null where the driver is too old for them).
struct Driver {
  CUresult (*cuInit)(unsigned flags);
  CUresult (*cuDriverGetVersion)(int* version);
  CUresult (*cuGetErrorString)(CUresult err, const char** str);
  CUresult (*cuGetErrorName)(CUresult err, const char** str);
  CUresult (*cuDeviceGetCount)(int* count);
  CUresult (*cuDeviceGet)(CUdevice* dev, int ordinal);
  CUresult (*cuDeviceGetAttribute)(int* value, int attrib, CUdevice dev);
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev);
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice dev);  // _v2
  CUresult (*cuCtxSetCurrent)(CUcontext ctx);
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx);
  CUresult (*cuCtxPushCurrent)(CUcontext ctx);  // _v2
  CUresult (*cuCtxPopCurrent)(CUcontext* ctx);  // _v2
  CUresult (*cuModuleLoadData)(CUmodule* mod, const void* image);
  CUresult (*cuModuleUnload)(CUmodule mod);
  CUresult (*cuModuleGetFunction)(CUfunction* fn, CUmodule mod, const char* name);
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared_bytes, CUstream stream,
                             void** params, void** extra);
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, size_t bytes);                    // _v2
  CUresult (*cuMemFree)(CUdeviceptr ptr);                                    // _v2
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, size_t bytes);  // _v2
  CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, size_t bytes);        // _v2
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void* src, size_t bytes,
                                CUstream stream);  // _v2
  CUresult (*cuMemcpyDtoHAsync)(void* dst, CUdeviceptr src, size_t bytes,
                                CUstream stream);                              // _v2
  CUresult (*cuMemsetD8)(CUdeviceptr dst, unsigned char value, size_t bytes);  // _v2
  // Page-locked host memory (cuda.h maps neither name to a _v2).
  CUresult (*cuMemHostAlloc)(void** p, size_t bytes, unsigned flags);
  CUresult (*cuMemFreeHost)(void* p);
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags);
  CUresult (*cuStreamDestroy)(CUstream stream);  // _v2
  CUresult (*cuStreamQuery)(CUstream stream);
  CUresult (*cuStreamSynchronize)(CUstream stream);
  CUresult (*cuEventCreate)(CUevent* event, unsigned flags);
  CUresult (*cuEventDestroy)(CUevent event);  // _v2
  CUresult (*cuEventRecord)(CUevent event, CUstream stream);
  CUresult (*cuEventQuery)(CUevent event);
  CUresult (*cuEventElapsedTime)(float* ms, CUevent start, CUevent end);  // _v2 where present
  CUresult (*cuPointerGetAttribute)(void* data, int attribute, CUdeviceptr ptr);
  // Optional: the allocation holding `ptr` (_v2), and its export as a dma-buf file descriptor
  // (CUDA 11.7+; `handle` is an int*), for GPUDirect RDMA registration (verbs/).
  CUresult (*cuMemGetAddressRange)(CUdeviceptr* base, size_t* size, CUdeviceptr ptr) = nullptr;
  CUresult (*cuMemGetHandleForAddressRange)(void* handle, CUdeviceptr ptr, size_t size, int type,
                                            unsigned long long flags) = nullptr;
  // Optional: CUDA IPC of cuMemAlloc memory between processes (gradwired imports a trainer's
  // buffers with them; `handle` is a 64-byte CUipcMemHandle), bound by their versioned names.
  CUresult (*cuIpcGetMemHandle)(void* handle, CUdeviceptr ptr) = nullptr;
  CUresult (*cuIpcOpenMemHandle)(CUdeviceptr* ptr, const void* handle, unsigned flags) = nullptr;
  CUresult (*cuIpcCloseMemHandle)(CUdeviceptr ptr) = nullptr;

  // The library the table came from and the driver's version (e.g. 13000).
  std::string library;
  int version = 0;
};

// The process-wide table: loads "libcuda.so.1" and runs cuInit(0) on first use. Thread-safe.
// kUnsupported: "no CUDA driver: libcuda.so.1 not found (...)", "... lacks cuInit",
// "cuInit failed: CUDA_ERROR_NO_DEVICE (...)" and so on. The table lives until exit.
Result<const Driver*> driver();

// Loads `library` into a new table (not cached, never unloaded; for tests and tools that need
// another library name). Same errors as driver().
Result<const Driver*> load_driver(const char* library);

// "CUDA_ERROR_OUT_OF_MEMORY (out of memory)" for a driver result code.
std::string error_text(const Driver& d, CUresult r);
// A Status for a failed driver call: kNoMemory for CUDA_ERROR_OUT_OF_MEMORY, kInvalidArg for
// CUDA_ERROR_INVALID_VALUE, kSystem otherwise; the message names the call.
Status cuda_error(const Driver& d, CUresult r, std::string_view what);

// True when a driver is loaded and `p` is device (or managed) memory known to it; false for host
// memory, null, or when there is no driver. Never fails, never loads anything but the driver.
bool is_device_pointer(const void* p);

// The table when libcuda.so.1 is already mapped into this process (by the application, a
// framework, or driver()), else nullptr. It never maps the library itself. It looks for the
// library (dlopen(RTLD_NOLOAD), which searches the library path when the name is not loaded:
// about 20 us) only when some object was loaded since its last look (glibc's load counter), so a
// process that never touched CUDA pays one dl_iterate_phdr step per call; once the library is
// seen the table is cached and later calls are one atomic load. Thread-safe.
const Driver* resident_driver();

// How many times resident_driver() has looked for the library (tests hold the per-call cost).
int64_t resident_driver_searches();

// What the resident driver (above) says `p` is: kHost for host memory, null, or when no driver is
// mapped; kDevice for memory only a GPU can read (cuMemAlloc, cudaMalloc); kManaged for managed
// memory (cudaMallocManaged), which the host can read too. One cuPointerGetAttribute for host
// memory, two for device memory; never fails.
enum class MemoryKind { kHost, kDevice, kManaged };
MemoryKind resident_memory_kind(const void* p);

// Waits until the work queued on `stream` has finished, polling cuStreamQuery (spin, then short
// sleeps): kTimeout after `timeout_ms`, a driver error if the stream failed. A null `stream` is
// the legacy default stream of the context current on this thread, so one must be current
// (ScopedContext in device_buffer.h).
Status stream_wait(const Driver& d, CUstream stream, int64_t timeout_ms);
// The same for an event: waits until the work before its last cuEventRecord has finished (at
// once for an event never recorded), polling cuEventQuery; kTimeout after `timeout_ms`.
Status event_wait(const Driver& d, CUevent event, int64_t timeout_ms);

}  // namespace gw::cuda
