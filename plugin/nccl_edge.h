// The C edge shared by the exported tables (exports.cc): Status to ncclResult_t with one WARN
// through NCCL's logger, exceptions stopped at the edge, and the entries whose body is the same
// for every version (devices, getProperties in each version's struct).
#pragma once

#include <exception>
#include <new>

#include "core/status.h"
#include "plugin/nccl_net_abi.h"

namespace gw::plugin {

// OK -> ncclSuccess; otherwise the code's ncclResult_t, after a WARN naming `op`, what failed and
// what to do.
ncclResult_t to_nccl(const Status& s, const char* op);

// Runs `body` (returning Status) and converts everything, exceptions included, at the C edge.
template <typename F>
ncclResult_t guarded(const char* op, F&& body) {
  try {
    return to_nccl(body(), op);
  } catch (const std::bad_alloc&) {
    return to_nccl(no_memory("out of memory"), op);
  } catch (const std::exception& e) {
    return to_nccl(internal_error("unexpected exception: {}", e.what()), op);
  } catch (...) {
    return to_nccl(internal_error("unexpected exception"), op);
  }
}

ncclResult_t count_devices(int* ndev);

// v12 is filled from the device; the older structs are copies of its fields they have.
ncclResult_t get_properties_v12(int dev, ncclNetProperties_v12_t* props);
ncclResult_t get_properties_v11(int dev, ncclNetProperties_v11_t* props);
ncclResult_t get_properties_v10(int dev, ncclNetProperties_v10_t* props);
ncclResult_t get_properties_v8(int dev, ncclNetProperties_v8_t* props);

}  // namespace gw::plugin
