#include "plugin/net_plugin.h"

#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/auto_backend.h"
#include "core/net/backend_registry.h"
#include "core/net/tcp_config.h"
#include "plugin/plugin_config.h"

namespace gw::plugin {

namespace {

namespace fs = std::filesystem;

// The token every rank presents in the handshake when GW_JOB_TOKEN is unset. NCCL gives a plugin
// no shared secret, so without GW_JOB_TOKEN connections are only checked for "is gradwire",
// not authenticated (docs/nccl-plugin.md says so).
constexpr const char* kDefaultJobToken = "gradwire-nccl-plugin-default-token";

// Largest message the plugin accepts: test() reports sizes as int, and NCCL's own FIFO
// limit for registered user buffers is 1 GiB (MAX_NET_SIZE).
constexpr size_t kMaxMessageBytes = size_t{1} << 30;

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
    if (!backend.ok() || !backend->auto_across_hosts) {
      return invalid_arg(
          "GW_PLUGIN_BACKEND='{}' is not a backend for the NCCL plugin (use {}; NCCL handles "
          "ranks on one host itself)",
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

uint32_t magic_of(const void* p) {
  // NCCL stores NCCL_NET_OPTIONAL_RECV_COMPLETION (0x1) in request slots: never dereference
  // pointers into the first page.
  if (reinterpret_cast<uintptr_t>(p) < 4096) return 0;
  uint32_t m = 0;
  std::memcpy(&m, p, sizeof(m));
  return m;
}

}  // namespace

// ---- validating casts ----------------------------------------------------------------------

Result<Context*> as_context(void* p) {
  if (p == nullptr) return internal_error("NULL context (init did not succeed?)");
  if (magic_of(p) != Context::kMagic) {
    return internal_error("unknown context {} (not created by this plugin's init)", p);
  }
  return static_cast<Context*>(p);
}

Result<ListenComm*> as_listen(void* p) {
  if (p == nullptr) return internal_error("NULL listen comm");
  if (magic_of(p) != ListenComm::kMagic) {
    return internal_error("unknown listen comm {} (not from listen, or already closed)", p);
  }
  return static_cast<ListenComm*>(p);
}

Result<PluginComm*> as_comm(void* p, bool send) {
  const char* kind = send ? "send" : "receive";
  if (p == nullptr) return internal_error("NULL {} comm", kind);
  uint32_t m = magic_of(p);
  uint32_t want = send ? PluginComm::kSendMagic : PluginComm::kRecvMagic;
  if (m == want) return static_cast<PluginComm*>(p);
  if (m == PluginComm::kSendMagic || m == PluginComm::kRecvMagic) {
    return internal_error("{} comm expected but a {} comm was passed", kind,
                          send ? "receive" : "send");
  }
  return internal_error("unknown {} comm {} (not from connect/accept, or already closed)", kind, p);
}

Result<MemHandle*> as_mem(void* p) {
  if (p == nullptr) return static_cast<MemHandle*>(nullptr);
  if (magic_of(p) != MemHandle::kMagic) {
    return internal_error("unknown memory handle {} (not from regMr, or deregistered)", p);
  }
  return static_cast<MemHandle*>(p);
}

Result<Request*> as_request(void* p) {
  if (p == nullptr) return internal_error("NULL request");
  if (magic_of(p) != Request::kMagic) {
    return internal_error("unknown request {} (not in flight: already completed or never posted)",
                          p);
  }
  return static_cast<Request*>(p);
}

// ---- PluginComm ----------------------------------------------------------------------------

PluginComm::PluginComm(std::shared_ptr<net::Transport> transport,
                       std::unique_ptr<net::SendComm> send)
    : magic_(kSendMagic), transport_(std::move(transport)), send_(std::move(send)) {
  for (int i = kSlots - 1; i >= 0; --i) free_.push_back(i);
}

PluginComm::PluginComm(std::shared_ptr<net::Transport> transport,
                       std::unique_ptr<net::RecvComm> recv)
    : magic_(kRecvMagic), transport_(std::move(transport)), recv_(std::move(recv)) {
  for (int i = kSlots - 1; i >= 0; --i) free_.push_back(i);
}

PluginComm::~PluginComm() {
  magic_ = 0;
  std::lock_guard<std::mutex> mr_lock(mr_mu_);
  // NCCL deregisters before closing; after an abort it may not, so release what is left
  // while the core comm still exists.
  for (MemHandle* mh : mrs_) {
    if (mh->mr != nullptr) (void)comm()->dereg_mr(mh->mr);
    mh->magic = 0;
    delete mh;
  }
  mrs_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (Request& r : requests_) r.magic = 0;  // requests in flight are abandoned
  send_.reset();
  recv_.reset();
}

net::Comm* PluginComm::comm() const {
  return send_ ? static_cast<net::Comm*>(send_.get()) : static_cast<net::Comm*>(recv_.get());
}

std::string PluginComm::peer_name() const { return comm()->peer_name(); }

Result<MemHandle*> PluginComm::reg_mr(void* data, size_t size, bool cuda) {
  if (data == nullptr && size > 0) return internal_error("NULL buffer of {} bytes", size);
  GW_ASSIGN_OR_RETURN(net::MemRegion * mr,
                      comm()->reg_mr(data, size, cuda ? net::MemType::kCuda : net::MemType::kHost));
  return track(mr, data, size);
}

Result<MemHandle*> PluginComm::reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd) {
  if (data == nullptr || size == 0) return internal_error("dma-buf of {} bytes at {}", size, data);
  GW_ASSIGN_OR_RETURN(net::MemRegion * mr, comm()->reg_mr_dmabuf(data, size, offset, fd));
  return track(mr, data, size);
}

MemHandle* PluginComm::track(net::MemRegion* mr, void* data, size_t size) {
  auto* mh = new MemHandle;
  mh->comm = this;
  mh->mr = mr;
  mh->base = static_cast<const char*>(data);
  mh->size = size;
  std::lock_guard<std::mutex> lock(mr_mu_);
  mrs_.push_back(mh);
  return mh;
}

Status PluginComm::dereg_mr(MemHandle* mh) {
  if (mh == nullptr) return internal_error("NULL memory handle");
  if (mh->comm != this)
    return internal_error("memory handle {} belongs to another comm", (void*)mh);
  std::lock_guard<std::mutex> lock(mr_mu_);
  auto it = std::find(mrs_.begin(), mrs_.end(), mh);
  if (it == mrs_.end()) return internal_error("memory handle {} is not registered", (void*)mh);
  mrs_.erase(it);
  Status st = mh->mr != nullptr ? comm()->dereg_mr(mh->mr) : ok_status();
  mh->magic = 0;
  delete mh;
  return st;
}

Status PluginComm::check_buffer(const void* data, size_t size, MemHandle* mh,
                                const char* op) const {
  if (size > kMaxMessageBytes) {
    return internal_error("{} of {} bytes exceeds the plugin's maxP2pBytes ({} bytes)", op, size,
                          kMaxMessageBytes);
  }
  if (data == nullptr && size > 0) return internal_error("{}: NULL buffer of {} bytes", op, size);
  if (mh == nullptr) return ok_status();
  if (mh->comm != this) return internal_error("{}: memory handle registered on another comm", op);
  const char* p = static_cast<const char*>(data);
  if (size > 0 && (p < mh->base || p + size > mh->base + mh->size)) {
    return internal_error("{}: buffer [{}, +{}) lies outside its registration [{}, +{})", op, data,
                          size, (const void*)mh->base, mh->size);
  }
  return ok_status();
}

Request* PluginComm::take_slot() {
  if (free_.empty()) return nullptr;
  Request* r = &requests_[free_.back()];
  r->slot = free_.back();
  free_.pop_back();
  r->comm = this;
  r->req = nullptr;
  return r;
}

void PluginComm::put_slot(Request* r) {
  r->magic = 0;
  r->req = nullptr;
  free_.push_back(r->slot);
}

Status PluginComm::adopt(Request* r, Result<net::Request*> posted, Request** request) {
  if (!posted.ok() || *posted == nullptr) {
    put_slot(r);
    return posted.status();
  }
  r->req = *posted;
  r->magic = Request::kMagic;
  *request = r;
  return ok_status();
}

Status PluginComm::isend(const void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  GW_RETURN_IF_ERROR(check_buffer(data, size, mh, "isend"));
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = take_slot();
  if (r == nullptr) return ok_status();  // NCCL retries after testing an older request
  return adopt(r, send_->isend(data, size, tag, mh ? mh->mr : nullptr), request);
}

Status PluginComm::irecv(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  // A receive may be posted larger than maxP2pBytes would allow a send; only what arrives counts.
  GW_RETURN_IF_ERROR(check_buffer(data, std::min(size, kMaxMessageBytes), mh, "irecv"));
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = take_slot();
  if (r == nullptr) return ok_status();
  return adopt(r, recv_->irecv(data, size, tag, mh ? mh->mr : nullptr), request);
}

Status PluginComm::iflush(void* data, size_t size, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (recv_ == nullptr) return internal_error("iflush on a send comm");
  if (mh == nullptr || mh->mr == nullptr || mh->mr->type != net::MemType::kCuda) {
    return ok_status();  // host memory: what the NIC wrote is visible already
  }
  GW_RETURN_IF_ERROR(check_buffer(data, size, mh, "iflush"));
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = take_slot();
  if (r == nullptr) {
    return internal_error("iflush: all {} request slots of the comm with {} are in flight", kSlots,
                          peer_name());
  }
  return adopt(r, recv_->iflush(data, size, mh->mr), request);
}

Status PluginComm::test(Request* r, bool* done, size_t* size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (r->magic != Request::kMagic || r->comm != this) {
    return internal_error("request {} is not in flight on this comm", (void*)r);
  }
  bool finished = false;
  size_t bytes = 0;
  Status st = comm()->test(r->req, &finished, &bytes);
  if (!st.ok()) {
    put_slot(r);  // core/net frees a failed request
    return st;
  }
  if (finished) put_slot(r);
  *done = finished;
  *size = bytes;
  return ok_status();
}

// ---- NetPlugin -----------------------------------------------------------------------------

NetPlugin& NetPlugin::instance() {
  // Never destroyed: NCCL may call finalize from an atexit path after static destructors ran.
  static NetPlugin* plugin = new NetPlugin;
  return *plugin;
}

void NetPlugin::log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                    const std::string& msg) const {
  ncclDebugLogger_t logger = logger_.load();
  if (logger != nullptr) {
    logger(level, flags, file, line, "%s", msg.c_str());
    return;
  }
  if (level == NCCL_LOG_WARN) {
    GW_LOG_WARN("{}", msg);
  } else {
    GW_LOG_INFO("{}", msg);
  }
}

void NetPlugin::pin_library() {
  // NCCL 2.28.9 dlcloses the plugin when its last communicator goes away and then fails to
  // reopen it (NVIDIA/nccl#1978); pinning keeps our code and threads valid for the process.
  if (pinned_ || !config::get_bool(plugin::plugin_config::kPluginPin)) return;
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&NetPlugin::instance), &info) == 0 ||
      info.dli_fname == nullptr) {
    GWP_INFO(NCCL_INIT, "NET/gradwire: dladdr failed ({}); library not pinned", dlerror());
    return;
  }
  void* self = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
  if (self == nullptr) {
    GWP_INFO(NCCL_INIT, "NET/gradwire: could not pin {} ({}); set NCCL_NET_PLUGIN_REF_COUNT=1",
             info.dli_fname, dlerror());
    return;
  }
  pinned_ = true;  // the handle is deliberately never closed
}

