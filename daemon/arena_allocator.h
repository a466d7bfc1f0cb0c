// The client's allocator over its arena's data region (gw_mem_alloc and staging copies): first
// fit over offsets, 64-byte units, free ranges coalesced. Not thread-safe (DaemonSession holds its
// lock around every call).
#pragma once

#include <cstdint>
#include <map>

#include "core/status.h"

namespace gw::daemon {

// First-fit allocator over [0, size) in 64-byte units; offsets, not pointers. Not thread-safe.
class ArenaAllocator {
 public:
  explicit ArenaAllocator(uint64_t size);
  // kNoMemory when no free range is large enough.
  Result<uint64_t> alloc(uint64_t bytes);
  // kInvalidArg unless off is the start of a live allocation.
  Status free(uint64_t off);
  uint64_t free_bytes() const;

 private:
  std::map<uint64_t, uint64_t> free_;  // offset -> size, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> size
};

}  // namespace gw::daemon
