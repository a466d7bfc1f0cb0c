// NetPlugin: the one implementation behind every exported ncclNetPlugin_vN table.
//
// It adapts NCCL's net API onto core/net (Transport / Listener / Connector / SendComm /
// RecvComm). The exported C tables (exports.cc) only translate argument shapes between ABI
// versions, map Status to ncclResult_t and log the failure through NCCL's logger.
//
// Requires / guarantees:
// - Nothing here blocks: listen/connect/accept/isend/irecv/test return at once; "not yet" is a
//   nullptr output with an OK status.
// - Thread-safe: NCCL's service and progress threads of several communicators call at once.
//   Each comm has its own lock; the process-wide state (devices, contexts) has another.
// - Every handle NCCL passes back (context, comm, memory handle, request) is checked for NULL
//   and for a magic number before use, so misuse fails with kInternal instead of crashing.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "core/net/transport.h"
#include "core/status.h"
#include "plugin/nccl_net_abi.h"

namespace gw::plugin {

// Largest message the plugin accepts: test() reports sizes as int, and NCCL's own FIFO
// limit for registered user buffers is 1 GiB (MAX_NET_SIZE).
inline constexpr size_t kMaxMessageBytes = size_t{1} << 30;

// What getProperties reports for one device. Built once per process and never freed: NCCL
// keeps the name and pciPath pointers.
struct DeviceInfo {
  std::string name;        // unique per device, e.g. "gw-tcp-eth0"
  std::string pci_path;    // sysfs realpath of /sys/class/net/<if>/device; empty if none
  std::string backend;     // a registry name: "tcp", "verbs"
  std::string interfaces;  // as the backend describes them ("eth0:10.0.0.1")
  uint64_t guid = 0;
  int speed_mbps = 0;
  float latency_us = 0;
  int max_comms = 0;
  int sockets_per_conn = 1;
  int io_threads = 0;         // tcp I/O worker threads per comm (0 = NCCL's proxy thread)
  std::string thread_policy;  // why: "auto: 16 online CPUs", "GW_SOCKET_NTHREADS=2", ...
  int ptr_support = NCCL_PTR_HOST;
  std::string gpudirect;    // "dma-buf", "nvidia-peermem", or "none: why"
  std::string daemon_note;  // GW_DAEMON: daemon mode and its address, or why not ("": unset)
};

// Per-communicator context returned by init (v11). v8..v10 share one process-wide context.
struct Context {
  static constexpr uint32_t kMagic = 0x47574358;  // "GWCX"
  uint32_t magic = kMagic;
  uint64_t comm_id = 0;
  int traffic_class = NCCL_NET_TRAFFIC_CLASS_UNDEF;
  // connect() is called again with the same handle buffer until it yields a comm. Pending
  // connectors are keyed by the buffer's address and checked against its contents, so a
  // reused buffer with a new handle starts a new connection.
  struct PendingConnect {
    net::Handle handle;
    std::unique_ptr<net::Connector> connector;
    std::shared_ptr<net::Transport> transport;
    int64_t since_us = -1;  // the first connect() call, for the timeline (-1: timeline off)
  };
  std::mutex mu;
  std::map<const void*, PendingConnect> pending;
};

struct ListenComm {
  static constexpr uint32_t kMagic = 0x47574c53;  // "GWLS"
  uint32_t magic = kMagic;
  int dev = 0;
  uint64_t comm_id = 0;  // the context's, for the timeline
  std::shared_ptr<net::Transport> transport;
  std::unique_ptr<net::Listener> listener;
  int64_t accept_since_us = -1;  // the first accept() call, for the timeline (-1: none yet / off)
};

class PluginComm;

struct MemHandle {
  static constexpr uint32_t kMagic = 0x47574d52;  // "GWMR"
  uint32_t magic = kMagic;
  PluginComm* comm = nullptr;
  net::MemRegion* mr = nullptr;  // may be nullptr: tcp needs no registration
  const char* base = nullptr;
  size_t size = 0;
};

struct Request {
  static constexpr uint32_t kMagic = 0x47575251;  // "GWRQ"
  uint32_t magic = 0;                             // kMagic while in flight
  PluginComm* comm = nullptr;
  net::Request* req = nullptr;
  int slot = -1;
  // For the timeline: when it was posted (-1: timeline off at the post), what, and its size/tag.
  enum class Kind : uint8_t { kSend, kRecv, kFlush };
  int64_t posted_us = -1;
  Kind kind = Kind::kSend;
  int tag = 0;
  size_t bytes = 0;
};

// Where a comm came from, for its timeline events (plugin/plugin_timeline.h).
struct CommOrigin {
  uint64_t comm_id = 0;    // NCCL's communicator hash (v11 init); 0 for the pre-v11 shared context
  int conn = 0;            // this process's connection number, counted from 1
  std::string backend;     // "tcp", "verbs", ...
  std::string trace_args;  // its timeline events' JSON members; made only while the timeline is on
};

// A send or receive connection, wrapping the core/net comm and a fixed pool of request
// wrappers (NCCL keeps at most NCCL_NET_MAX_REQUESTS in flight per comm).
class PluginComm {
 public:
  static constexpr uint32_t kSendMagic = 0x47575343;  // "GWSC"
  static constexpr uint32_t kRecvMagic = 0x47575243;  // "GWRC"
  static constexpr int kSlots = net::kMaxRequests;

  PluginComm(std::shared_ptr<net::Transport> transport, std::unique_ptr<net::SendComm> send);
  PluginComm(std::shared_ptr<net::Transport> transport, std::unique_ptr<net::RecvComm> recv);
  ~PluginComm();
  PluginComm(const PluginComm&) = delete;
  PluginComm& operator=(const PluginComm&) = delete;

