#include "gpudirect/device_buffer.h"

#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <utility>

namespace gw::cuda {

namespace {

// Keeps `dev`'s primary context alive for the rest of the process, as the CUDA runtime does.
// Without this, the last ScopedContext's release destroys the primary context, and with it
// every allocation made in it: a DeviceBuffer would outlive its own memory (seen on the H100:
// every cuMemsetD8 after DeviceBuffer::allocate failed with CUDA_ERROR_INVALID_VALUE).
Status pin_primary_context(const Driver& d, CUdevice dev) {
  static std::mutex mu;
  static std::set<CUdevice> pinned;
  std::lock_guard<std::mutex> lock(mu);
  if (pinned.count(dev)) return ok_status();
  CUcontext ctx;
  const CUresult r = d.cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != kCudaSuccess) return cuda_error(d, r, "cuDevicePrimaryCtxRetain (pin)");
  pinned.insert(dev);
  return ok_status();
}

// The two copies, on `device`'s legacy default stream (so after the work queued there).
Status htod(int device, CUdeviceptr dst, const void* src, size_t bytes) {
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device));
  const Driver& d = **driver();
  const CUresult r = d.cuMemcpyHtoD(dst, src, bytes);
  return r == kCudaSuccess ? ok_status() : cuda_error(d, r, "cuMemcpyHtoD");
}

Status dtoh(int device, void* dst, CUdeviceptr src, size_t bytes) {
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device));
  const Driver& d = **driver();
  const CUresult r = d.cuMemcpyDtoH(dst, src, bytes);
  return r == kCudaSuccess ? ok_status() : cuda_error(d, r, "cuMemcpyDtoH");
}

}  // namespace

Result<std::unique_ptr<ScopedContext>> ScopedContext::enter(int device) {
  GW_ASSIGN_OR_RETURN(const Driver* d, driver());
  CUdevice dev;
  CUresult r = d->cuDeviceGet(&dev, device);
  if (r != kCudaSuccess) return cuda_error(*d, r, fmt::format("cuDeviceGet({})", device));
  CUcontext ctx;
  r = d->cuDevicePrimaryCtxRetain(&ctx, dev);
  if (r != kCudaSuccess) return cuda_error(*d, r, "cuDevicePrimaryCtxRetain");
  if (Status pin = pin_primary_context(*d, dev); !pin.ok()) {
    d->cuDevicePrimaryCtxRelease(dev);
    return pin;
  }
  r = d->cuCtxPushCurrent(ctx);
  if (r != kCudaSuccess) {
    d->cuDevicePrimaryCtxRelease(dev);
    return cuda_error(*d, r, "cuCtxPushCurrent");
  }
  return std::unique_ptr<ScopedContext>(new ScopedContext(d, dev, ctx));
}

ScopedContext::~ScopedContext() {
  CUcontext popped;
  d_->cuCtxPopCurrent(&popped);
  d_->cuDevicePrimaryCtxRelease(dev_);
}

Result<DeviceBuffer> DeviceBuffer::allocate(int device, size_t bytes) {
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device));
  const Driver& d = **driver();
  DeviceBuffer b;
  const CUresult r = d.cuMemAlloc(&b.ptr_, bytes == 0 ? 1 : bytes);
  if (r != kCudaSuccess) {
    return cuda_error(d, r, fmt::format("cuMemAlloc({} bytes) on device {}", bytes, device));
  }
  b.size_ = bytes;
  b.ctx_ = scope->context();
  b.device_ = device;
  return b;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = std::exchange(o.ptr_, 0);
    size_ = std::exchange(o.size_, 0);
    ctx_ = std::exchange(o.ctx_, nullptr);
    device_ = std::exchange(o.device_, -1);
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (ptr_ == 0) return;
  if (auto scope = ScopedContext::enter(device_); scope.ok()) (*driver())->cuMemFree(ptr_);
  ptr_ = 0;
  size_ = 0;
}

Status DeviceBuffer::check_range(std::string_view op, size_t bytes, size_t offset) const {
  if (ptr_ == 0) return invalid_arg("DeviceBuffer::{}: no buffer", op);
  if (offset > size_ || bytes > size_ - offset) {
    return invalid_arg("DeviceBuffer::{}: {} bytes at offset {} exceed the buffer ({} bytes)", op,
                       bytes, offset, size_);
  }
  return ok_status();
}

