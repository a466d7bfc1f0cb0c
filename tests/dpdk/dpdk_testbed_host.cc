// One "host" of the namespace testbed (tests/testbed/testbed.sh runs it in every namespace).
//   p2p        2 hosts: the transport contract across hosts (sizes, 0 B, 32 in flight, larger
//              receive, truncation, tag mismatch, wrong token, close -> kPeer)
//   allreduce  N hosts: Communicator over "dpdk", sizes 0 B .. argv[2] bytes, results checked
//   kill       N hosts: the last host SIGKILLs itself mid-run; the others must fail in time
//              (results checked until then)
//   bench      2 hosts: latency and bandwidth of tcp then dpdk over the same veth, in one run
//   allreduce-bench  N hosts: allreduce median time per size, tcp then dpdk, in one run
//   zc-bench   no testbed: one process, loopback net_ring; cost per data frame with zero-copy TX
//              on and off for fragment payloads of 64 B .. 8928 B (the copy/zero-copy threshold)
// The rendezvous store runs on host 0's control interface (TB_STORE). Prints "RESULT ok" or
// "RESULT fail <why>" and exits 0/1.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "core/config.h"
#include "core/core_config.h"
#include "core/net/transport.h"
#include "core/store.h"
#include "dpdk/dpdk_port.h"
#include "dpdk/dpdk_transport.h"
#include "dpdk/engine.h"
#include "dpdk/engine_transport.h"
#include "dpdk/port_module.h"

using namespace gw;
using Clock = std::chrono::steady_clock;

