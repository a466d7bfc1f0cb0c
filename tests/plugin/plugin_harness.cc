#include "tests/plugin/plugin_harness.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "tests/support/local_daemon.h"

namespace gw::plugin_test {

namespace {

std::mutex log_mu;
std::vector<std::string>& log_store() {
  static auto* lines = new std::vector<std::string>;
  return *lines;
}

using Clock = std::chrono::steady_clock;

bool past(Clock::time_point deadline) { return Clock::now() > deadline; }
Clock::time_point after_ms(int ms) { return Clock::now() + std::chrono::milliseconds(ms); }

}  // namespace

void become_peer_host() {
  const char* d = getenv("GW_PLUGIN_TEST_PEER_DAEMON");
  const char* h = getenv("GW_PLUGIN_TEST_PEER_HOSTID");
  if (d == nullptr || h == nullptr) return;
  setenv("GW_DAEMON", d, 1);
  setenv("GW_HOSTID", h, 1);
}

namespace {

// The two daemons' stderr under GW_PLUGIN_TEST_XHOST=1 (read back by xhost_daemon_output), in a
// directory removed at exit.
struct DaemonLogs {
  std::string dir, path[2];
  ~DaemonLogs() {
    for (const std::string& p : path) {
      if (!p.empty()) ::unlink(p.c_str());
    }
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
};
DaemonLogs& daemon_logs() {
  static DaemonLogs logs;
  return logs;
}

// Sets (value non-null) or unsets `name`, returning what it was (nullopt: unset).
std::optional<std::string> swap_env(const char* name, const char* value) {
  const char* old = getenv(name);
  std::optional<std::string> was = old == nullptr ? std::nullopt : std::optional(std::string(old));
  if (value != nullptr) {
    setenv(name, value, 1);
  } else {
    unsetenv(name);
  }
  return was;
}

// Host h's (0: a, 1: b) daemon, with INFO logging and its stderr in a file (xhost_daemon_output).
// Over dpdk, with its end of a net_memif pair (GW_DPDK_EAL_ARGS, GW_DPDK_IP; the socket named
// after this process, so concurrent tests do not meet); once it runs, GW_DPDK_EAL_ARGS and
// GW_DPDK_IP are unset, so neither this process nor the plugin processes it starts inherit a port.
std::unique_ptr<gw::testing::LocalDaemon> start_xhost_daemon(const char* gradwired, int h,
                                                             const char* prefix, bool dpdk) {
  DaemonLogs& logs = daemon_logs();
  if (logs.dir.empty()) {
    char tmpl[] = "/tmp/gw-plugin-xlog-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp for the daemons' logs");
    logs.dir = tmpl;
  }
  logs.path[h] = logs.dir + (h == 0 ? "/a.log" : "/b.log");
  if (dpdk) {
    const std::string eal = fmt::format(
        "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error --vdev "
        "net_memif0,id=0,socket=/gw-plugin-xhost-{}.sock,role={},mac=02:72:00:00:00:0{}",
        ::getpid(), h == 0 ? "server" : "client", h + 1);
    const std::string ip = fmt::format("10.72.0.{}", h + 1);
    setenv("GW_DPDK_EAL_ARGS", eal.c_str(), 1);
    setenv("GW_DPDK_IP", ip.c_str(), 1);
  }
  // INFO: the daemons' "dpdk: engine on" line, and what they say when a connection ends.
  const auto level_was = swap_env("GW_LOG_LEVEL", "info");
  // The daemon inherits this process's stderr at its fork: a file for that moment.
  const int log = ::open(logs.path[h].c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  const int saved = ::fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 0);
  if (log >= 0 && saved >= 0) ::dup2(log, STDERR_FILENO);
  auto daemon = std::make_unique<gw::testing::LocalDaemon>(gradwired, prefix);
  if (log >= 0 && saved >= 0) ::dup2(saved, STDERR_FILENO);
  if (saved >= 0) ::close(saved);
  if (log >= 0) ::close(log);
  swap_env("GW_LOG_LEVEL", level_was ? level_was->c_str() : nullptr);
  if (dpdk) {
    // The ports are the daemons': nothing started later (plugin processes) may inherit one.
    unsetenv("GW_DPDK_EAL_ARGS");
    unsetenv("GW_DPDK_IP");
  }
  return daemon;
}

}  // namespace

std::string xhost_transport() {
  const char* t = getenv("GW_PLUGIN_TEST_XHOST_TRANSPORT");
  return t != nullptr && *t != '\0' ? t : "tcp";
}

std::string xhost_daemon_output(int host) {
  const std::string& p = daemon_logs().path[host == 0 ? 0 : 1];
  if (p.empty()) return "";
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Error xhost_went_over_dpdk() {
  if (xhost_transport() != "dpdk") return "";
  Error e;  // both daemons' outputs where either failed: each tells half of the meeting
  for (int h = 0; h < 2; ++h) {
    const std::string out = xhost_daemon_output(h);
    if (out.find("dpdk: engine on net_memif0") == std::string::npos) {
      e +=
          fmt::format("daemon {} did not say \"dpdk: engine on net_memif0\"; ", h == 0 ? 'a' : 'b');
    }
  }
  if (e.empty()) return e;
  for (int h = 0; h < 2; ++h) {
    e += fmt::format("\ndaemon {}'s output:\n{}", h == 0 ? 'a' : 'b', xhost_daemon_output(h));
  }
  return e;
}

std::string dpdk_cannot_start() {
  if (xhost_transport() != "dpdk") return "";
  for (int h = 0; h < 2; ++h) {
    const std::string out = xhost_daemon_output(h);
    const size_t at = out.find("rte_eal_init");
    if (at != std::string::npos) {
      const size_t from = out.rfind('\n', at);
      const size_t to = out.find('\n', at);
      return out.substr(from == std::string::npos ? 0 : from + 1,
                        to == std::string::npos ? std::string::npos : to - from - 1);
    }
  }
  return "";
}

void set_test_environment() {
  // Daemon mode (the *.daemon ctest variants set GW_PLUGIN_TEST_GRADWIRED to gradwired's path):
  // a gradwired of this process's own, stopped at exit, with GW_DAEMON pointing at it for the
  // plugin and for the peer processes, which inherit it (and so start none of their own).
  const char* gradwired = getenv("GW_PLUGIN_TEST_GRADWIRED");
  // Two hosts (GW_PLUGIN_TEST_XHOST=1, the *.daemon_xhost variants): two gradwired of this
  // process's own with their own host identities; this process is on host a, every peer process
  // on host b (nccl_plugin_peer moves there: GW_PLUGIN_TEST_PEER_DAEMON / _PEER_HOSTID).
  const char* xhost = getenv("GW_PLUGIN_TEST_XHOST");
  if (gradwired != nullptr && *gradwired != '\0' && getenv("GW_DAEMON") == nullptr &&
      xhost != nullptr && std::string(xhost) == "1") {
    // Over dpdk (GW_PLUGIN_TEST_XHOST_TRANSPORT=dpdk) each daemon gets an end of a net_memif
    // pair; given a port, each offers dpdk first, so their jobs run over it.
    const bool dpdk = xhost_transport() == "dpdk";
    auto start = [&](int h, const char* prefix) {
      return start_xhost_daemon(gradwired, h, prefix, dpdk);
    };
    setenv("GW_HOSTID", kXhostA, 1);
    static std::unique_ptr<gw::testing::LocalDaemon> a_daemon = start(0, "gw-plugin-xa");
    setenv("GW_HOSTID", kXhostB, 1);
    static std::unique_ptr<gw::testing::LocalDaemon> b_daemon = start(1, "gw-plugin-xb");
    setenv("GW_HOSTID", kXhostA, 1);
    gw::testing::LocalDaemon& a = *a_daemon;
    gw::testing::LocalDaemon& b = *b_daemon;
    if (!a.ready() || !b.ready() || !a.use()) {
      throw std::runtime_error(fmt::format("two gradwired ({}) did not come up", gradwired));
    }
    setenv("GW_PLUGIN_TEST_PEER_DAEMON", ("unix:" + b.socket()).c_str(), 1);
    setenv("GW_PLUGIN_TEST_PEER_HOSTID", kXhostB, 1);
    setenv("GW_PLUGIN_TEST_PEER_DAEMON_PID", std::to_string(b.pid()).c_str(), 1);
    setenv("GW_PLUGIN_TEST_HOST_A_DAEMON", ("unix:" + a.socket()).c_str(), 1);
  }
  if (gradwired != nullptr && *gradwired != '\0' && getenv("GW_DAEMON") == nullptr) {
    static gw::testing::LocalDaemon daemon(gradwired, "gw-plugin-test");
    if (!daemon.ready() || !daemon.use()) {
      throw std::runtime_error(fmt::format("gradwired {} did not come up", gradwired));
    }
  }
  // Loopback only, and deadlines short enough that a broken peer fails a test quickly.
  if (getenv("GW_SOCKET_IFNAME") == nullptr && getenv("NCCL_SOCKET_IFNAME") == nullptr) {
    setenv("GW_SOCKET_IFNAME", "lo", 0);
  }
  setenv("GW_TIMEOUT_MS", "4000", 0);
  // Two sockets by default, unless a test sets the count, or NCCL's knobs that imply one.
  if (getenv("NCCL_SOCKET_NTHREADS") == nullptr && getenv("NCCL_NSOCKS_PERTHREAD") == nullptr) {
    setenv("GW_SOCKET_NSOCKS", "2", 0);
  }
}

const Loaded& plugin() {
  static Loaded* loaded = [] {
    set_test_environment();
    auto* l = new Loaded;
    l->lib = dlopen(GW_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
    if (l->lib == nullptr) {
      throw std::runtime_error(fmt::format("dlopen {}: {}", GW_PLUGIN_PATH, dlerror()));
    }
    l->v12 = static_cast<ncclNet_v12_t*>(dlsym(l->lib, "ncclNetPlugin_v12"));
    l->v11 = static_cast<ncclNet_v11_t*>(dlsym(l->lib, "ncclNetPlugin_v11"));
    l->v10 = static_cast<ncclNet_v10_t*>(dlsym(l->lib, "ncclNetPlugin_v10"));
    l->v9 = static_cast<ncclNet_v9_t*>(dlsym(l->lib, "ncclNetPlugin_v9"));
    l->v8 = static_cast<ncclNet_v8_t*>(dlsym(l->lib, "ncclNetPlugin_v8"));
    if (l->v11 != nullptr) {
      // The process's first init, as NCCL's first communicator would do it; tests read its lines.
      void* ctx = nullptr;
      ncclNetCommConfig_v11_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
      l->first_init = l->v11->init(&ctx, 1, &cfg, record_log, nullptr);
      l->first_init_log = log_lines();
      l->v11->finalize(ctx);
    }
    return l;
  }();
  return *loaded;
}

void record_log(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                const char* fmt, ...) {
  char buf[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  const char* lvl = level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_INFO ? "INFO" : "OTHER";
  std::lock_guard<std::mutex> lock(log_mu);
  log_store().push_back(fmt::format("{} {}", lvl, buf));
}

std::vector<std::string> log_lines() {
  std::lock_guard<std::mutex> lock(log_mu);
  return log_store();
}

void clear_log() {
  std::lock_guard<std::mutex> lock(log_mu);
  log_store().clear();
}

// ---- buffers and patterns ------------------------------------------------------------------

Buffer::Buffer(size_t n) : size(n) {
  size_t rounded = (n + 4095) / 4096 * 4096;
  data = static_cast<uint8_t*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded));
  if (data == nullptr) throw std::bad_alloc();
}

Buffer::~Buffer() { std::free(data); }

MemfdBuffer::MemfdBuffer(size_t n, const char* name) : size(n) {
  const size_t rounded = (n + 4095) / 4096 * 4096;
  fd = memfd_create(name, MFD_CLOEXEC);
  if (fd < 0) return;
  if (ftruncate(fd, static_cast<off_t>(rounded == 0 ? 4096 : rounded)) != 0) return;
  void* m = mmap(nullptr, rounded == 0 ? 4096 : rounded, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m != MAP_FAILED) data = static_cast<uint8_t*>(m);
}

MemfdBuffer::~MemfdBuffer() {
  const size_t rounded = (size + 4095) / 4096 * 4096;
  if (data != nullptr) munmap(data, rounded == 0 ? 4096 : rounded);
  if (fd >= 0) close(fd);
}

void fill_pattern(uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + static_cast<uint32_t>(n);
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    p[i] = static_cast<uint8_t>(x >> 24);
  }
}

int64_t check_pattern(const uint8_t* p, size_t n, uint32_t seed) {
  uint32_t x = seed * 2654435761u + static_cast<uint32_t>(n);
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    if (p[i] != static_cast<uint8_t>(x >> 24)) return static_cast<int64_t>(i);
  }
  return -1;
}

