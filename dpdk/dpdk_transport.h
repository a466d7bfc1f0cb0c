// The DPDK backend of core/net: a reliable transport over UDP/IPv4 frames on a DPDK port.
//
// make_dpdk_transport() initialises EAL once per process (GW_DPDK_EAL_ARGS), opens the port
// (GW_DPDK_PORT) and starts the process-wide protocol engine on first use; every Transport it
// returns shares that engine, so listen/connect work within one process (loopback net_ring) and
// across hosts (af_xdp, af_packet, memif, a PCI NIC). Fails with kUnsupported when EAL or the
// port cannot start. It opens the port through the DPDK port module (dpdk/port_module.h,
// libgradwire_dpdk.so, the only part of dpdk/ that links libdpdk), so this file and the protocol
// (engine, wire, engine_transport: gw_dpdk_proto) need no DPDK library.
#pragma once

#include <memory>

#include "core/net/backend_registry.h"
#include "core/net/transport.h"
#include "core/status.h"
#include "dpdk/engine.h"

namespace gw::dpdk {

Result<std::unique_ptr<net::Transport>> make_dpdk_transport(const net::TransportOptions& options);

// The process-wide engine over the DPDK port (created on first call).
Result<std::shared_ptr<Engine>> process_engine();

// The registry's entry for dpdk: used only when asked for by name (it owns a port), never by
// auto; unavailable, with the reason, where the port module is not installed. Registered by
// gw_backends (cmake/backends.cmake).
net::Backend dpdk_backend();

}  // namespace gw::dpdk
