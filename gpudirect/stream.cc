#include "gpudirect/stream.h"

#include <utility>

#include "gpudirect/device_buffer.h"

namespace gw::cuda {

Result<Stream> Stream::create(int device) {
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device));
  const Driver& d = **driver();
  Stream s;
  const CUresult r = d.cuStreamCreate(&s.stream_, 0);  // blocking: ordered with the default stream
  if (r != kCudaSuccess)
    return cuda_error(d, r, fmt::format("cuStreamCreate on device {}", device));
  s.device_ = device;
  return s;
}

Stream& Stream::operator=(Stream&& o) noexcept {
  if (this != &o) {
    reset();
    stream_ = std::exchange(o.stream_, nullptr);
    device_ = std::exchange(o.device_, -1);
    events_ = std::move(o.events_);
    o.events_.clear();
  }
  return *this;
}

void Stream::reset() {
  if (stream_ != nullptr) {
    // Destroying a stream with work queued is allowed: the driver frees it once the work is done.
    if (auto scope = ScopedContext::enter(device_); scope.ok()) {
      const Driver& d = **driver();
      for (CUevent e : events_) {
        if (e != nullptr) d.cuEventDestroy(e);
      }
      d.cuStreamDestroy(stream_);
    }
  }
  stream_ = nullptr;
  device_ = -1;
  events_.clear();
}

Status Stream::copy_to_host(void* dst, const void* device_src, size_t bytes) {
  if (stream_ == nullptr) return invalid_arg("Stream::copy_to_host: no stream");
  if (bytes == 0) return ok_status();
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device_));
  const Driver& d = **driver();
  const CUresult r =
      d.cuMemcpyDtoHAsync(dst, reinterpret_cast<CUdeviceptr>(device_src), bytes, stream_);
  return r == kCudaSuccess ? ok_status() : cuda_error(d, r, "cuMemcpyDtoHAsync");
}

Status Stream::copy_to_device(void* device_dst, const void* src, size_t bytes) {
  if (stream_ == nullptr) return invalid_arg("Stream::copy_to_device: no stream");
  if (bytes == 0) return ok_status();
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device_));
  const Driver& d = **driver();
  const CUresult r =
      d.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(device_dst), src, bytes, stream_);
  return r == kCudaSuccess ? ok_status() : cuda_error(d, r, "cuMemcpyHtoDAsync");
}

Status Stream::record(size_t i) {
  if (stream_ == nullptr) return invalid_arg("Stream::record: no stream");
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device_));
  const Driver& d = **driver();
  if (events_.size() <= i) events_.resize(i + 1, nullptr);
  if (events_[i] == nullptr) {
    const CUresult r = d.cuEventCreate(&events_[i], kEventDisableTiming);
    if (r != kCudaSuccess) {
      events_[i] = nullptr;
      return cuda_error(d, r, "cuEventCreate");
    }
  }
  const CUresult r = d.cuEventRecord(events_[i], stream_);
  return r == kCudaSuccess ? ok_status() : cuda_error(d, r, "cuEventRecord");
}

Status Stream::wait_event(size_t i, int64_t timeout_ms) const {
  if (i >= events_.size() || events_[i] == nullptr) {
    return invalid_arg("Stream::wait_event: event {} was never recorded", i);
  }
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device_));
  return event_wait(**driver(), events_[i], timeout_ms);
}

Status Stream::wait(int64_t timeout_ms) const {
  if (stream_ == nullptr) return invalid_arg("Stream::wait: no stream");
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(device_));
  return stream_wait(**driver(), stream_, timeout_ms);
}

}  // namespace gw::cuda
