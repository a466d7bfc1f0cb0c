#include "capi/device_memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/log.h"

namespace gw::capi {

namespace {

// Handles are numbers, never pointers: a deregistered or foreign handle is looked up, never
// dereferenced. Process-wide, so one communicator's handle is foreign to every other.
std::atomic<uintptr_t> g_next_handle{0x6d656d0001};  // "mem", then a count

constexpr size_t kPoolKeep = 4;                     // host buffers the pool keeps between calls
constexpr size_t kPoolKeepBytes = size_t{1} << 30;  // and at most this many bytes of them

}  // namespace

// Free staging buffers of one communicator. Outlives the DeviceMemory while a call holds one.
struct DeviceMemory::Pool {
  std::mutex mu;
  std::vector<std::unique_ptr<cuda::PinnedBuffer>> free;

  std::unique_ptr<cuda::PinnedBuffer> take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu);
    auto best = free.end();
    for (auto it = free.begin(); it != free.end(); ++it) {
      if ((*it)->size() >= bytes && (best == free.end() || (*it)->size() < (*best)->size())) {
        best = it;
      }
    }
    if (best == free.end()) return nullptr;
    auto b = std::move(*best);
    free.erase(best);
    return b;
  }
  void give_back(std::unique_ptr<cuda::PinnedBuffer> b) {
    std::lock_guard<std::mutex> lock(mu);
    size_t held = 0;
    for (const auto& f : free) held += f->size();
    if (free.size() < kPoolKeep && held + b->size() <= kPoolKeepBytes) free.push_back(std::move(b));
  }
};

DeviceMemory::DeviceMemory(int rank, std::string transport)
    : rank_(rank), transport_(std::move(transport)), pool_(std::make_shared<Pool>()) {}

DeviceMemory::~DeviceMemory() = default;

Result<cuda::AllocationCache*> DeviceMemory::cache() {
  // The C layer saw device memory, so the driver is mapped: this loads nothing new.
  const cuda::Driver* d = cuda::resident_driver();
  if (d == nullptr) return unsupported("device memory without a loaded CUDA driver");
  std::lock_guard<std::mutex> lock(mu_);
  if (!cache_) cache_ = std::make_unique<cuda::AllocationCache>(*d);
  return cache_.get();
}

Result<cuda::Allocation> DeviceMemory::resolve(const void* p, size_t bytes) {
  GW_ASSIGN_OR_RETURN(cuda::AllocationCache * c, cache());
  return c->resolve(p, bytes);
}

std::string DeviceMemory::path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fmt::format(
      "staged through {} host memory (the plain collectives reduce and copy on the CPU; "
      "transport {}: no zero-copy GPUDirect path for them)",
      pinned_ ? "page-locked" : "pageable", transport_);
}

void DeviceMemory::note_path(bool pinned) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pinned_ = pinned;
    if (logged_) return;
    logged_ = true;
  }
  GW_LOG_INFO("rank {}: CUDA device memory in the collectives: {}", rank_, path());
}

Result<StagingBuffer> DeviceMemory::stage(const void* p, size_t bytes, const cuda::Allocation& a) {
  StagingBuffer out;
  const auto at = reinterpret_cast<uintptr_t>(p);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++counters_.staged_ranges;
    for (auto& [handle, r] : registrations_) {
      if (!r.device || !r.buffer) continue;
      const auto begin = reinterpret_cast<uintptr_t>(r.ptr);
      if (at < begin || at - begin > r.bytes || bytes > r.bytes - (at - begin)) continue;
      if (r.alloc.buffer_id != a.buffer_id || r.alloc.base != a.base) {
        // The registered allocation was freed and this address belongs to a new one.
        GW_LOG_DEBUG("rank {}: registration {:#x} is stale (its allocation was freed)", rank_,
                     handle);
        r.buffer.reset();
        ++counters_.stale_registrations;
        continue;
      }
      ++counters_.registered_hits;
      out.host = r.buffer->as<unsigned char>() + (at - begin);
      out.hold = r.buffer;
      out.pinned = r.buffer->pinned();
      out.registered = true;
    }
  }
  if (!out.registered) {
    std::unique_ptr<cuda::PinnedBuffer> b = pool_->take(bytes);
    if (!b) {
      GW_ASSIGN_OR_RETURN(cuda::PinnedBuffer fresh, cuda::PinnedBuffer::allocate(a.device, bytes));
      if (!fresh.pinned()) {
        GW_LOG_DEBUG("rank {}: staging buffer is pageable: {}", rank_, fresh.why_pageable());
      }
      b = std::make_unique<cuda::PinnedBuffer>(std::move(fresh));
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.pool_allocations;
    }
    out.host = b->get();
    out.pinned = b->pinned();
    std::weak_ptr<Pool> pool = pool_;
    cuda::PinnedBuffer* raw = b.release();
    out.hold = std::shared_ptr<void>(raw, [pool](void* v) {
      std::unique_ptr<cuda::PinnedBuffer> back(static_cast<cuda::PinnedBuffer*>(v));
      if (auto p = pool.lock()) p->give_back(std::move(back));
    });
  }
  note_path(out.pinned);
  return out;
}

Result<gw_mem_handle_t> DeviceMemory::register_range(const void* p, size_t bytes) {
  Registration r;
  r.ptr = p;
  r.bytes = bytes;
  r.device = cuda::resident_memory_kind(p) == cuda::MemoryKind::kDevice;
  if (r.device) {
    GW_ASSIGN_OR_RETURN(r.alloc, resolve(p, bytes));
    GW_ASSIGN_OR_RETURN(cuda::PinnedBuffer b, cuda::PinnedBuffer::allocate(r.alloc.device, bytes));
    r.buffer = std::make_shared<cuda::PinnedBuffer>(std::move(b));
  }
  const uintptr_t handle = g_next_handle.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  registrations_.emplace(handle, std::move(r));
  return reinterpret_cast<gw_mem_handle_t>(handle);
}

Status DeviceMemory::deregister(gw_mem_handle_t handle) {
  std::lock_guard<std::mutex> lock(mu_);
  if (registrations_.erase(reinterpret_cast<uintptr_t>(handle)) == 0) {
    return invalid_arg(
        "handle was not returned by gw_mem_register on this communicator, or was deregistered "
        "already");
  }
  return ok_status();
}

DeviceMemory::Counters DeviceMemory::counters() const {
  Counters c;
  {
    std::lock_guard<std::mutex> lock(mu_);
    c = counters_;
    c.registrations = registrations_.size();
    if (cache_) {
      c.cache_hits = cache_->hits();
      c.cache_invalidations = cache_->invalidations();
    }
  }
  return c;
}

}  // namespace gw::capi