// ---- drivers -------------------------------------------------------------------------------

Error connect_pair(NetApi& api, void* ctx, void** send_comm, void** recv_comm, int deadline_ms) {
  return connect_pair(api, ctx, api, ctx, send_comm, recv_comm, deadline_ms);
}

Error connect_pair(NetApi& api, void* ctx, NetApi& capi, void* cctx, void** send_comm,
                   void** recv_comm, int deadline_ms) {
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  *send_comm = nullptr;
  *recv_comm = nullptr;
  if (ncclResult_t r = api.listen(ctx, 0, handle, &lc); r != ncclSuccess || lc == nullptr) {
    return fmt::format("listen returned {} (listenComm {})", static_cast<int>(r), lc);
  }
  auto deadline = after_ms(deadline_ms);
  while (*send_comm == nullptr || *recv_comm == nullptr) {
    if (*send_comm == nullptr) {
      if (ncclResult_t r = capi.connect(cctx, 0, handle, send_comm); r != ncclSuccess) {
        api.close_listen(lc);
        return fmt::format("connect returned {}", static_cast<int>(r));
      }
    }
    if (*recv_comm == nullptr) {
      if (ncclResult_t r = api.accept(lc, recv_comm); r != ncclSuccess) {
        api.close_listen(lc);
        return fmt::format("accept returned {}", static_cast<int>(r));
      }
    }
    if (past(deadline)) {
      api.close_listen(lc);
      return fmt::format("connect/accept not done after {} ms (send {}, recv {})", deadline_ms,
                         *send_comm, *recv_comm);
    }
  }
  if (api.close_listen(lc) != ncclSuccess) return "closeListen failed";
  return "";
}

