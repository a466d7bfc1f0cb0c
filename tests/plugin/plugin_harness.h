// A driver for the built libnccl-net-gradwire.so that calls it the way NCCL's proxy does, with
// no NCCL and no GPU: dlopen, init with a recording logger, connect and accept alternately from
// one thread, post with retry on NULL requests, test until done. Every loop has a deadline.
//
// NetApi gives one shape to the five exported tables (v8..v12) so the same scenarios run
// through each version's function pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plugin/nccl_net_abi.h"

namespace gw::plugin_test {

// The plugin as loaded by this process (dlopen RTLD_NOW|RTLD_LOCAL of GW_PLUGIN_PATH). The first
// call sets the environment the tests rely on (loopback only, short deadlines).
struct Loaded {
  void* lib = nullptr;
  ncclNet_v12_t* v12 = nullptr;
  ncclNet_v11_t* v11 = nullptr;
  ncclNet_v10_t* v10 = nullptr;
  ncclNet_v9_t* v9 = nullptr;
  ncclNet_v8_t* v8 = nullptr;
  ncclResult_t first_init = ncclNumResults;  // result of the first v11 init in this process
  std::vector<std::string> first_init_log;   // what it logged
};
const Loaded& plugin();
void set_test_environment();

// The host identities (GW_HOSTID) of the two "hosts" of GW_PLUGIN_TEST_XHOST=1: this process and
// its daemon on a, peer processes and theirs on b.
inline constexpr const char* kXhostA = "gw-plugin-host-a";
inline constexpr const char* kXhostB = "gw-plugin-host-b";
// In a peer process: moves it to host b when the harness runs two hosts (before the plugin loads).
void become_peer_host();
// The transport the two hosts' daemons are to agree: GW_PLUGIN_TEST_XHOST_TRANSPORT (tcp when
// unset; verbs: the emulator, GW_VERBS_EMULATE=1; dpdk: set_test_environment gives daemon a and
// daemon b the two ends of a net_memif pair, GW_DPDK_EAL_ARGS / GW_DPDK_IP, and keeps their
// stderr for the calls below).
std::string xhost_transport();
// Result of a helper: empty = success, else what went wrong.
using Error = std::string;
// Two hosts (GW_PLUGIN_TEST_XHOST=1, any transport): what daemon a (0) or b (1) wrote to stderr so
// far, logging at INFO ("" otherwise).
std::string xhost_daemon_output(int host);
// Over dpdk: "" when both daemons said they run their DPDK engine on their memif end, else why
// not (with their output); "" for the other transports.
Error xhost_went_over_dpdk();
// Over dpdk: the daemons' rte_eal_init failure line when EAL cannot start on this machine (the
// tests then skip saying so), else "".
std::string dpdk_cannot_start();

// Lines the logger passed to init received, as "LEVEL message".
std::vector<std::string> log_lines();
void clear_log();
void record_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                const char* fmt, ...);

class NetApi {
 public:
  virtual ~NetApi() = default;
  virtual const char* version() const = 0;
  virtual const char* name() const = 0;
  virtual ncclResult_t init(void** ctx) = 0;
  virtual ncclResult_t finalize(void* ctx) = 0;  // no-op before v11
  virtual ncclResult_t devices(int* n) = 0;
  // Fills the fields every version has; the rest stay zero.
  virtual ncclResult_t properties(int dev, ncclNetProperties_v11_t* p) = 0;
  virtual ncclResult_t listen(void* ctx, int dev, void* handle, void** lc) = 0;
  virtual ncclResult_t connect(void* ctx, int dev, void* handle, void** sc) = 0;
  virtual ncclResult_t accept(void* lc, void** rc) = 0;
  virtual ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mh) = 0;
  virtual ncclResult_t dereg_mr(void* comm, void* mh) = 0;
  // regMrDmaBuf (v11 and v12 only; the others answer ncclInternalError).
  virtual ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset,
                                     int fd, void** mh) {
    return ncclInternalError;
  }
  virtual ncclResult_t isend(void* sc, void* data, size_t size, int tag, void* mh, void** req) = 0;
  virtual ncclResult_t irecv(void* rc, void* data, size_t size, int tag, void* mh, void** req) = 0;
  virtual ncclResult_t test(void* req, int* done, int* size) = 0;
  // iflush of one buffer (n = 1).
  virtual ncclResult_t iflush(void* rc, void* data, int size, void* mh, void** req) = 0;
  virtual ncclResult_t close_send(void* sc) = 0;
  virtual ncclResult_t close_recv(void* rc) = 0;
  virtual ncclResult_t close_listen(void* lc) = 0;
};

