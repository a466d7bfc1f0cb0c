#include "core/net/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/sys/fd.h"
#include "core/sys/time.h"

namespace gw::net {

std::string format_sockaddr(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return fmt::format("{}:{}", text, ntohs(in->sin_port));
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return fmt::format("[{}]:{}", text, ntohs(in6->sin6_port));
  }
  return fmt::format("<family {}>", addr->sa_family);
}

Result<std::vector<Interface>> list_interfaces() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return system_error("getifaddrs", errno);
  std::vector<Interface> out;
  for (ifaddrs* it = list; it != nullptr; it = it->ifa_next) {
    if (it->ifa_addr == nullptr) continue;
    int family = it->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    Interface iface;
    iface.name = it->ifa_name;
    std::memcpy(&iface.addr, it->ifa_addr,
                family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6));
    iface.up = (it->ifa_flags & IFF_UP) != 0 && (it->ifa_flags & IFF_RUNNING) != 0;
    iface.loopback = (it->ifa_flags & IFF_LOOPBACK) != 0;
    out.push_back(std::move(iface));
  }
  freeifaddrs(list);
  return out;
}

namespace {

std::vector<std::string_view> split_commas(std::string_view text) {
  std::vector<std::string_view> parts;
  while (!text.empty()) {
    size_t comma = text.find(',');
    std::string_view part = text.substr(0, comma);
    if (!part.empty()) parts.push_back(part);
    if (comma == std::string_view::npos) break;
    text.remove_prefix(comma + 1);
  }
  return parts;
}

bool is_link_local(const Interface& iface) {
  if (iface.addr.ss_family != AF_INET6) return false;
  const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&iface.addr);
  return IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr);
}

// Lower is better: IPv4, then global IPv6, then link-local IPv6.
int address_rank(const Interface& iface) {
  if (iface.addr.ss_family == AF_INET) return 0;
  return is_link_local(iface) ? 2 : 1;
}

bool same_address(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b)->sin_addr.s_addr;
  }
  if (a.ss_family == AF_INET6) {
    return std::memcmp(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr,
                       &reinterpret_cast<const sockaddr_in6*>(&b)->sin6_addr,
                       sizeof(in6_addr)) == 0;
  }
  return false;
}

bool is_loopback_address(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    return (ntohl(reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    return IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);
  }
  return false;
}

// Container bridges and their veth ends: never the default, as in NCCL.
bool is_container_link(const Interface& iface) {
  return iface.name.rfind("docker", 0) == 0 || iface.name.rfind("veth", 0) == 0;
}

}  // namespace

Result<sockaddr_storage> route_source(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), "9", &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalid_arg("route to '{}': the name does not resolve ({})", host, gai_strerror(rc));
  }
  Status last = system_error(fmt::format("route to '{}'", host), EHOSTUNREACH);
  sockaddr_storage out{};
  bool found = false;
  for (addrinfo* a = res; a != nullptr && !found; a = a->ai_next) {
    sys::Fd fd(socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) {
      last = system_error(fmt::format("route to '{}': socket", host), errno);
      continue;
    }
    if (connect(fd.get(), a->ai_addr, a->ai_addrlen) != 0) {
      last = system_error(fmt::format("route to '{}': connect", host), errno);
      continue;
    }
    socklen_t len = sizeof(out);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&out), &len) != 0) {
      last = system_error(fmt::format("route to '{}': getsockname", host), errno);
      continue;
    }
    found = true;
  }
  freeaddrinfo(res);
  if (!found) return last;
  if (out.ss_family == AF_INET) reinterpret_cast<sockaddr_in*>(&out)->sin_port = 0;
  if (out.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6*>(&out)->sin6_port = 0;
  return out;
}

Result<Interface> select_interface(std::string_view spec, const std::vector<Interface>& all,
                                   const sockaddr_storage* route_src) {
  bool exclude = false;
  bool exact = false;
  std::string_view list = spec;
  if (!list.empty() && list.front() == '^') {
    exclude = true;
    list.remove_prefix(1);
  }
  if (!list.empty() && list.front() == '=') {
    exact = true;
    list.remove_prefix(1);
  }
  std::vector<std::string_view> names = split_commas(list);
  if (!spec.empty() && names.empty()) {
    return invalid_arg("GW_SOCKET_IFNAME '{}' lists no interface name", spec);
  }

  auto matches = [&](const Interface& iface) {
    if (!iface.up) return false;
    if (spec.empty()) return true;
    bool listed = false;
    for (std::string_view name : names) {
      if (exact ? iface.name == name : iface.name.compare(0, name.size(), name) == 0) {
        listed = true;
        break;
      }
    }
    return listed != exclude;
  };

  std::vector<const Interface*> candidates;
  for (const Interface& iface : all) {
    if (matches(iface)) candidates.push_back(&iface);
  }
  if (spec.empty()) {
    // Default: no container links (unless nothing else is up).
    if (std::any_of(candidates.begin(), candidates.end(),
                    [](const Interface* c) { return !is_container_link(*c); })) {
      std::erase_if(candidates, [](const Interface* c) { return is_container_link(*c); });
    }
  }
  if (route_src != nullptr) {
    // The interface that routes to the store; loopback only when the store is on loopback.
    const bool store_on_loopback = is_loopback_address(*route_src);
    for (const Interface* c : candidates) {
      if (same_address(c->addr, *route_src) && (!c->loopback || store_on_loopback)) return *c;
    }
  }
  if (spec.empty()) {
    // Loopback only when nothing else is up.
    bool have_other = false;
    for (const Interface* c : candidates) have_other |= !c->loopback;
    if (have_other) std::erase_if(candidates, [](const Interface* c) { return c->loopback; });
  }
  const Interface* best = nullptr;
  if (!candidates.empty()) {
    // The first interface (getifaddrs order) with a routable address, else the first one.
    std::string name = candidates.front()->name;
    for (const Interface* c : candidates) {
      if (!is_link_local(*c)) {
        name = c->name;
        break;
      }
    }
    for (const Interface* c : candidates) {
      if (c->name == name && (best == nullptr || address_rank(*c) < address_rank(*best))) best = c;
    }
  }
  if (best == nullptr) {
    // One entry per interface, though getifaddrs lists one per address.
    std::string seen;
    std::vector<std::string> named;
    for (const Interface& iface : all) {
      if (std::find(named.begin(), named.end(), iface.name) != named.end()) continue;
      named.push_back(iface.name);
      seen += fmt::format("{}{}{}", seen.empty() ? "" : ", ", iface.name, iface.up ? "" : "(down)");
    }
    return invalid_arg("GW_SOCKET_IFNAME '{}' matches no interface that is up (have: {})", spec,
                       seen);
  }
  return *best;
}

void fill_random(void* out, size_t size) {
  auto* bytes = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < size) {
    ssize_t n = getrandom(bytes + got, size - got, GRND_NONBLOCK);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  // Fallback: mix the clock and the pid; uniqueness, not secrecy, is what callers need here.
  uint64_t x = static_cast<uint64_t>(sys::now_ns()) ^ (static_cast<uint64_t>(getpid()) << 32);
  for (; got < size; ++got) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    bytes[got] = static_cast<uint8_t>(x);
  }
}

uint64_t random_u64() {
  uint64_t v = 0;
  fill_random(&v, sizeof(v));
  return v;
}

std::string rank_name(int rank) { return rank >= 0 ? fmt::format("rank {}", rank) : "peer"; }

}  // namespace gw::net
