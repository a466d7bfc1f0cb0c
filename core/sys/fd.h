// Fd: the one owning wrapper of a file descriptor in gradwire.
//
// Ownership: an Fd closes its descriptor when destroyed or reset; it is move-only, and release()
// hands the descriptor back to the caller. A default-constructed Fd holds nothing (-1).
// Thread-compatible: one Fd is used by one thread at a time; the descriptor it holds may be used
// from several threads as the kernel allows.
#pragma once

#include <cstdint>
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

// Raises this process's descriptor soft limit (RLIMIT_NOFILE) to the hard one when it is lower:
// the usual soft limit of 1,024 is a few dozen ranks' worth of store and transport connections.
// Called whenever a store server or a tcp/shm transport is created. Thread-safe.
void raise_descriptor_limit();

// How long a connection that has not finished its hello (or request) keeps its place at an
// accepting socket whatever comes after it. Every listener caps such connections and a newcomer
// evicts the oldest; without this time a flood that reopens each evicted connection at once
// pushed out a real client whose first bytes came a few milliseconds after its connect, every
// time. While every place is younger, newcomers wait in the listen backlog: a flood is taken
// (cap) connections per grace period.
inline constexpr int64_t kEvictGraceMs = 20;

// What an accepting socket does when accept() fails with EMFILE or ENFILE (out of descriptors):
// it holds one spare descriptor, and shed() spends it to accept the waiting connection and close
// it at once (its connector sees a reset and retries until its deadline), then takes the spare
// back and pauses accepting for `backoff_ms`, so a caller that polls the socket does not spin on
// a listener that stays readable. Thread-compatible (one owner).
class AcceptShedder {
 public:
  explicit AcceptShedder(int64_t backoff_ms = 100);
  // Whether accepting is paused at `now_ns` (steady clock) after a shed.
  bool paused(int64_t now_ns) const { return now_ns < paused_until_ns_; }
  // Accepts one connection of `listen_fd` with the spare descriptor and closes it; pauses.
  void shed(int listen_fd, int64_t now_ns);
  uint64_t shed_count() const { return shed_count_; }
  // For a descriptor the owner must have now (a connection it already accepted needs one):
  // gives the spare back to the process; take_spare() reserves it again when it can.
  void release_spare() { spare_.reset(); }
  void take_spare();

 private:
  Fd spare_;
  int64_t backoff_ns_;
  int64_t paused_until_ns_ = 0;
  uint64_t shed_count_ = 0;
};

}  // namespace gw::sys