Status DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  GW_RETURN_IF_ERROR(check_range("upload", bytes, offset));
  return htod(device_, ptr_ + offset, src, bytes);
}

Status DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  GW_RETURN_IF_ERROR(check_range("download", bytes, offset));
  return dtoh(device_, dst, ptr_ + offset, bytes);
}

Status DeviceBuffer::fill(unsigned char value) {
  GW_RETURN_IF_ERROR(check_range("fill", size_, 0));
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device_));
  const Driver& d = **driver();
  const CUresult r = d.cuMemsetD8(ptr_, value, size_);
  return r == kCudaSuccess ? ok_status() : cuda_error(d, r, "cuMemsetD8");
}

Result<PinnedBuffer> PinnedBuffer::allocate(int device, size_t bytes) {
  PinnedBuffer b;
  const size_t n = bytes == 0 ? 1 : bytes;
  auto scope = ScopedContext::enter(device);
  if (scope.ok()) {
    const Driver& d = **driver();
    const CUresult r = d.cuMemHostAlloc(&b.p_, n, kMemHostAllocPortable);
    if (r == kCudaSuccess) {
      b.size_ = bytes;
      b.pinned_ = true;
      b.device_ = device;
      return b;
    }
    b.p_ = nullptr;
    b.why_ = cuda_error(d, r, fmt::format("cuMemHostAlloc({} bytes)", bytes)).message();
  } else {
    b.why_ = scope.status().message();
  }
  b.p_ = std::malloc(n);
  if (b.p_ == nullptr) return no_memory("PinnedBuffer: {} bytes of host memory", bytes);
  b.size_ = bytes;
  return b;
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    reset();
    p_ = std::exchange(o.p_, nullptr);
    size_ = std::exchange(o.size_, 0);
    pinned_ = std::exchange(o.pinned_, false);
    device_ = std::exchange(o.device_, -1);
    why_ = std::move(o.why_);
  }
  return *this;
}

void PinnedBuffer::reset() {
  if (p_ != nullptr) {
    if (!pinned_) {
      std::free(p_);
    } else if (auto scope = ScopedContext::enter(device_); scope.ok()) {
      (*driver())->cuMemFreeHost(p_);
    }
  }
  p_ = nullptr;
  size_ = 0;
  pinned_ = false;
  device_ = -1;
}

Result<int> device_of(const void* p) {
  GW_ASSIGN_OR_RETURN(const Driver* d, driver());
  if (p == nullptr) return invalid_arg("device_of: null pointer");
  int ordinal = -1;
  const CUresult r = d->cuPointerGetAttribute(&ordinal, kPointerAttrDeviceOrdinal,
                                              reinterpret_cast<CUdeviceptr>(p));
  if (r != kCudaSuccess || ordinal < 0) {
    return invalid_arg("{} is not GPU memory ({})", p, error_text(*d, r));
  }
  return ordinal;
}

Status copy_to_host(void* dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return ok_status();
  GW_ASSIGN_OR_RETURN(int dev, device_of(device_src));
  return dtoh(dev, dst, reinterpret_cast<CUdeviceptr>(device_src), bytes);
}

Status copy_to_device(void* device_dst, const void* src, size_t bytes) {
  if (bytes == 0) return ok_status();
  GW_ASSIGN_OR_RETURN(int dev, device_of(device_dst));
  return htod(dev, reinterpret_cast<CUdeviceptr>(device_dst), src, bytes);
}

Status copy_to_host_on(int device, void* dst, const void* device_src, size_t bytes) {
  if (bytes == 0) return ok_status();
  return dtoh(device, dst, reinterpret_cast<CUdeviceptr>(device_src), bytes);
}

Status copy_to_device_on(int device, void* device_dst, const void* src, size_t bytes) {
  if (bytes == 0) return ok_status();
  return htod(device, reinterpret_cast<CUdeviceptr>(device_dst), src, bytes);
}

}  // namespace gw::cuda
