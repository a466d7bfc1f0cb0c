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

namespace gw::plugin_test {

namespace {

using Clock = std::chrono::steady_clock;

int fail(const std::string& why) {
  std::fprintf(stderr, "nccl_plugin_peer: %s\n", why.c_str());
  return 1;
}

bool unhex(const std::string& hex, uint8_t* out) {
  if (hex.size() != 2 * NCCL_NET_HANDLE_MAXSIZE) return false;
  for (size_t i = 0; i < NCCL_NET_HANDLE_MAXSIZE; ++i) {
    out[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  }
  return true;
}

// Connects to `handle` until a comm, an error or 15 s: the result, *sc the comm.
ncclResult_t connect_to(NetApi& api, void* ctx, uint8_t* handle, void** sc) {
  *sc = nullptr;
  ncclResult_t r = ncclSuccess;
  const auto deadline = Clock::now() + std::chrono::seconds(15);
  while (r == ncclSuccess && *sc == nullptr && Clock::now() < deadline) {
    r = api.connect(ctx, 0, handle, sc);
    if (*sc == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return r;
}

int run_connect(const std::string& hex, const std::string& then) {
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
    return 0;
  }
  if (sc == nullptr) return fail("connect returned " + std::to_string(r) + " and no comm");
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
    // This instance opens its transport at its first listen: open it here, on host b, before
    // the environment moves to host a for the second instance.
    // Each instance's handle names its host (bytes [8, 16): FNV-1a 64 of the host identity), so
    // the two ends are on two hosts, not both on the one the environment named last.
    auto on_host = [](NetApi& x, void* c, const char* host) -> Error {
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
    };
    if (Error e = on_host(*api, ctx, kXhostB); !e.empty()) return fail(e);
    setenv("GW_DAEMON", a, 1);
    setenv("GW_HOSTID", kXhostA, 1);
    capi = make_api_of_copy();
    if (capi->init(&cctx) != ncclSuccess) return fail("init of the second instance");
    if (Error e = on_host(*capi, cctx, kXhostA); !e.empty()) return fail(e);
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
  if (mode == "daemon-dies" && argc == 3) return run_daemon_dies(argv[2]);
  if (mode == "bench" && argc == 2) return run_bench(false);
  if (mode == "bench-xhost" && argc == 2) return run_bench(true);
  return run_file_scenario(argc, argv);
}

}  // namespace gw::plugin_test

// ---- processes that meet through files: share, bench-pair ---------------------------------

namespace gw::plugin_test {

namespace {

// `data` as the file `path`, whole or not at all (a temporary, then rename).
Error publish_file(const std::string& path, const std::string& data) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return "cannot write " + tmp + ": " + std::strerror(errno);
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  if (std::fclose(f) != 0 || !ok) return "cannot write " + tmp;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return "cannot rename " + tmp;
  return "";
}

// The file `path` once it exists (up to `ms`), in *out.
Error await_file(const std::string& path, std::string* out, int ms) {
  for (const auto until = Clock::now() + std::chrono::milliseconds(ms);;) {
    if (FILE* f = std::fopen(path.c_str(), "rb"); f != nullptr) {
      out->clear();
      char buf[4096];
      while (size_t n = std::fread(buf, 1, sizeof(buf), f)) out->append(buf, n);
      std::fclose(f);
      return "";
    }
    if (Clock::now() > until) return path + " did not appear within " + std::to_string(ms) + " ms";
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// Two processes connect both ways through files in `dir`: each listens, publishes its handle as
// <dir>/<me>.handle, reads <dir>/<peer>.handle, then connects and accepts alternately (20 s).
Error connect_through_files(NetApi& api, void* ctx, const std::string& dir, const std::string& me,
                            const std::string& peer, void** sc, void** rc) {
  uint8_t mine[NCCL_NET_HANDLE_MAXSIZE] = {}, theirs[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  if (api.listen(ctx, 0, mine, &lc) != ncclSuccess || lc == nullptr) return "listen failed";
  if (Error e = publish_file(dir + "/" + me + ".handle", handle_hex(mine)); !e.empty()) return e;
  std::string hex;
  if (Error e = await_file(dir + "/" + peer + ".handle", &hex, 20000); !e.empty()) return e;
  if (!unhex(hex, theirs)) return "bad handle in " + dir + "/" + peer + ".handle";
  *sc = *rc = nullptr;
  for (const auto until = Clock::now() + std::chrono::seconds(20);
       *sc == nullptr || *rc == nullptr;) {
    if (*sc == nullptr && api.connect(ctx, 0, theirs, sc) != ncclSuccess) return "connect failed";
    if (*rc == nullptr && api.accept(lc, rc) != ncclSuccess) return "accept failed";
    if (Clock::now() > until) return "connect/accept with " + peer + " not done within 20 s";
    if (*sc == nullptr || *rc == nullptr) std::this_thread::yield();
  }
  return api.close_listen(lc) == ncclSuccess ? "" : "closeListen failed";
}

// What each pair of the share scenario moves, each way: 0 B, 1 B, eager (up to 16 KiB) and its
// edge, 64 KiB, several MiB.
constexpr size_t kShareSizes[] = {
    0, 1, 4096, 16384, 16385, 65536, (size_t{3} << 20) + 5, size_t{8} << 20};
constexpr size_t kShareCount = sizeof(kShareSizes) / sizeof(kShareSizes[0]);

uint32_t share_seed(int index, int phase, size_t i, int role) {
  return static_cast<uint32_t>(100000 * index + 1000 * phase + 10 * i + role);
}

// One process of share (host a: side a, role 0; host b: side b, role 1): connect both ways to the
// process of the other side with the same index; then each size one at a time both ways at once,
// then every size in flight at once both ways from registered buffers, every byte checked; then
// <dir>/<me>.done, and close only once the test has looked (<dir>/release) and the peer is done.
int run_share(const std::string& dir, const std::string& side, int index) {
  if (side != "a" && side != "b") return fail("share: side is a or b");
  const int role = side == "a" ? 0 : 1;
  const std::string me = side + std::to_string(index);
  std::string peer = role == 0 ? "b" : "a";
  peer += std::to_string(index);
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  const auto t0 = Clock::now();
  void *sc = nullptr, *rc = nullptr;
  if (Error e = connect_through_files(*api, ctx, dir, me, peer, &sc, &rc); !e.empty()) {
    return fail(me + ": " + e);
  }
  size_t bytes = 0;
  int messages = 0;
  // Phase 1: one size at a time, both ways at once.
  for (size_t i = 0; i < kShareCount; ++i) {
    const size_t n = kShareSizes[i];
    Buffer out(n), in(n + 64);  // the receive posted larger than the send
    fill_pattern(out.data, n, share_seed(index, 1, i, role));
    void *sreq = nullptr, *rreq = nullptr;
    if (Error e = post_recv(*api, rc, in.data, in.size, 7, nullptr, &rreq); !e.empty()) {
      return fail(me + ": " + e);
    }
    if (Error e = post_send(*api, sc, out.data, n, 7, nullptr, &sreq); !e.empty()) {
      return fail(me + ": " + e);
    }
    std::vector<int> sizes;
    if (Error e = wait_all(*api, {sreq, rreq}, &sizes); !e.empty()) {
      return fail(me + ": " + std::to_string(n) + " bytes: " + e);
    }
    if (sizes[1] != static_cast<int>(n)) {
      return fail(me + ": received " + std::to_string(sizes[1]) + " bytes, peer sent " +
                  std::to_string(n));
    }
    if (int64_t bad = check_pattern(in.data, n, share_seed(index, 1, i, 1 - role)); bad >= 0) {
      return fail(me + ": " + std::to_string(n) + "-byte message corrupt at byte " +
                  std::to_string(bad));
    }
    bytes += n;
    ++messages;
  }
  // Phase 2: every size in flight at once each way, from one registered buffer per direction.
  size_t total = 0;
  for (size_t n : kShareSizes) total += n;
  Buffer out(total), in(total);
  void *smh = nullptr, *rmh = nullptr;
  if (api->reg_mr(sc, out.data, out.size, NCCL_PTR_HOST, &smh) != ncclSuccess ||
      api->reg_mr(rc, in.data, in.size, NCCL_PTR_HOST, &rmh) != ncclSuccess) {
    return fail(me + ": regMr");
  }
  std::vector<void*> reqs(2 * kShareCount);
  size_t off = 0;
  for (size_t i = 0; i < kShareCount; ++i) {
    fill_pattern(out.data + off, kShareSizes[i], share_seed(index, 2, i, role));
    if (Error e =
            post_recv(*api, rc, in.data + off, kShareSizes[i], 9, rmh, &reqs[kShareCount + i]);
        !e.empty()) {
      return fail(me + ": " + e);
    }
    off += kShareSizes[i];
  }
  off = 0;
  for (size_t i = 0; i < kShareCount; ++i) {
    if (Error e = post_send(*api, sc, out.data + off, kShareSizes[i], 9, smh, &reqs[i]);
        !e.empty()) {
      return fail(me + ": " + e);
    }
    off += kShareSizes[i];
  }
  std::vector<int> sizes;
  if (Error e = wait_all(*api, reqs, &sizes); !e.empty()) return fail(me + ": burst: " + e);
  off = 0;
  for (size_t i = 0; i < kShareCount; ++i) {
    const size_t n = kShareSizes[i];
    if (sizes[kShareCount + i] != static_cast<int>(n) ||
        check_pattern(in.data + off, n, share_seed(index, 2, i, 1 - role)) >= 0) {
      return fail(me + ": burst message " + std::to_string(i) + " (" + std::to_string(n) +
                  " bytes) wrong or out of order");
    }
    off += n;
    bytes += n;
    ++messages;
  }
  api->dereg_mr(sc, smh);
  api->dereg_mr(rc, rmh);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("share %s: %d messages, %zu bytes each way, checked, in %.2f s\n", me.c_str(),
              messages, bytes, s);
  std::fflush(stdout);
  // The connections stay up until the test has seen them all, and until the peer is done reading.
  std::string ignored;
  if (Error e = publish_file(dir + "/" + me + ".done", "1"); !e.empty()) return fail(e);
  if (Error e = await_file(dir + "/release", &ignored, 25000); !e.empty())
    return fail(me + ": " + e);
  if (Error e = await_file(dir + "/" + peer + ".done", &ignored, 25000); !e.empty()) {
    return fail(me + ": " + e);
  }
  if (api->close_send(sc) != ncclSuccess || api->close_recv(rc) != ncclSuccess) {
    return fail(me + ": close");
  }
  return api->finalize(ctx) == ncclSuccess ? 0 : fail(me + ": finalize");
}

// One side of bench-pair: the sender (tx) drives, the receiver (rx) answers. Each command is an
// 8-byte message from tx: {1, 0} a 64 MiB transfer that rx acknowledges with 0 bytes, {2, n} n
// ping-pongs of 8 bytes, {0, 0} the end. tx prints "bench-pair LABEL 64MiB <GB/s> GB/s 8B <us>
// us": the best 64 MiB transfer (command to acknowledgement) and the best round's half round
// trip, measured as run_bench measures (a warm-up checked, then phases bounded in time).
int run_bench_pair(const std::string& dir, const std::string& side, const std::string& label) {
  if (side != "tx" && side != "rx") return fail("bench-pair: side is tx or rx");
  const bool tx = side == "tx";
  if (plugin().first_init != ncclSuccess) {
    for (const std::string& line : plugin().first_init_log) {
      std::fprintf(stderr, "  %s\n", line.c_str());
    }
    return fail(side + ": init failed");
  }
  // Direct mode asked for dpdk: the plugin must really run it.
  const char* backend = std::getenv("GW_PLUGIN_BACKEND");
  if (backend != nullptr && std::string(backend) == "dpdk") {
    bool said = false;
    for (const std::string& line : plugin().first_init_log) {
      said |= line.find("backend dpdk") != std::string::npos;
    }
    if (!said) return fail("GW_PLUGIN_BACKEND=dpdk but the plugin did not say \"backend dpdk\"");
  }
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  void *sc = nullptr, *rc = nullptr;
  if (Error e = connect_through_files(*api, ctx, dir, side, tx ? "rx" : "tx", &sc, &rc);
      !e.empty()) {
    return fail(side + ": " + e);
  }
  constexpr size_t kBig = size_t{64} << 20;
  Buffer big(kBig), cmd(8), ack(8);
  auto send = [&](void* data, size_t n) -> Error {
    void* req = nullptr;
    if (Error e = post_send(*api, sc, data, n, 1, nullptr, &req); !e.empty()) return e;
    return wait_all(*api, {req});
  };
  auto recv = [&](void* data, size_t n, int* got) -> Error {
    void* req = nullptr;
    if (Error e = post_recv(*api, rc, data, n, 1, nullptr, &req); !e.empty()) return e;
    std::vector<int> sizes;
    Error e = wait_all(*api, {req}, &sizes);
    if (got != nullptr) *got = sizes.empty() ? -1 : sizes[0];
    return e;
  };
  if (!tx) {
    for (int transfers = 0;;) {
      int got = 0;
      if (Error e = recv(cmd.data, 8, &got); !e.empty()) return fail("rx: command: " + e);
      uint32_t word[2];
      std::memcpy(word, cmd.data, 8);
      if (got != 8) return fail("rx: a command of " + std::to_string(got) + " bytes");
      if (word[0] == 0) break;
      if (word[0] == 1) {
        if (Error e = recv(big.data, kBig, &got); !e.empty()) return fail("rx: 64 MiB: " + e);
        if (got != static_cast<int>(kBig)) return fail("rx: 64 MiB arrived short");
        if (transfers++ == 0 && check_pattern(big.data, kBig, 5) != -1) {
          return fail("rx: 64 MiB arrived wrong");
        }
        if (Error e = send(ack.data, 0); !e.empty()) return fail("rx: ack: " + e);
      } else if (word[0] == 2) {
        for (uint32_t i = 0; i < word[1]; ++i) {
          if (Error e = recv(ack.data, 8, &got); !e.empty()) return fail("rx: ping: " + e);
          if (Error e = send(ack.data, 8); !e.empty()) return fail("rx: pong: " + e);
        }
      } else {
        return fail("rx: unknown command");
      }
    }
  } else {
    fill_pattern(big.data, kBig, 5);
    auto command = [&](uint32_t what, uint32_t n) -> Error {
      const uint32_t word[2] = {what, n};
      std::memcpy(cmd.data, word, 8);
      return send(cmd.data, 8);
    };
    auto transfer = [&]() -> Error {
      if (Error e = command(1, 0); !e.empty()) return e;
      void *sreq = nullptr, *rreq = nullptr;
      if (Error e = post_recv(*api, rc, ack.data, 8, 1, nullptr, &rreq); !e.empty()) return e;
      if (Error e = post_send(*api, sc, big.data, kBig, 1, nullptr, &sreq); !e.empty()) return e;
      return wait_all(*api, {sreq, rreq});
    };
    if (Error e = transfer(); !e.empty()) return fail("tx: warm-up: " + e);
    double best_gbps = 0;
    const auto bw_start = Clock::now();
    for (int i = 0; i < 8 && Clock::now() - bw_start < std::chrono::seconds(5); ++i) {
      const auto t0 = Clock::now();
      if (Error e = transfer(); !e.empty()) return fail("tx: " + e);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      best_gbps = std::max(best_gbps, double(kBig) / s / 1e9);
    }
    double best_us = 1e9;
    const auto lat_start = Clock::now();
    for (int round = 0; round < 10 && Clock::now() - lat_start < std::chrono::seconds(3); ++round) {
      constexpr uint32_t kN = 500;
      if (Error e = command(2, kN); !e.empty()) return fail("tx: " + e);
      const auto t0 = Clock::now();
      for (uint32_t i = 0; i < kN; ++i) {
        void *sreq = nullptr, *rreq = nullptr;
        if (Error e = post_recv(*api, rc, ack.data, 8, 1, nullptr, &rreq); !e.empty()) {
          return fail("tx: " + e);
        }
        if (Error e = post_send(*api, sc, cmd.data, 8, 1, nullptr, &sreq); !e.empty()) {
          return fail("tx: " + e);
        }
        if (Error e = wait_all(*api, {sreq, rreq}); !e.empty()) return fail("tx: ping: " + e);
      }
      best_us = std::min(best_us,
                         std::chrono::duration<double>(Clock::now() - t0).count() * 1e6 / kN / 2);
    }
    if (Error e = command(0, 0); !e.empty()) return fail("tx: " + e);
    std::printf("bench-pair %s 64MiB %.2f GB/s 8B %.1f us\n", label.c_str(), best_gbps, best_us);
    std::fflush(stdout);
  }
  // Both done before either closes: the last message each way has completed on both sides
  // (tx's stop was received by rx; rx waits for nothing more), so a short file barrier.
  std::string ignored;
  if (Error e = publish_file(dir + "/" + side + ".done", "1"); !e.empty()) return fail(e);
  if (Error e = await_file(dir + "/" + (tx ? "rx" : "tx") + ".done", &ignored, 20000); !e.empty()) {
    return fail(side + ": " + e);
  }
  api->close_send(sc);
  api->close_recv(rc);
  if (api->finalize(ctx) != ncclSuccess) return fail(side + ": finalize");
  return 0;
}

}  // namespace

int run_file_scenario(int argc, char** argv) {
  const std::string mode = argv[1];
  if (mode == "share" && argc == 5) return run_share(argv[2], argv[3], std::atoi(argv[4]));
  if (mode == "bench-pair" && argc == 5) return run_bench_pair(argv[2], argv[3], argv[4]);
  return -1;
}

}  // namespace gw::plugin_test

// ---- Two-process bench (bench-listen / bench-connect) and the ceilings beside it --------------
// (Its includes here, so that this section stays one appended block.)
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

// The ends of one plugin connection in two processes, as on two hosts (perf/plugin_daemon_netns.sh
// runs them in two namespace hosts); see daemon_scenarios.h for what each prints.

namespace gw::plugin_test {

namespace {

constexpr auto kBenchWait = std::chrono::seconds(60);  // the other end's start, its handle
constexpr int kBenchMsgMs = 60000;                     // one message (1 GiB at 1 Gb/s: 9 s)
constexpr uint32_t kBenchMagic = 0x47574e42;           // "GWNB"

// What the connecting end sends first: the transfers it will make, and its own listen handle
// (the connection back, for the go tokens and the ping-pong's answers).
struct BenchHello {
  uint32_t magic = kBenchMagic;
  uint32_t transfers = 0;
  uint64_t bytes = 0;
  uint64_t rounds = 0;
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
};

struct BenchArgs {
  std::string file;
  size_t bytes = 0;
  int transfers = 0;
  int rounds = 0;
};

// "64M", "4194304", "512K": bytes, or 0 when it is not a size.
size_t parse_size(const std::string& s) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = s.substr(used);
  if (unit == "K")
    v <<= 10;
  else if (unit == "M")
    v <<= 20;
  else if (unit == "G")
    v <<= 30;
  else if (!unit.empty())
    return 0;
  return static_cast<size_t>(v);
}

// The scenario's arguments as strings ("" when it takes none), each checked against the plugin's
// limits: "" or what is wrong.
Error parse_bench_args(const std::string& file, const std::string& bytes,
                       const std::string& transfers, const std::string& rounds, BenchArgs* a) {
  a->file = file;
  a->bytes = parse_size(bytes);
  try {
    a->transfers = std::stoi(transfers);
    a->rounds = rounds.empty() ? 1 : std::stoi(rounds);
  } catch (const std::exception&) {
    return "TRANSFERS and ROUNDS must be numbers";
  }
  // NCCL's sizes are int, and a message must fit the daemon's arena whole (GW_DAEMON_ARENA).
  if (a->bytes < 8 || a->bytes > (size_t{1} << 30)) return "BYTES '" + bytes + "' must be 8 to 1G";
  if (a->transfers < 1 || a->transfers > 1000) return "TRANSFERS must be 1 to 1000";
  if (a->rounds < 1 || a->rounds > 1000000) return "ROUNDS must be 1 to 1000000";
  return "";
}

// Writes `text` to `path` whole (a temporary file renamed over it), so a reader never sees half.
Error write_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return "cannot write " + tmp + ": " + std::strerror(errno);
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) return "cannot write " + tmp;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return "cannot rename " + tmp + ": " + std::strerror(errno);
  }
  return "";
}

// The first line of `path` once it exists (the other end writes it whole), within kBenchWait.
Error read_when_there(const std::string& path, std::string* line) {
  const auto until = Clock::now() + kBenchWait;
  for (;;) {
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[512] = {};
      const bool got = std::fgets(buf, sizeof(buf), f) != nullptr;
      std::fclose(f);
      *line = buf;
      while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
      if (got && !line->empty()) return "";
    }
    if (Clock::now() > until) {
      return path + " did not appear within " + std::to_string(kBenchWait.count()) +
             " s (the other end did not start?)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Error accept_from(NetApi& api, void* lc, void** rc) {
  *rc = nullptr;
  const auto until = Clock::now() + kBenchWait;
  while (*rc == nullptr) {
    if (api.accept(lc, rc) != ncclSuccess) return "accept failed";
    if (*rc != nullptr) break;
    if (Clock::now() > until) return "nobody connected within 60 s";
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return "";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const char* bench_mode() {
  const char* d = std::getenv("GW_DAEMON");
  return d != nullptr && *d != '\0' ? "daemon" : "direct";
}

// The plugin's own INFO lines of its first init (backend, daemon mode), for the log.
void say_first_init() {
  for (const std::string& line : plugin().first_init_log) {
    std::fprintf(stderr, "  %s\n", line.c_str());
  }
}

// Two 8-byte messages' worth of space: the go tokens and the ping-pong.
struct Small {
  Buffer out{8}, in{8};
};

constexpr int kTagData = 1, kTagGo = 2, kTagPing = 3, kTagHello = 9;

// The listening end: receives the transfers (each timed from posting its go token to the data's
// arrival, every one pattern-checked) and answers the connecting end's pings.
int run_bench_listen(const BenchArgs& a) {
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  say_first_init();
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  if (api->listen(ctx, 0, handle, &lc) != ncclSuccess) return fail("listen");
  if (Error e = write_whole(a.file, handle_hex(handle) + "\n"); !e.empty()) return fail(e);
  void* rc = nullptr;
  if (Error e = accept_from(*api, lc, &rc); !e.empty()) return fail(e);
  api->close_listen(lc);
  BenchHello hello;
  void* req = nullptr;
  std::vector<int> sizes;
  if (Error e = post_recv(*api, rc, &hello, sizeof(hello), kTagHello, nullptr, &req); !e.empty()) {
    return fail(e);
  }
  if (Error e = wait_all(*api, {req}, &sizes, kBenchMsgMs); !e.empty()) return fail("hello: " + e);
  if (sizes[0] != static_cast<int>(sizeof(hello)) || hello.magic != kBenchMagic) {
    return fail("the connecting end's first message is not a bench hello");
  }
  if (hello.bytes != a.bytes || hello.transfers != static_cast<uint32_t>(a.transfers) ||
      hello.rounds != static_cast<uint64_t>(a.rounds)) {
    return fail("the ends disagree: this end expects " + std::to_string(a.bytes) + " bytes x " +
                std::to_string(a.transfers) + ", " + std::to_string(a.rounds) +
                " rounds; the connecting end sends " + std::to_string(hello.bytes) + " x " +
                std::to_string(hello.transfers) + ", " + std::to_string(hello.rounds));
  }
  void* sc = nullptr;
  if (connect_to(*api, ctx, hello.handle, &sc) != ncclSuccess || sc == nullptr) {
    return fail("connecting back to the connecting end failed");
  }
  Buffer in(a.bytes);
  Small s;
  std::vector<double> gbps;
  int checked = 0;
  // Transfer 0 is the warm-up (checked, not timed). The sender alternates two buffers filled
  // once (seeds 100 and 101), so a transfer that delivered nothing leaves the other seed here.
  for (int i = 0; i <= a.transfers; ++i) {
    void *rreq = nullptr, *greq = nullptr;
    if (Error e = post_recv(*api, rc, in.data, a.bytes, kTagData, nullptr, &rreq); !e.empty()) {
      return fail(e);
    }
    const auto t0 = Clock::now();
    if (Error e = post_send(*api, sc, s.out.data, 8, kTagGo, nullptr, &greq); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {greq, rreq}, &sizes, kBenchMsgMs); !e.empty()) {
      return fail("transfer " + std::to_string(i) + ": " + e);
    }
    const double secs = seconds_since(t0);
    if (sizes[1] != static_cast<int>(a.bytes)) {
      return fail("transfer " + std::to_string(i) + " brought " + std::to_string(sizes[1]) +
                  " bytes");
    }
    if (int64_t bad = check_pattern(in.data, a.bytes, 100 + i % 2); bad >= 0) {
      return fail("transfer " + std::to_string(i) + ": byte " + std::to_string(bad) + " differs");
    }
    ++checked;
    if (i > 0) gbps.push_back(double(a.bytes) / secs / 1e9);
  }
  // Ping-pong, the connecting end pinging: the time between two pings' arrivals here is one
  // round trip (this end's answer, then the other end's next ping).
  std::vector<double> rtt_us;
  void* ping = nullptr;
  if (Error e = post_recv(*api, rc, s.in.data, 8, kTagPing, nullptr, &ping); !e.empty()) {
    return fail(e);
  }
  Clock::time_point last{};
  for (int k = 0; k < a.rounds; ++k) {
    if (Error e = wait_all(*api, {ping}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("ping " + std::to_string(k) + ": " + e);
    }
    const auto now = Clock::now();
    if (k > 0) rtt_us.push_back(std::chrono::duration<double, std::micro>(now - last).count());
    last = now;
    ping = nullptr;
    if (k + 1 < a.rounds) {
      if (Error e = post_recv(*api, rc, s.in.data, 8, kTagPing, nullptr, &ping); !e.empty()) {
        return fail(e);
      }
    }
    void* pong = nullptr;
    if (Error e = post_send(*api, sc, s.out.data, 8, kTagPing, nullptr, &pong); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {pong}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("pong " + std::to_string(k) + ": " + e);
    }
  }
  const double best = gbps.empty() ? 0 : *std::max_element(gbps.begin(), gbps.end());
  const double rtt = median(rtt_us);
  std::printf(
      "bench-listen mode=%s bytes=%zu transfers=%d checked=%d gbps_median=%.3f gbps_best=%.3f "
      "rounds=%d rtt_us_median=%.1f oneway_us=%.1f\n",
      bench_mode(), a.bytes, a.transfers, checked, median(gbps), best, a.rounds, rtt, rtt / 2);
  std::fflush(stdout);
  if (api->close_send(sc) != ncclSuccess || api->close_recv(rc) != ncclSuccess) {
    return fail("close");
  }
  return api->finalize(ctx) == ncclSuccess ? 0 : fail("finalize");
}

// The connecting end: sends each transfer when its go token arrives, then pings (8 bytes) and
// times each round trip to the other end's answer.
int run_bench_connect(const BenchArgs& a) {
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  say_first_init();
  // Both buffers filled before anything is timed (the pattern costs more than a transfer).
  Buffer out0(a.bytes), out1(a.bytes);
  fill_pattern(out0.data, a.bytes, 100);
  fill_pattern(out1.data, a.bytes, 101);
  std::string hex;
  if (Error e = read_when_there(a.file, &hex); !e.empty()) return fail(e);
  BenchHello hello;
  hello.bytes = a.bytes;
  hello.transfers = static_cast<uint32_t>(a.transfers);
  hello.rounds = static_cast<uint64_t>(a.rounds);
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  if (!unhex(hex, handle)) return fail(a.file + " does not hold a handle");
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  void* lc = nullptr;
  if (api->listen(ctx, 0, hello.handle, &lc) != ncclSuccess) return fail("listen");
  void* sc = nullptr;
  const ncclResult_t r = connect_to(*api, ctx, handle, &sc);
  if (sc == nullptr) return fail("connect returned " + std::to_string(r) + " and no comm");
  void* req = nullptr;
  if (Error e = post_send(*api, sc, &hello, sizeof(hello), kTagHello, nullptr, &req); !e.empty()) {
    return fail(e);
  }
  if (Error e = wait_all(*api, {req}, nullptr, kBenchMsgMs); !e.empty()) {
    return fail("hello: " + e);
  }
  void* rc = nullptr;
  if (Error e = accept_from(*api, lc, &rc); !e.empty()) return fail("the connection back: " + e);
  api->close_listen(lc);
  Small s;
  for (int i = 0; i <= a.transfers; ++i) {
    void *go = nullptr, *sreq = nullptr;
    if (Error e = post_recv(*api, rc, s.in.data, 8, kTagGo, nullptr, &go); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {go}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("go " + std::to_string(i) + ": " + e);
    }
    Buffer& out = i % 2 == 0 ? out0 : out1;
    if (Error e = post_send(*api, sc, out.data, a.bytes, kTagData, nullptr, &sreq); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {sreq}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("transfer " + std::to_string(i) + ": " + e);
    }
  }
  std::vector<double> rtt_us;
  for (int k = 0; k < a.rounds; ++k) {
    void *pong = nullptr, *ping = nullptr;
    if (Error e = post_recv(*api, rc, s.in.data, 8, kTagPing, nullptr, &pong); !e.empty()) {
      return fail(e);
    }
    const auto t0 = Clock::now();
    if (Error e = post_send(*api, sc, s.out.data, 8, kTagPing, nullptr, &ping); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {ping, pong}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("round " + std::to_string(k) + ": " + e);
    }
    rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const double rtt = median(rtt_us);
  std::printf(
      "bench-connect mode=%s bytes=%zu transfers=%d rounds=%d rtt_us_median=%.1f "
      "oneway_us=%.1f\n",
      bench_mode(), a.bytes, a.transfers, a.rounds, rtt, rtt / 2);
  std::fflush(stdout);
  if (api->close_send(sc) != ncclSuccess || api->close_recv(rc) != ncclSuccess) {
    return fail("close");
  }
  return api->finalize(ctx) == ncclSuccess ? 0 : fail("finalize");
}

// One memcpy of BYTES, TRANSFERS times: the median and best GB/s.
int run_ceiling_memcpy(const BenchArgs& a) {
  std::vector<uint8_t> src(a.bytes, 1), dst(a.bytes, 0);
  std::vector<double> gbps;
  for (int i = 0; i < a.transfers; ++i) {
    src[static_cast<size_t>(i) % a.bytes] = static_cast<uint8_t>(i);
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), a.bytes);
    gbps.push_back(double(a.bytes) / seconds_since(t0) / 1e9);
  }
  if (std::memcmp(dst.data(), src.data(), a.bytes) != 0) return fail("memcpy copied wrong");
  std::printf("ceiling-memcpy bytes=%zu transfers=%d gbps_median=%.3f gbps_best=%.3f\n", a.bytes,
              a.transfers, median(gbps), *std::max_element(gbps.begin(), gbps.end()));
  std::fflush(stdout);
  return 0;
}

// A socket closed when it goes out of scope (the peer links no gradwire library).
struct Sock {
  explicit Sock(int d) : fd(d) {}
  ~Sock() {
    if (fd >= 0) ::close(fd);
  }
  Sock(const Sock&) = delete;
  Sock& operator=(const Sock&) = delete;
  int get() const { return fd; }
  bool valid() const { return fd >= 0; }
  int fd;
};

// Every read and write of the raw TCP ceiling gives up after this long.
constexpr int kTcpIoSeconds = 60;

void set_io_deadline(int fd) {
  timeval tv{kTcpIoSeconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

Error io_all(int fd, uint8_t* p, size_t n, bool write) {
  for (size_t off = 0; off < n;) {
    const ssize_t k =
        write ? ::send(fd, p + off, n - off, MSG_NOSIGNAL) : ::recv(fd, p + off, n - off, 0);
    if (k == 0) return "the other end closed the connection";
    if (k < 0) {
      if (errno == EINTR) continue;
      return std::string(write ? "send" : "recv") + ": " + std::strerror(errno) +
             (errno == EAGAIN ? " (no progress for 60 s)" : "");
    }
    off += static_cast<size_t>(k);
  }
  return "";
}

// The raw TCP ceiling, one connection: the sink listens on every interface (port in FILE), and
// times each transfer from writing its one-byte go to the last byte's arrival, as bench-listen.
int run_tcp_sink(const BenchArgs& a) {
  Sock ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof(addr);
  if (!ls.valid() || ::bind(ls.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(ls.get(), 1) != 0 ||
      ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return fail(std::string("tcp-sink: listening: ") + std::strerror(errno));
  }
  if (Error e = write_whole(a.file, std::to_string(ntohs(addr.sin_port)) + "\n"); !e.empty()) {
    return fail(e);
  }
  pollfd p{ls.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(kBenchWait.count() * 1000)) != 1) {
    return fail("tcp-sink: nobody connected within 60 s");
  }
  Sock c(::accept4(ls.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!c.valid()) return fail(std::string("tcp-sink: accept: ") + std::strerror(errno));
  set_io_deadline(c.get());
  std::vector<uint8_t> in(a.bytes);
  uint8_t go = 1;
  std::vector<double> gbps;
  for (int i = 0; i <= a.transfers; ++i) {
    const auto t0 = Clock::now();
    if (Error e = io_all(c.get(), &go, 1, true); !e.empty()) return fail("tcp-sink: " + e);
    if (Error e = io_all(c.get(), in.data(), a.bytes, false); !e.empty()) {
      return fail("tcp-sink: " + e);
    }
    if (i > 0) gbps.push_back(double(a.bytes) / seconds_since(t0) / 1e9);
  }
  if (check_pattern(in.data(), a.bytes, 7) != -1) return fail("tcp-sink: the bytes arrived wrong");
  std::printf("tcp-sink bytes=%zu transfers=%d gbps_median=%.3f gbps_best=%.3f\n", a.bytes,
              a.transfers, median(gbps), *std::max_element(gbps.begin(), gbps.end()));
  std::fflush(stdout);
  return 0;
}

int run_tcp_source(const BenchArgs& a, const std::string& ip) {
  std::vector<uint8_t> out(a.bytes);
  fill_pattern(out.data(), a.bytes, 7);
  std::string port;
  if (Error e = read_when_there(a.file, &port); !e.empty()) return fail(e);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  int p = 0;
  try {
    p = std::stoi(port);
  } catch (const std::exception&) {
  }
  if (p <= 0 || p > 65535 || ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return fail("tcp-source: bad address " + ip + ":" + port);
  }
  addr.sin_port = htons(static_cast<uint16_t>(p));
  Sock c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  set_io_deadline(c.get());  // also bounds connect (SO_SNDTIMEO)
  if (!c.valid() || ::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail("tcp-source: connect to " + ip + ":" + port + ": " + std::strerror(errno));
  }
  uint8_t go = 0;
  for (int i = 0; i <= a.transfers; ++i) {
    if (Error e = io_all(c.get(), &go, 1, false); !e.empty()) return fail("tcp-source: " + e);
    if (Error e = io_all(c.get(), out.data(), a.bytes, true); !e.empty()) {
      return fail("tcp-source: " + e);
    }
  }
  return 0;
}

}  // namespace

int run_bench_scenario(int argc, char** argv) {
  const std::string mode = argv[1];
  std::vector<std::string> v(argv + 2, argv + argc);
  BenchArgs a;
  auto usage = [&](const char* args) {
    fail("usage: " + mode + " " + args);
    return 2;
  };
  auto parsed = [&](const std::string& f, const std::string& b, const std::string& t,
                    const std::string& r) {
    Error e = parse_bench_args(f, b, t, r, &a);
    if (!e.empty()) fail(mode + ": " + e);
    return e.empty();
  };
  if (mode == "bench-listen" || mode == "bench-connect") {
    if (v.size() != 4) return usage("FILE BYTES TRANSFERS ROUNDS");
    if (!parsed(v[0], v[1], v[2], v[3])) return 2;
    return mode == "bench-listen" ? run_bench_listen(a) : run_bench_connect(a);
  }
  if (mode == "ceiling-memcpy") {
    if (v.size() != 2) return usage("BYTES TRANSFERS");
    return parsed("", v[0], v[1], "") ? run_ceiling_memcpy(a) : 2;
  }
  if (mode == "tcp-sink") {
    if (v.size() != 3) return usage("FILE BYTES TRANSFERS");
    return parsed(v[0], v[1], v[2], "") ? run_tcp_sink(a) : 2;
  }
  if (mode == "tcp-source") {
    if (v.size() != 4) return usage("IP FILE BYTES TRANSFERS");
    return parsed(v[1], v[2], v[3], "") ? run_tcp_source(a, v[0]) : 2;
  }
  return -1;
}

}  // namespace gw::plugin_test
