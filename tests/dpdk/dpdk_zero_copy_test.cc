// Zero-copy transmit from registered memory (docs/dpdk.md "Zero copy") over a loopback net_ring
// port in this process: net_ring hands the sender's mbufs to the receiver untouched, so the
// receiving engine sees the very segment that points into the sender's registered buffer.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <random>
#include <thread>
#include <vector>

#include "dpdk/dpdk_port.h"
#include "dpdk/dpdk_transport.h"
#include "dpdk/engine.h"
#include "dpdk/engine_transport.h"

namespace gw::dpdk {
namespace {

using net::Handle;
using net::MemType;
using net::RecvComm;
using net::SendComm;
using net::TransportOptions;
using Clock = std::chrono::steady_clock;

// A port that behaves like a PMD which keeps transmitted mbufs after tx_burst: while `holding`,
// the first transmission of every zero-copy data frame is kept (taken, not sent) until
// release_after_ms has passed since hold began; retransmissions go through, so the message is
// delivered and acknowledged while the port still references the user's buffer.
class HoldingPort : public FramePort {
 public:
  explicit HoldingPort(std::unique_ptr<FramePort> inner) : inner_(std::move(inner)) {}
  ~HoldingPort() override {
    for (auto& b : held_) inner_->free(b);
  }
  MacAddr mac() const override { return inner_->mac(); }
  size_t mtu() const override { return inner_->mtu(); }
  bool tx_l4_offload() const override { return inner_->tx_l4_offload(); }
  std::string name() const override { return "holding " + inner_->name(); }
  bool alloc(FrameBuf* buf) override { return inner_->alloc(buf); }
  void free(FrameBuf& buf) override { inner_->free(buf); }
  bool zero_copy() const override { return inner_->zero_copy(); }
  bool attach_external(FrameBuf* buf, const uint8_t* data, size_t len, TxRef* const* refs,
                       int n) override {
    return inner_->attach_external(buf, data, len, refs, n);
  }
  size_t rx_burst(FrameBuf* bufs, size_t n) override {
    maybe_release();
    return inner_->rx_burst(bufs, n);
  }
  void tx_cleanup() override { maybe_release(); }
  size_t tx_burst(FrameBuf* bufs, size_t n) override {
    maybe_release();
    std::vector<FrameBuf> pass;
    for (size_t i = 0; i < n; ++i) {
      Frame f;
      if (hold_ && bufs[i].len2 > 0 &&
          decode_frame_split(bufs[i].data, bufs[i].len, bufs[i].data2, bufs[i].len2, false, &f) ==
              DecodeError::kOk &&
          !(f.hdr.flags & kFlagRetx)) {
        held_.push_back(bufs[i]);
        ++held_total_;
      } else {
        pass.push_back(bufs[i]);
      }
    }
    size_t sent = pass.empty() ? 0 : inner_->tx_burst(pass.data(), pass.size());
    for (size_t i = sent; i < pass.size(); ++i) inner_->free(pass[i]);  // as a full ring would
    return n;
  }
  // Called by the test while no engine call runs (before the sends), or through the engine.
  void hold(int64_t release_after_ms) {
    hold_ = true;
    release_at_ = Clock::now() + std::chrono::milliseconds(release_after_ms);
  }
  size_t held_total() const { return held_total_; }

