// Internal to libgradwire.so: where the C ABI's handle objects (gw_comm, gw_request) live, so that
// a call can check a handle without a global lock. Slots are carved from slabs that are never
// freed; a handle is the address of its slot. contains() tells a slot of this table from any other
// pointer (foreign, junk) without touching it and without a lock, so that the slot's own atomic
// fields (its magic, set while the handle is live) can then be read safely: a destroyed handle is
// reported, never dereferenced into freed memory. Freed slots are reused oldest first (FIFO), so
// a stale handle names a newer object only after every other free slot was taken (malloc, which
// the table replaces, hands the last freed address back first).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

namespace gw::capi {

template <typename T, size_t kPerSlab = 256, size_t kMaxSlabs = 4096>
class HandleTable {
 public:
  // Allocated once and never freed (calls made during static destruction still find it).
  static HandleTable& instance() {
    static HandleTable* t = new HandleTable();
    return *t;
  }

  // A free slot (its fields as the last release() left them), or nullptr when kMaxSlabs slabs
  // are all in use.
  T* acquire() {
    std::lock_guard<std::mutex> lock(mu_);
    if (free_.empty()) {
      const size_t n = count_.load(std::memory_order_relaxed);
      if (n == kMaxSlabs) return nullptr;
      T* slab = new T[kPerSlab];
      for (size_t i = 0; i < kPerSlab; ++i) free_.push_back(&slab[i]);
      slabs_[n].store(slab, std::memory_order_relaxed);
      count_.store(n + 1, std::memory_order_release);
    }
    T* t = free_.front();
    free_.pop_front();
    return t;
  }
  // Gives a slot back, to be reused after every slot freed before it.
  void release(T* t) {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(t);
  }
  // Whether p is a slot of this table (lock-free; never reads *p).
  bool contains(const void* p) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    const size_t n = count_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
      const auto s = reinterpret_cast<uintptr_t>(slabs_[i].load(std::memory_order_relaxed));
      if (a >= s && a < s + kPerSlab * sizeof(T)) return (a - s) % sizeof(T) == 0;
    }
    return false;
  }

 private:
  HandleTable() = default;
  std::mutex mu_;        // free_ and the growth of slabs_
  std::deque<T*> free_;  // oldest first
  std::atomic<size_t> count_{0};
  std::atomic<T*> slabs_[kMaxSlabs] = {};
};

}  // namespace gw::capi
