// The DPDK backend's Transport over a protocol Engine (dpdk/engine.h): comms, requests and the
// connection handle, with no DPDK library involved. make_dpdk_transport (dpdk/dpdk_transport.h)
// puts it over the process's DPDK port; tests put it over MemSwitch ports, one per "host", on
// machines without DPDK too. It honours the whole contract of core/net/transport.h.
#pragma once

#include <memory>

#include "core/net/transport.h"
#include "core/status.h"
#include "dpdk/engine.h"

namespace gw::dpdk {

// A transport over `engine`. Requires options.timeout_ms > 0 (not checked here).
std::unique_ptr<net::Transport> make_engine_transport(std::shared_ptr<Engine> engine,
                                                      const net::TransportOptions& options);

// Engine settings from the config table (GW_DPDK_*), for a port with this MAC.
Result<EngineConfig> engine_config_from_table(const MacAddr& mac);

// Handle layout (docs/wire-dpdk.md): magic, version, MAC, IPv4, UDP port, listener id.
void encode_handle(const ConnectTarget& target, net::Handle* handle);
Result<ConnectTarget> decode_handle(const net::Handle& handle);

}  // namespace gw::dpdk
