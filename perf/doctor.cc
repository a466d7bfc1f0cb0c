#include "perf/doctor.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "dpdk/af_xdp_args.h"

namespace gw::perf {
namespace {

namespace fs = std::filesystem;

// The first line of a sysfs file, without its newline; nullopt when it cannot be read.
std::optional<std::string> read_line(const fs::path& p) {
  std::ifstream f(p);
  if (!f) return std::nullopt;
  std::string s;
  std::getline(f, s);
  if (f.bad()) return std::nullopt;
  return s;
}

std::optional<long long> read_int(const fs::path& p) {
  auto s = read_line(p);
  if (!s) return std::nullopt;
  try {
    size_t used = 0;
    long long v = std::stoll(*s, &used, 0);
    return v;
  } catch (...) {
    return std::nullopt;
  }
}

// Sorted names of the entries of a directory (empty when it does not exist).
std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.push_back(e.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

fs::path under(const std::string& root, const char* path) { return fs::path(root) / path; }

// The largest IB MTU a RoCE port can use over a netdev MTU (RoCE v2 headers: Ethernet is outside
// the netdev MTU; IPv4/UDP/BTH/ICRC take up to 58 bytes of it).
int roce_active_mtu(long long netdev_mtu) {
  int best = 0;
  for (int m : {256, 512, 1024, 2048, 4096}) {
    if (m + 58 <= netdev_mtu) best = m;
  }
  return best;
}

// "6.1.0-18-amd64" -> {6, 1}
std::pair<int, int> kernel_version(const std::string& release) {
  int major = 0, minor = 0;
  if (std::sscanf(release.c_str(), "%d.%d", &major, &minor) < 1) return {0, 0};
  return {major, minor};
}

std::string human_bytes(uint64_t b) {
  if (b >= (uint64_t{1} << 30)) return fmt::format("{} GiB", b >> 30);
  if (b >= (uint64_t{1} << 20)) return fmt::format("{} MiB", b >> 20);
  return fmt::format("{} KiB", b >> 10);
}

struct Nic {
  std::string name;
  long long numa = -1;
};

void check_port(const std::string& root, const std::string& dev, const std::string& port,
                std::vector<Finding>* out) {
  const fs::path p = fs::path(root) / "class/infiniband" / dev / "ports" / port;
  const std::string where = fmt::format("{} port {}", dev, port);
  const std::string state = read_line(p / "state").value_or("?");
  const std::string phys = read_line(p / "phys_state").value_or("?");
  const std::string layer = read_line(p / "link_layer").value_or("?");
  const std::string rate = read_line(p / "rate").value_or("?");
  const bool active = state.find("ACTIVE") != std::string::npos;
  const bool roce = layer == "Ethernet";
  if (!active) {
    out->push_back({Severity::kWarn, "rdma",
                    fmt::format("{}: state {}, physical state {} ({})", where, state, phys, layer),
                    roce ? "bring the netdev behind it up and check its cable and switch port"
                         : "check the cable, and that a subnet manager (opensm, or the switch's) "
                           "runs on this fabric"});
    return;
  }
  out->push_back(
      {Severity::kOk, "rdma", fmt::format("{}: {}, {}, {}", where, state, layer, rate), ""});
  if (!roce) {
    const long long lid = read_int(p / "lid").value_or(0);
    const long long sm = read_int(p / "sm_lid").value_or(0);
    if (lid == 0) {
      out->push_back({Severity::kError, "ib",
                      fmt::format("{}: no LID assigned (lid 0x0, sm_lid {:#x})", where, sm),
                      "start a subnet manager (opensm) on the fabric; without a LID the port "
                      "cannot carry traffic"});
    } else {
      out->push_back(
          {Severity::kOk, "ib", fmt::format("{}: lid {:#x}, sm_lid {:#x}", where, lid, sm), ""});
    }
    return;
  }
  // RoCE: a RoCE v2 GID with an address, its netdev, and that netdev's MTU.
  std::string v2_ndev;
  int v2_index = -1, v1_only = 0;
  for (const auto& idx : entries(p / "gid_attrs/types")) {
    const std::string type = read_line(p / "gid_attrs/types" / idx).value_or("");
    const std::string gid = read_line(p / "gids" / idx).value_or("");
    const bool zero = gid.empty() || gid.find_first_not_of("0:") == std::string::npos;
    if (zero) continue;
    if (type == "RoCE v2") {
      if (v2_index < 0) {
        v2_index = std::atoi(idx.c_str());
        v2_ndev = read_line(p / "gid_attrs/ndevs" / idx).value_or("");
      }
    } else {
      ++v1_only;
    }
  }
  if (v2_index < 0) {
    out->push_back(
        {Severity::kError, "roce",
         fmt::format("{}: no RoCE v2 GID with an address ({} other GIDs)", where, v1_only),
         "give the netdev behind the port an IPv4 or IPv6 address: the RoCE v2 GIDs are "
         "made from it"});
    return;
  }
  out->push_back({Severity::kOk, "roce",
                  fmt::format("{}: RoCE v2 GID index {} on {}", where, v2_index, v2_ndev), ""});
  if (v2_ndev.empty()) return;
  const fs::path net = fs::path(root) / "class/net" / v2_ndev;
  const auto mtu = read_int(net / "mtu");
  const auto speed = read_int(net / "speed");
  if (!mtu) {
    out->push_back(
        {Severity::kWarn, "roce", fmt::format("{}: cannot read {}'s MTU", where, v2_ndev), ""});
    return;
  }
  const int active_mtu = roce_active_mtu(*mtu);
  const std::string speed_text = speed && *speed > 0 ? fmt::format(", {} Mb/s", *speed) : "";
  if (active_mtu < 4096) {
    out->push_back(
        {Severity::kWarn, "roce",
         fmt::format("{}: {} has MTU {}{}: RoCE runs with an active MTU of {}", where, v2_ndev,
                     *mtu, speed_text, active_mtu),
         fmt::format("set MTU 9000 (at least 4154) on {} and on the switch ports for a 4096-byte "
                     "RoCE MTU: fewer packets and completions per message",
                     v2_ndev)});
  } else {
    out->push_back(
        {Severity::kOk, "roce",
         fmt::format("{}: {} MTU {}{}: active MTU 4096", where, v2_ndev, *mtu, speed_text), ""});
  }
}

// An AF_XDP socket receives on one queue of its interface: frames the interface hashes to the
// queues the port does not hold (RSS) reach the kernel, not the port. A vdev that names no queue
// holds every one, up to kAfXdpMaxQueues; one that names a queue holds that one.
void check_af_xdp(const std::string& root, const std::string& eal_args, std::vector<Finding>* out) {
  using dpdk::kAfXdpMaxQueues;
  for (const dpdk::AfXdpVdev& p : dpdk::af_xdp_vdevs(dpdk::split_eal_args(eal_args))) {
    const fs::path queues = fs::path(root) / "class/net" / p.iface / "queues";
    if (p.iface.empty() || !fs::exists(fs::path(root) / "class/net" / p.iface)) {
      out->push_back({Severity::kError, "af_xdp",
                      fmt::format("GW_DPDK_EAL_ARGS: {} names interface '{}', which this host "
                                  "does not have",
                                  p.name, p.iface),
                      "give the vdev iface=<a network interface of this host> (ip link)"});
      continue;
    }
    size_t rx = 0;
    for (const auto& e : entries(queues)) rx += e.rfind("rx-", 0) == 0;
    if (rx > 1 && !p.names_queue) {
      const bool all = rx <= kAfXdpMaxQueues;
      out->push_back(
          {all ? Severity::kOk : Severity::kWarn, "af_xdp",
           all ? fmt::format("{} on {}: the port takes every one of its {} receive queues", p.name,
                             p.iface, rx)
               : fmt::format("{} on {}: the port takes {} of its {} receive queues: frames {} "
                             "steers to the others (its hash of each flow) go to the kernel, so "
                             "peers whose frames land there are never heard",
                             p.name, p.iface, kAfXdpMaxQueues, rx, p.iface),
           all ? ""
               : fmt::format("give {} at most {} queues (ethtool -L {} combined {})", p.iface,
                             kAfXdpMaxQueues, p.iface, kAfXdpMaxQueues)});
    } else if (rx > 1) {
      const std::string first = p.first_queue();
      out->push_back(
          {Severity::kWarn, "af_xdp",
           fmt::format("{} receives on queue {} of {}, which has {} receive queues: frames {} "
                       "steers to the others (its hash of each flow) go to the kernel, so peers "
                       "whose frames land there are never heard",
                       p.name, first, p.iface, rx, p.iface),
           fmt::format("name no queue in the vdev (the port then takes every one, up to {}), "
                       "give {} one queue (ethtool -L {} combined 1; a veth: rx 1 tx 1), or "
                       "steer the engine's UDP port to queue {} (ethtool -N {} flow-type udp4 "
                       "dst-port 47000 action {}; GW_DPDK_UDP_PORT if you changed it)",
                       kAfXdpMaxQueues, p.iface, p.iface, first, p.iface, first)});
    } else {
      out->push_back({Severity::kOk, "af_xdp",
                      fmt::format("{} on {}: one receive queue, every frame reaches the port",
                                  p.name, p.iface),
                      ""});
    }
  }
}

}  // namespace

DoctorInputs host_inputs() {
  DoctorInputs in;
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0) {
    in.memlock_bytes = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : rl.rlim_cur;
  }
  utsname u{};
  if (uname(&u) == 0) in.kernel_release = u.release;
  if (const char* e = std::getenv("GW_DPDK_EAL_ARGS")) in.dpdk_eal_args = e;  // main: config
  if (void* h = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL)) {
    in.have_dmabuf_symbol = dlsym(h, "ibv_reg_dmabuf_mr") != nullptr;
    dlclose(h);
  }
  return in;
}