// "v8", "v9", "v10", "v11", "v12".
std::unique_ptr<NetApi> make_api(const std::string& version);
// The v11 API of a second instance of the plugin (a copy loaded again): it reads the environment
// afresh at its init, so one process can hold ends on two "hosts" (GW_HOSTID, GW_DAEMON).
std::unique_ptr<NetApi> make_api_of_copy();

// Page-aligned host buffer.
struct Buffer {
  explicit Buffer(size_t size);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  uint8_t* data = nullptr;
  size_t size = 0;
};
// A stand-in device buffer: a memfd of `size` bytes (whole pages) mapped here; `fd` is its
// dma-buf, so a NIC that reaches the dma-buf (the verbs emulator maps it itself) reaches these
// very bytes. data is null when the memfd could not be made.
struct MemfdBuffer {
  MemfdBuffer(size_t size, const char* name);
  ~MemfdBuffer();
  MemfdBuffer(const MemfdBuffer&) = delete;
  MemfdBuffer& operator=(const MemfdBuffer&) = delete;
  uint8_t* data = nullptr;
  size_t size = 0;
  int fd = -1;
};
void fill_pattern(uint8_t* p, size_t n, uint32_t seed);
// Index of the first byte that differs from the pattern, or -1.
int64_t check_pattern(const uint8_t* p, size_t n, uint32_t seed);

// listen on `listen_ctx`'s side, then connect and accept alternately from this thread until
// both are non-NULL (deadline_ms). Closes the listen comm after accept, as NCCL does.
Error connect_pair(NetApi& api, void* ctx, void** send_comm, void** recv_comm,
                   int deadline_ms = 10000);
// The same with the listener on `api` and the connector on `capi` (another plugin instance).
Error connect_pair(NetApi& api, void* ctx, NetApi& capi, void* cctx, void** send_comm,
                   void** recv_comm, int deadline_ms = 10000);
// Polls test() until done (or error/deadline); *size gets the reported size.
Error wait_request(NetApi& api, void* req, int* size, int deadline_ms = 20000);
// Polls every request round robin, as NCCL's progress thread does, until all are done; sizes
// (if given) receives each one's reported size. A sender may only finish once its peer's receive
// is tested, so requests of one process are never waited for one at a time.
Error wait_all(NetApi& api, const std::vector<void*>& reqs, std::vector<int>* sizes = nullptr,
               int deadline_ms = 30000);
// Posts with retry while the plugin answers NULL (deadline_ms).
Error post_send(NetApi& api, void* sc, void* data, size_t size, int tag, void* mh, void** req,
                int deadline_ms = 10000);
Error post_recv(NetApi& api, void* rc, void* data, size_t size, int tag, void* mh, void** req,
                int deadline_ms = 10000);

std::string handle_hex(const uint8_t* handle);

// Runs the nccl_plugin_peer helper (GW_PLUGIN_PEER_PATH) with `args` and extra environment
// ("NAME=value" sets, "-NAME" removes); returns its exit status, or -1 when it crashed or had to
// be killed (30 s deadline). A change of GW_DAEMON (set or removed) puts the peer where it says:
// the variables that would move it to host b's daemon (GW_PLUGIN_TEST_PEER_DAEMON and
// GW_PLUGIN_TEST_PEER_HOSTID, become_peer_host) are dropped too, so "-GW_DAEMON" is direct mode
// in every variant. With `out`, the peer's stdout is also kept there (and still printed here).
int run_peer(const std::vector<std::string>& env, const std::vector<std::string>& args,
             std::string* out = nullptr);

// The transfers of nccl_plugin_peer's "timeline" scenario, which the timeline test finds in the
// trace: message i has kTimelineSizes[i] bytes, tag kTimelineTag0 + i, and a receive posted
// kTimelineRecvExtra bytes larger.
inline constexpr size_t kTimelineSizes[] = {0, 333, 4096, size_t{1} << 20, (size_t{3} << 20) + 7};
inline constexpr int kTimelineTag0 = 100;
inline constexpr size_t kTimelineRecvExtra = 64;

}  // namespace gw::plugin_test

namespace gw::plugin_test {

// One side of the two-process scenario: listen, send our handle on write_fd, read the peer's
// from read_fd, connect and accept alternately, then for every size both sides send and receive
// at once (content checked; each side's pattern seed includes its role 0 or 1), then a burst of
// 32 messages in flight each way, then close and finalize.
Error exchange_with_peer(NetApi& api, int read_fd, int write_fd, int role);

}  // namespace gw::plugin_test