 private:
  void maybe_release() {
    if (!hold_ || Clock::now() < release_at_) return;
    hold_ = false;
    while (!held_.empty()) {
      size_t sent = inner_->tx_burst(held_.data(), held_.size());
      for (size_t i = sent; i < held_.size(); ++i) inner_->free(held_[i]);
      held_.clear();
    }
  }
  std::unique_ptr<FramePort> inner_;
  std::vector<FrameBuf> held_;
  bool hold_ = false;
  Clock::time_point release_at_;
  size_t held_total_ = 0;
};

EngineConfig ring_config(FaultConfig faults = {}) {
  EngineConfig c;
  c.ip = 0x0a000009;
  c.rto_min_us = 2000;
  c.peer_timeout_ms = 5000;
  c.heartbeat_ms = 50;
  c.window = 64;
  c.faults = faults;
  return c;
}

Result<std::unique_ptr<FramePort>> ring_port(const std::string& zero_copy = "auto") {
  DpdkPortOptions o;
  o.port = "ring";
  o.nb_mbufs = 2048;
  o.zero_copy = zero_copy;
  return open_dpdk_port(o);
}

struct Pair {
  std::unique_ptr<net::Transport> t;
  std::unique_ptr<net::Listener> l;
  std::unique_ptr<SendComm> s;
  std::unique_ptr<RecvComm> r;
};

// Both ends on one engine (a loopback port: what it sends comes back to it).
void connect(const std::shared_ptr<Engine>& e, int64_t timeout_ms, Pair* p) {
  TransportOptions o;
  o.job_token = "zc";
  o.timeout_ms = timeout_ms;
  p->t = make_engine_transport(e, o);
  Handle h;
  auto l = p->t->listen(&h);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  p->l = std::move(*l);
  auto c = p->t->connect(h);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((!p->s || !p->r) && Clock::now() < deadline) {
    if (!p->s) {
      auto x = (*c)->poll();
      ASSERT_TRUE(x.ok()) << x.status().to_string();
      if (*x) p->s = std::move(*x);
    }
    if (!p->r) {
      auto x = p->l->accept();
      ASSERT_TRUE(x.ok()) << x.status().to_string();
      if (*x) p->r = std::move(*x);
    }
  }
  ASSERT_TRUE(p->s && p->r) << "handshake did not complete";
}

// Polls both requests to completion (or the deadline); returns the send's status.
Status run(Pair& p, net::Request* sr, net::Request* rr, int64_t ms = 20000) {
  bool sd = false, rd = false;
  size_t n = 0;
  const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
  while ((!sd || !rd) && Clock::now() < deadline) {
    if (!rd) {
      Status s = p.r->test(rr, &rd, &n);
      if (!s.ok()) return s.with_context("recv: ");
    }
    if (!sd) {
      Status s = p.s->test(sr, &sd, &n);
      if (!s.ok()) return s;
    }
  }
  return sd && rd ? ok_status() : timeout_error("transfer did not complete in {} ms", ms);
}

std::vector<uint8_t> pattern(size_t n, uint32_t seed) {
  std::vector<uint8_t> v(n);
  std::mt19937 rng(seed);
  for (auto& x : v) x = static_cast<uint8_t>(rng());
  return v;
}

TEST(DpdkZeroCopy, RegisteredPayloadIsSentInPlaceAndReadWhereItLies) {
  // Before the engine: the tap's counters and the buffers of requests still in flight when an
  // assertion ends the test early outlive it.
  std::vector<uint8_t> src = pattern(1 << 20, 1), dst(src.size() + 64, 0xee);
  // Frames whose payload the receiving engine read inside the sender's buffer.
  size_t in_place = 0, data_frames = 0;
  auto port = ring_port();
  if (!port.ok()) GTEST_SKIP() << "DPDK cannot start here: " << port.status().to_string();
  ASSERT_TRUE((*port)->zero_copy()) << "net_ring must allow zero copy in auto mode";
  auto e = *Engine::create(std::move(*port), ring_config());
  Pair p;
  ASSERT_NO_FATAL_FAILURE(connect(e, 5000, &p));
  e->set_frame_tap([&](const Frame& f) {
    if (f.hdr.type != FrameType::kData) return;
    ++data_frames;
    if (f.payload >= src.data() && f.payload + f.payload_len <= src.data() + src.size()) {
      ++in_place;
    }
  });
  auto mr = p.s->reg_mr(src.data(), src.size(), MemType::kHost);
  ASSERT_TRUE(mr.ok());
  auto rr = *p.r->irecv(dst.data(), dst.size(), 3, nullptr);
  auto sr = *p.s->isend(src.data(), src.size(), 3, *mr);
  ASSERT_TRUE(run(p, sr, rr).ok());
  e->set_frame_tap(nullptr);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), src.size()));
  const EngineStats st = e->stats();
  const size_t frags = (src.size() + e->payload_max() - 1) / e->payload_max();
  EXPECT_GE(st.zc_frames_tx, frags);
  EXPECT_EQ(st.zc_fallbacks, 0u);
  // Every byte went zero copy at least once; more only through retransmissions (a slow run).
  EXPECT_GE(st.zc_bytes_tx, src.size());
  EXPECT_LE(st.zc_bytes_tx, src.size() + st.retransmits * e->payload_max());
  EXPECT_LE(st.zc_frames_tx, frags + st.retransmits);
  EXPECT_GE(in_place, frags);
  EXPECT_EQ(in_place, data_frames);
  EXPECT_GE(st.rx_split_frames, frags);
  // The UDP checksum spans both segments; the receiver verified it in software (net_ring has no
  // offload) and dropped nothing.
  EXPECT_EQ(st.decode_drops_total(), 0u);
  EXPECT_TRUE(p.s->dereg_mr(*mr).ok());
}

