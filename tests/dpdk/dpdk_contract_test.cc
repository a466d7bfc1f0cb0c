// The transport contract (core/net/transport.h) on the DPDK backend:
//   mem:        two engines ("hosts") over an in-memory switch, no DPDK involved;
//   mem_faults: the same with 5% loss, 5% reordering and 5% duplication injected on both sides;
//   ring:       the real backend (EAL + a loopback net_ring port) in this one process; skipped
//               in a build without the DPDK port layer (GW_WITH_DPDK=OFF or no libdpdk).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <tuple>
#include <vector>

#include "core/net/backend_registry.h"
#include "dpdk/engine.h"
#include "dpdk/engine_transport.h"
#include "tests/support/sanitizers.h"
#ifdef GW_HAVE_DPDK
#include "dpdk/dpdk_transport.h"
#endif

namespace gw::dpdk {
namespace {

using net::Handle;
using net::RecvComm;
using net::SendComm;
using net::Transport;
using net::TransportOptions;

struct Backend {
  std::shared_ptr<MemSwitch> sw;
  std::shared_ptr<Engine> a, b;  // a: the listening host, b: the connecting host
};

EngineConfig mem_config(uint32_t ip, bool faults, uint64_t seed) {
  EngineConfig c;
  c.ip = ip;
  c.rto_min_us = 2000;
  c.peer_timeout_ms = 1500;
  c.heartbeat_ms = 50;
  if (faults) c.faults = FaultConfig{0.05, 0.05, 0.05, seed};
  return c;
}

class Contract : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& p = GetParam();
    if (p == "ring") {
#ifdef GW_HAVE_DPDK
      auto e = process_engine();
      if (!e.ok()) GTEST_SKIP() << "DPDK cannot start here: " << e.status().to_string();
      be_.a = be_.b = *e;
      return;
#else
      GTEST_SKIP() << "no DPDK port here: " << net::backend_status("dpdk").to_string();
#endif
    }
    be_.sw = std::make_shared<MemSwitch>();
    const bool faults = p == "mem_faults";
    be_.a = *Engine::create(be_.sw->attach({2, 0, 0, 0, 0, 1}), mem_config(0x0a000001, faults, 11));
    be_.b = *Engine::create(be_.sw->attach({2, 0, 0, 0, 0, 2}), mem_config(0x0a000002, faults, 22));
  }

  std::unique_ptr<Transport> transport(bool listening_side, const std::string& token = "tok",
                                       int64_t timeout_ms = 5000) {
    TransportOptions o;
    o.job_token = token;
    o.timeout_ms = timeout_ms;
    return make_engine_transport(listening_side ? be_.a : be_.b, o);
  }

  // Connects b -> a and returns both ends.
  void connect(std::unique_ptr<SendComm>* s, std::unique_ptr<RecvComm>* r,
               const std::string& token = "tok") {
    auto ta = transport(true, token), tb = transport(false, token);
    Handle h;
    auto l = ta->listen(&h);
    ASSERT_TRUE(l.ok()) << l.status().to_string();
    auto c = tb->connect(h);
    ASSERT_TRUE(c.ok()) << c.status().to_string();
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while ((!*s || !*r) && std::chrono::steady_clock::now() < deadline) {
      if (!*s) {
        auto x = (*c)->poll();
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        if (*x) *s = std::move(*x);
      }
      if (!*r) {
        auto x = (*l)->accept();
        ASSERT_TRUE(x.ok()) << x.status().to_string();
        if (*x) *r = std::move(*x);
      }
    }
    ASSERT_TRUE(*s && *r) << "handshake did not complete";
  }

  template <typename CommT>
  static Status wait(CommT& comm, net::Request* req, size_t* size, int64_t ms = 20000) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (std::chrono::steady_clock::now() < deadline) {
      bool done = false;
      Status s = comm.test(req, &done, size);
      if (!s.ok() || done) return s;
    }
    return timeout_error("test did not complete in {} ms", ms);
  }

  Backend be_;
};

TEST_P(Contract, SmallMessageWithTag) {
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_NO_FATAL_FAILURE(connect(&s, &r));
  const char msg[] = "hello gradwire";
  char buf[64] = {};
  auto rr = r->irecv(buf, sizeof(buf), 7, nullptr);
  auto sr = s->isend(msg, sizeof(msg), 7, nullptr);
  ASSERT_TRUE(rr.ok() && *rr && sr.ok() && *sr);
  size_t n = 0;
  ASSERT_TRUE(wait(*r, *rr, &n).ok());
  EXPECT_EQ(n, sizeof(msg));
  EXPECT_STREQ(buf, msg);
  ASSERT_TRUE(wait(*s, *sr, &n).ok());
  EXPECT_EQ(n, sizeof(msg));
  EXPECT_NE(s->peer_name().find("dpdk"), std::string::npos);
}

