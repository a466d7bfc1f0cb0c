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

#include "core/net/transport.h"
#include "core/status.h"

namespace gw::verbs {

// kUnsupported with "verbs unavailable: <reason>" where the library or a device is missing.
Result<std::unique_ptr<net::Transport>> make_verbs_transport(const net::TransportOptions& options);

// Makes "verbs" reachable through net::make_transport(). Idempotent.
Status register_verbs_backend();

}  // namespace gw::verbs
