// Small blocking-with-deadline TCP helpers for the rendezvous store (not the data path: that is
// core/net). Every call takes a deadline and returns kTimeout when it passes; a closed or reset
// connection is kPeer; other system call failures are kSystem with errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/store.h"

namespace gw::store_socket {

// Owns a file descriptor; closes it on destruction.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// "host:port", with brackets for IPv6 literals.
std::string format_addr(const std::string& host, int port);

// Parses "host:port" / "[v6]:port". Port must be 1..65535 unless allow_zero.
Status parse_addr(const std::string& text, bool allow_zero, std::string* host, int* port);

// Listens on host:port (port 0: the kernel picks; host "" or "0.0.0.0": every IPv4 address,
// "::": every address). SO_REUSEADDR is set. Returns the socket (non-blocking) and the port.
// On failure *failed_errno (if given) is the errno of the last failed call, 0 if none.
Result<Fd> listen_tcp(const std::string& host, int port, int* bound_port,
                      int* failed_errno = nullptr);

// One connection attempt, bounded by the deadline. The returned socket is blocking-free
// (O_NONBLOCK) with TCP_NODELAY set. A refused connection is kPeer.
Result<Fd> connect_tcp(const std::string& host, int port, Deadline deadline);

// Sends / receives exactly n bytes, waiting with poll() until the deadline. `what` names the
// operation and the peer for error messages.
Status send_all(int fd, const void* data, size_t n, Deadline deadline, std::string_view what);
Status recv_all(int fd, void* data, size_t n, Deadline deadline, std::string_view what);

// Milliseconds from now to the deadline, clamped to [0, INT32_MAX] (for poll()).
int ms_until(Deadline deadline);

}  // namespace gw::store_socket
