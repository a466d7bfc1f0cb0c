#include "core/sys/huge_pages.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/log.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1 (uapi asm-generic/mman-common.h); glibc 2.36 lacks it
#endif

namespace gw::sys {
namespace {

std::atomic<uint64_t> g_attempts{0};
std::atomic<uint64_t> g_collapsed{0};
std::atomic<bool> g_said{false};  // the INFO line about a refusal, once per process

int advise_collapse(void* addr, size_t len) {
  return madvise(addr, len, MADV_COLLAPSE) == 0 ? 0 : errno;
}

}  // namespace

HugePageCollapser::HugePageCollapser(bool enabled, Advise advise)
    : enabled_(enabled), advise_(advise ? std::move(advise) : Advise(advise_collapse)) {}

uint64_t HugePageCollapser::attempts() { return g_attempts.load(std::memory_order_relaxed); }
uint64_t HugePageCollapser::collapsed() { return g_collapsed.load(std::memory_order_relaxed); }

void HugePageCollapser::note(const void* p, size_t bytes) {
  if (!enabled_ || bytes < kMinBytes) return;
  const auto start = reinterpret_cast<uintptr_t>(p);
  ++clock_;
  auto it = std::find_if(slots_.begin(), slots_.end(),
                         [&](const Slot& s) { return s.start == start && s.bytes == bytes; });
  if (it == slots_.end()) {
    if (slots_.size() < kSlots) {
      slots_.push_back(Slot{start, bytes});
      it = slots_.end() - 1;
    } else {
      it = std::min_element(slots_.begin(), slots_.end(),
                            [](const Slot& a, const Slot& b) { return a.last < b.last; });
      *it = Slot{start, bytes};
    }
  }
  it->last = clock_;
  const uint64_t seen = ++it->seen;
  if (it->refused || seen < 2 || (seen != 2 && seen % kRetryEvery != 0)) return;
  const uintptr_t lo = (start + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t hi = (start + bytes) & ~(kHugePage - 1);
  if (hi <= lo) return;
  g_attempts.fetch_add(1, std::memory_order_relaxed);
  const int err = advise_(reinterpret_cast<void*>(lo), hi - lo);
  if (err == 0) {
    g_collapsed.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  if (err == EINVAL || err == ENOSYS || err == EPERM) {
    // Before Linux 6.1, transparent huge pages off, or a mapping they cannot back (a file, a
    // range marked MADV_NOHUGEPAGE): this buffer stays as it is.
    it->refused = true;
    if (!g_said.exchange(true)) {
      GW_LOG_INFO(
          "huge pages: the kernel refused MADV_COLLAPSE for a {}-byte buffer ({}); it keeps its "
          "4 KiB pages (the direct shm collectives copy it more slowly)",
          bytes, std::strerror(err));
    }
  }
  // EAGAIN / ENOMEM (no free huge pages now): the next retry tries again.
}

}  // namespace gw::sys
