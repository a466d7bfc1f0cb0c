// HugePageCollapser: turns the large buffers a caller hands in again and again into transparent
// huge pages (madvise MADV_COLLAPSE, Linux 6.1+), once per buffer. Why: a peer that copies such a
// buffer through the kernel (process_vm_readv / process_vm_writev: collectives/shm_direct.h) pins
// every page of it for every call, and with 4 KiB pages the pinning and the page walks are a
// large share of the copy; with 2 MiB pages they nearly vanish (docs/perf.md, "Heap buffers at
// the memory ceiling"). MADV_COLLAPSE keeps the bytes and the addresses (the kernel copies the
// small pages into huge ones); nothing the program can see changes but speed.
//
// Policy, per buffer (start address and length, exact): nothing the first time it is seen (a
// buffer used once is not worth a copy); the second time, the 2 MiB-aligned pages inside it are
// collapsed; after that again every kRetryEvery-th time (cheap when they still are huge pages;
// a buffer freed and allocated again at the same address gets its huge pages back). Buffers
// under kMinBytes are left alone. A buffer the kernel refuses (EINVAL: before Linux 6.1,
// transparent huge pages set to "never", a file mapping) is not tried again; a refusal for want
// of memory (EAGAIN, ENOMEM) waits for the next retry. At most kSlots buffers are remembered, the
// least recently seen forgotten. Not thread-safe (one per communicator, under its collective lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace gw::sys {

class HugePageCollapser {
 public:
  static constexpr size_t kMinBytes = size_t{8} << 20;
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr uint64_t kRetryEvery = 64;
  static constexpr size_t kSlots = 16;

  // madvise(addr, len, MADV_COLLAPSE): 0 or an errno value. Tests replace it.
  using Advise = std::function<int(void* addr, size_t len)>;

  explicit HugePageCollapser(bool enabled = true, Advise advise = {});

  // The caller is about to use [p, p + bytes) (again).
  void note(const void* p, size_t bytes);

  bool enabled() const { return enabled_; }
  // Process-wide counts (tests, perf): ranges handed to MADV_COLLAPSE, and those it took.
  static uint64_t attempts();
  static uint64_t collapsed();

 private:
  struct Slot {
    uintptr_t start = 0;
    size_t bytes = 0;
    uint64_t seen = 0;
    uint64_t last = 0;     // clock_ at the last sighting
    bool refused = false;  // MADV_COLLAPSE said EINVAL/EPERM: not tried again
  };
  bool enabled_;
  Advise advise_;
  uint64_t clock_ = 0;
  std::vector<Slot> slots_;
};

}  // namespace gw::sys