// NCCL gives one network channel's traffic to one send comm and one receive comm, and with I/O
// threads each comm is served by threads of its own, so throughput grows with the number of
// channels. NCCL's topology search gives a single-NIC host 2 channels, which left the plugin well
// short of what 4 channels reach (docs/nccl-plugin.md, "Measured on the H100 test machine"; NCCL's
// Socket transport gained nothing from 4). So, like other NCCL net plugins that
// tune NCCL for their network, the plugin sets NCCL_MIN_NCHANNELS when the user has not (and
// has not capped NCCL_MAX_NCHANNELS below it). NCCL reads it after the plugin's init.
// Returns what was done, for the INFO line.
// `*set` becomes the count written to NCCL_MIN_NCHANNELS, 0 when none was (the tuner asks for
// that many channels per collective only when the plugin set it: plugin/tuner.cc).
static Result<std::string> request_channels(const DeviceInfo& d, int* set) {
  *set = 0;
  const int64_t knob = config::get_int(plugin::plugin_config::kPluginMinChannels);
  if (knob < -1 || knob > 32) {
    return invalid_arg("GW_PLUGIN_MIN_CHANNELS={} is out of range (-1 = never, 0 = auto, 1-32)",
                       knob);
  }
  if (knob < 0) return std::string("NCCL's channel choice kept (GW_PLUGIN_MIN_CHANNELS=-1)");
  int64_t want = knob;
  if (knob == 0) {
    if (d.backend != "tcp" || d.io_threads == 0) {
      return std::string("NCCL's channel choice kept (auto)");
    }
    want = 4;
  }
  if (const char* user = std::getenv("NCCL_MIN_NCHANNELS"); user != nullptr) {
    return fmt::format("NCCL_MIN_NCHANNELS={} kept (set by the user)", user);
  }
  if (const char* cap = std::getenv("NCCL_MAX_NCHANNELS"); cap != nullptr) {
    char* end = nullptr;
    const long v = std::strtol(cap, &end, 10);
    if (end != cap && v < want) {
      return fmt::format("NCCL's channel choice kept (NCCL_MAX_NCHANNELS={})", cap);
    }
  }
  const std::string value = std::to_string(want);
  if (setenv("NCCL_MIN_NCHANNELS", value.c_str(), 0) != 0) {
    return fmt::format("could not set NCCL_MIN_NCHANNELS ({})", std::strerror(errno));
  }
  *set = static_cast<int>(want);
  return fmt::format(
      "set NCCL_MIN_NCHANNELS={} ({}; GW_PLUGIN_MIN_CHANNELS=-1 keeps NCCL's choice)", value,
      knob == 0 ? "auto: tcp comms with I/O threads" : "GW_PLUGIN_MIN_CHANNELS");
}

