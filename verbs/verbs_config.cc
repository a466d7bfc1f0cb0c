#include "verbs/verbs_config.h"

#include <sys/socket.h>

#include "core/config.h"

namespace gw::verbs {
namespace {

Result<int> ranged(config::Key key, int64_t lo, int64_t hi) {
  int64_t v = config::get_int(key);
  if (v < lo || v > hi) {
    return invalid_arg("{}={} is out of range ({}-{})", config::row(key).name, v, lo, hi);
  }
  return static_cast<int>(v);
}

}  // namespace

Result<VerbsConfig> load_verbs_config() {
  using config::Key;
  GW_RETURN_IF_ERROR(config::validate());
  VerbsConfig c;
  c.hca = config::get_string(Key::kIbHca);
  GW_ASSIGN_OR_RETURN(c.gid_index, ranged(Key::kIbGidIndex, -1, 255));
  std::string family = config::get_string(Key::kIbAddrFamily);
  if (family == "AF_INET") {
    c.addr_family = AF_INET;
  } else if (family == "AF_INET6") {
    c.addr_family = AF_INET6;
  } else {
    return invalid_arg("GW_IB_ADDR_FAMILY='{}': expected AF_INET or AF_INET6", family);
  }
  GW_ASSIGN_OR_RETURN(c.qps_per_conn, ranged(Key::kIbQpsPerConn, 1, 16));
  GW_ASSIGN_OR_RETURN(c.timeout, ranged(Key::kIbTimeout, 1, 31));
  GW_ASSIGN_OR_RETURN(c.retry_cnt, ranged(Key::kIbRetryCnt, 0, 7));
  GW_ASSIGN_OR_RETURN(c.rnr_retry, ranged(Key::kIbRnrRetry, 0, 7));
  GW_ASSIGN_OR_RETURN(c.traffic_class, ranged(Key::kIbTc, 0, 255));
  GW_ASSIGN_OR_RETURN(c.service_level, ranged(Key::kIbSl, 0, 15));
  GW_ASSIGN_OR_RETURN(c.mtu_bytes, ranged(Key::kIbMtu, 0, 4096));
  if (c.mtu_bytes != 0 && (c.mtu_bytes < 256 || (c.mtu_bytes & (c.mtu_bytes - 1)) != 0)) {
    return invalid_arg("GW_IB_MTU={}: expected 0 or one of 256, 512, 1024, 2048, 4096",
                       c.mtu_bytes);
  }
  c.use_inline = config::get_bool(Key::kIbUseInline);
  return c;
}

}  // namespace gw::verbs
