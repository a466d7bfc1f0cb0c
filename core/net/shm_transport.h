// The shm backend: a ring of slots in a memfd shared by two processes of one host, with an
// AF_UNIX socket as handshake and liveness channel. Wire format: docs/wire-shm.md.
#pragma once

#include <memory>

#include "core/net/backend_registry.h"
#include "core/net/transport.h"

namespace gw::net {

// Reads GW_SHM_SLOT_SIZE / GW_SHM_NSLOTS; the host identity is TransportOptions::host_id, else
// GW_HOSTID, else hostname + boot id. Fails with kInvalidArg on out-of-range settings.
Result<std::unique_ptr<Transport>> make_shm_transport(const TransportOptions& options);

// The registry's entry for shm (core/net/backend_registry.h).
Backend shm_backend();

}  // namespace gw::net
