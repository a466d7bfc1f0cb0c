#include "daemon/device_import.h"

#include <utility>

namespace gw::daemon {

Result<std::unique_ptr<DeviceImport>> DeviceImport::open(
    const Request& r, std::atomic<uint64_t>* live,
    std::shared_ptr<std::atomic<uint64_t>> job_live) {
  GW_ASSIGN_OR_RETURN(const cuda::Driver* d, cuda::driver());
  if (d->cuIpcOpenMemHandle == nullptr || d->cuIpcCloseMemHandle == nullptr) {
    return unsupported("gradwired: the CUDA driver ({}) has no CUDA IPC", d->library);
  }
  std::unique_ptr<DeviceImport> imp(new DeviceImport());
  imp->d_ = d;
  cuda::CUresult e = d->cuDeviceGet(&imp->dev_, r.device);
  if (e != cuda::kCudaSuccess) return cuda::cuda_error(*d, e, "gradwired: cuDeviceGet");
  e = d->cuDevicePrimaryCtxRetain(&imp->ctx_, imp->dev_);
  if (e != cuda::kCudaSuccess) {
    imp->ctx_ = nullptr;
    return cuda::cuda_error(*d, e, "gradwired: cuDevicePrimaryCtxRetain");
  }
  // The job thread works in the device's primary context (shared with anything else of this
  // process on that device).
  e = d->cuCtxSetCurrent(imp->ctx_);
  if (e == cuda::kCudaSuccess) {
    e = d->cuIpcOpenMemHandle(&imp->ptr_, r.handle, cuda::kIpcLazyEnablePeerAccess);
  }
  if (e != cuda::kCudaSuccess) {
    imp->ptr_ = 0;
    return cuda::cuda_error(*d, e, "gradwired: cuIpcOpenMemHandle of the trainer's allocation");
  }
  imp->bytes_ = r.alloc_bytes;
  imp->live_ = live;
  imp->job_live_ = std::move(job_live);
  if (live) live->fetch_add(1);
  if (imp->job_live_) imp->job_live_->fetch_add(1);
  return imp;
}

DeviceImport::~DeviceImport() {
  if (ptr_ != 0) {
    (void)d_->cuCtxSetCurrent(ctx_);
    (void)d_->cuIpcCloseMemHandle(ptr_);
    if (live_) live_->fetch_sub(1);
    if (job_live_) job_live_->fetch_sub(1);
  }
  if (ctx_ != nullptr) (void)d_->cuDevicePrimaryCtxRelease(dev_);
}

Status DeviceImport::check(uint64_t off, size_t n) const {
  if (off > bytes_ || n > bytes_ - off) {
    return invalid_arg("gradwired: [{}, +{}) outside an imported allocation of {} bytes", off, n,
                       bytes_);
  }
  return ok_status();
}

Status DeviceImport::download(uint64_t off, void* dst, size_t n) const {
  GW_RETURN_IF_ERROR(check(off, n));
  if (n == 0) return ok_status();
  cuda::CUresult e = d_->cuCtxSetCurrent(ctx_);
  if (e == cuda::kCudaSuccess) e = d_->cuMemcpyDtoH(dst, ptr_ + off, n);
  if (e != cuda::kCudaSuccess) return cuda::cuda_error(*d_, e, "gradwired: device to host copy");
  return ok_status();
}

Status DeviceImport::upload(uint64_t off, const void* src, size_t n) const {
  GW_RETURN_IF_ERROR(check(off, n));
  if (n == 0) return ok_status();
  cuda::CUresult e = d_->cuCtxSetCurrent(ctx_);
  if (e == cuda::kCudaSuccess) e = d_->cuMemcpyHtoD(ptr_ + off, src, n);
  if (e != cuda::kCudaSuccess) return cuda::cuda_error(*d_, e, "gradwired: host to device copy");
  return ok_status();
}

}  // namespace gw::daemon