TEST_P(Contract, OrderingZeroBytesAnyTagAndLargeOffsets) {
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_NO_FATAL_FAILURE(connect(&s, &r));
  // Sizes straddle the fragment size; a 0-byte message sits in the middle.
  const std::vector<size_t> sizes = {1, 0, 1000, 8928, 8929, 3 << 20, 17, 0, 65537};
  size_t total = std::accumulate(sizes.begin(), sizes.end(), size_t{0});
  std::vector<uint8_t> src(total), dst(total + 4096, 0xee);
  for (size_t i = 0; i < total; ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<net::Request*> sreqs, rreqs;
  size_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    auto rr = r->irecv(dst.data() + off, sizes[i] + 16, i % 2 ? net::kAnyTag : int(i), nullptr);
    auto sr = s->isend(src.data() + off, sizes[i], int(i), nullptr);
    ASSERT_TRUE(rr.ok() && *rr && sr.ok() && *sr);
    rreqs.push_back(*rr);
    sreqs.push_back(*sr);
    off += sizes[i];
  }
  // Test the last one first: it must not complete before the earlier ones are tested.
  bool done = true;
  size_t n = 0;
  ASSERT_TRUE(r->test(rreqs.back(), &done, &n).ok());
  EXPECT_FALSE(done);
  for (size_t i = 0; i < sizes.size(); ++i) {
    ASSERT_TRUE(wait(*r, rreqs[i], &n).ok()) << i;
    EXPECT_EQ(n, sizes[i]) << i;
    ASSERT_TRUE(wait(*s, sreqs[i], &n).ok()) << i;
    EXPECT_EQ(n, sizes[i]);
  }
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), total), 0);
}

TEST_P(Contract, ThirtyTwoInFlightThenNoSlot) {
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_NO_FATAL_FAILURE(connect(&s, &r));
  std::vector<uint64_t> src(net::kMaxRequests), dst(net::kMaxRequests);
  std::vector<net::Request*> sq, rq;
  for (int i = 0; i < net::kMaxRequests; ++i) {
    src[i] = 0x1000 + i;
    auto sr = s->isend(&src[i], 8, 1, nullptr);
    ASSERT_TRUE(sr.ok() && *sr);
    sq.push_back(*sr);
    auto rr = r->irecv(&dst[i], 8, 1, nullptr);
    ASSERT_TRUE(rr.ok() && *rr);
    rq.push_back(*rr);
  }
  uint64_t extra = 0;
  auto full = s->isend(&extra, 8, 1, nullptr);
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(*full, nullptr);
  auto rfull = r->irecv(&extra, 8, 1, nullptr);
  ASSERT_TRUE(rfull.ok());
  EXPECT_EQ(*rfull, nullptr);
  size_t n;
  for (int i = 0; i < net::kMaxRequests; ++i) {
    ASSERT_TRUE(wait(*s, sq[i], &n).ok());
    ASSERT_TRUE(wait(*r, rq[i], &n).ok());
    EXPECT_EQ(dst[i], src[i]);
  }
  net::Request* bogus = reinterpret_cast<net::Request*>(&extra);
  bool done;
  EXPECT_EQ(r->test(bogus, &done, &n).code(), Code::kInvalidArg);
}

TEST_P(Contract, TruncationFailsBothSidesThenGoesOnTagMismatchFailsTheRecvComm) {
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_NO_FATAL_FAILURE(connect(&s, &r));
  std::vector<uint8_t> big(100000, 1), small(1000);
  auto rr = r->irecv(small.data(), small.size(), 0, nullptr);
  auto sr = s->isend(big.data(), big.size(), 0, nullptr);
  size_t n;
  Status rs = wait(*r, *rr, &n), ss = wait(*s, *sr, &n);
  EXPECT_EQ(rs.code(), Code::kInvalidArg) << rs.to_string();
  EXPECT_EQ(ss.code(), Code::kInvalidArg) << ss.to_string();
  EXPECT_NE(rs.message().find("truncated"), std::string::npos);
  // After a truncation the next message still flows.
  uint32_t v = 5, w = 0;
  rr = r->irecv(&w, 4, 3, nullptr);
  sr = s->isend(&v, 4, 3, nullptr);
  ASSERT_TRUE(wait(*r, *rr, &n).ok());
  ASSERT_TRUE(wait(*s, *sr, &n).ok());
  EXPECT_EQ(w, 5u);
  // Tag mismatch fails the receive with kInternal, and the receiving comm stays failed (the
  // streams are out of step), as the conformance suite requires.
  rr = r->irecv(&w, 4, 1, nullptr);
  sr = s->isend(&v, 4, 2, nullptr);
  rs = wait(*r, *rr, &n);
  EXPECT_EQ(rs.code(), Code::kInternal) << rs.to_string();
  EXPECT_NE(rs.message().find("tag mismatch"), std::string::npos);
  (void)wait(*s, *sr, &n);
  EXPECT_FALSE(r->irecv(&w, 4, net::kAnyTag, nullptr).ok());
}