TEST(DpdkZeroCopy, UnregisteredAndSmallPayloadsAreCopied) {
  auto port = ring_port();
  if (!port.ok()) GTEST_SKIP() << "DPDK cannot start here: " << port.status().to_string();
  auto e = *Engine::create(std::move(*port), ring_config());
  Pair p;
  ASSERT_NO_FATAL_FAILURE(connect(e, 5000, &p));
  std::vector<uint8_t> src = pattern(256 << 10, 2), dst(src.size());
  auto rr = *p.r->irecv(dst.data(), dst.size(), 0, nullptr);
  auto sr = *p.s->isend(src.data(), src.size(), 0, nullptr);  // not registered
  ASSERT_TRUE(run(p, sr, rr).ok());
  EXPECT_EQ(src, dst);
  EXPECT_EQ(e->stats().zc_frames_tx, 0u);
  // Registered, but one frame (the default threshold): the copy is cheaper.
  ASSERT_EQ(e->config().zero_copy_min, 0u);
  auto mr = *p.s->reg_mr(src.data(), src.size(), MemType::kHost);
  const size_t small = e->payload_max();
  rr = *p.r->irecv(dst.data(), small, 0, nullptr);
  sr = *p.s->isend(src.data(), small, 0, mr);
  ASSERT_TRUE(run(p, sr, rr).ok());
  EXPECT_EQ(e->stats().zc_frames_tx, 0u);
  EXPECT_EQ(0, std::memcmp(src.data(), dst.data(), small));
  EXPECT_TRUE(p.s->dereg_mr(mr).ok());
}

// The port keeps the first transmission of each frame for 150 ms; the retransmissions deliver
// the message. The send is acknowledged long before, but completes only once the port let go,
// and dereg_mr issued meanwhile waits for the same moment.
TEST(DpdkZeroCopy, SendAndDeregWaitUntilThePortReleasesEveryFrame) {
  auto inner = ring_port();
  if (!inner.ok()) GTEST_SKIP() << "DPDK cannot start here: " << inner.status().to_string();
  auto holding = std::make_unique<HoldingPort>(std::move(*inner));
  HoldingPort* hp = holding.get();
  auto e = *Engine::create(std::move(holding), ring_config());
  Pair p;
  ASSERT_NO_FATAL_FAILURE(connect(e, 5000, &p));
  std::vector<uint8_t> src = pattern(64 << 10, 3), dst(src.size());
  auto mr = *p.s->reg_mr(src.data(), src.size(), MemType::kHost);
  const auto t0 = Clock::now();
  e->progress();  // nothing in flight: the engine is idle while we arm the port
  hp->hold(150);
  auto rr = *p.r->irecv(dst.data(), dst.size(), 0, nullptr);
  auto sr = *p.s->isend(src.data(), src.size(), 0, mr);
  bool rd = false, sd = false;
  size_t n = 0;
  while (!rd && Clock::now() - t0 < std::chrono::seconds(5)) {
    ASSERT_TRUE(p.r->test(rr, &rd, &n).ok());
  }
  ASSERT_TRUE(rd) << "retransmissions did not deliver the message";
  EXPECT_EQ(src, dst);
  EXPECT_GT(hp->held_total(), 0u);
  // Delivered (and soon acknowledged), but the port still holds frames into src.
  ASSERT_TRUE(p.s->test(sr, &sd, &n).ok());
  EXPECT_FALSE(sd);
  const auto before_dereg = Clock::now();
  ASSERT_LT(before_dereg - t0, std::chrono::milliseconds(140)) << "machine too slow to check";
  Status ds = p.s->dereg_mr(mr);
  const auto waited = Clock::now() - t0;
  EXPECT_TRUE(ds.ok()) << ds.to_string();
  EXPECT_GE(waited, std::chrono::milliseconds(150));
  while (!sd && Clock::now() - t0 < std::chrono::seconds(5)) {
    ASSERT_TRUE(p.s->test(sr, &sd, &n).ok());
  }
  EXPECT_TRUE(sd);
  EXPECT_GT(e->stats().retransmits, 0u);
}

