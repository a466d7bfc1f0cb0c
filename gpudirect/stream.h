// Stream: a CUDA stream with a few events, for asynchronous copies and kernels (gpu_codecs.h),
// in a device's primary context (entered with device_buffer.h's ScopedContext).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.h"
#include "gpudirect/cuda_driver.h"

namespace gw::cuda {

// A stream of `device`'s primary context and a few events, destroyed with the object. The stream
// is a blocking one (not CU_STREAM_NON_BLOCKING): its work runs after work queued before on the
// legacy default stream, and the default stream's later work after it, as with the synchronous
// copies below. Every call makes the context current for itself and returns without waiting,
// except the waits. Not thread-safe per object.
class Stream {
 public:
  Stream() = default;
  static Result<Stream> create(int device);

  Stream(Stream&& o) noexcept { *this = std::move(o); }
  Stream& operator=(Stream&& o) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { reset(); }

  CUstream get() const { return stream_; }
  int device() const { return device_; }

  // Queue a copy (cuMemcpyDtoHAsync / HtoDAsync). The host memory must stay valid, and must not
  // be written (to device) or read (to host) until the copy has run: a later wait says when.
  Status copy_to_host(void* dst, const void* device_src, size_t bytes);
  Status copy_to_device(void* device_dst, const void* src, size_t bytes);
  // Records event `i` (created on first use, without timing) after the work queued so far.
  Status record(size_t i);
  // Waits until the work before the last record(i) has finished: kTimeout after timeout_ms, a
  // driver error when it failed. kInvalidArg for an event never recorded.
  Status wait_event(size_t i, int64_t timeout_ms) const;
  // Waits until all queued work has finished (stream_wait).
  Status wait(int64_t timeout_ms) const;

  void reset();

 private:
  CUstream stream_ = nullptr;
  int device_ = -1;
  std::vector<CUevent> events_;
};

}  // namespace gw::cuda
