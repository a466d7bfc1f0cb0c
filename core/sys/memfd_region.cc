#include "core/sys/memfd_region.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

namespace gw::sys {
namespace {

Result<void*> map_shared(int fd, size_t size) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return system_error(fmt::format("mmap {} bytes", size), errno);
  return p;
}

}  // namespace

MemfdRegion::MemfdRegion(MemfdRegion&& other) noexcept
    : fd_(std::move(other.fd_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

MemfdRegion& MemfdRegion::operator=(MemfdRegion&& other) noexcept {
  if (this != &other) {
    unmap();
    fd_ = std::move(other.fd_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MemfdRegion::~MemfdRegion() { unmap(); }

void MemfdRegion::unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

Result<MemfdRegion> MemfdRegion::create(std::string_view name, size_t size) {
  if (size == 0) return invalid_arg("memfd '{}': size must be positive", name);
  std::string n(name);
  Fd fd(::memfd_create(n.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd.valid()) return system_error(fmt::format("memfd_create '{}'", name), errno);
  if (::ftruncate(fd.get(), static_cast<off_t>(size)) != 0) {
    return system_error(fmt::format("memfd '{}': ftruncate {} bytes", name, size), errno);
  }
  if (::fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return system_error(fmt::format("memfd '{}': F_ADD_SEALS", name), errno);
  }
  GW_ASSIGN_OR_RETURN(void* p, map_shared(fd.get(), size));
  return MemfdRegion(std::move(fd), p, size);
}

Result<MemfdRegion> MemfdRegion::map(Fd fd, size_t expected_size) {
  if (!fd.valid()) return invalid_arg("map of a memory region: no descriptor");
  if (expected_size == 0) return invalid_arg("map of a memory region: size must be positive");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return system_error("fstat of a received region", errno);
  if (static_cast<uint64_t>(st.st_size) != expected_size) {
    return peer_error("received region is {} bytes, expected {}", st.st_size, expected_size);
  }
  GW_ASSIGN_OR_RETURN(void* p, map_shared(fd.get(), expected_size));
  return MemfdRegion(std::move(fd), p, expected_size);
}

}  // namespace gw::sys