// One-frame messages go before their receive is posted (eager): the receiver keeps them until
// the receive comes, the send completes only once the CTS shows the receive matches, and a
// mismatch fails both sides as the rendezvous path does. 40 small messages through 32 request
// slots arrive in order and intact.
TEST_P(Contract, EagerMessagesBeforeTheReceiveKeepContractAndOrder) {
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_NO_FATAL_FAILURE(connect(&s, &r));
  const uint64_t eager_before = be_.b->stats().eager_sends;
  std::vector<uint8_t> small(100);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(i * 7 + 3);
  auto sr = s->isend(small.data(), small.size(), 4, nullptr);
  ASSERT_TRUE(sr.ok() && *sr);
  size_t n = 0;
  bool done = false;
  for (int i = 0; i < 200; ++i) {  // frames flow, but no receive is posted: not complete
    ASSERT_TRUE(s->test(*sr, &done, &n).ok());
    ASSERT_FALSE(done) << "an eager send completed before its receive was posted";
    be_.a->progress();
  }
  EXPECT_GT(be_.b->stats().eager_sends, eager_before);
  std::vector<uint8_t> got(256, 0xEE);
  auto rr = r->irecv(got.data(), got.size(), 4, nullptr);
  ASSERT_TRUE(rr.ok() && *rr);
  ASSERT_TRUE(wait(*r, *rr, &n).ok());
  EXPECT_EQ(n, small.size());
  EXPECT_TRUE(std::equal(small.begin(), small.end(), got.begin()));
  EXPECT_EQ(got[small.size()], 0xEE);
  ASSERT_TRUE(wait(*s, *sr, &n).ok());

  // Truncation found after the fact: both sides fail with kInvalidArg, the comm goes on.
  sr = s->isend(small.data(), small.size(), 1, nullptr);
  for (int i = 0; i < 50; ++i) {
    be_.a->progress();
    be_.b->progress();
  }
  rr = r->irecv(got.data(), 10, 1, nullptr);
  Status rs = wait(*r, *rr, &n), ss = wait(*s, *sr, &n);
  EXPECT_EQ(rs.code(), Code::kInvalidArg) << rs.to_string();
  EXPECT_EQ(ss.code(), Code::kInvalidArg) << ss.to_string();

  // 40 small messages, sent ahead of their receives as far as the request slots allow.
  constexpr int kMany = 40;
  std::vector<net::Request*> sends;
  for (int i = 0; i < kMany; ++i) {
    auto x = s->isend(&small[i], 1, 2, nullptr);
    ASSERT_TRUE(x.ok());
    if (*x == nullptr) break;  // no slot: the rest go after the first ones complete
    sends.push_back(*x);
  }
  for (int i = 0; i < 50; ++i) {
    be_.a->progress();
    be_.b->progress();
  }
  int delivered = 0;
  size_t next_send = sends.size();
  for (int i = 0; i < kMany; ++i) {
    uint8_t v = 0;
    auto x = r->irecv(&v, 1, 2, nullptr);
    ASSERT_TRUE(x.ok() && *x);
    Status st = wait(*r, *x, &n);
    ASSERT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(v, small[i]) << "message " << i;
    ++delivered;
    if (!sends.empty() && i < static_cast<int>(sends.size())) {
      ASSERT_TRUE(wait(*s, sends[i], &n).ok());
      if (next_send < static_cast<size_t>(kMany)) {
        auto y = s->isend(&small[next_send], 1, 2, nullptr);
        ASSERT_TRUE(y.ok() && *y);
        sends.push_back(*y);
        ++next_send;
      }
    }
  }
  EXPECT_EQ(delivered, kMany);

  // Tag mismatch on an early message: kInternal on both sides, the receiving comm stays failed.
  sr = s->isend(small.data(), 8, 9, nullptr);
  for (int i = 0; i < 50; ++i) {
    be_.a->progress();
    be_.b->progress();
  }
  rr = r->irecv(got.data(), 64, 8, nullptr);
  rs = wait(*r, *rr, &n);
  ss = wait(*s, *sr, &n);
  EXPECT_EQ(rs.code(), Code::kInternal) << rs.to_string();
  EXPECT_EQ(ss.code(), Code::kInternal) << ss.to_string();
  EXPECT_FALSE(r->irecv(got.data(), 64, net::kAnyTag, nullptr).ok());
}

TEST_P(Contract, CloseWithRequestsInFlightFailsThePeerWithKPeer) {
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_NO_FATAL_FAILURE(connect(&s, &r));
  std::vector<uint8_t> buf(1 << 20);
  auto rr = r->irecv(buf.data(), buf.size(), 0, nullptr);
  ASSERT_TRUE(rr.ok() && *rr);
  auto sr = s->isend(buf.data(), buf.size(), 0, nullptr);  // in flight (rendezvous) as we close
  auto t0 = std::chrono::steady_clock::now();
  s.reset();  // abandons the send; must not block
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(200));
  // The receive either completed before the close or fails with kPeer naming the peer.
  std::vector<uint8_t> buf2(16);
  size_t n;
  Status st = wait(*r, *rr, &n, 5000);
  if (st.ok()) {
    auto r2 = r->irecv(buf2.data(), buf2.size(), 0, nullptr);
    if (r2.ok() && *r2)
      st = wait(*r, *r2, &n, 5000);
    else
      st = r2.status();
  }
  EXPECT_EQ(st.code(), Code::kPeer) << st.to_string();
  EXPECT_NE(st.message().find("dpdk"), std::string::npos);
  // The receiver side closing fails the sender's requests too.
  std::unique_ptr<SendComm> s2;
  std::unique_ptr<RecvComm> r2;
  ASSERT_NO_FATAL_FAILURE(connect(&s2, &r2));
  auto sr2 = s2->isend(buf.data(), 64, 0, nullptr);
  r2.reset();
  st = wait(*s2, *sr2, &n, 5000);
  EXPECT_EQ(st.code(), Code::kPeer) << st.to_string();
}

