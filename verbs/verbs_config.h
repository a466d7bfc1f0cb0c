// The verbs backend's tunables: the one place verbs/ reads its rows of the config table.
#pragma once

#include <string>

#include "core/status.h"

namespace gw::verbs {

struct VerbsConfig {
  std::string hca;      // GW_IB_HCA (NCCL_IB_HCA syntax)
  int gid_index = -1;   // -1 = automatic
  int addr_family = 2;  // AF_INET or AF_INET6 for the automatic RoCE GID
  int qps_per_conn = 1;
  int timeout = 20;  // 4.096 us x 2^timeout
  int retry_cnt = 7;
  int rnr_retry = 7;  // 7 = infinite
  int traffic_class = 0;
  int service_level = 0;
  int mtu_bytes = 0;  // 0 = negotiate from both ports
  bool use_inline = true;
};

// Reads and checks every row; kInvalidArg names the variable and its range.
Result<VerbsConfig> load_verbs_config();

}  // namespace gw::verbs
