// The tcp backend: striped, non-blocking TCP sockets, progressed on the caller's thread, or with
// GW_SOCKET_NTHREADS = T > 0 by T I/O worker threads per comm (socket s -> thread s % T).
// Wire format: docs/wire-tcp.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/net/backend_registry.h"
#include "core/net/transport.h"

namespace gw::net {

// Reads GW_SOCKET_IFNAME / GW_SOCKET_NSOCKS / GW_SOCKET_NTHREADS / GW_SOCKET_BUFSIZE /
// GW_SOCKET_CHUNK (and TransportOptions::socket_threads / socket_nsocks for auto); fails with
// kInvalidArg when one is out of range or no interface matches.
Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportOptions& options);

// The registry's entry for tcp (core/net/backend_registry.h).
Backend tcp_backend();

// The striping rule: a message of `size` bytes on `nsocks` sockets with stripe unit `unit` puts
// bytes [begin, end) on socket `index`. Part size = max(unit, ceil(size / nsocks)); socket i
// carries [i * part, min(size, (i + 1) * part)), so small messages use socket 0 only.
struct StripeRange {
  size_t begin = 0;
  size_t end = 0;
};
StripeRange tcp_stripe(size_t size, int nsocks, size_t unit, int index);

}  // namespace gw::net
