// NetPlugin's devices: which backend the plugin opens (GW_PLUGIN_BACKEND, auto), how its tcp comms
// are threaded, and what getProperties reports for the device (name, PCI path, speed, guid,
// pointer support), read from sysfs once per process.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/config.h"
#include "core/core_config.h"
#include "core/net/auto_backend.h"
#include "core/net/backend_registry.h"
#include "core/net/tcp_config.h"
#include "plugin/net_plugin.h"
#include "plugin/plugin_config.h"
#ifdef GW_PLUGIN_DAEMON
#include "daemon/daemon_config.h"
#include "plugin/daemon_transport.h"
#endif

namespace gw::plugin {

namespace {

namespace fs = std::filesystem;

// The token every rank presents in the handshake when GW_JOB_TOKEN is unset. NCCL gives a plugin
// no shared secret, so without GW_JOB_TOKEN connections are only checked for "is gradwire",
// not authenticated (docs/nccl-plugin.md says so).
constexpr const char* kDefaultJobToken = "gradwire-nccl-plugin-default-token";

std::string read_line(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (in) std::getline(in, line);
  return line;
}

// "eth0:10.0.0.1,eth1:10.0.1.1" (or space separated) -> {"eth0", "eth1"}; names without a
// /sys/class/net entry are dropped.
std::vector<std::string> interface_names(const std::string& described) {
  std::vector<std::string> names;
  std::string token;
  std::istringstream in(described);
  while (std::getline(in, token, ',')) {
    std::istringstream words(token);
    std::string word;
    while (words >> word) {
      std::string name = word.substr(0, word.find(':'));
      std::error_code ec;
      if (!name.empty() && fs::exists(fs::path("/sys/class/net") / name, ec) &&
          std::find(names.begin(), names.end(), name) == names.end()) {
        names.push_back(name);
      }
    }
  }
  return names;
}

std::string pci_path_of(const std::string& ifname) {
  std::error_code ec;
  fs::path dev = fs::path("/sys/class/net") / ifname / "device";
  if (!fs::exists(dev, ec)) return "";
  fs::path real = fs::canonical(dev, ec);
  if (ec) return "";
  // Virtual functions such as virtio sit below their PCI device (.../0000:00:03.0/virtio2);
  // NCCL's topology wants the directory named by the PCI address.
  for (fs::path p = real; !p.empty() && p != p.root_path(); p = p.parent_path()) {
    std::string b = p.filename().string();
    if (b.size() == 12 && b[4] == ':' && b[7] == ':' && b[10] == '.') return p.string();
  }
  return "";
}

int speed_of(const std::string& ifname) {
  // Virtual interfaces (lo, veth) have no speed or report -1; NCCL treats <= 0 as 10 Gbps.
  std::string s = read_line(fs::path("/sys/class/net") / ifname / "speed");
  char* end = nullptr;
  long v = s.empty() ? 0 : std::strtol(s.c_str(), &end, 10);
  return (v > 0 && v < INT_MAX) ? static_cast<int>(v) : 0;
}

uint64_t guid_of(const std::string& ifname) {
  // The MAC address identifies the NIC port; interfaces of one port share bandwidth.
  std::string mac = read_line(fs::path("/sys/class/net") / ifname / "address");
  uint64_t guid = 0;
  for (char c : mac) {
    int v = (c >= '0' && c <= '9')   ? c - '0'
            : (c >= 'a' && c <= 'f') ? c - 'a' + 10
            : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                                     : -1;
    if (v >= 0) guid = (guid << 4) | static_cast<uint64_t>(v);
  }
  return guid;
}

std::string job_token() {
  std::string token = config::get_string(core_config::kJobToken);
  return token.empty() ? kDefaultJobToken : token;
}

// One of NCCL's own Socket-transport knobs: nullopt when unset or <= 0 (NCCL's "auto" values),
// kInvalidArg when it is not a number. These are NCCL's variables, not gradwire tunables, so
// they are read here and not through the configuration rows.
Result<std::optional<int>> nccl_socket_knob(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::optional<int>();
  char* end = nullptr;
  errno = 0;
  long n = std::strtol(v, &end, 10);
  if (*v == '\0' || end == nullptr || *end != '\0' || errno != 0) {
    return invalid_arg("{}='{}' is not a number", name, v);
  }
  if (n <= 0) return std::optional<int>();
  return std::optional<int>(static_cast<int>(std::min<long>(n, 16)));
}

// How many I/O threads and sockets each tcp comm gets when GW_SOCKET_NTHREADS / GW_SOCKET_NSOCKS
// are 0 (auto); an explicit GW_ value wins inside make_tcp_transport.
//
// Without our own threads NCCL's single proxy thread would run every kernel copy of every send
// and receive of every connection, which caps bandwidth below NCCL's Socket transport on a
// many-core GPU host: Socket hands a connection's socket I/O to helper threads
// (NCCL_SOCKET_NTHREADS, documented default 1, so send and receive copies run on separate
// threads beside the proxy; 2.28.9's code picks 0 for NICs other than AWS/GCP, see
// docs/nccl-plugin.md) and its recommended 4x4 tuning runs 4 threads x 4
// sockets. So on hosts with 8+ online CPUs every comm gets one worker (the send and receive
// copies of all connections spread over cores); on smaller hosts (the 2-core build machine)
// extra threads only add wake-ups and fight the ranks for the cores, so I/O stays on the
// caller's thread. NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD are honoured as fallbacks so a
// job tuned for Socket keeps its tuning: nsocks = threads x sockets per thread (at most 16).
struct SocketPolicy {
  int threads = 0;
  int nsocks = 0;  // 0 = tcp's own rule
  std::string why;
};

Result<SocketPolicy> socket_policy() {
  SocketPolicy p;
  GW_ASSIGN_OR_RETURN(std::optional<int> nthreads, nccl_socket_knob("NCCL_SOCKET_NTHREADS"));
  GW_ASSIGN_OR_RETURN(std::optional<int> per_thread, nccl_socket_knob("NCCL_NSOCKS_PERTHREAD"));
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  if (nthreads) {
    p.threads = *nthreads;
    p.why = fmt::format("NCCL_SOCKET_NTHREADS={}", *nthreads);
  } else {
    p.threads = cpus >= 8 ? 1 : 0;
    p.why = fmt::format("auto: {} online CPUs", cpus);
  }
  if (nthreads || per_thread) {
    p.nsocks = std::min(16, nthreads.value_or(1) * per_thread.value_or(1));
    p.why +=
        fmt::format(", {} socket(s) from NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD", p.nsocks);
  }
  return p;
}

// The one place the plugin's backend is chosen. GW_PLUGIN_BACKEND names a backend that auto may
// pick across hosts (NCCL handles ranks on one host itself), or "auto": the registry's one rule
// (core/net/auto_backend.h) for a peer on another host, trying the next backend when one turns
// out unsupported when it opens.
Result<std::unique_ptr<net::Transport>> open_backend(const std::string& requested,
                                                     std::string* chosen,
                                                     std::string* thread_policy = nullptr) {
  net::TransportOptions options;
  GW_ASSIGN_OR_RETURN(SocketPolicy policy, socket_policy());
  options.socket_threads = policy.threads;
  options.socket_nsocks = policy.nsocks;
  if (thread_policy != nullptr) {
    const int64_t gw_threads = config::get_int(net::tcp_config::kSocketNthreads);
    *thread_policy =
        gw_threads != 0 ? fmt::format("GW_SOCKET_NTHREADS={}", gw_threads) : policy.why;
  }
  options.job_token = job_token();
  options.timeout_ms = config::get_int(core_config::kTimeoutMs);
  options.host_id = config::get_string(core_config::kHostId);
  if (options.timeout_ms <= 0) {
    return invalid_arg("GW_TIMEOUT_MS={} must be a positive number of milliseconds",
                       options.timeout_ms);
  }
  if (requested != "auto") {
    auto backend = net::find_backend(requested);
    // dpdk is never auto's choice (a port has one owner: one NCCL process per port, where daemon
    // mode shares the port between them), but crosses hosts when named.
    const bool named_only = requested == "dpdk";
    if (!backend.ok() || !(backend->auto_across_hosts || named_only)) {
      return invalid_arg(
          "GW_PLUGIN_BACKEND='{}' is not a backend for the NCCL plugin (use {}, or dpdk; NCCL "
          "handles ranks on one host itself)",
          requested, net::describe_cross_host_backends());
    }
    auto t = net::make_transport(requested, options);
    if (!t.ok()) return t.status().with_context(fmt::format("opening the {} backend", requested));
    *chosen = requested;
    return t;
  }
  std::vector<std::string> failed;
  while (true) {
    GW_ASSIGN_OR_RETURN(net::AutoChoice choice, net::choose_auto_backend(false, failed));
    GWP_INFO(NCCL_INIT | NCCL_NET, "NET/gradwire: {}", choice.reason);
    auto t = net::make_transport(choice.name, options);
    if (t.ok()) {
      *chosen = choice.name;
      return t;
    }
    if (t.status().code() != Code::kUnsupported) {
      return t.status().with_context(fmt::format("opening the {} backend", choice.name));
    }
    GWP_INFO(NCCL_INIT | NCCL_NET, "NET/gradwire: {} unavailable ({}); auto chooses again",
             choice.name, t.status().to_string());
    failed.push_back(choice.name);
  }
}

// Daemon mode (GW_DAEMON; plugin/daemon_transport.h): the connections go through the host's
// gradwired, and `nic` only describes the device to NCCL. *note (when given) says which mode and
// why; `nic` comes back unchanged in direct mode.
Result<std::unique_ptr<net::Transport>> through_daemon(std::unique_ptr<net::Transport> nic,
                                                       std::string* note) {
#ifdef GW_PLUGIN_DAEMON
  std::string why;
  GW_ASSIGN_OR_RETURN(std::string address, plugin_daemon_address(&why));
  if (note != nullptr) *note = why;
  if (address.empty()) return nic;
  DaemonNetOptions o;
  o.address = address;
  o.job_token = job_token();
  o.timeout_ms = config::get_int(core_config::kTimeoutMs);
  o.arena_bytes = static_cast<uint64_t>(config::get_int(daemon_config::kArena));
  if (note != nullptr) {
    *note = fmt::format(
        "daemon mode ({}): connections through gradwired, host buffers copied "
        "through a {} byte arena per connection",
        why, o.arena_bytes);
  }
  return make_daemon_transport(o, nic->properties());
#else
  const char* d = std::getenv("GW_DAEMON");
  if (d != nullptr && *d != '\0' && std::string(d) != "auto") {
    return Status(Code::kUnsupported,
                  "GW_DAEMON is set but this self-contained plugin build has no daemon mode "
                  "(build the plugin inside the project)");
  }
  return nic;
#endif
}

int max_comms_for(int sockets_per_conn) {
  // Each connection holds sockets_per_conn descriptors (plus one listener while it is set up);
  // the open-file limit is what really caps the number of comms.
  struct rlimit rl {};
  int64_t limit = 65536;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    limit = static_cast<int64_t>(rl.rlim_cur);
  }
  int64_t comms = limit / std::max(1, sockets_per_conn + 1);
  return static_cast<int>(std::clamp<int64_t>(comms, 1, 65536));
}
}  // namespace