TEST_P(Contract, ConnectorTimesOutWhenNobodyAnswers) {
  auto ta = transport(true), tb = transport(false, "tok", 300);
  Handle h;
  auto l = ta->listen(&h);
  ASSERT_TRUE(l.ok());
  l->reset();  // the listener is gone: nobody will answer
  auto c = tb->connect(h);
  ASSERT_TRUE(c.ok());
  auto t0 = std::chrono::steady_clock::now();
  Status st;
  while (true) {
    auto x = (*c)->poll();
    if (!x.ok()) {
      st = x.status();
      break;
    }
    ASSERT_EQ(*x, nullptr);
    ASSERT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  }
  EXPECT_EQ(st.code(), Code::kTimeout) << st.to_string();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(250));
}

TEST_P(Contract, WrongTokenIsRefusedAndTheListenerKeepsListening) {
  auto ta = transport(true, "right"), bad = transport(false, "wrong"),
       good = transport(false, "right");
  Handle h;
  auto l = ta->listen(&h);
  ASSERT_TRUE(l.ok());
  auto c = bad->connect(h);
  ASSERT_TRUE(c.ok());
  Status st;
  auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    auto x = (*c)->poll();
    auto a = (*l)->accept();
    ASSERT_TRUE(a.ok());
    EXPECT_EQ(*a, nullptr);  // never accepted
    if (!x.ok()) {
      st = x.status();
      break;
    }
  }
  EXPECT_EQ(st.code(), Code::kPeer) << st.to_string();
  EXPECT_NE(st.message().find("token"), std::string::npos);
  auto c2 = good->connect(h);
  ASSERT_TRUE(c2.ok());
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  t0 = std::chrono::steady_clock::now();
  while ((!s || !r) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    if (!s) s = std::move(*(*c2)->poll());
    if (!r) r = std::move(*(*l)->accept());
  }
  EXPECT_TRUE(s && r);
  EXPECT_GT(be_.a->stats().hello_refused, 0u);
}

TEST_P(Contract, BadArgumentsAreRefused) {
  auto t = transport(true);
  Handle junk;
  junk.bytes.fill(0xab);
  auto c = t->connect(junk);
  EXPECT_EQ(c.status().code(), Code::kInvalidArg);
  EXPECT_EQ(t->listen(nullptr).status().code(), Code::kInvalidArg);
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  ASSERT_NO_FATAL_FAILURE(connect(&s, &r));
  EXPECT_EQ(s->isend(nullptr, 10, 0, nullptr).status().code(), Code::kInvalidArg);
  EXPECT_EQ(r->irecv(nullptr, 10, 0, nullptr).status().code(), Code::kInvalidArg);
  std::vector<uint8_t> buf(100);
  auto mr = s->reg_mr(buf.data(), 50, net::MemType::kHost);
  ASSERT_TRUE(mr.ok());
  EXPECT_EQ(s->isend(buf.data() + 40, 20, 0, *mr).status().code(), Code::kInvalidArg);
  EXPECT_EQ(s->reg_mr(buf.data(), 50, net::MemType::kCuda).status().code(), Code::kUnsupported);
  EXPECT_TRUE(s->dereg_mr(*mr).ok());
}

INSTANTIATE_TEST_SUITE_P(Dpdk, Contract, ::testing::Values("mem", "mem_faults", "ring"),
                         [](const auto& info) { return info.param; });

// Two engines on one in-memory switch, hosts a (10.0.0.1) and b (10.0.0.2), their transports,
// and after connect(sender) one connection with its sender on `sender` ('a' or 'b'): s and r.
// Everything lives as long as the struct.
struct EnginePair {
  std::shared_ptr<MemSwitch> sw = std::make_shared<MemSwitch>();
  std::shared_ptr<Engine> a, b;
  std::unique_ptr<Transport> ta, tb;
  std::unique_ptr<net::Listener> l;
  std::unique_ptr<net::Connector> c;
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;

  EnginePair(EngineConfig ca, EngineConfig cb, int64_t timeout_ms, size_t mtu = 9000) {
    a = *Engine::create(sw->attach({2, 0, 0, 0, 0, 1}, mtu), ca);
    b = *Engine::create(sw->attach({2, 0, 0, 0, 0, 2}, mtu), cb);
    TransportOptions o;
    o.job_token = "t";
    if (timeout_ms > 0) o.timeout_ms = timeout_ms;
    ta = make_engine_transport(a, o);
    tb = make_engine_transport(b, o);
  }
  // Starts the connection (listener on the other host); connect() also polls it up.
  void start(char sender) {
    Handle h;
    l = *(sender == 'a' ? tb : ta)->listen(&h);
    c = *(sender == 'a' ? ta : tb)->connect(h);
  }
  void connect(char sender) {
    start(sender);
    while (!s || !r) {
      if (!s) s = std::move(*c->poll());
      if (!r) r = std::move(*l->accept());
    }
  }
};

// Issue 16, strangers: the dpdk handshake proves the token without sending it, checks the rank
// the listener expects, and refuses a replayed handshake (as tcp and shm do).

// Polls a connector and a listener until the connector fails, connects, or `ms` pass.
Status poll_until_done(net::Connector& c, net::Listener& l, std::unique_ptr<SendComm>* s,
                       std::unique_ptr<RecvComm>* r, int64_t ms = 3000) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms)) {
    auto x = c.poll();
    if (!x.ok()) return x.status();
    if (*x) *s = std::move(*x);
    auto a = l.accept();
    if (!a.ok()) return a.status();
    if (*a) *r = std::move(*a);
    if (*s && *r) return ok_status();
  }
  return timeout_error("neither connected nor refused in {} ms", ms);
}

