// Small helpers shared by the tcp and shm backends: address formatting, interface selection
// (NCCL_SOCKET_IFNAME syntax) and random bytes. Descriptors and time are core/sys's.
//
// Everything here is thread-compatible (no shared state) and never blocks.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gw::net {

// "10.0.0.2:41234" or "[fd00::2]:41234".
std::string format_sockaddr(const sockaddr* addr);

// One address of one interface, as getifaddrs() reports it.
struct Interface {
  std::string name;
  sockaddr_storage addr{};
  bool up = false;
  bool loopback = false;
};

// Every AF_INET / AF_INET6 address of every interface, in getifaddrs() order.
Result<std::vector<Interface>> list_interfaces();

// Picks one address according to an NCCL_SOCKET_IFNAME-style spec:
//   ""            first interface that is up and not loopback, else loopback;
//   "eth,ib"      names starting with any listed prefix;
//   "^docker,lo"  names starting with none of the listed prefixes;
//   "=eth0"       exact names ("^=eth0" excludes exact names).
// Only interfaces that are up count; IPv4 is preferred over IPv6 on the same interface, and
// IPv6 link-local addresses are used only when nothing else matches.
// Fails with kInvalidArg naming the spec when nothing matches.
Result<Interface> select_interface(std::string_view spec, const std::vector<Interface>& all);

// Fills `out` from getrandom(); falls back to the clock when the kernel refuses.
void fill_random(void* out, size_t size);
uint64_t random_u64();

// "rank 3" or "peer" when the rank is unknown (< 0).
std::string rank_name(int rank);

}  // namespace gw::net
