#include "tests/plugin/daemon_scenarios.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/plugin/plugin_harness.h"
#include "tests/plugin/scenario_util.h"

namespace gw::plugin_test {

namespace {

using scenario::Clock;
using scenario::connect_to;
using scenario::fail;
using scenario::unhex;

// DIR/name with `text`, whole or not at all (written aside, then renamed).
bool put_file(const std::string& dir, const std::string& name, const std::string& text) {
  const std::string tmp = dir + "/." + name + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  return std::fclose(f) == 0 && ok && std::rename(tmp.c_str(), (dir + "/" + name).c_str()) == 0;
}

// Whether DIR/name appears within `ms`.
bool await_file(const std::string& dir, const std::string& name, int ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(ms);
  while (::access((dir + "/" + name).c_str(), F_OK) != 0) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// The device buffers of the killed-with-a-device-op scenarios (issue 28): large enough that the
// emulated NICs move them for a while (the kill lands mid-transfer).
constexpr size_t kInflightBytes = size_t{64} << 20;

int run_connect(const std::string& hex, const std::string& then, const std::string& dir = "") {
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  if (!unhex(hex, handle)) return fail("bad handle");
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  clear_log();
  void* sc = nullptr;
  const auto t0 = Clock::now();
  ncclResult_t r = connect_to(*api, ctx, handle, &sc);
  if (then == "fail") {
    if (sc != nullptr) return fail("a process of another job connected to the listener");
    if (r != ncclSystemError) return fail("connect returned " + std::to_string(r));
    bool named = false;
    for (const std::string& line : log_lines()) {
      std::fprintf(stderr, "  %s\n", line.c_str());
      if (line.rfind("WARN", 0) == 0 && line.find("GW_JOB_TOKEN") != std::string::npos) {
        named = true;
      }
    }
    if (!named) return fail("no WARN naming GW_JOB_TOKEN");
    std::fprintf(stderr, "connect refused after %.1f s\n",
                 std::chrono::duration<double>(Clock::now() - t0).count());
    api->finalize(ctx);  // its context, or LeakSanitizer fails the ASan build's run
    return 0;
  }
  if (sc == nullptr) return fail("connect returned " + std::to_string(r) + " and no comm");
  if (then == "dmabuf-die") {
    // A device buffer registered through the daemon, then the process killed without a word:
    // the daemon must release the registration with the client (the test reads its log).
    MemfdBuffer dev(1 << 20, "gw-dmabuf-die");
    void* mh = nullptr;
    if (dev.data == nullptr) return fail("memfd");
    if (api->reg_mr_dmabuf(sc, dev.data, dev.size, NCCL_PTR_CUDA, 0, dev.fd, &mh) != ncclSuccess) {
      return fail("regMrDmaBuf failed");
    }
    std::printf("registered\n");
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
    return fail("still alive");
  }
  if (then == "dmabuf-send-die") {
    // A device message of 1 MiB sent (its bytes wait at this host's daemon until the listener's
    // receive takes the header), then the process killed: the listener's receives fail.
    MemfdBuffer dev(1 << 20, "gw-dmabuf-send-die");
    void* mh = nullptr;
    if (dev.data == nullptr) return fail("memfd");
    if (api->reg_mr_dmabuf(sc, dev.data, dev.size, NCCL_PTR_CUDA, 0, dev.fd, &mh) != ncclSuccess) {
      return fail("regMrDmaBuf failed");
    }
    fill_pattern(dev.data, dev.size, 5);
    void* req = nullptr;
    if (Error e = post_send(*api, sc, dev.data, dev.size, 1, mh, &req); !e.empty()) return fail(e);
    std::printf("sent\n");
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::kill(::getpid(), SIGKILL);
    return fail("still alive");
  }
  if (then == "dmabuf-send-inflight") {
    // A device send of 64 MiB once the listener posted its receive (DIR/posted), this process's
    // pid in DIR/pid: the test kills it once the first bytes landed, the send in flight.
    MemfdBuffer dev(kInflightBytes, "gw-dmabuf-send-inflight");
    void* mh = nullptr;
    if (dev.data == nullptr) return fail("memfd");
    if (api->reg_mr_dmabuf(sc, dev.data, dev.size, NCCL_PTR_CUDA, 0, dev.fd, &mh) != ncclSuccess) {
      return fail("regMrDmaBuf failed");
    }
    fill_pattern(dev.data, dev.size, 21);
    if (!put_file(dir, "pid", std::to_string(::getpid()))) return fail("DIR/pid");
    if (!await_file(dir, "posted", 20000)) return fail("no DIR/posted within 20 s");
    void* req = nullptr;
    if (Error e = post_send(*api, sc, dev.data, dev.size, 1, mh, &req); !e.empty()) return fail(e);
    std::printf("sent\n");
    std::fflush(stdout);
    int done = 0, size = 0;
    for (const auto until = Clock::now() + std::chrono::seconds(25); Clock::now() < until;) {
      if (api->test(req, &done, &size) != ncclSuccess) return fail("the send failed");
      if (done) return fail("the send completed before the test killed this process");
    }
    return fail("the test did not kill this process");
  }
  if (then == "die") {
    // Long enough for the listener to post its receive: the rank dies with it in flight.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(::getpid(), SIGKILL);
    return fail("still alive");
  }
  Buffer out(4096);
  fill_pattern(out.data, out.size, 77);
  void* req = nullptr;
  if (Error e = post_send(*api, sc, out.data, out.size, 3, nullptr, &req); !e.empty()) {
    return fail(e);
  }
  if (Error e = wait_all(*api, {req}); !e.empty()) return fail(e);
  if (api->close_send(sc) != ncclSuccess) return fail("close");
  return api->finalize(ctx) == ncclSuccess ? 0 : fail("finalize");
}

// listen DIR MODE: the receiving end on host b (docs in daemon_scenarios.h).
int run_listen(const std::string& dir, const std::string& mode) {
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  if (api->listen(ctx, 0, handle, &lc) != ncclSuccess) return fail("listen");
  if (!put_file(dir, "handle", handle_hex(handle))) return fail("DIR/handle");
  void* rc = nullptr;
  for (const auto until = Clock::now() + std::chrono::seconds(20); rc == nullptr;) {
    if (api->accept(lc, &rc) != ncclSuccess) return fail("accept");
    if (rc == nullptr && Clock::now() > until) return fail("nobody connected within 20 s");
    if (rc == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  MemfdBuffer dev(kInflightBytes, "gw-dmabuf-listen");
  void* mh = nullptr;
  if (dev.data == nullptr) return fail("memfd");
  // Waits (in the daemon) for the data connection the test's first device registration makes.
  if (api->reg_mr_dmabuf(rc, dev.data, dev.size, NCCL_PTR_CUDA, 0, dev.fd, &mh) != ncclSuccess) {
    return fail("regMrDmaBuf failed");
  }
  if (mode == "dmabuf-recv-inflight") {
    // A device receive of 64 MiB posted (DIR/posted); once its first bytes landed, killed.
    void* req = nullptr;
    if (Error e = post_recv(*api, rc, dev.data, dev.size, 1, mh, &req); !e.empty()) return fail(e);
    if (!put_file(dir, "posted", "")) return fail("DIR/posted");
    const volatile uint8_t* first = dev.data;
    for (const auto until = Clock::now() + std::chrono::seconds(20); Clock::now() < until;) {
      bool landed = false;
      for (size_t i = 0; i < 64 && !landed; ++i) landed = first[i] != 0;
      if (landed) {
        std::printf("landed\n");
        std::fflush(stdout);
        ::kill(::getpid(), SIGKILL);
      }
      std::this_thread::yield();  // the daemons share the cores
    }
    return fail("no byte landed within 20 s");
  }
  if (mode == "dmabuf-held") {
    // Registered (DIR/registered), then killed 300 ms after the test sent (DIR/sent) without
    // posting a receive: its daemon holds the device message's header.
    if (!put_file(dir, "registered", "")) return fail("DIR/registered");
    if (!await_file(dir, "sent", 20000)) return fail("no DIR/sent within 20 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    std::printf("killed\n");
    std::fflush(stdout);
    ::kill(::getpid(), SIGKILL);
    return fail("still alive");
  }
  return fail("listen: no mode " + mode);
}

int run_daemon_dies(const char* gradwired) {
  char dir[] = "/tmp/gw-plugin-dies-XXXXXX";
  if (::mkdtemp(dir) == nullptr) return fail("mkdtemp");
  const std::string sock = std::string(dir) + "/s.sock";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::execl(gradwired, gradwired, "--foreground", "--socket", sock.c_str(),
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  auto cleanup = [&] {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    ::unlink(sock.c_str());
    ::unlink((sock + ".ctl").c_str());
    ::rmdir(dir);
  };
  for (int i = 0; i < 200 && ::access((sock + ".ctl").c_str(), F_OK) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::setenv("GW_DAEMON", ("unix:" + sock).c_str(), 1);
  int rc = [&]() -> int {
    if (plugin().first_init != ncclSuccess) return fail("init failed");
    auto api = make_api("v11");
    void* ctx = nullptr;
    if (api->init(&ctx) != ncclSuccess) return fail("init");
    void *sc = nullptr, *rc = nullptr;
    if (Error e = connect_pair(*api, ctx, &sc, &rc); !e.empty()) return fail(e);
    Buffer in(1 << 20);
    void* req = nullptr;
    if (Error e = post_recv(*api, rc, in.data, in.size, 0, nullptr, &req); !e.empty()) {
      return fail(e);
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
    const auto t0 = Clock::now();
    int done = 0, size = 0;
    ncclResult_t r = ncclSuccess;
    while (r == ncclSuccess && !done && Clock::now() - t0 < std::chrono::seconds(5)) {
      r = api->test(req, &done, &size);
    }
    const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
    if (r == ncclSuccess) return fail(done ? "the receive completed" : "test() hung 5 s");
    std::fprintf(stderr, "test() failed %.3f s after the daemon died\n", waited);
    Buffer out(100);
    void* sreq = nullptr;
    r = api->isend(sc, out.data, 100, 0, nullptr, &sreq);
    if (r == ncclSuccess && sreq != nullptr) {
      done = 0;
      const auto t1 = Clock::now();
      while (r == ncclSuccess && !done && Clock::now() - t1 < std::chrono::seconds(5)) {
        r = api->test(sreq, &done, &size);
      }
      if (r == ncclSuccess) return fail("a send after the daemon died did not fail");
    }
    uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* lc = nullptr;
    if (api->listen(ctx, 0, handle, &lc) != ncclSuccess) return fail("listen");
    void* sc2 = nullptr;
    const auto t2 = Clock::now();
    r = connect_to(*api, ctx, handle, &sc2);
    if (r == ncclSuccess) return fail("connect without a daemon did not fail");
    std::fprintf(stderr, "connect failed %.3f s after it started\n",
                 std::chrono::duration<double>(Clock::now() - t2).count());
    api->close_listen(lc);
    api->close_send(sc);
    api->close_recv(rc);
    api->finalize(ctx);
    return 0;
  }();
  cleanup();
  return rc;
}

// Each instance's handle names its host (bytes [8, 16): FNV-1a 64 of the host identity), so the
// two ends are on two hosts, not both on the one the environment named last: "" when `x`'s is
// `host`. The instance's transport is made at its first listen, which this is.
Error on_host(NetApi& x, void* c, const char* host) {
  uint8_t h[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  if (x.listen(c, 0, h, &lc) != ncclSuccess) return "listen";
  x.close_listen(lc);
  uint64_t want = 0xcbf29ce484222325ull, got = 0;
  for (const char* p = host; *p != '\0'; ++p) {
    want = (want ^ static_cast<unsigned char>(*p)) * 0x100000001b3ull;
  }
  for (int i = 7; i >= 0; --i) got = (got << 8) | h[8 + i];
  return got == want ? "" : std::string("an instance is not on host ") + host;
}

}  // namespace

Error second_instance_on_host_a(NetApi& api, void* ctx, const char* daemon_a,
                                std::unique_ptr<NetApi>* second, void** second_ctx) {
  // This instance's transport opens on host b (its first listen) before the environment moves
  // to host a for the second instance.
  if (Error e = on_host(api, ctx, kXhostB); !e.empty()) return e;
  setenv("GW_DAEMON", daemon_a, 1);
  setenv("GW_HOSTID", kXhostA, 1);
  *second = make_api_of_copy();
  if ((*second)->init(second_ctx) != ncclSuccess) {
    second->reset();
    return "init of the second instance (host a)";
  }
  return on_host(**second, *second_ctx, kXhostA);
}

namespace {

// xhost: the receiving end on this process's host (b, with its daemon), the sending end on
// host a through daemon a (GW_PLUGIN_TEST_HOST_A_DAEMON), in a second instance of the plugin.
int run_bench(bool xhost) {
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  std::unique_ptr<NetApi> capi;
  void* cctx = ctx;
  if (xhost) {
    const char* a = std::getenv("GW_PLUGIN_TEST_HOST_A_DAEMON");
    if (a == nullptr) return fail("bench-xhost: two hosts only (GW_PLUGIN_TEST_XHOST=1)");
    if (Error e = second_instance_on_host_a(*api, ctx, a, &capi, &cctx); !e.empty()) {
      return fail("bench-xhost: " + e);
    }
  }
  void *sc = nullptr, *rc = nullptr;
  if (Error e = connect_pair(*api, ctx, capi ? *capi : *api, cctx, &sc, &rc); !e.empty()) {
    return fail(e);
  }
  NetApi& sapi = capi ? *capi : *api;
  auto one = [&](Buffer& out, Buffer& in, size_t size) -> Error {
    void *sreq = nullptr, *rreq = nullptr;
    if (Error e = post_recv(*api, rc, in.data, size, 1, nullptr, &rreq); !e.empty()) return e;
    if (Error e = post_send(sapi, sc, out.data, size, 1, nullptr, &sreq); !e.empty()) return e;
    if (!capi) return wait_all(*api, {sreq, rreq});
    // Both requests, each through its own instance, polled in turn as two proxy threads would.
    for (const auto until = Clock::now() + std::chrono::seconds(20);;) {
      int sd = 0, rd = 0, n = 0;
      if (sreq != nullptr && sapi.test(sreq, &sd, &n) != ncclSuccess) return "isend failed";
      if (sd) sreq = nullptr;
      if (rreq != nullptr && api->test(rreq, &rd, &n) != ncclSuccess) return "irecv failed";
      if (rd) rreq = nullptr;
      if (sreq == nullptr && rreq == nullptr) return "";
      if (Clock::now() > until) return "transfer not done after 20 s";
    }
  };
  constexpr size_t kBig = size_t{64} << 20;
  Buffer out(kBig), in(kBig);
  fill_pattern(out.data, kBig, 5);
  if (Error e = one(out, in, kBig); !e.empty()) return fail(e);  // warm-up
  if (check_pattern(in.data, kBig, 5) != -1) return fail("64 MiB arrived wrong");
  // Best of several, each phase bounded in time so a loaded machine ends it early (run_peer's
  // deadline is 30 s): 64 MiB transfers one at a time, then rounds of 500 8-byte messages.
  double best_gbps = 0;
  const auto bw_start = Clock::now();
  for (int i = 0; i < 8 && Clock::now() - bw_start < std::chrono::seconds(5); ++i) {
    const auto t0 = Clock::now();
    if (Error e = one(out, in, kBig); !e.empty()) return fail(e);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best_gbps = std::max(best_gbps, double(kBig) / s / 1e9);
  }
  double best_us = 1e9;
  const auto lat_start = Clock::now();
  for (int round = 0; round < 10 && Clock::now() - lat_start < std::chrono::seconds(3); ++round) {
    constexpr int kN = 500;
    const auto t0 = Clock::now();
    for (int i = 0; i < kN; ++i) {
      if (Error e = one(out, in, 8); !e.empty()) return fail(e);
    }
    best_us =
        std::min(best_us, std::chrono::duration<double>(Clock::now() - t0).count() * 1e6 / kN);
  }
  const char* d = std::getenv("GW_DAEMON");
  std::printf("bench %s 64MiB %.2f GB/s 8B %.1f us\n",
              xhost                ? "daemon-xhost"
              : d != nullptr && *d ? "daemon"
                                   : "direct",
              best_gbps, best_us);
  std::fflush(stdout);
  sapi.close_send(sc);
  api->close_recv(rc);
  if (capi) capi->finalize(cctx);
  api->finalize(ctx);
  return 0;
}

}  // namespace

int run_daemon_scenario(int argc, char** argv) {
  const std::string mode = argv[1];
  if (mode == "connect" && argc == 4) return run_connect(argv[2], argv[3]);
  if (mode == "connect" && argc == 5) return run_connect(argv[2], argv[3], argv[4]);
  if (mode == "listen" && argc == 4) return run_listen(argv[2], argv[3]);
  if (mode == "daemon-dies" && argc == 3) return run_daemon_dies(argv[2]);
  if (mode == "bench" && argc == 2) return run_bench(false);
  if (mode == "bench-xhost" && argc == 2) return run_bench(true);
  return run_file_scenario(argc, argv);
}

}  // namespace gw::plugin_test
