#include "daemon/arena_allocator.h"

#include <iterator>

namespace gw::daemon {

namespace {
constexpr uint64_t kUnit = 64;
}  // namespace

ArenaAllocator::ArenaAllocator(uint64_t size) {
  const uint64_t usable = size / kUnit * kUnit;
  if (usable > 0) free_[0] = usable;
}

Result<uint64_t> ArenaAllocator::alloc(uint64_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes > UINT64_MAX - kUnit) return no_memory("{} bytes", bytes);
  const uint64_t need = (bytes + kUnit - 1) / kUnit * kUnit;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const uint64_t off = it->first;
    const uint64_t left = it->second - need;
    free_.erase(it);
    if (left > 0) free_[off + need] = left;
    used_[off] = need;
    return off;
  }
  return no_memory("no free range of {} bytes in the arena ({} bytes free in {} ranges)", need,
                   free_bytes(), free_.size());
}

Status ArenaAllocator::free(uint64_t off) {
  auto u = used_.find(off);
  if (u == used_.end()) return invalid_arg("offset {} is not an allocation", off);
  uint64_t start = off;
  uint64_t size = u->second;
  used_.erase(u);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + size) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = size;
  return ok_status();
}

uint64_t ArenaAllocator::free_bytes() const {
  uint64_t total = 0;
  for (const auto& [off, size] : free_) total += size;
  return total;
}

}  // namespace gw::daemon