namespace {

int env_int(const char* n, int d) {
  const char* v = getenv(n);
  return v ? atoi(v) : d;
}

// Set once this process's DPDK engine exists: a failure then prints the engine's counters, which
// tell a frame lost on the way (tx_ring_full, injected drops, port errors) from one dropped on
// arrival (not_for_us, unknown_conn, wrong_session, decode drops).
bool g_engine_up = false;
void print_stats();

[[noreturn]] void fail(const std::string& why) {
  std::printf("RESULT fail %s\n", why.c_str());
  if (g_engine_up) {
    g_engine_up = false;  // print_stats() failing calls fail() again: once is enough
    print_stats();
  }
  std::fflush(stdout);
  std::_Exit(1);
}

#define CHECK_OK(expr)                                              \
  do {                                                              \
    ::gw::Status s_ = (expr);                                       \
    if (!s_.ok()) fail(std::string(#expr) + ": " + s_.to_string()); \
  } while (0)

template <typename T>
T take(Result<T> r, const char* what) {
  if (!r.ok()) fail(std::string(what) + ": " + r.status().to_string());
  return std::move(*r);
}

Deadline dl(int s = 60) { return deadline_after_ms(s * 1000); }

template <typename C>
Status wait(C& comm, net::Request* req, size_t* n, int ms = 30000) {
  auto end = Clock::now() + std::chrono::milliseconds(ms);
  while (Clock::now() < end) {
    bool done = false;
    Status s = comm.test(req, &done, n);
    if (!s.ok() || done) return s;
  }
  return timeout_error("request not done after {} ms", ms);
}

struct Pair {
  std::unique_ptr<net::Transport> t;
  std::unique_ptr<net::Listener> l;
  std::unique_ptr<net::SendComm> s;
  std::unique_ptr<net::RecvComm> r;
};

// Host 0 receives, host 1 sends; `key` names the handle in the store.
Pair make_pair(Store& store, int host, const std::string& transport, const std::string& key,
               const std::string& token = "tb-token") {
  Pair p;
  net::TransportOptions o;
  o.job_token = token;
  o.timeout_ms = 20000;
  o.rank = host;
  p.t = transport == "dpdk" ? take(dpdk::make_dpdk_transport(o), "make_dpdk_transport")
                            : take(net::make_transport(transport, o), "make_transport");
  if (host == 0) {
    net::Handle h;
    p.l = take(p.t->listen(&h), "listen");
    CHECK_OK(store.set(key, Bytes(h.bytes.begin(), h.bytes.end()), dl()));
    auto end = Clock::now() + std::chrono::seconds(30);
    while (!p.r && Clock::now() < end) p.r = take(p.l->accept(), "accept");
    if (!p.r) fail("accept: nobody connected in 30 s");
  } else {
    Bytes b = take(store.get(key, dl()), "store get handle");
    net::Handle h;
    std::memcpy(h.bytes.data(), b.data(), std::min(b.size(), h.bytes.size()));
    auto c = take(p.t->connect(h), "connect");
    while (!p.s) p.s = take(c->poll(), "connector poll");
  }
  return p;
}

uint8_t pat(size_t i, size_t k) { return static_cast<uint8_t>(i * 131 + k * 7 + 1); }

void run_p2p(Store& store, int host) {
  Pair p = make_pair(store, host, "dpdk", "p2p");
  const std::vector<size_t> sizes = {0, 1, 1400, 3000, 8928, 65537, 8u << 20, 3};
  for (size_t k = 0; k < sizes.size(); ++k) {
    std::vector<uint8_t> buf(sizes[k] + 16);
    size_t n = 0;
    if (host == 0) {
      auto r = take(p.r->irecv(buf.data(), buf.size(), net::kAnyTag, nullptr), "irecv");
      CHECK_OK(wait(*p.r, r, &n));
      if (n != sizes[k]) fail("size mismatch");
      for (size_t i = 0; i < n; ++i) {
        if (buf[i] != pat(i, k)) fail("payload mismatch at " + std::to_string(i));
      }
    } else {
      for (size_t i = 0; i < sizes[k]; ++i) buf[i] = pat(i, k);
      auto s = take(p.s->isend(buf.data(), sizes[k], int(k), nullptr), "isend");
      CHECK_OK(wait(*p.s, s, &n));
    }
  }
  // 32 in flight.
  std::vector<std::vector<uint8_t>> bufs(net::kMaxRequests, std::vector<uint8_t>(4096));
  std::vector<net::Request*> reqs;
  for (int i = 0; i < net::kMaxRequests; ++i) {
    if (host == 1) std::fill(bufs[i].begin(), bufs[i].end(), uint8_t(i));
    auto r = host == 0 ? take(p.r->irecv(bufs[i].data(), 4096, 9, nullptr), "irecv")
                       : take(p.s->isend(bufs[i].data(), 4096, 9, nullptr), "isend");
    if (r == nullptr) fail("no slot among the first 32 requests");
    reqs.push_back(r);
  }
  for (int i = 0; i < net::kMaxRequests; ++i) {
    size_t n;
    CHECK_OK(host == 0 ? wait(*p.r, reqs[i], &n) : wait(*p.s, reqs[i], &n));
    if (host == 0 && bufs[i][4095] != uint8_t(i)) fail("32-in-flight payload");
  }
  // Truncation, then tag mismatch.
  {
    std::vector<uint8_t> b(5000);
    size_t n;
    Status st = host == 0 ? wait(*p.r, take(p.r->irecv(b.data(), 1000, 0, nullptr), "irecv"), &n)
                          : wait(*p.s, take(p.s->isend(b.data(), 5000, 0, nullptr), "isend"), &n);
    if (st.code() != Code::kInvalidArg) fail("truncation: " + st.to_string());
    // Tag mismatch leaves the receiving comm failed: run it on a pair of its own.
    Pair t = make_pair(store, host, "dpdk", "p2p-tag");
    uint32_t v = 1;
    st = host == 0 ? wait(*t.r, take(t.r->irecv(&v, 4, 1, nullptr), "irecv"), &n)
                   : wait(*t.s, take(t.s->isend(&v, 4, 2, nullptr), "isend"), &n);
    if (host == 0 && st.code() != Code::kInternal) fail("tag mismatch: " + st.to_string());
    if (host == 0 && t.r->irecv(&v, 4, net::kAnyTag, nullptr).ok()) {
      fail("receive after a tag mismatch did not fail");
    }
    CHECK_OK(store_barrier(store, "p2p-tag-done", 2, dl()));
  }
  // Wrong token across hosts.
  if (host == 0) {
    net::TransportOptions o;
    o.job_token = "tb-token";
    auto t = take(dpdk::make_dpdk_transport(o), "transport");
    net::Handle h;
    auto l = take(t->listen(&h), "listen");
    CHECK_OK(store.set("p2p-bad", Bytes(h.bytes.begin(), h.bytes.end()), dl()));
    auto end = Clock::now() + std::chrono::seconds(3);
    while (Clock::now() < end) {
      if (take(l->accept(), "accept") != nullptr) fail("accepted a wrong token");
    }
    CHECK_OK(store.set("p2p-bad-done", Bytes{1}, dl()));
  } else {
    net::TransportOptions o;
    o.job_token = "not-the-token";
    o.timeout_ms = 10000;
    auto t = take(dpdk::make_dpdk_transport(o), "transport");
    Bytes b = take(store.get("p2p-bad", dl()), "get");
    net::Handle h;
    std::memcpy(h.bytes.data(), b.data(), h.bytes.size());
    auto c = take(t->connect(h), "connect");
    Result<std::unique_ptr<net::SendComm>> r = std::unique_ptr<net::SendComm>();
    while (r.ok() && !*r) r = c->poll();
    if (r.status().code() != Code::kPeer)
      fail("wrong token not refused: " + r.status().to_string());
    (void)store.get("p2p-bad-done", dl());
  }
  // Close -> kPeer on the other host.
  CHECK_OK(store_barrier(store, "p2p-close", 2, dl()));
  if (host == 1) {
    p.s.reset();
  } else {
    std::vector<uint8_t> b(64);
    size_t n;
    auto t0 = Clock::now();
    // The close may be seen when the receive is posted (irecv fails) or while it waits.
    auto posted = p.r->irecv(b.data(), 64, 0, nullptr);
    Status st = posted.ok() ? wait(*p.r, *posted, &n, 15000) : posted.status();
    if (st.code() != Code::kPeer) fail("close not seen as kPeer: " + st.to_string());
    std::printf("close seen after %.0f ms: %s\n",
                std::chrono::duration<double, std::milli>(Clock::now() - t0).count(),
                st.to_string().c_str());
  }
  CHECK_OK(store_barrier(store, "p2p-end", 2, dl()));
  auto e = take(dpdk::process_engine(), "engine");
  auto st = e->stats();
  std::printf(
      "stats: tx %lu rx %lu data_tx %lu retx %lu dups %lu decode_drops %lu wrong_token %lu\n",
      st.tx_frames, st.rx_frames, st.data_frames_tx, st.retransmits, st.duplicates,
      st.decode_drops_total(), st.wrong_token);
}

void print_stats() {
  auto st = take(dpdk::process_engine(), "engine")->stats();
  std::printf("stats: %s\n", dpdk::describe(st).c_str());
  std::fflush(stdout);
}

std::unique_ptr<coll::Communicator> make_comm(std::shared_ptr<Store> store, int host, int n,
                                              const std::string& transport = "dpdk") {
  coll::CommOptions o;
  o.rank = host;
  o.world_size = n;
  o.store = store;
  o.transport = transport;  // "dpdk" is found in the registry (gw_backends registers it)
  o.job_token = "tb-token";
  auto comm = take(coll::Communicator::create(o), "Communicator::create");
  if (transport == "dpdk") g_engine_up = true;  // the Communicator brought the engine up
  return comm;
}

// Allreduce timing, tcp then dpdk over the same data interface (GW_SOCKET_IFNAME=d0 for tcp):
// per size, `iters` timed runs after one warm-up; prints the median and the bus bandwidth.
void run_allreduce_bench(std::shared_ptr<Store> store, int host, int n,
                         const std::vector<size_t>& sizes, int iters) {
  for (const std::string transport : {"tcp", "dpdk"}) {
    auto comm = make_comm(store, host, n, transport);
    for (size_t bytes : sizes) {
      const size_t count = bytes / 4;
      std::vector<float> x(count);
      std::vector<double> ms;
      for (int it = 0; it <= iters; ++it) {
        for (size_t i = 0; i < count; ++i) x[i] = float(host + 1 + int(i % 7));
        auto t0 = Clock::now();
        CHECK_OK(
            comm->allreduce(x.data(), x.data(), count, coll::DataType::kF32, coll::ReduceOp::kSum));
        if (it > 0)
          ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        for (size_t i = 0; i < count; i += 4099) {
          if (x[i] != float(n * (n + 1) / 2 + n * int(i % 7)))
            fail("allreduce bench: wrong result");
        }
      }
      std::sort(ms.begin(), ms.end());
      const double med = ms[ms.size() / 2];
      const double algbw = bytes / (med / 1e3) / 1e6;
      std::printf("ARBENCH transport=%s bytes=%zu median_ms=%.2f algbw_MBps=%.0f busbw_MBps=%.0f\n",
                  transport.c_str(), bytes, med, algbw, algbw * 2 * (n - 1) / n);
      std::fflush(stdout);
    }
    CHECK_OK(store_barrier(*store, "arbench-" + transport, n, dl()));
  }
  print_stats();
}

void run_allreduce(std::shared_ptr<Store> store, int host, int n, size_t max_bytes) {
  auto comm = make_comm(store, host, n);
  std::vector<size_t> sizes = {0, 4, 4096, 1 << 20};
  for (size_t s = 16u << 20; s <= max_bytes; s *= 4) sizes.push_back(s);
  if (sizes.back() != max_bytes && max_bytes > (1u << 20)) sizes.push_back(max_bytes);
  for (size_t bytes : sizes) {
    size_t count = bytes / 4;
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = float(host + 1 + int(i % 7));
    auto t0 = Clock::now();
    CHECK_OK(
        comm->allreduce(x.data(), x.data(), count, coll::DataType::kF32, coll::ReduceOp::kSum));
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    for (size_t i = 0; i < count; ++i) {
      float want = float(n * (n + 1) / 2 + n * int(i % 7));
      if (x[i] != want)
        fail("allreduce of " + std::to_string(bytes) + " B wrong at " + std::to_string(i));
    }
    std::printf("allreduce %zu B ok in %.1f ms\n", bytes, ms);
    std::fflush(stdout);
  }
  print_stats();
}

void run_kill(std::shared_ptr<Store> store, int host, int n) {
  auto comm = make_comm(store, host, n);
  // Every rank starts at host + 1 and sums in place: after k allreduces every element holds
  // n(n+1)/2 * n^(k-1), exact in float for the few iterations before the death.
  std::vector<float> x(1 << 20, float(host + 1));
  float want = float(n * (n + 1) / 2);
  const int64_t timeout_ms = config::get_int(core_config::kTimeoutMs);
  for (int it = 0;; ++it) {
    if (host == n - 1 && it == 3) {
      std::printf("host %d: killing myself mid-run\n", host);
      std::fflush(stdout);
      raise(SIGKILL);
    }
    auto t0 = Clock::now();
    Status st =
        comm->allreduce(x.data(), x.data(), x.size(), coll::DataType::kF32, coll::ReduceOp::kSum);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (!st.ok()) {
      std::printf("host %d: allreduce %d failed after %.0f ms (GW_TIMEOUT_MS %ld): %s\n", host, it,
                  ms, timeout_ms, st.to_string().c_str());
      if (ms > timeout_ms + 2000) fail("error came too late");
      std::printf("KILL-OK\n");
      return;
    }
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i] != want) fail("allreduce " + std::to_string(it) + " wrong at " + std::to_string(i));
    }
    want *= float(n);
    if (it > 1000) fail("allreduce kept succeeding without the dead host");
  }
}

