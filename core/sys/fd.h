// Fd: the one owning wrapper of a file descriptor in gradwire.
//
// Ownership: an Fd closes its descriptor when destroyed or reset; it is move-only, and release()
// hands the descriptor back to the caller. A default-constructed Fd holds nothing (-1).
// Thread-compatible: one Fd is used by one thread at a time; the descriptor it holds may be used
// from several threads as the kernel allows.
#pragma once

#include <utility>

#include "core/status.h"

namespace gw::sys {

class Fd {
 public:
  Fd() = default;
  // Takes ownership of `fd` (-1: nothing).
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Gives up ownership without closing; the Fd holds nothing afterwards.
  int release() { return std::exchange(fd_, -1); }
  // Closes the current descriptor (errors from close() are ignored: the descriptor is gone
  // either way) and takes ownership of `fd`.
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Sets O_NONBLOCK on `fd` (kSystem with errno text on failure).
Status set_nonblocking(int fd);

}  // namespace gw::sys
