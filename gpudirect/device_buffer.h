// DeviceBuffer: device memory from cuMemAlloc in a device's primary context, freed on
// destruction. For tests, gw-gpu-check and staging; not a caching allocator.
// PinnedBuffer: host memory for copies to and from the GPU, page-locked when the driver allows.
//
// upload / download are synchronous copies (cuMemcpyHtoD/DtoH): they return when the bytes have
// arrived. Not thread-safe per object; distinct objects may be used from any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "gpudirect/cuda_driver.h"

namespace gw::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  // kUnsupported without a driver, kNoMemory when the device is full.
  static Result<DeviceBuffer> allocate(int device, size_t bytes);

  DeviceBuffer(DeviceBuffer&& o) noexcept { *this = std::move(o); }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { reset(); }

  void* get() const { return reinterpret_cast<void*>(ptr_); }
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(ptr_ + byte_offset);
  }
  size_t size() const { return size_; }

  // Copies `bytes` to / from offset `offset` of the buffer; kInvalidArg past its end.
  Status upload(const void* src, size_t bytes, size_t offset = 0);
  Status download(void* dst, size_t bytes, size_t offset = 0) const;
  // Sets every byte to `value`.
  Status fill(unsigned char value);

  void reset();

 private:
  Status check_range(std::string_view op, size_t bytes, size_t offset) const;

  CUdeviceptr ptr_ = 0;
  size_t size_ = 0;
  CUcontext ctx_ = nullptr;
  int device_ = -1;
};

// Host memory that copies to and from GPU memory can use without the driver staging it: page-
// locked (cuMemHostAlloc, portable to every context, so any device may use it) when the driver
// allows, else ordinary pageable memory, which every copy accepts too, only slower and without
// overlapping the host (cuMemcpyDtoHAsync into pageable memory returns when the copy is done).
// pinned() says which and why_pageable() why not. Freed on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  // Never fails for the pinning: without a driver, or when cuMemHostAlloc fails (the locked-memory
  // limit, say), the buffer is pageable. kNoMemory only when no memory at all can be had.
  // `device`'s primary context is current for the cuMemHostAlloc.
  static Result<PinnedBuffer> allocate(int device, size_t bytes);

  PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { reset(); }

  void* get() const { return p_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return size_; }
  bool pinned() const { return pinned_; }
  const std::string& why_pageable() const { return why_; }

  void reset();

 private:
  void* p_ = nullptr;
  size_t size_ = 0;
  bool pinned_ = false;
  int device_ = -1;
  std::string why_;
};

// The device ordinal of device (or managed) memory `p`; kInvalidArg for host memory or null,
// kUnsupported without a driver.
Result<int> device_of(const void* p);
// Copies between host memory and device memory that need not be a DeviceBuffer (a caller's
// cudaMalloc'd tensor, say), through the legacy default stream, so after work queued there.
Status copy_to_host(void* dst, const void* device_src, size_t bytes);
Status copy_to_device(void* device_dst, const void* src, size_t bytes);
// The same on a device the caller already knows (AllocationCache), without asking the driver.
Status copy_to_host_on(int device, void* dst, const void* device_src, size_t bytes);
Status copy_to_device_on(int device, void* device_dst, const void* src, size_t bytes);

// Makes the primary context of `device` current on this thread for the life of the object
// (push on construction, pop on destruction) and keeps it retained meanwhile. The first entry
// per device also pins the primary context for the life of the process, so memory allocated
// in it survives between scopes.
class ScopedContext {
 public:
  static Result<std::unique_ptr<ScopedContext>> enter(int device);
  ~ScopedContext();
  CUcontext context() const { return ctx_; }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  ScopedContext(const Driver* d, CUdevice dev, CUcontext ctx) : d_(d), dev_(dev), ctx_(ctx) {}
  const Driver* d_;
  CUdevice dev_;
  CUcontext ctx_;
};

}  // namespace gw::cuda