void bench_one(Store& store, int host, const std::string& transport) {
  Pair p = make_pair(store, host, transport, "bench-" + transport);
  // Latency: 8-byte ping-pong needs both directions: a second pair the other way.
  Pair q;
  {
    // reverse: host 1 listens
    net::TransportOptions o;
    o.job_token = "tb-token";
    o.timeout_ms = 20000;
    q.t = transport == "dpdk" ? take(dpdk::make_dpdk_transport(o), "t")
                              : take(net::make_transport(transport, o), "t");
    if (host == 1) {
      net::Handle h;
      q.l = take(q.t->listen(&h), "listen");
      CHECK_OK(store.set("rev-" + transport, Bytes(h.bytes.begin(), h.bytes.end()), dl()));
      while (!q.r) q.r = take(q.l->accept(), "accept");
    } else {
      Bytes b = take(store.get("rev-" + transport, dl()), "get");
      net::Handle h;
      std::memcpy(h.bytes.data(), b.data(), h.bytes.size());
      auto c = take(q.t->connect(h), "connect");
      while (!q.s) q.s = take(c->poll(), "poll");
    }
  }
  net::SendComm& s = host == 0 ? *q.s : *p.s;
  net::RecvComm& r = host == 0 ? *p.r : *q.r;
  const int iters = 2000;
  uint64_t v = 0;
  size_t n;
  auto t0 = Clock::now();
  for (int i = 0; i < iters + 100; ++i) {
    if (i == 100) t0 = Clock::now();
    if (host == 0) {
      CHECK_OK(wait(s, take(s.isend(&v, 8, 0, nullptr), "isend"), &n));
      CHECK_OK(wait(r, take(r.irecv(&v, 8, 0, nullptr), "irecv"), &n));
    } else {
      CHECK_OK(wait(r, take(r.irecv(&v, 8, 0, nullptr), "irecv"), &n));
      CHECK_OK(wait(s, take(s.isend(&v, 8, 0, nullptr), "isend"), &n));
    }
  }
  double lat_us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters / 2;
  // Bandwidth: host 1 -> host 0, 4 MiB messages, 4 in flight, 256 MiB total.
  const size_t msg = 4u << 20, total = 256u << 20;
  std::vector<uint8_t> buf(msg * 4, 1);
  // Registered, as the NCCL plugin does: the sender may then go zero copy
  // (TB_REG=0: unregistered, always copied).
  net::MemRegion* mr = nullptr;
  if (env_int("TB_REG", 1) == 1) {
    mr = host == 0 ? take(p.r->reg_mr(buf.data(), buf.size(), net::MemType::kHost), "reg_mr")
                   : take(p.s->reg_mr(buf.data(), buf.size(), net::MemType::kHost), "reg_mr");
  }
  t0 = Clock::now();
  std::vector<net::Request*> inflight;
  size_t posted = 0, done_bytes = 0;
  const bool trace = getenv("TB_TRACE") != nullptr;
  auto last_trace = Clock::now();
  while (done_bytes < total) {
    while (posted < total && inflight.size() < 4) {
      uint8_t* b = buf.data() + (posted / msg % 4) * msg;
      net::Request* rq = host == 0 ? take(p.r->irecv(b, msg, 0, mr), "irecv")
                                   : take(p.s->isend(b, msg, 0, mr), "isend");
      if (!rq) break;
      inflight.push_back(rq);
      posted += msg;
    }
    if (trace && transport == "dpdk" &&
        Clock::now() - last_trace > std::chrono::milliseconds(100)) {
      last_trace = Clock::now();
      auto st = take(dpdk::process_engine(), "engine")->stats();
      std::printf(
          "trace t=%.0f ms done %zu MB data_tx %lu retx %lu (to %lu fast %lu) spurious %lu "
          "srtt %.0f rto %.0f tol %.0f polls %lu idle %lu yields %lu slow rx/tx %lu/%lu max "
          "%lu/%lu us\n",
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), done_bytes >> 20,
          st.data_frames_tx, st.retransmits, st.timeout_retransmits, st.fast_retransmits,
          st.spurious_retransmits, st.srtt_us, st.rto_us, st.tolerance_us, st.polls, st.idle_polls,
          st.yields, st.port.slow_rx, st.port.slow_tx, st.port.max_rx_us, st.port.max_tx_us);
    }
    bool d = false;
    CHECK_OK(host == 0 ? p.r->test(inflight.front(), &d, &n) : p.s->test(inflight.front(), &d, &n));
    if (d) {
      inflight.erase(inflight.begin());
      done_bytes += msg;
    }
  }
  double sec = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("BENCH transport=%s lat_us=%.1f bw_MBps=%.0f\n", transport.c_str(), lat_us,
              total / sec / 1e6);
  if (transport == "dpdk") print_stats();
  std::fflush(stdout);
  if (mr != nullptr) CHECK_OK(host == 0 ? p.r->dereg_mr(mr) : p.s->dereg_mr(mr));
  CHECK_OK(store_barrier(store, "bench-done-" + transport, 2, dl()));
}

