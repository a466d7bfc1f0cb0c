// Internal to libgradwire.so: the state behind a gw_comm_t and the helpers every C entry point
// uses (handle lookup, Status -> gw_status_t with the message kept for gw_last_error(), and the
// exception barrier). capi/gradwire.cc defines them; other capi/*.cc files (compressed.cc) use
// them so that every part of the C ABI reports errors and checks handles the same way.
#pragma once

#include <memory>
#include <mutex>
#include <new>
#include <string>

#include "collectives/communicator.h"
#include "collectives/compress/compress.h"
#include "core/status.h"
#include "core/store.h"
#include "gradwire/gradwire.h"

#define GW_EXPORT extern "C" __attribute__((visibility("default")))

namespace gw::cuda {
class DeviceCompression;  // gpudirect/device_compression.h
}

namespace gw::capi {

struct CommState {
  std::unique_ptr<gw::coll::Communicator> comm;
  std::shared_ptr<gw::Store> store;  // rank 0's TcpStore hosts the server: keep it alive
  int rank = -1;
  int size = -1;

  // Compression: error-feedback residuals per tensor key and byte counters, created on the
  // first compressed call and freed with the communicator (declared after comm, so destroyed
  // before it).
  std::mutex compress_mu;
  std::unique_ptr<gw::coll::Compressor> compressor;
  // GPU tensors' residuals and staging (gpudirect/device_compression.h), created on the first
  // GPU call.
  std::shared_ptr<gw::cuda::DeviceCompression> device_compression;
};

// Stores "call: message" for gw_last_error() on this thread and returns the matching code.
gw_status_t fail(const char* call, const Status& s);

// The state of a live handle, or kInvalidArg (NULL, destroyed, foreign).
Result<std::shared_ptr<CommState>> lookup(gw_comm_t comm);
// Same, and kAborted when the communicator was aborted.
Result<std::shared_ptr<CommState>> usable(gw_comm_t comm);

// Runs an entry point's body: converts its Status, and every exception, to a gw_status_t.
template <typename F>
gw_status_t guarded(const char* call, F&& body) noexcept {
  try {
    Status s = body();
    if (s.ok()) return GW_OK;
    return fail(call, s);
  } catch (const std::bad_alloc&) {
    return fail(call, gw::no_memory("out of memory"));
  } catch (const std::exception& e) {
    return fail(call, gw::internal_error("unexpected exception: {}", e.what()));
  } catch (...) {
    return fail(call, gw::internal_error("unexpected non-standard exception"));
  }
}

}  // namespace gw::capi
