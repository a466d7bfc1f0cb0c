// Rows of the RDMA verbs backend (verbs/, docs/verbs.md); see core/config.h. Also the checked
// tunables a verbs transport reads from its options' snapshot.
#pragma once

#include <string>

#include "core/config.h"
#include "core/config_snapshot.h"
#include "core/status.h"

namespace gw::verbs {
namespace verbs_config {

extern const config::Row kVerbsEmulate;
extern const config::Row kVerbsEmuAddr;
extern const config::Row kVerbsEmuDmabuf;
extern const config::Row kVerbsEmuLink;
extern const config::Row kIbHca;
extern const config::Row kIbGidIndex;
extern const config::Row kIbAddrFamily;
extern const config::Row kIbQpsPerConn;
extern const config::Row kIbTimeout;
extern const config::Row kIbRetryCnt;
extern const config::Row kIbRnrRetry;
extern const config::Row kIbTc;
extern const config::Row kIbSl;
extern const config::Row kIbMtu;
extern const config::Row kIbUseInline;
extern const config::Row kIbGdrFlush;
extern const config::Row kIbSysfsRoot;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace verbs_config

struct VerbsConfig {
  bool emulate = false;  // GW_VERBS_EMULATE: the emulator's table instead of libibverbs
  std::string hca;       // GW_IB_HCA (NCCL_IB_HCA syntax)
  int gid_index = -1;    // -1 = automatic
  int addr_family = 2;   // AF_INET or AF_INET6 for the automatic RoCE GID
  int qps_per_conn = 1;
  int timeout = 20;  // 4.096 us x 2^timeout
  int retry_cnt = 7;
  int rnr_retry = 7;  // 7 = infinite
  int traffic_class = 0;
  int service_level = 0;
  int mtu_bytes = 0;  // 0 = negotiate from both ports
  bool use_inline = true;
  // GW_IB_GPUDIRECT: how CUDA memory is registered with the NIC.
  enum class GpuDirect { kAuto, kDmabuf, kPeermem, kOff };
  GpuDirect gpudirect = GpuDirect::kAuto;
  bool gdr_flush = true;  // GW_IB_GDR_FLUSH: iflush reads back from received device memory
  std::string sysfs_root = "/sys";  // GW_IB_SYSFS_ROOT: where nvidia_peermem is looked for
};

// Reads and checks every row of `snapshot`; kInvalidArg names the variable and its range, or
// the snapshot's own problems (malformed values).
Result<VerbsConfig> load_verbs_config(const config::Snapshot& snapshot);

}  // namespace gw::verbs
