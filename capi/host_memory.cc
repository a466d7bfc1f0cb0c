// The plain collectives move host memory only: a CUDA device pointer is refused by name instead
// of being read by the CPU (a segfault, or garbage through a stale mapping). The check asks the
// CUDA driver only when the process has already mapped it (gw::cuda::resident_driver), so a
// host-only process pays one dlopen(RTLD_NOLOAD) per call and no CUDA initialisation ever.
#include "capi/capi_internal.h"
#include "gpudirect/cuda_driver.h"

namespace gw::capi {

namespace {
thread_local bool t_device_ok = false;  // a DeviceMemoryScope of a session that takes it
}  // namespace

DeviceMemoryScope::DeviceMemoryScope(const Session& session) : prev_(t_device_ok) {
  t_device_ok = session.takes_device_memory();
}
DeviceMemoryScope::~DeviceMemoryScope() { t_device_ok = prev_; }

Status check_host_memory(const char* arg, const void* p) {
  if (t_device_ok) return ok_status();
  if (gw::cuda::resident_memory_kind(p) != gw::cuda::MemoryKind::kDevice) return ok_status();
  return gw::unsupported(
      "argument {} is CUDA device memory: the plain collectives take host memory only (copy the "
      "tensor to host memory, or use gw_allreduce_compressed, which takes device memory)",
      arg);
}

}  // namespace gw::capi
