// A trainer's device allocation opened in gradwired (docs/wire-daemon.md, opcode import): the
// CUDA IPC handle the trainer exported, opened in the daemon's own context of that device
// (cuIpcOpenMemHandle), and closed when the import is released or its trainer goes. The copies
// between it and host memory are the daemon's host path (device -> host, sum, host -> device),
// the path the stand-in driver can run; docs/daemon.md says which path a job took.
//
// Thread-compatible: the job thread that opened it uses it. The destructor closes it (and gives
// back the device's primary context) and counts it out of Counters::live_imports.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/status.h"
#include "daemon/protocol.h"
#include "gpudirect/cuda_driver.h"

namespace gw::daemon {

class DeviceImport {
 public:
  // Opens r's handle (an import request) with the process's CUDA driver. kUnsupported without a
  // driver or without CUDA IPC in it; the driver's error when the handle does not open (its
  // exporter is gone, another device, ...). live (the daemon's) and job_live (its job's) count it
  // while the import lives.
  static Result<std::unique_ptr<DeviceImport>> open(
      const Request& r, std::atomic<uint64_t>* live,
      std::shared_ptr<std::atomic<uint64_t>> job_live);
  ~DeviceImport();
  DeviceImport(const DeviceImport&) = delete;
  DeviceImport& operator=(const DeviceImport&) = delete;

  uint64_t bytes() const { return bytes_; }
  // Synchronous copies between [off, + n) of the allocation and host memory; kInvalidArg past its
  // end, the driver's error otherwise.
  Status download(uint64_t off, void* dst, size_t n) const;
  Status upload(uint64_t off, const void* src, size_t n) const;

 private:
  DeviceImport() = default;
  Status check(uint64_t off, size_t n) const;
  const cuda::Driver* d_ = nullptr;
  cuda::CUcontext ctx_ = nullptr;
  cuda::CUdevice dev_ = 0;
  cuda::CUdeviceptr ptr_ = 0;
  uint64_t bytes_ = 0;
  std::atomic<uint64_t>* live_ = nullptr;
  std::shared_ptr<std::atomic<uint64_t>> job_live_;
};

}  // namespace gw::daemon
