// MemfdRegion: shared memory that lives only as a descriptor and its mappings (memfd_create):
// nothing in any filesystem to leak when a process dies. One process creates it, passes the
// descriptor over a unix socket (core/sys/unix_socket.h), and the peer maps it.
//
// Ownership: a region owns its mapping (unmapped on destruction) and, until close_fd(), its
// descriptor. Move-only. The mapping stays valid after close_fd(); the memory is freed when the
// last mapping and descriptor in any process are gone.
// Thread-compatible; the mapped bytes themselves are shared with no synchronisation of their own.
// Errors: kSystem with errno text for failed system calls; kPeer for a received descriptor that
// is not what the sender promised.
#pragma once

#include <cstddef>
#include <string_view>

#include "core/status.h"
#include "core/sys/fd.h"

namespace gw::sys {

class MemfdRegion {
 public:
  MemfdRegion() = default;
  MemfdRegion(MemfdRegion&& other) noexcept;
  MemfdRegion& operator=(MemfdRegion&& other) noexcept;
  MemfdRegion(const MemfdRegion&) = delete;
  MemfdRegion& operator=(const MemfdRegion&) = delete;
  ~MemfdRegion();

  // A zero-filled region of `size` (> 0) bytes, mapped read/write and shared. `name` shows in
  // /proc/PID/fd as "/memfd:NAME" (for people debugging; it need not be unique). Its size is
  // sealed (F_SEAL_SHRINK | F_SEAL_GROW): no process can truncate it under a mapping, which
  // would turn accesses into SIGBUS.
  static Result<MemfdRegion> create(std::string_view name, size_t size);

  // Maps a descriptor received from a peer, read/write and shared, taking ownership of it.
  // Refuses (kPeer) a descriptor whose size is not `expected_size`, so a peer cannot make this
  // process touch bytes past the end of the file.
  static Result<MemfdRegion> map(Fd fd, size_t expected_size);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  bool mapped() const { return data_ != nullptr; }
  // The descriptor to pass to a peer; -1 after close_fd().
  int fd() const { return fd_.get(); }
  // Closes the descriptor once it has been passed on (or is not needed); the mapping remains.
  void close_fd() { fd_.reset(); }

 private:
  MemfdRegion(Fd fd, void* data, size_t size) : fd_(std::move(fd)), data_(data), size_(size) {}
  void unmap();

  Fd fd_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace gw::sys