TEST(DpdkEngine, TheTokenNeverCrossesTheWire) {
  const std::string token = "a-secret-job-token-0123456789";
  std::mutex mu;  // before the pair: what the tap captures outlives its engines
  std::vector<std::vector<uint8_t>> frames;
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 3000);
  p.sw->set_tap([&](const uint8_t* d, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    frames.emplace_back(d, d + n);
  });
  TransportOptions o;
  o.job_token = token;
  o.timeout_ms = 3000;
  p.ta = make_engine_transport(p.a, o);
  p.tb = make_engine_transport(p.b, o);
  p.connect('b');
  p.sw->set_tap(nullptr);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_FALSE(frames.empty());
  for (const auto& f : frames) {
    EXPECT_EQ(std::search(f.begin(), f.end(), token.begin(), token.end()), f.end())
        << "a frame of " << f.size() << " bytes carries the job token";
  }
}

TEST(DpdkEngine, AListenerRefusesARankItDoesNotExpectAndKeepsListening) {
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 3000);
  TransportOptions o;
  o.job_token = "t";
  o.timeout_ms = 3000;
  o.rank = 0;
  auto listening = make_engine_transport(p.a, o);
  o.rank = 2;
  auto stranger = make_engine_transport(p.b, o);
  o.rank = 1;
  auto expected = make_engine_transport(p.b, o);
  Handle h;
  auto l = *listening->listen(&h);
  l->expect_peer(1);
  auto c = *stranger->connect(h);
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  Status st = poll_until_done(*c, *l, &s, &r);
  EXPECT_EQ(st.code(), Code::kPeer) << st.to_string();
  EXPECT_EQ(r, nullptr) << "rank 2 was accepted where rank 1 was expected";
  EXPECT_GT(p.a->stats().wrong_rank, 0u);
  auto c2 = *expected->connect(h);
  s.reset();
  r.reset();
  st = poll_until_done(*c2, *l, &s, &r);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// A handle read by someone else names rank 0: a connector that states rank 0 as the listener
// rank of another listener (a stale or foreign handle) is refused too.
TEST(DpdkEngine, AHandshakeMeantForAnotherRankIsRefused) {
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 3000);
  TransportOptions o;
  o.job_token = "t";
  o.timeout_ms = 3000;
  o.rank = 3;
  auto listening = make_engine_transport(p.a, o);
  o.rank = 1;
  auto connecting = make_engine_transport(p.b, o);
  Handle h;
  auto l = *listening->listen(&h);
  auto t = decode_handle(h);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->listener_rank, 3);
  t->listener_rank = 2;  // the connector believes it reaches rank 2
  encode_handle(*t, &h);
  auto c = *connecting->connect(h);
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
  Status st = poll_until_done(*c, *l, &s, &r);
  EXPECT_EQ(st.code(), Code::kPeer) << st.to_string();
  EXPECT_EQ(r, nullptr);
}

// Someone who captured a whole handshake replays it (under a fresh session, as a new
// connection): the listener's fresh challenge makes the captured proof worthless.
TEST(DpdkEngine, AReplayedHandshakeIsRefused) {
  std::mutex mu;  // before the pair: what the tap captures outlives its engines
  std::vector<std::vector<uint8_t>> sent_by_b;
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 3000);
  p.sw->set_tap([&](const uint8_t* d, size_t n) {
    Frame f;
    if (decode_frame(d, n, false, &f) != DecodeError::kOk || f.src.ip != 0x0a000002) return;
    if (f.hdr.type == FrameType::kHello || f.hdr.type == FrameType::kProof) {
      std::lock_guard<std::mutex> lock(mu);
      sent_by_b.emplace_back(d, d + n);
    }
  });
  p.connect('b');
  p.sw->set_tap(nullptr);
  std::vector<std::vector<uint8_t>> captured;
  {
    std::lock_guard<std::mutex> lock(mu);
    captured = sent_by_b;
  }
  ASSERT_FALSE(captured.empty());
  const uint64_t refused0 = p.a->stats().hello_refused;
  // Replayed as is (the same session), and as a new connection (another session).
  for (uint64_t session_xor : {uint64_t{0}, uint64_t{0x5a5a}}) {
    for (const auto& raw : captured) {
      Frame f;
      ASSERT_EQ(decode_frame(raw.data(), raw.size(), false, &f), DecodeError::kOk);
      GwHeader h = f.hdr;
      h.session ^= session_xor;
      std::vector<uint8_t> buf(raw.size() + 64);
      const size_t n =
          encode_frame(buf.data(), buf.size(), f.src, f.dst, h, f.payload, f.payload_len, 7);
      ASSERT_GT(n, 0u);
      p.a->inject_rx(buf.data(), n);
      p.a->progress();
    }
    for (int i = 0; i < 50; ++i) {
      p.a->progress();
      p.b->progress();
      auto extra = p.l->accept();
      ASSERT_TRUE(extra.ok());
      EXPECT_EQ(*extra, nullptr) << "a replayed handshake was accepted";
    }
  }
  EXPECT_GT(p.a->stats().hello_refused, refused0);
}

