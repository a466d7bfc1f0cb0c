// gradwire-perf doctor: reads a host's RDMA and network set-up from sysfs and the process limits
// and prints findings, each with what to change (docs/verbs.md, "doctor").
//
// Everything is read below a sysfs root (default /sys, GW_IB_SYSFS_ROOT), so tests run it against
// fixture trees laid out as the kernel documents them
// (Documentation/ABI/stable/sysfs-class-infiniband, sysfs-class-net, sysfs-kernel-mm-hugepages).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gw::perf {

enum class Severity { kOk, kInfo, kWarn, kError };

struct Finding {
  Severity severity = Severity::kInfo;
  std::string area;  // rdma, roce, ib, memlock, hugepages, numa, gpudirect
  std::string what;  // what was found
  std::string fix;   // what to change ("" when nothing)
};

struct DoctorInputs {
  std::string root = "/";           // prefix of /sys (and /proc)
  uint64_t memlock_bytes = 0;       // RLIMIT_MEMLOCK's soft limit; UINT64_MAX = unlimited
  std::string kernel_release;       // uname -r, e.g. "6.1.0-18-amd64"
  bool have_dmabuf_symbol = false;  // libibverbs exports ibv_reg_dmabuf_mr (rdma-core >= 34)
  std::string dpdk_eal_args;        // GW_DPDK_EAL_ARGS: its net_af_xdp ports' interfaces
};

// The inputs of this host: sysfs at /sys, getrlimit, uname, dlsym in libibverbs.
DoctorInputs host_inputs();

std::vector<Finding> run_doctor(const DoctorInputs& in);

std::string_view severity_name(Severity s);
// One line per finding: "[warn] area: what\n        -> fix".
std::string format_findings(const std::vector<Finding>& f);
// {"findings": [{"severity", "area", "what", "fix"}...], "errors": N, "warnings": N}
std::string findings_json(const std::vector<Finding>& f);

}  // namespace gw::perf
