// nccl_plugin_peer's scenarios of processes that meet through files: share, bench-pair
// (daemon_scenarios.h says what each does).
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

#include "tests/plugin/daemon_scenarios.h"
#include "tests/plugin/plugin_harness.h"
#include "tests/plugin/scenario_util.h"

namespace gw::plugin_test {

namespace {

using scenario::Clock;
using scenario::connect_to;
using scenario::fail;
using scenario::unhex;

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