// Idle HELLOs from strangers (each a new pending handshake) are capped: the oldest is dropped,
// memory stays bounded, and a real connector still gets through.
TEST(DpdkEngine, PendingHandshakesAreCappedAndARealConnectorGetsThrough) {
  EngineConfig ca = mem_config(0x0a000001, false, 1);
  ca.max_pending_handshakes = 8;
  EnginePair p(ca, mem_config(0x0a000002, false, 2), 3000);
  Handle h;
  p.l = *p.ta->listen(&h);
  auto t = *decode_handle(h);
  for (uint32_t i = 0; i < 100; ++i) {
    GwHeader hh;
    hh.type = FrameType::kHello;
    hh.dst_conn = t.listener_id;
    hh.src_conn = 1000 + i;
    hh.session = 77 + i;
    hh.token_tag = token_tag("t");
    hh.tag = -1;
    hh.msg = static_cast<uint32_t>(-1);
    uint8_t challenge[kHelloPayload] = {};
    uint8_t buf[512];
    const size_t n = encode_frame(buf, sizeof(buf), Endpoint{{2, 0, 0, 0, 0, 9}, 0x0a000009, 47000},
                                  p.a->local(), hh, challenge, sizeof(challenge), 1);
    ASSERT_GT(n, 0u);
    p.a->inject_rx(buf, n);
  }
  EXPECT_GE(p.a->stats().handshakes_dropped, 92u);
  p.c = *p.tb->connect(h);
  Status st = poll_until_done(*p.c, *p.l, &p.s, &p.r);
  EXPECT_TRUE(st.ok()) << st.to_string();
}

// A host that goes silent (no CLOSE: power cut, kill -9) is detected by heartbeat silence.
TEST(DpdkEngine, SilentPeerFailsWithKPeerWithinThePeerTimeout) {
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 800);
  p.connect('b');
  auto& sw = p.sw;
  auto& r = p.r;
  std::vector<uint8_t> buf(64);
  auto rr = *r->irecv(buf.data(), buf.size(), 0, nullptr);
  // Host b vanishes: its engine stops without a word (the switch forgets its port first).
  sw->detach({2, 0, 0, 0, 0, 2});
  auto t0 = std::chrono::steady_clock::now();
  Status st;
  bool done = false;
  size_t n;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5)) {
    st = r->test(rr, &done, &n);
    if (!st.ok() || done) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(st.code(), Code::kPeer) << st.to_string();
  EXPECT_NE(st.message().find("no frame from the peer"), std::string::npos);
  EXPECT_LT(took, std::chrono::milliseconds(2000));
}

// A receiver that got a message and closes before its ACK and CTS reached the sender: the close
// retransmits what is unacknowledged before its CLOSE, and the CLOSE carries the cumulative ack,
// so the sender's delivered send completes instead of failing with "the peer closed the
// connection". (CI hit this in perf/dpdk_vs_tcp.sh: p2p's final control message under 1% loss.)
TEST(DpdkEngine, CloseAcknowledgesWhatThePeerReceived) {
  // Before the pair: the filter's state and the buffers of requests still in flight when an
  // assertion ends the test early outlive the engines that use them.
  std::atomic<int> dropped{0};
  std::atomic<bool> closing{false};
  uint8_t out[8] = {1, 2, 3, 4, 5, 6, 7, 8}, in[8] = {};
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 3000);
  p.connect('a');
  auto& sw = p.sw;
  auto& s = p.s;
  auto& r = p.r;
  // Every frame from b to a is lost until b closes (its ACK and its CTS for the message below,
  // and any ACK it repeats: b acknowledges a message's end on its next progress pass, or its
  // background pass, so how many frames that is depends on timing); from the close on, every
  // frame, retransmissions included, gets through.
  sw->set_filter([&](const uint8_t* data, size_t len) {
    Frame f;
    if (decode_frame(data, len, false, &f) != DecodeError::kOk) return true;
    if (f.src.ip != 0x0a000002u || f.hdr.type == FrameType::kClose) return true;
    if (closing.load()) return true;
    dropped.fetch_add(1);
    return false;
  });
  auto rr = *r->irecv(in, sizeof(in), 0, nullptr);
  auto sr = *s->isend(out, 0, 0, nullptr);  // a 0-byte message, as p2p's control message
  bool done = false;
  size_t n = 0;
  auto t0 = std::chrono::steady_clock::now();
  while (!done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    ASSERT_TRUE(r->test(rr, &done, &n).ok());
  }
  ASSERT_TRUE(done);
  EXPECT_EQ(n, 0u);
  bool sent = false;
  ASSERT_TRUE(s->test(sr, &sent, &n).ok());
  EXPECT_FALSE(sent);  // b's ACK and CTS were lost
  closing.store(true);
  r.reset();  // the receiver closes and goes
  Status st;
  t0 = std::chrono::steady_clock::now();
  while (!sent && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    st = s->test(sr, &sent, &n);
    if (!st.ok()) break;
  }
  EXPECT_TRUE(st.ok()) << st.to_string();
  EXPECT_TRUE(sent);
  EXPECT_GE(dropped.load(), 1);  // b's answer (one frame or more) was lost before its close
}

