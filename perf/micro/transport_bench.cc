// The machine's ceilings for the transports and the copy-saving paths against them: a plain
// loopback TCP stream (the kernel's own ceiling for the tcp backend), then one 64 MiB message
// through the shm backend (two-copy ring against single-copy reads) and the tcp backend (copying
// sends against MSG_ZEROCOPY), 128 KiB to 64 MiB, with both ends polled from one thread, so the
// CPU time is the work a message costs: compare with memcpy (codec_bench.cc) in the same run.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/net/shm_transport.h"
#include "core/net/tcp_transport.h"
#include "perf/micro/micro_util.h"

namespace gw::micro {
namespace {

constexpr size_t kMessage = size_t{64} << 20;

// ---- Loopback TCP, a sender thread streaming into a receiver: what the kernel moves per second.
void bench_loopback_tcp(benchmark::State& state) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) != 0 || listen(lfd, 1) != 0) {
    state.SkipWithError("loopback listen failed");
    return;
  }
  int tx = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(tx, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    state.SkipWithError("loopback connect failed");
    return;
  }
  int rx = accept(lfd, nullptr, nullptr);
  close(lfd);
  std::vector<char> src(kMessage, 1), dst(1 << 20);
  for (auto _ : state) {
    std::thread sender([&] {
      size_t off = 0;
      while (off < kMessage) {
        ssize_t n = send(tx, src.data() + off, kMessage - off, MSG_NOSIGNAL);
        if (n <= 0) return;
        off += static_cast<size_t>(n);
      }
    });
    size_t got = 0;
    while (got < kMessage) {
      ssize_t n = recv(rx, dst.data(), dst.size(), 0);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    sender.join();
  }
  close(tx);
  close(rx);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kMessage));
}
BENCHMARK(bench_loopback_tcp)->Name("ceiling/loopback_tcp_64MiB")->UseRealTime();

struct Pair {
  std::unique_ptr<net::Transport> transport;
  std::unique_ptr<net::Listener> listener;
  std::unique_ptr<net::SendComm> send;
  std::unique_ptr<net::RecvComm> recv;
};

bool connect_pair(Result<std::unique_ptr<net::Transport>> t, Pair* p) {
  if (!t.ok()) return false;
  p->transport = std::move(*t);
  net::Handle h;
  auto l = p->transport->listen(&h);
  if (!l.ok()) return false;
  p->listener = std::move(*l);
  auto c = p->transport->connect(h);
  if (!c.ok()) return false;
  for (int i = 0; i < 1000000 && (!p->send || !p->recv); ++i) {
    if (!p->send) {
      auto s = (*c)->poll();
      if (!s.ok()) return false;
      p->send = std::move(*s);
    }
    if (!p->recv) {
      auto r = p->listener->accept();
      if (!r.ok()) return false;
      p->recv = std::move(*r);
    }
  }
  return p->send && p->recv;
}

bool one_message(Pair& p, const char* src, char* dst, size_t size) {
  auto s = p.send->isend(src, size, 1, nullptr);
  auto r = p.recv->irecv(dst, size, 1, nullptr);
  if (!s.ok() || !r.ok() || *s == nullptr || *r == nullptr) return false;
  bool sd = false, rd = false;
  size_t n = 0;
  while (!sd || !rd) {
    if (!sd && !p.send->test(*s, &sd, &n).ok()) return false;
    if (!rd && !p.recv->test(*r, &rd, &n).ok()) return false;
  }
  return true;
}

// Arg 0: the old path (ring / copying sends); 1: the copy-saving one, from the smallest size.
// Arg 1: the message size.
void run_pair(benchmark::State& state, const char* backend) {
  const bool saving = state.range(0) != 0;
  const size_t size = static_cast<size_t>(state.range(1));
  net::TransportOptions o;
  o.job_token = "micro";
  o.timeout_ms = 10000;
  o.host_id = "micro-host";
  o.rank = 1;
  const std::string b = backend;
  if (b == "shm") {
    setenv("GW_SHM_CMA_MIN", saving ? "1" : "0", 1);
  } else {
    setenv("GW_SOCKET_IFNAME", "lo", 1);
    setenv("GW_SOCKET_ZEROCOPY", saving ? "on" : "off", 1);
    setenv("GW_SOCKET_ZEROCOPY_MIN", "0", 1);
  }
  Pair p;
  bool ok = connect_pair(b == "shm" ? net::make_shm_transport(o) : net::make_tcp_transport(o), &p);
  unsetenv("GW_SHM_CMA_MIN");
  unsetenv("GW_SOCKET_ZEROCOPY");
  unsetenv("GW_SOCKET_ZEROCOPY_MIN");
  if (!ok) {
    state.SkipWithError("could not connect a pair");
    return;
  }
  std::vector<char> src(size, 7), dst(size, 0);
  if (!one_message(p, src.data(), dst.data(), 16)) {  // the receiver answers the shm offer
    state.SkipWithError("warm-up message failed");
    return;
  }
  for (auto _ : state) {
    if (!one_message(p, src.data(), dst.data(), size)) {
      state.SkipWithError("message failed");
      return;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

// Both paths at a collective's pipeline chunk (128 KiB), 1 MiB and 64 MiB.
void path_and_size(benchmark::internal::Benchmark* b) {
  for (int64_t size : {int64_t{128} << 10, int64_t{1} << 20, int64_t{64} << 20}) {
    b->Args({0, size})->Args({1, size});
  }
}

void bench_shm_message(benchmark::State& state) { run_pair(state, "shm"); }
BENCHMARK(bench_shm_message)->Name("transport/shm_single_copy")->Apply(path_and_size);

void bench_tcp_message(benchmark::State& state) { run_pair(state, "tcp"); }
BENCHMARK(bench_tcp_message)->Name("transport/tcp_zerocopy")->Apply(path_and_size);

}  // namespace
}  // namespace gw::micro