Status NetPlugin::discover() {
  if (!devices_.empty()) return ok_status();
  Status valid = config::validate();
  if (!valid.ok()) return valid.with_context("malformed GW_* environment variable");
  std::string backend;
  std::string thread_policy;
  GW_ASSIGN_OR_RETURN(std::unique_ptr<net::Transport> transport,
                      open_backend(config::get_string(plugin::plugin_config::kPluginBackend),
                                   &backend, &thread_policy));
  const net::Properties& p = transport->properties();
  DeviceInfo d;
  d.backend = backend;
  d.interfaces = p.interfaces;
  d.sockets_per_conn = std::max(1, p.sockets_per_conn);
  d.io_threads = p.io_threads;
  d.thread_policy = std::move(thread_policy);
  d.latency_us = static_cast<float>(p.latency_us);
  // Device memory only where the transport registers it with its NIC (verbs with GPUDirect
  // RDMA); otherwise NCCL stages GPU buffers through host memory.
  const net::Transport::DeviceMemory dm = transport->device_memory();
  d.ptr_support = NCCL_PTR_HOST | (dm.reg ? NCCL_PTR_CUDA : 0) | (dm.dmabuf ? NCCL_PTR_DMABUF : 0);
  d.gpudirect = dm.reg ? (dm.dmabuf ? "dma-buf" : "nvidia-peermem") : "none: " + dm.why;
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
    transports_[dev] = std::move(t);
  }
  return transports_[dev];
}