// An eager send that its CTS refuses (truncated) while its frame is still unacknowledged: the
// send fails and its buffer is the caller's again, so the frame's retransmission must not read
// it: it goes with a copy of its bytes, and the receiver fails its receive on it. (Before, the
// retransmission read the freed buffer: ASan's heap-use-after-free in the debug build.)
TEST(DpdkEngine, ARefusedEagerSendsRetransmissionDoesNotReadItsBuffer) {
  std::atomic<bool> dropping{true};  // before the pair: the filter runs until its engines go
  uint8_t in[8] = {};
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 3000);
  p.connect('a');  // a sends, b receives
  p.sw->set_filter([&](const uint8_t* data, size_t len) {
    Frame f;
    if (decode_frame(data, len, false, &f) != DecodeError::kOk) return true;
    return !(dropping.load() && f.hdr.type == FrameType::kData && f.src.ip == 0x0a000001u);
  });
  auto buf = std::make_unique<std::vector<uint8_t>>(100, 0x5a);
  const uint64_t eager_before = p.a->stats().eager_sends;
  auto sr = *p.s->isend(buf->data(), buf->size(), 0, nullptr);  // eager: its frame is lost
  ASSERT_EQ(p.a->stats().eager_sends, eager_before + 1);
  auto rr = *p.r->irecv(in, sizeof(in), 0, nullptr);  // its CTS refuses the 100 bytes
  bool done = false;
  size_t n = 0;
  Status st;
  const auto t0 = std::chrono::steady_clock::now();
  while (st.ok() && !done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    st = p.s->test(sr, &done, &n);
  }
  EXPECT_EQ(st.code(), Code::kInvalidArg) << st.to_string();
  buf.reset();  // the caller's again, and gone
  dropping.store(false);
  st = Status();
  done = false;
  while (st.ok() && !done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4)) {
    st = p.r->test(rr, &done, &n);
  }
  EXPECT_EQ(st.code(), Code::kInvalidArg) << st.to_string();
  EXPECT_NE(st.message().find("truncated"), std::string::npos) << st.to_string();
  EXPECT_GT(p.a->stats().retransmits, 0u);
}

// A ping-pong over the two one-way connections between two engines (perf p2p's latency loop),
// driven step by step from one thread (no background passes) so the frames are the same on any
// machine. Before, every message and every CTS drew an ACK frame of its own: four per round
// trip. Now the ACK of the ping leaves in the burst of the pong (Engine::acks_with_answer), the
// ACK of the CTS for a pong rides on the pong and the ACK of a CTS for a ping on the next ping
// (Engine::ack_carried): two ACK frames per round trip (three where a round takes longer than
// a CTS's ACK may wait, 25 us: the sanitizer builds).
TEST(DpdkEngine, APingPongsAcksRideOnItsRepliesAndReceives) {
  EngineConfig ca = mem_config(0x0a000001, false, 1), cb = mem_config(0x0a000002, false, 2);
  ca.progress_interval_us = cb.progress_interval_us = 0;
  int acks = 0, cts = 0, data = 0;  // before the pair: its engines' last frames pass the filter
  bool counting = false;
  EnginePair p(ca, cb, 5000);
  p.connect('a');  // a -> b: the pings
  std::unique_ptr<SendComm> back_s;
  std::unique_ptr<RecvComm> back_r;
  {
    Handle h;
    auto l = *p.ta->listen(&h);
    auto c = *p.tb->connect(h);
    ASSERT_TRUE(poll_until_done(*c, *l, &back_s, &back_r).ok());  // b -> a: the pongs
  }
  p.sw->set_filter([&](const uint8_t* frame, size_t len) {
    Frame f;
    if (counting && decode_frame(frame, len, false, &f) == DecodeError::kOk) {
      if (f.hdr.type == FrameType::kAck) ++acks;
      if (f.hdr.type == FrameType::kCts) ++cts;
      if (f.hdr.type == FrameType::kData) ++data;
    }
    return true;
  });
  // Polls one side's request until it completes (only that side's engine makes passes).
  auto spin = [](auto& comm, net::Request* req, const char* what) {
    bool done = false;
    size_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (!done) {
      Status st = comm->test(req, &done, &n);
      if (!st.ok()) return st.with_context(what);
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(5)) {
        return timeout_error("{}: not done in 5 s", what);
      }
    }
    return ok_status();
  };
  constexpr int kWarm = 20, kRounds = 400;
  uint64_t ping_in = 0, pong_in = 0, ping_out = 0, pong_out = 0;
  auto ping_recv = p.r->irecv(&ping_in, sizeof(ping_in), 3, nullptr);  // b's first CTS
  ASSERT_TRUE(ping_recv.ok());
  for (int i = 0; i < kWarm + kRounds; ++i) {
    if (i == kWarm) counting = true;
    ping_out = uint64_t(i);
    auto pong_recv = back_r->irecv(&pong_in, sizeof(pong_in), 4, nullptr);  // a
    auto ping = p.s->isend(&ping_out, sizeof(ping_out), 3, nullptr);
    ASSERT_TRUE(pong_recv.ok() && ping.ok());
    ASSERT_TRUE(spin(p.r, *ping_recv, "b: the ping").ok());  // b
    ASSERT_EQ(ping_in, uint64_t(i));
    pong_out = ping_in * 3;
    auto pong = back_s->isend(&pong_out, sizeof(pong_out), 4, nullptr);
    ASSERT_TRUE(pong.ok());
    ASSERT_TRUE(spin(p.s, *ping, "a: the ping sent").ok());  // a
    ASSERT_TRUE(spin(back_r, *pong_recv, "a: the pong").ok());
    ASSERT_EQ(pong_in, uint64_t(3 * i));
    ASSERT_TRUE(spin(back_s, *pong, "b: the pong sent").ok());  // b
    if (i + 1 < kWarm + kRounds) {
      ping_recv = p.r->irecv(&ping_in, sizeof(ping_in), 3, nullptr);
      ASSERT_TRUE(ping_recv.ok());
    }
  }
  counting = false;
  // One data frame and one CTS per message (a sanitizer build's slow rounds also see a few tail
  // probes: a CTS whose ACK waited out the probe timeout).
  EXPECT_GE(data, 2 * kRounds);
  EXPECT_GE(cts, 2 * kRounds - 1);  // no receive posted after the last ping
  const EngineStats sa = p.a->stats(), sb = p.b->stats();
  if (!gw::testing::kSanitizer) {
    EXPECT_LE(data + cts, 4 * kRounds + kRounds / 20);
    EXPECT_LE(acks, 2 * kRounds + kRounds / 4) << "data " << data << " cts " << cts;
  } else {
    EXPECT_LE(acks, 3 * kRounds + kRounds / 4) << "data " << data << " cts " << cts;
  }
  // The CTS of each pong's receive always rides on the pong.
  EXPECT_GE(sa.acks_carried + sb.acks_carried, uint64_t(kRounds)) << describe(sb);
}

