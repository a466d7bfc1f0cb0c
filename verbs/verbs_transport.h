// The RDMA verbs backend of the Transport interface (core/net/transport.h).
//
// Connection set-up: the receiver listens on a TCP socket whose address is the Handle; the
// sender connects, presents the job token and its queue pairs, the receiver answers with its
// own, both move their RC QPs INIT -> RTR -> RTS, and the sender confirms. The socket then stays
// open only to notice a peer that closes or dies sooner than RC retries would (about 30 s with
// the default timeout 20 and retry count 7). Data path (docs/verbs.md): the receiver RDMA-WRITEs
// a clear-to-send record (buffer address, rkey, capacity, tag) into the sender's FIFO; the
// sender RDMA-WRITEs the message WITH_IMM, striped over GW_IB_QPS_PER_CONN queue pairs, each
// immediate carrying its stripe's size.
#pragma once

#include <memory>

#include "core/net/backend_registry.h"
#include "core/net/transport.h"
#include "core/status.h"

namespace gw::verbs {

// kUnsupported with "verbs unavailable: <reason>" where the library or a device is missing.
// Tunables come from options.config (captured now when empty).
Result<std::unique_ptr<net::Transport>> make_verbs_transport(const net::TransportOptions& options);

// Ok when GW_VERBS_EMULATE=1 (read now) or when libibverbs.so.1 loads and lists a device (looked
// for once per process); otherwise kUnsupported with the reason ("libibverbs.so.1 not found
// (...)", "no RDMA devices (...)"). Opens nothing.
Status probe_verbs();

// The registry's entry for verbs: `auto` picks it for peers on other hosts when the probe
// passes, ahead of tcp, and never for peers on this host (shm or tcp serve those). Registered by
// gw_backends (cmake/backends.cmake).
net::Backend verbs_backend();

}  // namespace gw::verbs
