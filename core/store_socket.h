// Small blocking-with-deadline TCP helpers for the rendezvous store (not the data path: that is
// core/net). Every call takes a deadline and returns kTimeout when it passes; a closed or reset
// connection is kPeer; other system call failures are kSystem with errno text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"

namespace gw::store_socket {

using sys::Deadline;

// "host:port", with brackets for IPv6 literals.
std::string format_addr(const std::string& host, int port);

// Parses "host:port" / "[v6]:port". Port must be 1..65535 unless allow_zero.
Status parse_addr(const std::string& text, bool allow_zero, std::string* host, int* port);

// Listens on host:port (port 0: the kernel picks; host "" or "0.0.0.0": every IPv4 address,
// "::": every address). SO_REUSEADDR is set. Returns the socket (non-blocking) and the port.
// On failure *failed_errno (if given) is the errno of the last failed call, 0 if none.
Result<sys::Fd> listen_tcp(const std::string& host, int port, int* bound_port,
                           int* failed_errno = nullptr);

// One connection attempt, bounded by the deadline. The returned socket is blocking-free
// (O_NONBLOCK) with TCP_NODELAY set. A refused connection is kPeer.
Result<sys::Fd> connect_tcp(const std::string& host, int port, Deadline deadline);

// Sends / receives exactly n bytes, waiting with poll() until the deadline. `what` names the
// operation and the peer for error messages.
Status send_all(int fd, const void* data, size_t n, Deadline deadline, std::string_view what);
Status recv_all(int fd, void* data, size_t n, Deadline deadline, std::string_view what);

}  // namespace gw::store_socket