Status NetPlugin::discover() {
  if (!devices_.empty()) return ok_status();
  Status valid = config::validate();
  if (!valid.ok()) return valid.with_context("malformed GW_* environment variable");
  std::string backend;
  std::string thread_policy;
  GW_ASSIGN_OR_RETURN(std::unique_ptr<net::Transport> transport,
                      open_backend(config::get_string(plugin::plugin_config::kPluginBackend),
                                   &backend, &thread_policy));
  std::string daemon_note;
  GW_ASSIGN_OR_RETURN(transport, through_daemon(std::move(transport), &daemon_note));
  const net::Properties& p = transport->properties();
  DeviceInfo d;
  d.backend = backend;
  d.interfaces = p.interfaces;
  d.sockets_per_conn = std::max(1, p.sockets_per_conn);
  d.io_threads = p.io_threads;
  d.thread_policy = std::move(thread_policy);
  d.daemon_note = std::move(daemon_note);
  d.latency_us = static_cast<float>(p.latency_us);
  // Device memory only where the transport registers it with its NIC (verbs with GPUDirect
  // RDMA); otherwise NCCL stages GPU buffers through host memory.
  const net::Transport::DeviceMemory dm = transport->device_memory();
  d.ptr_support = NCCL_PTR_HOST | (dm.reg ? NCCL_PTR_CUDA : 0) | (dm.dmabuf ? NCCL_PTR_DMABUF : 0);
  // Daemon mode: what gradwired said, yes or no, with its reason (the start-up line shows it).
  const bool daemon_mode = d.daemon_note.rfind("daemon mode", 0) == 0;
  d.gpudirect = dm.reg ? (dm.dmabuf ? "dma-buf" : "nvidia-peermem") : "none: " + dm.why;
  if (daemon_mode) {
    d.gpudirect = dm.dmabuf ? "dma-buf through gradwired (" + dm.why + ")"
                            : "none through gradwired (" + dm.why + ")";
  }
  std::vector<std::string> ifs = interface_names(p.interfaces);
  std::string joined;
  int speed = 0;
  for (const std::string& name : ifs) {
    joined += (joined.empty() ? "" : "+") + name;
    speed += speed_of(name);
  }
  d.name = fmt::format("gw-{}-{}", backend, joined.empty() ? "0" : joined);
  d.pci_path = ifs.empty() ? "" : pci_path_of(ifs.front());
  d.guid = ifs.empty() ? 0 : guid_of(ifs.front());
  if (d.guid == 0) d.guid = 0x6777000000000000ULL;  // loopback has an all-zero MAC
  if (speed <= 0) speed = p.speed_mbps > 0 ? p.speed_mbps : 10000;
  d.speed_mbps = speed;
  d.max_comms = max_comms_for(d.sockets_per_conn);
  devices_.push_back(std::move(d));
  transports_.push_back(std::shared_ptr<net::Transport>(std::move(transport)));
  return ok_status();
}

Result<std::shared_ptr<net::Transport>> NetPlugin::transport_for(int dev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dev < 0 || dev >= static_cast<int>(devices_.size())) {
    return internal_error("device {} does not exist ({} device(s); was init called?)", dev,
                          devices_.size());
  }
  if (!transports_[dev]) {  // dropped by the last finalize; a new communicator needs it again
    std::string backend;
    GW_ASSIGN_OR_RETURN(std::unique_ptr<net::Transport> t,
                        open_backend(devices_[dev].backend, &backend));
    GW_ASSIGN_OR_RETURN(transports_[dev], through_daemon(std::move(t), nullptr));
  }
  return transports_[dev];
}

Result<int> NetPlugin::device_count() {
  std::lock_guard<std::mutex> lock(mu_);
  if (devices_.empty()) return internal_error("devices called before a successful init");
  return static_cast<int>(devices_.size());
}

Result<const DeviceInfo*> NetPlugin::device(int dev) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dev < 0 || dev >= static_cast<int>(devices_.size())) {
    return internal_error("device {} does not exist ({} device(s))", dev, devices_.size());
  }
  return &devices_[dev];
}
}  // namespace gw::plugin
