#include "verbs/device_select.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace gw::verbs {

Result<HcaSpec> HcaSpec::parse(std::string_view spec) {
  HcaSpec h;
  if (!spec.empty() && spec.front() == '^') {
    h.exclude_ = true;
    spec.remove_prefix(1);
  }
  if (!spec.empty() && spec.front() == '=') {
    h.exact_ = true;
    spec.remove_prefix(1);
  }
  while (!spec.empty()) {
    size_t comma = spec.find(',');
    std::string_view item = spec.substr(0, comma);
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    if (item.empty()) continue;
    Entry e;
    size_t colon = item.find(':');
    e.name = std::string(item.substr(0, colon));
    if (colon != std::string_view::npos) {
      std::string_view p = item.substr(colon + 1);
      auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), e.port);
      if (ec != std::errc() || ptr != p.data() + p.size() || e.port < 1 || e.port > 255) {
        return invalid_arg("GW_IB_HCA: bad port in '{}' (expected device[:port],...)", item);
      }
    }
    if (e.name.empty()) return invalid_arg("GW_IB_HCA: empty device name in '{}'", item);
    h.entries_.push_back(std::move(e));
  }
  return h;
}

bool HcaSpec::selects(std::string_view device, int port) const {
  if (entries_.empty()) return true;
  bool listed = false;
  for (const Entry& e : entries_) {
    bool name_ok = exact_ ? device == e.name : device.substr(0, e.name.size()) == e.name;
    if (name_ok && (e.port < 0 || e.port == port)) listed = true;
  }
  return exclude_ ? !listed : listed;
}

bool gid_is_unset(const ibv_gid& gid) {
  for (uint8_t b : gid.raw) {
    if (b != 0) return false;
  }
  return true;
}

bool gid_is_link_local(const ibv_gid& gid) {
  return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80;
}

bool gid_is_ipv4_mapped(const ibv_gid& gid) {
  static const uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(gid.raw, kPrefix, 12) == 0;
}

std::string format_gid(const ibv_gid& gid) {
  char buf[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, gid.raw, buf, sizeof(buf));
  return buf;
}

Result<int> choose_gid_index(bool ethernet, int configured, int family,
                             const std::vector<GidInfo>& table, std::string* why) {
  if (!ethernet) {
    int index = configured >= 0 ? configured : 0;
    *why = configured >= 0 ? "GW_IB_GID_INDEX" : "InfiniBand port: GID 0";
    return index;
  }
  if (configured >= 0) {
    for (const GidInfo& g : table) {
      if (g.index == configured && g.query_err == 0) {
        *why = "GW_IB_GID_INDEX";
        return configured;
      }
    }
    return invalid_arg("GW_IB_GID_INDEX={} is not a readable entry of the port's GID table",
                       configured);
  }
  int v1 = -1;
  int skipped = 0;
  for (const GidInfo& g : table) {
    if (g.query_err != 0 || gid_is_unset(g.gid) || gid_is_link_local(g.gid)) continue;
    if ((family == AF_INET) != gid_is_ipv4_mapped(g.gid)) continue;
    if (g.type_err != 0) {  // containers hide some gid_attrs entries (EINVAL): not usable
      ++skipped;
      continue;
    }
    if (g.type == "RoCE v2") {
      *why = fmt::format("automatic: first RoCE v2 {} GID", family == AF_INET ? "IPv4" : "IPv6");
      return g.index;
    }
    if (v1 < 0) v1 = g.index;
  }
  if (v1 >= 0) {
    *why = "automatic: no RoCE v2 GID of the address family, using RoCE v1";
    return v1;
  }
  return invalid_arg(
      "no usable RoCE GID of family {} ({} entries, {} with unreadable type); set GW_IB_GID_INDEX",
      family == AF_INET ? "AF_INET" : "AF_INET6", table.size(), skipped);
}

int mtu_bytes(int mtu_enum) { return mtu_enum >= 1 && mtu_enum <= 5 ? 128 << mtu_enum : 0; }

int mtu_from_bytes(int bytes) {
  for (int e = 1; e <= 5; ++e) {
    if ((128 << e) == bytes) return e;
  }
  return 0;
}

}  // namespace gw::verbs