Error wait_request(NetApi& api, void* req, int* size, int deadline_ms) {
  auto deadline = after_ms(deadline_ms);
  int done = 0;
  while (true) {
    ncclResult_t r = api.test(req, &done, size);
    if (r != ncclSuccess) return fmt::format("test returned {}", static_cast<int>(r));
    if (done) return "";
    if (past(deadline)) return fmt::format("request not done after {} ms", deadline_ms);
  }
}

Error wait_all(NetApi& api, const std::vector<void*>& reqs, std::vector<int>* sizes,
               int deadline_ms) {
  auto deadline = after_ms(deadline_ms);
  std::vector<bool> done(reqs.size(), false);
  if (sizes != nullptr) sizes->assign(reqs.size(), -1);
  size_t remaining = reqs.size();
  while (remaining > 0) {
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (done[i]) continue;
      int d = 0, size = -1;
      ncclResult_t r = api.test(reqs[i], &d, &size);
      if (r != ncclSuccess)
        return fmt::format("test of request {} returned {}", i, static_cast<int>(r));
      if (d) {
        done[i] = true;
        --remaining;
        if (sizes != nullptr) (*sizes)[i] = size;
      }
    }
    if (remaining > 0 && past(deadline)) {
      return fmt::format("{} of {} requests not done after {} ms", remaining, reqs.size(),
                         deadline_ms);
    }
  }
  return "";
}

