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
//   ""            the address `route_src` (see route_source) when an interface that is up has it,
//                 is not docker* or veth*, and is not loopback unless route_src is (the store is
//                 on this host's loopback): the interface that routes to the store, as NCCL
//                 picks the one matching the route to its bootstrap address. Else the first
//                 interface that is up and not loopback, docker* or veth*; else loopback;
//   "eth,ib"      names starting with any listed prefix;
//   "^docker,lo"  names starting with none of the listed prefixes;
//   "=eth0"       exact names ("^=eth0" excludes exact names).
// With a spec, route_src chooses among the matching addresses when one of them is it.
// Only interfaces that are up count; IPv4 is preferred over IPv6 on the same interface, and
// IPv6 link-local addresses are used only when nothing else matches.
// Fails with kInvalidArg naming the spec when nothing matches.
Result<Interface> select_interface(std::string_view spec, const std::vector<Interface>& all,
                                   const sockaddr_storage* route_src = nullptr);

// The address this host sends from to reach `host` (name or numeric address), as the routing
// table says: a UDP socket connect()ed there (no packet leaves) and getsockname(). Port 0.
// kInvalidArg when the name does not resolve, kSystem when no route leads there.
Result<sockaddr_storage> route_source(const std::string& host);

// Fills `out` from getrandom(); falls back to the clock when the kernel refuses.
void fill_random(void* out, size_t size);
uint64_t random_u64();

// "rank 3" or "peer" when the rank is unknown (< 0).
std::string rank_name(int rank);

}  // namespace gw::net
