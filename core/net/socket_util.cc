#include "core/net/socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace

Result<Interface> select_interface(std::string_view spec, const std::vector<Interface>& all) {
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
    // Default: loopback only when nothing else is up.
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
    std::string seen;
    for (const Interface& iface : all) {
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
