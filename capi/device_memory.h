// DeviceMemory: one communicator's handling of CUDA device memory in direct mode (issue 27).
// The plain collectives reduce and copy on the CPU, so a device buffer is staged: copied into
// host memory before the collective and back after it (capi/device_staging.h). This object owns
// what that needs across calls:
// - the allocation cache (gpudirect/allocation_cache.h): the device of a buffer, by allocation,
//   dropped when the allocation is freed and its address reused;
// - a pool of page-locked host buffers (pageable where pinning fails), reused call after call;
// - gw_mem_register's registrations: a registered device range keeps a staging buffer of its own,
//   allocated once, so its calls take nothing from the pool. A registration whose allocation was
//   freed (the buffer id changed) is stale: its buffer is dropped and the call stages through the
//   pool; gw_mem_deregister still accepts its handle.
// - the INFO line that says, once per communicator, which path device memory takes.
// Thread-safe (calls of one communicator may overlap through the i-forms and point-to-point).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "gpudirect/allocation_cache.h"
#include "gpudirect/device_buffer.h"
#include "gradwire/gradwire.h"

namespace gw::capi {

// Host memory lent to one staged range; the memory stays valid while `hold` does.
struct StagingBuffer {
  void* host = nullptr;
  std::shared_ptr<void> hold;
  bool pinned = false;
  bool registered = false;  // the range's own registration buffer, not the pool's
};

class DeviceMemory {
 public:
  // rank and transport: for the INFO line (the transport of the communicator's links).
  DeviceMemory(int rank, std::string transport);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // The allocation holding [p, p + bytes) (cached; see AllocationCache). kUnsupported without a
  // loaded driver, kInvalidArg when the range is not inside one allocation.
  Result<cuda::Allocation> resolve(const void* p, size_t bytes);

  // Host memory for staging [p, p + bytes) of allocation `a`: the buffer of a live registration
  // that holds the whole range, else one from the pool (allocated when the pool has none large
  // enough). Logs the INFO line on the first call.
  Result<StagingBuffer> stage(const void* p, size_t bytes, const cuda::Allocation& a);

  // gw_mem_register / gw_mem_deregister (gradwire.h). Host and managed memory: a registration
  // that does nothing but exist (the collectives use such memory in place).
  Result<gw_mem_handle_t> register_range(const void* p, size_t bytes);
  Status deregister(gw_mem_handle_t handle);

  // The path device memory takes, for gw_comm_describe ("device_memory") and the INFO line.
  std::string path() const;

  struct Counters {
    uint64_t staged_ranges = 0;        // ranges staged (each copied in and/or out)
    uint64_t pool_allocations = 0;     // host buffers the pool had to allocate
    uint64_t registered_hits = 0;      // ranges staged through a registration's own buffer
    uint64_t stale_registrations = 0;  // registrations found on a freed (reused) allocation
    uint64_t cache_hits = 0;           // AllocationCache
    uint64_t cache_invalidations = 0;  // AllocationCache: freed allocations seen
    size_t registrations = 0;          // live registrations
  };
  Counters counters() const;

 private:
  struct Registration {
    const void* ptr = nullptr;
    size_t bytes = 0;
    bool device = false;  // false: host or managed memory (nothing to do)
    cuda::Allocation alloc;
    std::shared_ptr<cuda::PinnedBuffer> buffer;  // null once stale
  };
  struct Pool;

  Result<cuda::AllocationCache*> cache();
  void note_path(bool pinned);

  const int rank_;
  const std::string transport_;
  mutable std::mutex mu_;
  std::unique_ptr<cuda::AllocationCache> cache_;
  std::shared_ptr<Pool> pool_;
  std::map<uintptr_t, Registration> registrations_;  // by handle value
  Counters counters_;
  bool logged_ = false;
  bool pinned_ = true;  // what the last staging buffer was
};

}  // namespace gw::capi
