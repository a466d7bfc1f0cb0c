// The listen handle of the NCCL plugin in daemon mode (GW_DAEMON set; plugin/daemon_transport.h):
// what NCCL carries from the receiving rank to the sending one through its bootstrap, naming the
// listener's endpoint at its host's gradwired. 128 bytes (NCCL_NET_HANDLE_MAXSIZE), little-endian:
//
//   [0, 4)    magic "GWDH"
//   [4, 6)    version (1)
//   [6, 8)    length of the daemon address below (0 today: the listener's daemon is the host's)
//   [8, 16)   the listener's host: FNV-1a 64 of its host identity (core/bootstrap.h)
//   [16, 32)  the endpoint's nonce (random, from the listener): with the job token it keys the
//             connection in the daemon, so only a process of the same job meets it there
//   [32, 36)  the listener's pid (for messages)
//   [36, 100) the listener's daemon address, for the cross-host leg (a later step)
//   [100, 128) zero
//
// A handle from a direct-mode listener (another magic) is refused with a message saying so.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace gw::plugin {

inline constexpr size_t kDaemonHandleBytes = 128;
inline constexpr size_t kDaemonAddressMax = 64;

struct DaemonHandle {
  static constexpr uint32_t kMagic = 0x48445747;  // "GWDH" as little-endian bytes
  static constexpr uint16_t kVersion = 1;
  uint64_t host = 0;
  std::array<uint8_t, 16> nonce{};
  uint32_t pid = 0;
  std::string daemon;  // at most kDaemonAddressMax bytes
};

// FNV-1a 64 of a host identity, as the handle carries it.
uint64_t host_hash(const std::string& host_identity);

// Writes the 128 bytes of h to out (kInvalidArg when its daemon address is too long).
Status encode_daemon_handle(const DaemonHandle& h, uint8_t* out);
// kInvalidArg naming what is wrong: short, another magic (a direct-mode listener), a version this
// plugin does not know, an address longer than its room, or non-zero padding.
Result<DaemonHandle> decode_daemon_handle(const uint8_t* p, size_t n);

}  // namespace gw::plugin
