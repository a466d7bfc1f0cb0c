#include "gpudirect/allocation_cache.h"

#include <fmt/format.h>

namespace gw::cuda {

namespace {
constexpr size_t kMaxEntries = 4096;  // a bound on what a long job's churn can leave behind
}  // namespace

Result<Allocation> AllocationCache::resolve(const void* p, size_t bytes) {
  if (p == nullptr) return invalid_arg("a null pointer is not device memory");
  const auto ptr = reinterpret_cast<CUdeviceptr>(p);
  // The buffer id and the range come from the driver on every call: they are what tells a live
  // allocation from a freed one whose address came back.
  unsigned long long id = 0;
  const bool have_id = d_.cuPointerGetAttribute(&id, kPointerAttrBufferId, ptr) == kCudaSuccess;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (have_id && !by_base_.empty()) {
      auto it = by_base_.upper_bound(ptr);
      if (it != by_base_.begin()) {
        --it;
        const Allocation& a = it->second;
        if (ptr < a.base + a.size) {
          if (a.buffer_id == id) {
            if (bytes > a.base + a.size - ptr) {
              return invalid_arg(
                  "{} bytes at {} pass the end of its CUDA allocation ({} bytes at "
                  "{:#x})",
                  bytes, p, a.size, a.base);
            }
            ++hits_;
            return a;
          }
          by_base_.erase(it);  // freed, and the address handed out again
          ++invalidations_;
        }
      }
    }
  }
  if (d_.cuMemGetAddressRange == nullptr) {
    return unsupported("the CUDA driver lacks cuMemGetAddressRange");
  }
  Allocation a;
  CUdeviceptr base = 0;
  size_t size = 0;
  CUresult r = d_.cuMemGetAddressRange(&base, &size, ptr);
  if (r != kCudaSuccess) {
    return invalid_arg("{} is not CUDA device memory ({})", p, error_text(d_, r));
  }
  int device = -1;
  r = d_.cuPointerGetAttribute(&device, kPointerAttrDeviceOrdinal, ptr);
  if (r != kCudaSuccess || device < 0) {
    return invalid_arg("{}: no device ordinal ({})", p, error_text(d_, r));
  }
  a.base = base;
  a.size = size;
  a.buffer_id = have_id ? id : 0;
  a.device = device;
  if (bytes > a.base + a.size - ptr) {
    return invalid_arg("{} bytes at {} pass the end of its CUDA allocation ({} bytes at {:#x})",
                       bytes, p, a.size, a.base);
  }
  std::lock_guard<std::mutex> lock(mu_);
  a.generation = next_generation_++;
  if (!have_id) return a;  // nothing to tell a reused address by: ask every time
  // Entries overlapping the new allocation belong to freed ones.
  for (auto it = by_base_.begin(); it != by_base_.end();) {
    const Allocation& o = it->second;
    if (o.base < a.base + a.size && a.base < o.base + o.size) {
      it = by_base_.erase(it);
      ++invalidations_;
    } else {
      ++it;
    }
  }
  if (by_base_.size() >= kMaxEntries) by_base_.erase(by_base_.begin());
  by_base_[a.base] = a;
  return a;
}

uint64_t AllocationCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

uint64_t AllocationCache::invalidations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return invalidations_;
}

size_t AllocationCache::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_base_.size();
}

}  // namespace gw::cuda