Error post_send(NetApi& api, void* sc, void* data, size_t size, int tag, void* mh, void** req,
                int deadline_ms) {
  auto deadline = after_ms(deadline_ms);
  while (true) {
    *req = reinterpret_cast<void*>(0x5);  // the plugin must always overwrite it
    ncclResult_t r = api.isend(sc, data, size, tag, mh, req);
    if (r != ncclSuccess) return fmt::format("isend returned {}", static_cast<int>(r));
    if (*req != nullptr) return "";
    if (past(deadline)) return "isend kept returning a NULL request";
    std::this_thread::yield();
  }
}

Error post_recv(NetApi& api, void* rc, void* data, size_t size, int tag, void* mh, void** req,
                int deadline_ms) {
  auto deadline = after_ms(deadline_ms);
  while (true) {
    // NCCL stores the optional-completion hint here before calling irecv.
    *req = reinterpret_cast<void*>(NCCL_NET_OPTIONAL_RECV_COMPLETION);
    ncclResult_t r = api.irecv(rc, data, size, tag, mh, req);
    if (r != ncclSuccess) return fmt::format("irecv returned {}", static_cast<int>(r));
    if (*req == reinterpret_cast<void*>(NCCL_NET_OPTIONAL_RECV_COMPLETION)) {
      return "irecv left the request slot unwritten";
    }
    if (*req != nullptr) return "";
    if (past(deadline)) return "irecv kept returning a NULL request";
    std::this_thread::yield();
  }
}

