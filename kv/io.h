// The parameter server's sockets: plain TCP (docs/wire-kv.md says why not core/net), non-blocking
// descriptors driven by poll() with a deadline on every wait, and a stop flag that ends a read
// waiting for a peer that says nothing (checked every 50 ms), or a stop eventfd polled beside the
// socket, or neither where shutdown() ends the wait (no timer: an idle connection costs no
// wake-ups).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"
#include "kv/wire.h"

namespace gw::kv {

// A listening socket on every interface, port chosen by the kernel; *port gets it.
Result<sys::Fd> listen_any(int* port);
// "host:port" this process is reached at by peers that reach `route_host` (the store's host):
// the address the routing table sends from toward it (127.0.0.1 when it is empty or loopback).
std::string advertised_address(const std::string& route_host, int port);
// Connects to "host:port" (retrying refusals until the deadline).
Result<sys::Fd> connect_to(const std::string& addr, sys::Deadline deadline);
// Accepts one connection when one is waiting within `wait_ms`; an invalid Fd when none.
Result<sys::Fd> accept_one(int listen_fd, int wait_ms);

// Writes all of the iovecs: kTimeout at the deadline, kPeer when the peer is gone.
Status write_frame(int fd, const Header& h, const void* payload, sys::Deadline deadline);
// Reads exactly n bytes. kPeer on EOF (eof_ok: an EOF before the first byte returns kAborted so
// that a clean close is told apart), kTimeout at the deadline, kAborted once *stop is set or
// stop_fd (an eventfd, >= 0) is readable. With stop_fd, or with neither (the caller ends the wait
// by shutting the socket down), the wait sleeps until data, the deadline or the stop; with only
// *stop, it looks at it every 50 ms.
Status read_exact(int fd, void* buf, size_t n, sys::Deadline deadline,
                  const std::atomic<bool>* stop, bool eof_ok = false, int stop_fd = -1);
// Reads one frame's header and checks it (decode_header).
Status read_header(int fd, Header* h, sys::Deadline deadline, const std::atomic<bool>* stop,
                   int stop_fd = -1);

}  // namespace gw::kv
