#include "collectives/shared_host_memory.h"

#include <sys/stat.h>

#include <cerrno>
#include <map>
#include <mutex>

#include "core/sys/memfd_region.h"

namespace gw::coll::shared_host_memory {
namespace {

struct Entry {
  sys::MemfdRegion region;
  uint64_t ino = 0;
  uint64_t gen = 0;
};

struct Registry {
  std::mutex mu;
  std::map<uintptr_t, Entry> by_base;  // keyed by the mapping's first byte
  uint64_t next_gen = 1;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: usable from other static destructors
  return *r;
}

}  // namespace

Result<void*> allocate(size_t bytes) {
  if (bytes == 0) return invalid_arg("shared host memory: size must be positive");
  GW_ASSIGN_OR_RETURN(sys::MemfdRegion region, sys::MemfdRegion::create("gw-mem-alloc", bytes));
  struct stat st {};
  if (::fstat(region.fd(), &st) != 0) return system_error("fstat of a shared allocation", errno);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  void* p = region.data();
  Entry e;
  e.ino = static_cast<uint64_t>(st.st_ino);
  e.gen = r.next_gen++;
  e.region = std::move(region);
  r.by_base.emplace(reinterpret_cast<uintptr_t>(p), std::move(e));
  return p;
}

bool release(void* p) {
  Registry& r = registry();
  sys::MemfdRegion gone;  // unmapped after the lock is dropped
  {
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.by_base.find(reinterpret_cast<uintptr_t>(p));
    if (it == r.by_base.end()) return false;
    gone = std::move(it->second.region);
    r.by_base.erase(it);
  }
  return true;
}

std::optional<Ref> find(const void* p, size_t len) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.by_base.upper_bound(a);
  if (it == r.by_base.begin()) return std::nullopt;
  --it;
  const Entry& e = it->second;
  const uintptr_t base = it->first;
  const size_t size = e.region.size();
  if (a - base >= size || len > size - (a - base)) return std::nullopt;
  return Ref{e.gen, e.ino, size, a - base, e.region.fd()};
}

size_t count() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return r.by_base.size();
}

}  // namespace gw::coll::shared_host_memory
