// Device, port and GID choice for the verbs backend: pure functions, tested on fixtures.
#pragma once

#include <infiniband/verbs.h>

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gw::verbs {

// GW_IB_HCA, in NCCL_IB_HCA's syntax: "mlx5_0:1,mlx5_1" selects devices whose names start with
// an entry (and only the given port when one is named); a leading '^' excludes the listed ones
// instead; a leading '=' (after '^' if both) compares whole names. Empty selects everything.
class HcaSpec {
 public:
  static Result<HcaSpec> parse(std::string_view spec);
  bool selects(std::string_view device, int port) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string name;
    int port = -1;  // -1: any port
  };
  bool exclude_ = false;
  bool exact_ = false;
  std::vector<Entry> entries_;
};

// What one GID table index holds, as the device and sysfs report it.
struct GidInfo {
  int index = 0;
  int query_err = 0;  // errno of ibv_query_gid (0 = ok)
  ibv_gid gid{};
  int type_err = 0;  // errno of the gid_attrs/types read (EINVAL in containers)
  std::string type;  // "RoCE v2", "IB/RoCE v1"
};

bool gid_is_unset(const ibv_gid& gid);
bool gid_is_link_local(const ibv_gid& gid);
bool gid_is_ipv4_mapped(const ibv_gid& gid);
std::string format_gid(const ibv_gid& gid);

// The GID index to use on a port. InfiniBand: `configured` or 0. Ethernet (RoCE): `configured`
// when >= 0, else the first RoCE v2 GID of `family` (AF_INET: IPv4-mapped) that is neither unset
// nor link-local, skipping indexes whose type cannot be read; else the first such RoCE v1 GID.
// `why` receives a sentence on how it was chosen, for the INFO line.
Result<int> choose_gid_index(bool ethernet, int configured, int family,
                             const std::vector<GidInfo>& table, std::string* why);

// ibv_mtu enum <-> bytes; mtu_from_bytes(0) is 0.
int mtu_bytes(int mtu_enum);
int mtu_from_bytes(int bytes);

}  // namespace gw::verbs