Result<Context*> NetPlugin::init(uint64_t comm_id, int traffic_class) {
  std::lock_guard<std::mutex> lock(mu_);
  pin_library();
  GW_RETURN_IF_ERROR(discover());
  if (!announced_) {
    GW_ASSIGN_OR_RETURN(const std::string channels,
                        request_channels(devices_.front(), &channels_set_));
    announced_ = true;
    const DeviceInfo& d = devices_.front();
    bool own_token = !config::get_string(core_config::kJobToken).empty();
    GWP_INFO(
        NCCL_INIT | NCCL_NET,
        "NET/gradwire: backend {}, device {} (interfaces {}, pci {}), {} socket(s) per "
        "connection, {} I/O thread(s) per comm ({}), {} Mbps, pointer support {}, job "
        "token {}, library {}, GPUDirect RDMA {}",
        d.backend, d.name, d.interfaces.empty() ? "?" : d.interfaces,
        d.pci_path.empty() ? "none" : d.pci_path, d.sockets_per_conn, d.io_threads,
        d.io_threads == 0 ? "progress on NCCL's proxy thread; " + d.thread_policy : d.thread_policy,
        d.speed_mbps,
        (d.ptr_support & NCCL_PTR_DMABUF) ? "HOST|CUDA|DMABUF"
        : (d.ptr_support & NCCL_PTR_CUDA) ? "HOST|CUDA"
                                          : "HOST",
        own_token ? "from GW_JOB_TOKEN" : "default (set GW_JOB_TOKEN on every rank)",
        pinned_ ? "pinned" : "not pinned", d.gpudirect);
    GWP_INFO(NCCL_INIT | NCCL_NET, "NET/gradwire: {}", channels);
  }
  auto* ctx = new Context;
  ctx->comm_id = comm_id;
  ctx->traffic_class = traffic_class;
  live_comm_ids_.insert(comm_id);
  return ctx;
}

