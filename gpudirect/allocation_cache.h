// AllocationCache: what the CUDA driver says about the allocations a process hands to gradwire,
// keyed by allocation (cuMemGetAddressRange's base), so that a buffer used call after call costs
// one attribute query instead of several, and so that per-allocation state (a registration's
// staging buffer) can hang off it.
//
// An allocation can be freed and its address handed out again by the next cudaMalloc without
// gradwire seeing either call. Every lookup therefore asks the driver for the pointer's buffer id
// (CU_POINTER_ATTRIBUTE_BUFFER_ID, unique per allocation for the life of the process) and drops
// the entry when it changed, as when the size or base changed: a freed and reused address never
// gets a stale entry. Where the driver has no buffer id, nothing is cached (every lookup asks).
//
// Thread-safe. Never loads the driver: it uses the one driver() already loaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/status.h"
#include "gpudirect/cuda_driver.h"

namespace gw::cuda {

struct Allocation {
  uintptr_t base = 0;      // the allocation's first byte (cuMemGetAddressRange)
  size_t size = 0;         // its bytes
  uint64_t buffer_id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID; 0 where the driver has none
  int device = -1;         // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
  // The allocation's generation in this cache: it changes when the entry was replaced (freed and
  // reused address), so holders of per-allocation state can tell theirs is stale.
  uint64_t generation = 0;
};

class AllocationCache {
 public:
  explicit AllocationCache(const Driver& d) : d_(d) {}

  // The allocation holding [p, p + bytes): kInvalidArg when p is not device memory the driver
  // knows or the range passes the allocation's end.
  Result<Allocation> resolve(const void* p, size_t bytes);

  // Counters: lookups answered from the cache, entries dropped because their allocation was
  // freed (buffer id, base or size changed), entries held now.
  uint64_t hits() const;
  uint64_t invalidations() const;
  size_t entries() const;

 private:
  const Driver& d_;
  mutable std::mutex mu_;
  std::map<uintptr_t, Allocation> by_base_;
  uint64_t hits_ = 0;
  uint64_t invalidations_ = 0;
  uint64_t next_generation_ = 1;
};

}  // namespace gw::cuda