  bool is_send() const { return magic_ == kSendMagic; }
  std::string peer_name() const;
  const CommOrigin& origin() const { return origin_; }
  // Set once, before NCCL sees the comm.
  void set_origin(CommOrigin o) { origin_ = std::move(o); }

  // `cuda`: device memory (NCCL_PTR_CUDA), registered through the transport's GPUDirect path.
  Result<MemHandle*> reg_mr(void* data, size_t size, bool cuda = false);
  // Device memory handed over as a dma-buf (regMrDmaBuf).
  Result<MemHandle*> reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd);
  // A failure (daemon mode: the daemon refused, an op still names the region) keeps the handle.
  Status dereg_mr(MemHandle* mh);
  // A handle for a registration the comm made; kept until a dereg_mr succeeds or the comm's end.
  MemHandle* track(net::MemRegion* mr, void* data, size_t size);
  // *request = nullptr when no slot is free now.
  Status isend(const void* data, size_t size, int tag, MemHandle* mh, Request** request);
  Status irecv(void* data, size_t size, int tag, MemHandle* mh, Request** request);
  // The GDR flush of a completed receive into [data, data+size); *request = nullptr when the
  // transport needs none (host memory, tcp).
  Status iflush(void* data, size_t size, MemHandle* mh, Request** request);
  Status test(Request* request, bool* done, size_t* size);

  uint32_t magic_;

 private:
  Request* take_slot();  // caller holds mu_
  void put_slot(Request* r);
  // Hands NCCL the core/net request `posted` in slot `r` (*request), or gives the slot back when
  // nothing was posted (no core slot free, or an error). Caller holds mu_.
  Status adopt(Request* r, Result<net::Request*> posted, Request** request);
  Status check_buffer(const void* data, size_t size, MemHandle* mh, const char* op) const;
  net::Comm* comm() const;

  CommOrigin origin_;
  std::shared_ptr<net::Transport> transport_;  // keeps the backend alive while this comm lives
  std::unique_ptr<net::SendComm> send_;
  std::unique_ptr<net::RecvComm> recv_;
  std::mutex mu_;  // requests_, free_ and the core comm's data path
  std::array<Request, kSlots> requests_{};
  std::vector<int> free_;
  std::mutex mr_mu_;  // mrs_ (regMr runs on NCCL's service thread, racing the progress thread)
  std::vector<MemHandle*> mrs_;
};

class NetPlugin {
 public:
  static NetPlugin& instance();

  // The logger of the most recent init; lines go to gw::log when NCCL gave none.
  void set_logger(ncclDebugLogger_t logger) { logger_.store(logger); }
  void log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
           const std::string& msg) const;

  // Discovers devices and opens the backend on first use, then returns a new context.
  Result<Context*> init(uint64_t comm_id, int traffic_class);
  // The context shared by the pre-v11 tables (their init runs once per process).
  Result<Context*> shared_context();
  Status finalize(Context* ctx);  // ctx may be nullptr

  Result<int> device_count();
  Result<const DeviceInfo*> device(int dev);

  // For the tuner (plugin/tuner.h): whether NCCL assigned this plugin to the communicator
  // `comm_id` (a v11 context with that id is live, or a pre-v11 NCCL opened the shared one), and
  // the channel count the plugin wrote to NCCL_MIN_NCHANNELS (0 when it wrote none).
  bool serves(uint64_t comm_id);
  int channels_set();

  Status listen(Context* ctx, int dev, void* handle, ListenComm** listen_comm);
  Status connect(Context* ctx, int dev, void* handle, PluginComm** send_comm);
  Status accept(ListenComm* lc, PluginComm** recv_comm);
  Status close_listen(ListenComm* lc);
  Status close_comm(PluginComm* comm, bool send);

 private:
  // Names `comm`'s origin (context, connection number, backend) for the timeline.
  void name_comm(PluginComm* comm, uint64_t comm_id, int dev);
  NetPlugin() = default;
  Status discover();  // mu_ held
  Result<std::shared_ptr<net::Transport>> transport_for(int dev);
  void pin_library();

  std::atomic<ncclDebugLogger_t> logger_{nullptr};
  std::mutex mu_;
  std::vector<DeviceInfo> devices_;                          // filled once, never shrunk
  std::vector<std::shared_ptr<net::Transport>> transports_;  // dropped at the last finalize
  std::multiset<uint64_t> live_comm_ids_;  // one entry per live context (the shared one: 0)
  int channels_set_ = 0;
  Context* shared_context_ = nullptr;
  bool pinned_ = false;
  bool announced_ = false;
};

// Validating casts of the opaque pointers NCCL hands back.
Result<Context*> as_context(void* p);
Result<ListenComm*> as_listen(void* p);
Result<PluginComm*> as_comm(void* p, bool send);
Result<MemHandle*> as_mem(void* p);  // nullptr is allowed and yields nullptr
Result<Request*> as_request(void* p);

}  // namespace gw::plugin

#define GWP_LOG(level, flags, ...)                                          \
  ::gw::plugin::NetPlugin::instance().log(level, flags, __FILE__, __LINE__, \
                                          fmt::format(__VA_ARGS__))
#define GWP_WARN(...) GWP_LOG(NCCL_LOG_WARN, NCCL_NET, __VA_ARGS__)
#define GWP_INFO(flags, ...) GWP_LOG(NCCL_LOG_INFO, flags, __VA_ARGS__)