std::string handle_hex(const uint8_t* handle) {
  std::string s;
  for (int i = 0; i < NCCL_NET_HANDLE_MAXSIZE; ++i) s += fmt::format("{:02x}", handle[i]);
  return s;
}

}  // namespace gw::plugin_test

namespace gw::plugin_test {

namespace {

Error write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return fmt::format("write to pipe: {}", strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
  return "";
}

Error read_all(int fd, uint8_t* p, size_t n, int deadline_ms) {
  auto deadline = after_ms(deadline_ms);
  while (n > 0) {
    pollfd pfd{fd, POLLIN, 0};
    int ms = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
    if (ms <= 0) return "peer did not send its handle in time";
    int rc = ::poll(&pfd, 1, ms);
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) continue;
    ssize_t r = ::read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return "peer closed the pipe before sending its handle";
    p += r;
    n -= static_cast<size_t>(r);
  }
  return "";
}

struct Step {
  size_t size;
  uint32_t seed;
};

// `what`, with the plugin's last warning logged after the first `from` lines (the reason it
// gives NCCL) where there is one: a failure in CI says why without a rerun.
Error with_reason(const char* what, size_t from) {
  const std::vector<std::string> lines = log_lines();
  for (size_t i = lines.size(); i > from; --i) {
    if (lines[i - 1].rfind("WARN ", 0) == 0) return fmt::format("{}: {}", what, lines[i - 1]);
  }
  return what;
}

}  // namespace

