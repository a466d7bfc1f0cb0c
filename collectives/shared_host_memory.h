// Host memory that the ranks of one host can map into each other: what gw_mem_alloc hands out in
// direct mode when the communicator's allreduce reads its peers' buffers (shm_direct.h). Each
// allocation is a memfd region (core/sys/memfd_region.h) registered here, process-wide, so a
// collective that finds its buffer inside one can tell a peer where (descriptor number, inode,
// offset) and the peer maps the region once through /proc/PID/fd/FD. Then a rank reads its peers'
// inputs and writes their outputs with plain loads and stores: no kernel copy, no page pinning
// per call (docs/wire-shm.md, "Shared buffers").
//
// The registry holds each region's descriptor until release(): a peer can open it only while it
// is open here. Thread-safe (one mutex; allocate and release are rare, find is a map lookup).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

#include "core/status.h"

namespace gw::coll::shared_host_memory {

// Where a buffer lies in a registered region, as a peer needs it to map the region. Its bytes
// travel as they are in the direct allreduce's per-call exchange (shm_direct.h), which sends a
// default Ref (gen 0) for a buffer in no region.
struct Ref {
  uint64_t gen = 0;           // this process's number for the allocation (from 1, never reused)
  uint64_t ino = 0;           // its inode: a peer checks it reopened the same region
  uint64_t region_bytes = 0;  // the region's size (sealed: it cannot change)
  uint64_t offset = 0;        // the buffer's start within the region
  int64_t fd = -1;            // the region's descriptor in the owning process
};

// `bytes` (> 0) zeroed bytes of shared memory, page-aligned, registered. kInvalidArg for 0,
// kSystem when the kernel refuses (no descriptors left, no memory).
Result<void*> allocate(size_t bytes);

// Unmaps and closes the region allocate() returned at `p`; false when p is not one (nothing done).
// A peer that mapped it keeps its mapping until it lets go (the memory is freed then).
bool release(void* p);

// The region that holds all of [p, p + len), if any (len 0: the one holding p).
std::optional<Ref> find(const void* p, size_t len);

// How many regions are registered now (tests).
size_t count();

}  // namespace gw::coll::shared_host_memory
