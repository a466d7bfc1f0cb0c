// The DPDK side of the backend: EAL initialisation (once per process) and a FramePort over one
// ethdev: a PCI NIC on a real host, or net_af_xdp / net_af_packet / net_memif / net_ring here.
//
// Thread-safety: eal_init_once and open_dpdk_port may be called from any thread; the returned
// port is used by one engine (which serialises its calls).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "dpdk/frame_port.h"

namespace gw::dpdk {

struct DpdkPortOptions {
  std::string eal_args;  // GW_DPDK_EAL_ARGS; empty = kDefaultEalArgs
  std::string port;      // "" = first ethdev the EAL args created, else a loopback net_ring;
                         // "ring" = a loopback net_ring; a number = that port id
  size_t mtu = 9000;
  int nb_mbufs = 8192;
  int nb_desc = 1024;
  std::string zero_copy = "auto";  // GW_DPDK_ZERO_COPY: auto, on, off
};

inline constexpr const char* kDefaultEalArgs =
    "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error";

// Splits the EAL argument string on whitespace (no quoting) and runs rte_eal_init once. Later
// calls return the first call's result, whatever their arguments (EAL cannot re-initialise).
// The calling thread's CPU affinity is restored afterwards (EAL pins it to its main lcore).
Status eal_init_once(const std::string& args);

Result<std::unique_ptr<FramePort>> open_dpdk_port(const DpdkPortOptions& options);

}  // namespace gw::dpdk