// Cost of a one-frame message, copied vs zero copy, on a loopback net_ring in this process
// (sender and receiver on one engine: a message costs its TX, its RX, the receive copy, the CTS
// and the ACK, the same in both modes but for the TX copy). Message sizes 64 B .. 8928 B (one
// frame each); median of 5 runs of 2000 messages, the two modes alternating.
void zc_bench() {
  std::printf("zc-bench: ns per one-frame message (median of 5), loopback net_ring, one engine\n");
  struct Side {
    std::shared_ptr<dpdk::Engine> e;
    std::unique_ptr<net::Transport> t;
    std::unique_ptr<net::Listener> l;
    std::unique_ptr<net::SendComm> s;
    std::unique_ptr<net::RecvComm> r;
  } side[2];
  for (int zc = 0; zc < 2; ++zc) {
    dpdk::DpdkPortOptions po;
    po.port = "ring";
    po.nb_mbufs = 1024;
    po.zero_copy = zc ? "on" : "off";
    dpdk::EngineConfig c;
    c.ip = 0x0a000001;
    c.zero_copy_min = 1;
    side[zc].e =
        take(dpdk::Engine::create(take(dpdk::open_port_through_module(po), "port"), c), "engine");
    net::TransportOptions o;
    o.job_token = "zc";
    o.timeout_ms = 20000;
    side[zc].t = dpdk::make_engine_transport(side[zc].e, o);
    net::Handle h;
    side[zc].l = take(side[zc].t->listen(&h), "listen");
    auto cn = take(side[zc].t->connect(h), "connect");
    while (!side[zc].s || !side[zc].r) {
      if (!side[zc].s) side[zc].s = take(cn->poll(), "poll");
      if (!side[zc].r) side[zc].r = take(side[zc].l->accept(), "accept");
    }
  }
  std::vector<uint8_t> src(8928, 7), dst(8928);
  net::MemRegion* mr[2];
  for (int zc = 0; zc < 2; ++zc) {
    mr[zc] = take(side[zc].s->reg_mr(src.data(), src.size(), net::MemType::kHost), "reg_mr");
  }
  for (size_t size : {64, 256, 512, 1024, 2048, 4096, 8928}) {
    std::vector<double> runs[2];
    for (int run = 0; run < 5; ++run) {
      for (int zc = 0; zc < 2; ++zc) {
        Side& sd = side[zc];
        const uint64_t zc0 = sd.e->stats().zc_frames_tx;
        const int msgs = 2000;
        const auto t0 = Clock::now();
        for (int m = 0; m < msgs; ++m) {
          auto rr = take(sd.r->irecv(dst.data(), size, 0, nullptr), "irecv");
          auto sr = take(sd.s->isend(src.data(), size, 0, mr[zc]), "isend");
          size_t n;
          CHECK_OK(wait(*sd.r, rr, &n));
          CHECK_OK(wait(*sd.s, sr, &n));
        }
        runs[zc].push_back(std::chrono::duration<double, std::nano>(Clock::now() - t0).count() /
                           msgs);
        const uint64_t zcn = sd.e->stats().zc_frames_tx - zc0;
        if (zc ? zcn < static_cast<uint64_t>(msgs) : zcn != 0) fail("zc-bench: wrong mode");
        if (std::memcmp(src.data(), dst.data(), size) != 0) fail("zc-bench: wrong data");
      }
    }
    double med[2];
    for (int zc = 0; zc < 2; ++zc) {
      std::sort(runs[zc].begin(), runs[zc].end());
      med[zc] = runs[zc][2];
    }
    std::printf("zc-bench message %5zu B: copy %7.0f ns  zero-copy %7.0f ns  (%+.1f%%)\n", size,
                med[0], med[1], 100.0 * (med[1] - med[0]) / med[0]);
  }
  for (int zc = 0; zc < 2; ++zc) CHECK_OK(side[zc].s->dereg_mr(mr[zc]));
  // Multi-frame messages from a 64 MiB buffer walked in order (out of cache, as gradients are):
  // GB/s of payload, median of 5, the two modes alternating.
  std::vector<uint8_t> big(64u << 20, 3), sink(64u << 20);
  for (int zc = 0; zc < 2; ++zc) {
    mr[zc] = take(side[zc].s->reg_mr(big.data(), big.size(), net::MemType::kHost), "reg_mr");
  }
  for (size_t size : {size_t{64} << 10, size_t{1} << 20, size_t{16} << 20}) {
    std::vector<double> runs[2];
    for (int run = 0; run < 5; ++run) {
      for (int zc = 0; zc < 2; ++zc) {
        Side& sd = side[zc];
        const auto t0 = Clock::now();
        for (size_t off = 0; off + size <= big.size(); off += size) {
          auto rr = take(sd.r->irecv(sink.data() + off, size, 0, nullptr), "irecv");
          auto sr = take(sd.s->isend(big.data() + off, size, 0, mr[zc]), "isend");
          size_t n;
          CHECK_OK(wait(*sd.r, rr, &n));
          CHECK_OK(wait(*sd.s, sr, &n));
        }
        runs[zc].push_back(static_cast<double>(big.size()) /
                           std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
      }
    }
    double med[2];
    for (int zc = 0; zc < 2; ++zc) {
      std::sort(runs[zc].begin(), runs[zc].end());
      med[zc] = runs[zc][2];
    }
    std::printf("zc-bench message %5zu KiB: copy %5.2f GB/s  zero-copy %5.2f GB/s  (%+.1f%%)\n",
                size >> 10, med[0], med[1], 100.0 * (med[1] - med[0]) / med[0]);
  }
  if (sink != big) fail("zc-bench: wrong data");
  for (int zc = 0; zc < 2; ++zc) CHECK_OK(side[zc].s->dereg_mr(mr[zc]));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fail(
        "usage: dpdk_testbed_host p2p|allreduce [max_bytes]|allreduce-bench [bytes...]|kill|bench");
  }
  const std::string mode = argv[1];
  if (mode == "zc-bench") {
    zc_bench();
    std::_Exit(0);
  }
  const int host = env_int("TB_HOST", -1), n = env_int("TB_HOSTS", 0);
  const char* store_ip = getenv("TB_STORE");
  if (host < 0 || n <= 0 || store_ip == nullptr) fail("TB_HOST/TB_HOSTS/TB_STORE not set");
  TcpStoreOptions so;
  so.host = store_ip;
  so.port = 29411;
  so.host_server = host == 0;
  so.token = "tb-store";
  so.connect_timeout_ms = 30000;
  auto store = take(TcpStore::create(so), "TcpStore::create");
  if (mode == "p2p") {
    run_p2p(*store, host);
  } else if (mode == "allreduce") {
    run_allreduce(store, host, n, argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (16u << 20));
  } else if (mode == "allreduce-bench") {
    std::vector<size_t> sizes;
    for (int i = 2; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 10));
    if (sizes.empty()) sizes = {4096, 1u << 20, 64u << 20};
    run_allreduce_bench(store, host, n, sizes, env_int("TB_ITERS", 5));
  } else if (mode == "kill") {
    run_kill(store, host, n);
  } else if (mode == "bench") {
    if (std::string(getenv("TB_BENCH_TCP") ? getenv("TB_BENCH_TCP") : "1") == "1") {
      bench_one(*store, host, "tcp");
    }
    bench_one(*store, host, "dpdk");
  } else {
    fail("unknown mode " + mode);
  }
  std::printf("RESULT ok\n");
  std::fflush(stdout);
  // Peers may still be finishing: leave the store up a moment, then exit without teardown races.
  std::this_thread::sleep_for(std::chrono::milliseconds(host == 0 ? 1500 : 200));
  std::_Exit(0);
}
