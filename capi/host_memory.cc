// CUDA device memory in the C ABI: which buffers are device memory (check_memory), and
// gw_mem_register / gw_mem_deregister. The check asks the CUDA driver only when the process has
// already mapped it (gw::cuda::resident_driver), so a host-only process pays one
// dlopen(RTLD_NOLOAD) per call and no CUDA initialisation ever. Device memory is staged by the
// Session's DeviceMemory (capi/device_staging.h) in direct mode; daemon mode refuses it by name
// instead of letting the CPU read it (a segfault, or garbage through a stale mapping).
#include "capi/capi_internal.h"
#include "capi/device_memory.h"
#include "gpudirect/cuda_driver.h"

namespace gw::capi {

Status check_memory(const Session& st, const char* arg, const void* p, bool* device) {
  if (gw::cuda::resident_memory_kind(p) != gw::cuda::MemoryKind::kDevice) return ok_status();
  if (st.device_memory() != nullptr) {
    *device = true;
    return ok_status();
  }
  return gw::unsupported(
      "argument {} is CUDA device memory: in daemon mode (GW_DAEMON) the plain collectives take "
      "host memory only (copy the tensor to host memory, use direct mode, or use "
      "gw_allreduce_compressed, which takes device memory)",
      arg);
}

}  // namespace gw::capi

using gw::Status;
using namespace gw::capi;  // NOLINT: this file implements gw::capi

GW_EXPORT gw_status_t gw_mem_register(gw_comm_t comm, const void* ptr, size_t bytes,
                                      gw_mem_handle_t* handle) {
  return guarded("gw_mem_register", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    if (handle == nullptr) return gw::invalid_arg("argument handle (the output pointer) is NULL");
    if (ptr == nullptr) return gw::invalid_arg("argument ptr is NULL");
    if (bytes == 0) return gw::invalid_arg("argument bytes is 0");
    GW_RETURN_IF_ERROR(check_buffer("ptr", ptr, bytes));
    auto dm = st->device_memory();
    if (!dm) {
      return gw::unsupported(
          "daemon mode (GW_DAEMON) does not have gw_mem_register yet; use gw_mem_alloc for host "
          "memory, or direct mode");
    }
    GW_ASSIGN_OR_RETURN(gw_mem_handle_t h, dm->register_range(ptr, bytes));
    *handle = h;
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_mem_deregister(gw_comm_t comm, gw_mem_handle_t handle) {
  return guarded("gw_mem_deregister", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, lookup(comm));
    if (handle == nullptr) return gw::invalid_arg("argument handle is NULL");
    auto dm = st->device_memory();
    if (!dm)
      return gw::invalid_arg("handle was not returned by gw_mem_register on this communicator");
    return dm->deregister(handle);
  });
}