// A port that never lets go (until the end): dereg_mr and the send end in clear kTimeout errors
// at the deadline instead of hanging, and the region stays registered.
TEST(DpdkZeroCopy, FramesHeldPastTheDeadlineFailDeregAndSendWithTimeout) {
  auto inner = ring_port();
  if (!inner.ok()) GTEST_SKIP() << "DPDK cannot start here: " << inner.status().to_string();
  auto holding = std::make_unique<HoldingPort>(std::move(*inner));
  HoldingPort* hp = holding.get();
  auto e = *Engine::create(std::move(holding), ring_config());
  Pair p;
  ASSERT_NO_FATAL_FAILURE(connect(e, 300, &p));
  std::vector<uint8_t> src = pattern(32 << 10, 4), dst(src.size());
  auto mr = *p.s->reg_mr(src.data(), src.size(), MemType::kHost);
  e->progress();
  hp->hold(1500);
  auto rr = *p.r->irecv(dst.data(), dst.size(), 0, nullptr);
  auto sr = *p.s->isend(src.data(), src.size(), 0, mr);
  const auto t0 = Clock::now();
  bool sd = false, rd = false;
  size_t n = 0;
  // The data goes after the CTS: wait until the port holds some of it.
  while (hp->held_total() == 0 && Clock::now() - t0 < std::chrono::seconds(1)) {
    ASSERT_TRUE(p.r->test(rr, &rd, &n).ok());
  }
  ASSERT_GT(hp->held_total(), 0u);
  Status ds = p.s->dereg_mr(mr);
  EXPECT_EQ(ds.code(), Code::kTimeout) << ds.to_string();
  EXPECT_NE(ds.message().find("still held by port"), std::string::npos) << ds.to_string();
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1200));
  Status ss;
  while (Clock::now() - t0 < std::chrono::seconds(3)) {
    if (!rd) {
      ASSERT_TRUE(p.r->test(rr, &rd, &n).ok());
    }
    ss = p.s->test(sr, &sd, &n);
    if (!ss.ok() || sd) break;
  }
  EXPECT_EQ(ss.code(), Code::kTimeout) << ss.to_string();
  EXPECT_NE(ss.message().find("zero-copy frame(s) still held"), std::string::npos);
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1400)) << "the port released first";
  EXPECT_EQ(src, dst);
  // The region is still registered: once the port lets go, dereg succeeds.
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  Status again = p.s->dereg_mr(mr);
  while (!again.ok() && again.code() == Code::kTimeout && Clock::now() < deadline) {
    again = p.s->dereg_mr(mr);
  }
  EXPECT_TRUE(again.ok()) << again.to_string();
}

TEST(DpdkZeroCopy, RetransmissionsUnderInjectedLossReattachAndStayCorrect) {
  auto port = ring_port();
  if (!port.ok()) GTEST_SKIP() << "DPDK cannot start here: " << port.status().to_string();
  auto e = *Engine::create(std::move(*port), ring_config(FaultConfig{0.05, 0.05, 0.05, 9}));
  Pair p;
  ASSERT_NO_FATAL_FAILURE(connect(e, 10000, &p));
  std::vector<uint8_t> src = pattern(4 << 20, 5), dst(src.size());
  auto mr = *p.s->reg_mr(src.data(), src.size(), MemType::kHost);
  auto rr = *p.r->irecv(dst.data(), dst.size(), 0, nullptr);
  auto sr = *p.s->isend(src.data(), src.size(), 0, mr);
  Status s = run(p, sr, rr, 30000);
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(src, dst);
  const EngineStats st = e->stats();
  const size_t frags = (src.size() + e->payload_max() - 1) / e->payload_max();
  EXPECT_GT(st.retransmits, 0u);
  EXPECT_GT(st.injected_drops, 0u);
  EXPECT_GT(st.injected_dups, 0u);
  // Retransmitted data frames went zero copy again (re-attached), not copied.
  EXPECT_GT(st.zc_frames_tx, frags);
  EXPECT_EQ(st.decode_drops_total(), 0u);
  // The send completed only after every frame was released: nothing left to wait for.
  const auto t0 = Clock::now();
  EXPECT_TRUE(p.s->dereg_mr(mr).ok());
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(50));
}

TEST(DpdkZeroCopy, KnobOffOnAndBadValue) {
  auto off = ring_port("off");
  if (!off.ok()) GTEST_SKIP() << "DPDK cannot start here: " << off.status().to_string();
  EXPECT_FALSE((*off)->zero_copy());
  auto on = ring_port("on");
  ASSERT_TRUE(on.ok()) << on.status().to_string();
  EXPECT_TRUE((*on)->zero_copy());
  auto bad = ring_port("maybe");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArg);
  EXPECT_NE(bad.status().message().find("GW_DPDK_ZERO_COPY"), std::string::npos);
  // With zero copy off, registered sends are copied.
  auto e = *Engine::create(std::move(*off), ring_config());
  Pair p;
  ASSERT_NO_FATAL_FAILURE(connect(e, 5000, &p));
  std::vector<uint8_t> src = pattern(100 << 10, 6), dst(src.size());
  auto mr = *p.s->reg_mr(src.data(), src.size(), MemType::kHost);
  auto rr = *p.r->irecv(dst.data(), dst.size(), 0, nullptr);
  auto sr = *p.s->isend(src.data(), src.size(), 0, mr);
  ASSERT_TRUE(run(p, sr, rr).ok());
  EXPECT_EQ(src, dst);
  EXPECT_EQ(e->stats().zc_frames_tx, 0u);
  EXPECT_EQ(e->stats().rx_split_frames, 0u);
  EXPECT_TRUE(p.s->dereg_mr(mr).ok());
}

}  // namespace
}  // namespace gw::dpdk