Result<Context*> NetPlugin::shared_context() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shared_context_ != nullptr) return shared_context_;
  }
  GW_ASSIGN_OR_RETURN(Context * ctx, init(0, NCCL_NET_TRAFFIC_CLASS_UNDEF));
  std::lock_guard<std::mutex> lock(mu_);
  if (shared_context_ != nullptr) {  // another thread won the race
    live_comm_ids_.erase(live_comm_ids_.find(ctx->comm_id));
    delete ctx;
    return shared_context_;
  }
  shared_context_ = ctx;  // lives for the process: pre-v11 NCCL has no finalize
  return ctx;
}

Status NetPlugin::finalize(Context* ctx) {
  if (ctx == nullptr) return ok_status();
  {
    std::lock_guard<std::mutex> lock(ctx->mu);
    ctx->pending.clear();  // connectors NCCL gave up on
  }
  std::vector<std::shared_ptr<net::Transport>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ctx == shared_context_) return ok_status();
    if (auto it = live_comm_ids_.find(ctx->comm_id); it != live_comm_ids_.end()) {
      live_comm_ids_.erase(it);
    }
    ctx->magic = 0;
    delete ctx;
    if (live_comm_ids_.empty()) dropped.swap(transports_);
    transports_.resize(devices_.size());
  }
  // Comms still open hold their own reference; the backend goes when the last of them closes.
  dropped.clear();
  return ok_status();
}

bool NetPlugin::serves(uint64_t comm_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return shared_context_ != nullptr || live_comm_ids_.count(comm_id) != 0;
}

int NetPlugin::channels_set() {
  std::lock_guard<std::mutex> lock(mu_);
  return channels_set_;
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

Status NetPlugin::listen(Context* ctx, int dev, void* handle, ListenComm** listen_comm) {
  if (handle == nullptr) return internal_error("NULL handle buffer");
  GW_ASSIGN_OR_RETURN(std::shared_ptr<net::Transport> t, transport_for(dev));
  net::Handle h;
  GW_ASSIGN_OR_RETURN(std::unique_ptr<net::Listener> listener, t->listen(&h));
  auto lc = std::make_unique<ListenComm>();
  lc->dev = dev;
  lc->transport = std::move(t);
  lc->listener = std::move(listener);
  std::memcpy(handle, h.bytes.data(), h.bytes.size());
  *listen_comm = lc.release();
  return ok_status();
}

Status NetPlugin::connect(Context* ctx, int dev, void* handle, PluginComm** send_comm) {
  *send_comm = nullptr;
  if (handle == nullptr) return internal_error("NULL handle buffer");
  std::lock_guard<std::mutex> lock(ctx->mu);
  auto it = ctx->pending.find(handle);
  if (it != ctx->pending.end() &&
      std::memcmp(it->second.handle.bytes.data(), handle, net::kHandleSize) != 0) {
    ctx->pending.erase(it);  // the buffer now holds another peer's handle
    it = ctx->pending.end();
  }
  if (it == ctx->pending.end()) {
    Context::PendingConnect pc;
    std::memcpy(pc.handle.bytes.data(), handle, net::kHandleSize);
    GW_ASSIGN_OR_RETURN(pc.transport, transport_for(dev));
    GW_ASSIGN_OR_RETURN(pc.connector, pc.transport->connect(pc.handle));
    it = ctx->pending.emplace(handle, std::move(pc)).first;
  }
  auto polled = it->second.connector->poll();
  if (!polled.ok()) {
    ctx->pending.erase(it);
    return polled.status();
  }
  if (*polled == nullptr) return ok_status();  // NCCL calls again with the same handle
  *send_comm = new PluginComm(it->second.transport, std::move(*polled));
  ctx->pending.erase(it);
  return ok_status();
}

Status NetPlugin::accept(ListenComm* lc, PluginComm** recv_comm) {
  *recv_comm = nullptr;
  GW_ASSIGN_OR_RETURN(std::unique_ptr<net::RecvComm> recv, lc->listener->accept());
  if (recv == nullptr) return ok_status();
  *recv_comm = new PluginComm(lc->transport, std::move(recv));
  return ok_status();
}

Status NetPlugin::close_listen(ListenComm* lc) {
  lc->magic = 0;
  delete lc;
  return ok_status();
}

Status NetPlugin::close_comm(PluginComm* comm, bool send) {
  delete comm;
  return ok_status();
}

}  // namespace gw::plugin