Error exchange_with_peer(NetApi& api, int read_fd, int write_fd, int role) {
  const size_t logged = log_lines().size();
  void* ctx = nullptr;
  if (api.init(&ctx) != ncclSuccess) return with_reason("init failed", logged);
  uint8_t mine[NCCL_NET_HANDLE_MAXSIZE] = {}, theirs[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  if (api.listen(ctx, 0, mine, &lc) != ncclSuccess || lc == nullptr) {
    return with_reason("listen failed", logged);
  }
  if (Error e = write_all(write_fd, mine, sizeof(mine)); !e.empty()) return e;
  if (Error e = read_all(read_fd, theirs, sizeof(theirs), 15000); !e.empty()) return e;
  void *sc = nullptr, *rc = nullptr;
  auto deadline = after_ms(15000);
  while (sc == nullptr || rc == nullptr) {
    if (sc == nullptr && api.connect(ctx, 0, theirs, &sc) != ncclSuccess) {
      return with_reason("connect failed", logged);
    }
    if (rc == nullptr && api.accept(lc, &rc) != ncclSuccess) {
      return with_reason("accept failed", logged);
    }
    if (past(deadline)) return "connect/accept across processes timed out";
  }
  api.close_listen(lc);

  std::vector<Step> steps;
  for (size_t s : {size_t{0}, size_t{1}, size_t{4096}, (size_t{1} << 20) + 3, size_t{64} << 20}) {
    steps.push_back({s, static_cast<uint32_t>(s % 1000)});
  }
  for (const Step& st : steps) {
    Buffer out(st.size), in(st.size + 128);  // receive posted larger than the send
    fill_pattern(out.data, st.size, st.seed * 2 + role);
    void *sreq = nullptr, *rreq = nullptr;
    if (Error e = post_recv(api, rc, in.data, in.size, 1 - role, nullptr, &rreq); !e.empty()) {
      return e;
    }
    if (Error e = post_send(api, sc, out.data, st.size, role, nullptr, &sreq); !e.empty()) return e;
    std::vector<int> sizes;
    if (Error e = wait_all(api, {sreq, rreq}, &sizes); !e.empty()) return e;
    int rsize = sizes[1];
    if (rsize != static_cast<int>(st.size)) {
      return fmt::format("received {} bytes, peer sent {}", rsize, st.size);
    }
    if (int64_t bad = check_pattern(in.data, st.size, st.seed * 2 + (1 - role)); bad >= 0) {
      return fmt::format("{}-byte message corrupt at byte {}", st.size, bad);
    }
  }
  // 32 registered buffers in flight each way.
  constexpr int kN = NCCL_NET_MAX_REQUESTS;
  constexpr size_t kSize = 64 * 1024;
  Buffer out(kSize * kN), in(kSize * kN);
  void *smh = nullptr, *rmh = nullptr;
  if (api.reg_mr(sc, out.data, out.size, NCCL_PTR_HOST, &smh) != ncclSuccess) return "regMr";
  if (api.reg_mr(rc, in.data, in.size, NCCL_PTR_HOST, &rmh) != ncclSuccess) return "regMr";
  std::vector<void*> sreq(kN), rreq(kN);
  for (int i = 0; i < kN; ++i) {
    fill_pattern(out.data + i * kSize, kSize, 500 + i * 2 + role);
    if (Error e = post_recv(api, rc, in.data + i * kSize, kSize, 1 - role, rmh, &rreq[i]);
        !e.empty()) {
      return e;
    }
  }
  for (int i = 0; i < kN; ++i) {
    if (Error e = post_send(api, sc, out.data + i * kSize, kSize, role, smh, &sreq[i]);
        !e.empty()) {
      return e;
    }
  }
  std::vector<void*> all = sreq;
  all.insert(all.end(), rreq.begin(), rreq.end());
  if (Error e = wait_all(api, all); !e.empty()) return "burst: " + e;
  for (int i = 0; i < kN; ++i) {
    if (check_pattern(in.data + i * kSize, kSize, 500 + i * 2 + (1 - role)) >= 0) {
      return fmt::format("burst message {} corrupt or out of order", i);
    }
  }
  api.dereg_mr(sc, smh);
  api.dereg_mr(rc, rmh);
  // Both sides must be done reading before either closes: a one-byte barrier over the pipes.
  uint8_t token = 1;
  if (Error e = write_all(write_fd, &token, 1); !e.empty()) return e;
  if (Error e = read_all(read_fd, &token, 1, 30000); !e.empty()) return e;
  if (api.close_send(sc) != ncclSuccess || api.close_recv(rc) != ncclSuccess) return "close";
  if (api.finalize(ctx) != ncclSuccess) return "finalize";
  return "";
}

// ---- the peer helper ----------------------------------------------------------------------

// Runs the peer helper with extra environment ("NAME=value" sets, "-NAME" removes); returns its
// exit status, or -1 when it crashed or had to be killed.
int run_peer(const std::vector<std::string>& env, const std::vector<std::string>& args,
             std::string* out) {
  // Everything is built before fork: the child of a threaded process may only exec.
  std::vector<std::string> names;  // the variables env replaces or removes
  for (const std::string& change : env) {
    names.push_back(change[0] == '-' ? change.substr(1) : change.substr(0, change.find('=')));
    if (names.back() == "GW_DAEMON") {
      // The caller chose the peer's daemon (or none): nothing may move it to host b's.
      names.push_back("GW_PLUGIN_TEST_PEER_DAEMON");
      names.push_back("GW_PLUGIN_TEST_PEER_HOSTID");
    }
  }
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string v(*e);
    bool replaced = false;
    for (const std::string& name : names) {
      if (v.compare(0, name.size() + 1, name + "=") == 0) replaced = true;
    }
    if (!replaced) vars.push_back(v);
  }
  for (const std::string& change : env) {
    if (change[0] != '-') vars.push_back(change);
  }
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_s = {GW_PLUGIN_PEER_PATH};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  int pipe_fds[2] = {-1, -1};
  if (out != nullptr) {
    out->clear();
    if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) return -1;
  }
  std::fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (pipe_fds[1] >= 0) {
      ::dup2(pipe_fds[1], STDOUT_FILENO);  // dup2 clears O_CLOEXEC on the copy
      ::fcntl(STDOUT_FILENO, F_SETFL, 0);  // the peer writes blocking
    }
    execve(GW_PLUGIN_PEER_PATH, argv.data(), envp.data());
    _exit(127);
  }
  if (pipe_fds[1] >= 0) ::close(pipe_fds[1]);
  // What the peer wrote so far, kept and echoed.
  auto drain = [&] {
    if (pipe_fds[0] < 0) return;
    char buf[4096];
    for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof(buf))) > 0;) {
      out->append(buf, static_cast<size_t>(n));
      std::fwrite(buf, 1, static_cast<size_t>(n), stdout);
    }
    std::fflush(stdout);
  };
  auto finish = [&](int rc) {
    drain();
    if (pipe_fds[0] >= 0) ::close(pipe_fds[0]);
    return rc;
  };
  if (pid < 0) return finish(-1);
  // Reap with a deadline; kill a peer that hangs.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return finish(-1);
    }
    drain();  // a full pipe must not stop the peer
    usleep(10000);
  }
  return finish(WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

}  // namespace gw::plugin_test