std::vector<Finding> run_doctor(const DoctorInputs& in) {
  std::vector<Finding> out;
  // RDMA devices and their ports.
  const fs::path ib = under(in.root, "class/infiniband");
  std::vector<Nic> nics;
  for (const auto& dev : entries(ib)) {
    Nic n{dev, read_int(ib / dev / "device/numa_node").value_or(-1)};
    nics.push_back(n);
    const auto ports = entries(ib / dev / "ports");
    if (ports.empty()) {
      out.push_back({Severity::kWarn, "rdma", fmt::format("{}: no ports in sysfs", dev), ""});
    }
    for (const auto& port : ports) check_port(in.root, dev, port, &out);
  }
  if (nics.empty()) {
    out.push_back({Severity::kInfo, "rdma",
                   "no RDMA device (/sys/class/infiniband is empty or missing): the verbs backend "
                   "is unavailable, tcp (or dpdk) is used",
                   "load the NIC's RDMA driver (mlx5_ib, irdma, bnxt_re, efa, ...), or rdma_rxe "
                   "over a netdev to try RoCE without RDMA hardware"});
  }
  // Locked memory: every registered buffer counts against it.
  if (in.memlock_bytes != UINT64_MAX) {
    const bool low = in.memlock_bytes < (uint64_t{1} << 30);
    out.push_back({low ? Severity::kWarn : Severity::kOk, "memlock",
                   fmt::format("ulimit -l (RLIMIT_MEMLOCK) is {}", human_bytes(in.memlock_bytes)),
                   low ? "registering gradient buffers fails beyond it: raise it to unlimited "
                         "(limits.conf 'memlock unlimited', systemd LimitMEMLOCK=infinity, docker "
                         "--ulimit memlock=-1)"
                       : ""});
  } else {
    out.push_back({Severity::kOk, "memlock", "ulimit -l is unlimited", ""});
  }
  // Hugepages (DPDK's memory).
  const fs::path hp = under(in.root, "kernel/mm/hugepages");
  long long total_mib = 0, free_mib = 0;
  for (const auto& size : entries(hp)) {
    long long kb = 0;
    if (std::sscanf(size.c_str(), "hugepages-%lldkB", &kb) != 1) continue;
    total_mib += read_int(hp / size / "nr_hugepages").value_or(0) * kb / 1024;
    free_mib += read_int(hp / size / "free_hugepages").value_or(0) * kb / 1024;
  }
  if (total_mib == 0) {
    out.push_back({Severity::kInfo, "hugepages", "no hugepages reserved",
                   "the dpdk backend needs them (or runs with --no-huge, slower): echo 1024 > "
                   "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages"});
  } else {
    out.push_back({Severity::kOk, "hugepages",
                   fmt::format("{} MiB of hugepages reserved, {} MiB free", total_mib, free_mib),
                   ""});
  }
  // GPUs (the nvidia driver's PCI devices) and GPUDirect RDMA.
  const fs::path nv = under(in.root, "bus/pci/drivers/nvidia");
  std::vector<std::pair<std::string, long long>> gpus;
  for (const auto& e : entries(nv)) {
    if (e.find(':') == std::string::npos) continue;  // bind, unbind, new_id, module ...
    gpus.emplace_back(e, read_int(nv / e / "numa_node").value_or(-1));
  }
  if (!gpus.empty()) {
    const bool peermem = fs::exists(under(in.root, "module/nvidia_peermem"));
    const auto [maj, min] = kernel_version(in.kernel_release);
    const bool dmabuf_kernel = maj > 5 || (maj == 5 && min >= 12);
    if (peermem) {
      out.push_back({Severity::kOk, "gpudirect",
                     fmt::format("{} GPU(s); nvidia_peermem is loaded: GPU memory can be "
                                 "registered with the NIC",
                                 gpus.size()),
                     ""});
    } else if (dmabuf_kernel && in.have_dmabuf_symbol) {
      out.push_back({Severity::kOk, "gpudirect",
                     fmt::format("{} GPU(s); kernel {} and libibverbs with ibv_reg_dmabuf_mr: "
                                 "dma-buf registration of GPU memory is possible",
                                 gpus.size(), in.kernel_release),
                     "it needs the open GPU kernel modules (or a driver that exports dma-buf)"});
    } else {
      out.push_back(
          {Severity::kWarn, "gpudirect",
           fmt::format(
               "{} GPU(s) but no GPUDirect RDMA path: nvidia_peermem not loaded, {}", gpus.size(),
               !dmabuf_kernel ? fmt::format("kernel {} < 5.12 (no dma-buf)", in.kernel_release)
                              : "libibverbs without ibv_reg_dmabuf_mr"),
           "load nvidia-peermem (modprobe nvidia-peermem), or use a kernel >= 5.12 with "
           "rdma-core >= 34 for dma-buf; otherwise GPU buffers are staged through host memory"});
    }
    // NUMA: a GPU and the NICs on different nodes cross the inter-socket link.
    for (const auto& [bdf, node] : gpus) {
      for (const Nic& n : nics) {
        if (node >= 0 && n.numa >= 0 && node != n.numa) {
          out.push_back({Severity::kWarn, "numa",
                         fmt::format("GPU {} is on NUMA node {}, NIC {} on node {}", bdf, node,
                                     n.name, n.numa),
                         fmt::format("traffic between them crosses the CPU interconnect: give "
                                     "this GPU's rank a NIC on node {} (GW_IB_HCA) if there is one",
                                     node)});
        }
      }
    }
  }
  check_af_xdp(in.root, in.dpdk_eal_args, &out);
  out.push_back({Severity::kInfo, "pcie",
                 "PCIe ACS between GPUs and NICs is not checked (needs lspci -vvv as root)", ""});
  return out;
}

std::string_view severity_name(Severity s) {
  switch (s) {
    case Severity::kOk:
      return "ok";
    case Severity::kInfo:
      return "info";
    case Severity::kWarn:
      return "warn";
    case Severity::kError:
      return "error";
  }
  return "?";
}

std::string format_findings(const std::vector<Finding>& findings) {
  std::string out;
  for (const Finding& f : findings) {
    out += fmt::format("[{:5}] {}: {}\n", severity_name(f.severity), f.area, f.what);
    if (!f.fix.empty()) out += fmt::format("        -> {}\n", f.fix);
  }
  return out;
}

std::string findings_json(const std::vector<Finding>& findings) {
  nlohmann::json doc;
  doc["findings"] = nlohmann::json::array();
  int errors = 0, warnings = 0;
  for (const Finding& f : findings) {
    doc["findings"].push_back({{"severity", severity_name(f.severity)},
                               {"area", f.area},
                               {"what", f.what},
                               {"fix", f.fix}});
    errors += f.severity == Severity::kError;
    warnings += f.severity == Severity::kWarn;
  }
  doc["errors"] = errors;
  doc["warnings"] = warnings;
  return doc.dump(2) + "\n";
}

}  // namespace gw::perf
