// The DPDK backend of core/net: a reliable transport over UDP/IPv4 frames on a DPDK port.
//
// make_dpdk_transport() initialises EAL once per process (GW_DPDK_EAL_ARGS), opens the port
// (GW_DPDK_PORT) and starts the process-wide protocol engine on first use; every Transport it
// returns shares that engine, so listen/connect work within one process (loopback net_ring) and
// across hosts (af_xdp, af_packet, memif, a PCI NIC). It honours the whole contract of
// core/net/transport.h. Fails with kUnsupported when EAL or the port cannot start.
#pragma once

#include <memory>

#include "core/net/transport.h"
#include "core/status.h"
#include "dpdk/engine.h"

namespace gw::dpdk {

Result<std::unique_ptr<net::Transport>> make_dpdk_transport(const net::TransportOptions& options);

// A transport over a given engine (tests run engines over MemSwitch ports, one per "host").
std::unique_ptr<net::Transport> make_engine_transport(std::shared_ptr<Engine> engine,
                                                      const net::TransportOptions& options);

// Engine settings from the configuration (dpdk/dpdk_config.h), for a port with this MAC.
Result<EngineConfig> engine_config_from_table(const MacAddr& mac);

// The process-wide engine over the DPDK port (created on first call).
Result<std::shared_ptr<Engine>> process_engine();

// Handle layout (docs/wire-dpdk.md): magic, version, MAC, IPv4, UDP port, listener id.
void encode_handle(const ConnectTarget& target, net::Handle* handle);
Result<ConnectTarget> decode_handle(const net::Handle& handle);

}  // namespace gw::dpdk