// A connector whose only HELLO_ACK was lost still connects when the listener that accepted it
// is already closed (a Communicator closes its listeners once it has accepted): the listening
// engine answers the retransmitted HELLO from the connection it made. Before, the HELLO found
// no listener and the connector timed out (the 4-host netns test's one-way "not established").
TEST(DpdkEngine, LostHelloAckIsRepeatedAfterTheListenerIsClosed) {
  std::atomic<int> acks_dropped{0};  // before the pair: the filter runs until its engines go
  uint8_t out[4] = {1, 2, 3, 4}, in[4] = {};
  EnginePair p(mem_config(0x0a000001, false, 1), mem_config(0x0a000002, false, 2), 3000);
  p.sw->set_filter([&](const uint8_t* data, size_t len) {
    Frame f;
    if (decode_frame(data, len, false, &f) != DecodeError::kOk) return true;
    return f.hdr.type != FrameType::kHelloAck || acks_dropped.fetch_add(1) >= 1;
  });
  p.start('a');
  auto [l, c, s, r] = std::tie(p.l, p.c, p.s, p.r);  // references into p
  const auto t0 = std::chrono::steady_clock::now();
  while (!s && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2)) {
    auto polled = c->poll();
    ASSERT_TRUE(polled.ok()) << polled.status().to_string();
    s = std::move(*polled);
    if (!r) {
      r = std::move(*l->accept());
      if (r) l.reset();  // accepted: the listener goes, as the Communicator's does
    }
  }
  EXPECT_TRUE(r != nullptr);
  EXPECT_TRUE(s != nullptr) << "the connector never saw a HELLO_ACK";
  EXPECT_GE(acks_dropped.load(), 1);
  if (s && r) {  // and the connection works
    auto rr = *r->irecv(in, 4, 0, nullptr);
    auto sr = *s->isend(out, 4, 0, nullptr);
    bool rd = false, sd = false;
    size_t n = 0;
    while ((!rd || !sd) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(4)) {
      if (!rd) {
        ASSERT_TRUE(r->test(rr, &rd, &n).ok());
      }
      if (!sd) {
        ASSERT_TRUE(s->test(sr, &sd, &n).ok());
      }
    }
    EXPECT_TRUE(rd && sd);
    EXPECT_EQ(std::memcmp(in, out, 4), 0);
  }
}

// Heavy loss, reordering and duplication: a large message still arrives intact, and the
// counters show the protocol worked for it.
TEST(DpdkEngine, LargeTransferSurvivesHeavyFaults) {
  EngineConfig ca = mem_config(0x0a000001, false, 1), cb = mem_config(0x0a000002, false, 2);
  ca.faults = FaultConfig{0.10, 0.10, 0.10, 5};
  cb.faults = FaultConfig{0.10, 0.10, 0.10, 6};
  ca.mtu = cb.mtu = 1500;
  EnginePair p(ca, cb, 0, 1500);
  p.connect('b');
  auto& s = p.s;
  auto& r = p.r;
  std::vector<uint8_t> src(4 << 20), dst(4 << 20);
  std::mt19937 rng(3);
  for (auto& x : src) x = static_cast<uint8_t>(rng());
  auto rr = *r->irecv(dst.data(), dst.size(), 0, nullptr);
  auto sr = *s->isend(src.data(), src.size(), 0, nullptr);
  bool sd = false, rd = false;
  size_t n;
  auto t0 = std::chrono::steady_clock::now();
  while ((!sd || !rd) && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(30)) {
    if (!sd) {
      ASSERT_TRUE(s->test(sr, &sd, &n).ok());
    }
    if (!rd) {
      ASSERT_TRUE(r->test(rr, &rd, &n).ok());
    }
  }
  ASSERT_TRUE(sd && rd);
  EXPECT_EQ(src, dst);
  EngineStats sa = p.a->stats(), sb = p.b->stats();
  EXPECT_GT(sb.retransmits, 0u);
  EXPECT_GT(sb.fast_retransmits, 0u);
  EXPECT_GT(sa.duplicates, 0u);
  EXPECT_GT(sb.injected_drops + sa.injected_drops, 0u);
  EXPECT_EQ(sa.decode_drops_total(), 0u);
}

}  // namespace
}  // namespace gw::dpdk
