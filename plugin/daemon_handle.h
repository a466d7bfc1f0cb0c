// The listen handle of the NCCL plugin in daemon mode (GW_DAEMON set; plugin/daemon_transport.h):
// what NCCL carries from the receiving rank to the sending one through its bootstrap, naming the
// listener's endpoint at its host's gradwired. 128 bytes (NCCL_NET_HANDLE_MAXSIZE), little-endian:
//
//   [0, 4)    magic "GWDH"
//   [4, 6)    version (2: messages of 4 MiB or more travel in chunks, plugin/daemon_transport.h
//             "Pipelining"; a plugin that cuts them otherwise, or not at all (version 1), is
//             refused at connect rather than misreading the chunks)
//   [6, 8)    length of the store address below (0: none, a listener of an older plugin)
//   [8, 16)   the listener's host: FNV-1a 64 of its host identity (core/bootstrap.h)
//   [16, 32)  the endpoint's nonce (random, from the listener): with the job token it keys the
//             connection in the daemon, so only a process of the same job meets it there
//   [32, 36)  the listener's pid (for messages)
//   [36, 100) the store the listening process hosts for the cross-host leg, "host:port" (host
//             an IPv4 or IPv6 literal, no brackets; port 1..65535): a connector of another
//             host announces itself there and both daemons of the connection's job meet there
//             (plugin/daemon_transport.h); it requires the job token
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
inline constexpr size_t kStoreAddressMax = 64;

struct DaemonHandle {
  static constexpr uint32_t kMagic = 0x48445747;  // "GWDH" as little-endian bytes
  static constexpr uint16_t kVersion = 2;
  uint64_t host = 0;
  std::array<uint8_t, 16> nonce{};
  uint32_t pid = 0;
  std::string store;  // "host:port", at most kStoreAddressMax bytes; "" for none
};

// "host:port" -> its parts: kInvalidArg unless the host is non-empty and made of address
// characters (hex digits, '.', ':', '%' and letters of a scope name) and the port is 1..65535.
Status split_store_address(const std::string& address, std::string* host, int* port);

// FNV-1a 64 of a host identity, as the handle carries it.
uint64_t host_hash(const std::string& host_identity);

// Writes the 128 bytes of h to out (kInvalidArg when its store address is too long or not
// host:port).
Status encode_daemon_handle(const DaemonHandle& h, uint8_t* out);
// kInvalidArg naming what is wrong: short, another magic (a direct-mode listener), a version this
// plugin does not know, an address longer than its room or not host:port, or non-zero padding.
Result<DaemonHandle> decode_daemon_handle(const uint8_t* p, size_t n);

}  // namespace gw::plugin
