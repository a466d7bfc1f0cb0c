// NetPlugin's lifecycle: the process-wide instance and its logger, init/finalize of the per-
// communicator contexts, pinning the library, the channel count asked of NCCL, and the validating
// casts of the opaque pointers NCCL hands back. Devices: devices.cc; connection set-up:
// connection.cc; a comm's memory registration and data path: comm_memory.cc, comm_data.cc.
#include "plugin/net_plugin.h"

#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "plugin/plugin_config.h"
#include "plugin/plugin_timeline.h"

namespace gw::plugin {

namespace {

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
    if (!d.daemon_note.empty()) GWP_INFO(NCCL_INIT | NCCL_NET, "NET/gradwire: {}", d.daemon_note);
    // GW_TIMELINE: the transfers as a Chrome trace (plugin/plugin_timeline.h). A file that cannot
    // be created costs the trace, not the communicator.
    if (auto tl = trace::open_from_env(); !tl.ok()) {
      GWP_WARN("NET/gradwire: no timeline: {}", tl.status().to_string());
    } else if (!tl->empty()) {
      GWP_INFO(NCCL_INIT | NCCL_NET, "NET/gradwire: {}", *tl);
    }
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
}  // namespace gw::plugin
