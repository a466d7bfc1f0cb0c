// The copy-saving paths beyond the conformance suite (which runs them too, as its tcp-zc and
// shm-cma variants): MSG_ZEROCOPY notification accounting and the rule that a send completes only
// once the kernel has let go of its buffer; shm single-copy reads, a sender that waits for them,
// and the fall-back to the ring when reading the sender's memory is refused.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/net/shm_cma.h"
#include "core/net/shm_transport.h"
#include "core/net/tcp/zerocopy.h"
#include "core/net/tcp_transport.h"
#include "tests/support/connected_pair.h"
#include "tests/support/test_env.h"

namespace gw::net {
namespace {

using ::gw::testing::connect_self;
using Conn = ::gw::testing::ConnectedPair;
using ::gw::testing::now_ms;
using ::gw::testing::ScopedEnv;

TEST(ZcTracker, RangesCompleteTheOldestCallsInOrder) {
  tcp::ZcTracker t;
  EXPECT_TRUE(t.idle());
  for (int i = 0; i < 5; ++i) t.on_sent();
  EXPECT_FALSE(t.idle());
  ASSERT_TRUE(t.note(0, 1, false).ok());
  EXPECT_EQ(t.completed(), 2u);
  EXPECT_FALSE(t.idle());
  ASSERT_TRUE(t.note(2, 4, true).ok());
  EXPECT_TRUE(t.idle());
  EXPECT_EQ(t.copied(), 3u);
}

TEST(ZcTracker, ARangeBeyondTheIssuedCallsOrReportedTwiceIsAnError) {
  tcp::ZcTracker t;
  t.on_sent();
  t.on_sent();
  EXPECT_EQ(t.note(0, 2, false).code(), Code::kInternal);  // 3 reported, 2 issued
  EXPECT_EQ(t.completed(), 0u);
  ASSERT_TRUE(t.note(0, 0, false).ok());
  EXPECT_EQ(t.note(0, 0, false).code(), Code::kInternal);  // call 0 twice
  EXPECT_EQ(t.note(0, 1, false).code(), Code::kInternal);  // call 0 again, with call 1
  ASSERT_TRUE(t.note(1, 1, false).ok());
  EXPECT_TRUE(t.idle());
  EXPECT_EQ(t.note(1, 1, false).code(), Code::kInternal);  // nothing outstanding
}

// CI saw "calls 1..1" reported before call 0 (ASan, a killed receiver): the kernel may report a
// call late when it frees the call's skb late.
TEST(ZcTracker, RangesOutOfOrderCompleteOnceEveryCallIsIn) {
  tcp::ZcTracker t;
  t.on_sent(8);
  ASSERT_TRUE(t.note(1, 1, false).ok());
  ASSERT_TRUE(t.note(5, 6, true).ok());
  ASSERT_TRUE(t.note(3, 3, false).ok());
  EXPECT_EQ(t.completed(), 4u);
  EXPECT_FALSE(t.idle());
  EXPECT_EQ(t.note(6, 7, false).code(), Code::kInternal);  // 6 was reported
  EXPECT_EQ(t.note(0, 1, false).code(), Code::kInternal);  // 1 was reported
  EXPECT_EQ(t.note(2, 3, false).code(), Code::kInternal);  // 3 was reported
  ASSERT_TRUE(t.note(0, 0, false).ok());
  ASSERT_TRUE(t.note(2, 2, false).ok());
  ASSERT_TRUE(t.note(7, 7, false).ok());
  EXPECT_FALSE(t.idle());  // call 4 is still out
  ASSERT_TRUE(t.note(4, 4, false).ok());
  EXPECT_TRUE(t.idle());
  EXPECT_EQ(t.completed(), 8u);
  EXPECT_EQ(t.copied(), 2u);
  t.on_sent(2);  // 8 and 9, reported backwards
  ASSERT_TRUE(t.note(9, 9, false).ok());
  EXPECT_FALSE(t.idle());
  ASSERT_TRUE(t.note(8, 8, false).ok());
  EXPECT_TRUE(t.idle());
}

// Calls cut into random ranges reported in a random order: idle exactly when the last is in, and
// any range reported twice is refused.
TEST(ZcTracker, RandomOrdersOfRandomRanges) {
  std::mt19937 rng(20261202);
  for (int round = 0; round < 200; ++round) {
    tcp::ZcTracker t;
    const uint32_t calls = 1 + rng() % 64;
    t.on_sent(calls);
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    for (uint32_t lo = 0; lo < calls;) {
      const uint32_t hi = std::min(calls - 1, lo + static_cast<uint32_t>(rng() % 4));
      ranges.emplace_back(lo, hi);
      lo = hi + 1;
    }
    std::shuffle(ranges.begin(), ranges.end(), rng);
    for (size_t i = 0; i < ranges.size(); ++i) {
      EXPECT_FALSE(t.idle());
      ASSERT_TRUE(t.note(ranges[i].first, ranges[i].second, false).ok()) << "round " << round;
      const auto& again = ranges[rng() % (i + 1)];
      EXPECT_EQ(t.note(again.first, again.second, false).code(), Code::kInternal);
    }
    EXPECT_TRUE(t.idle());
    EXPECT_EQ(t.completed(), calls);
  }
}

TEST(ZcTracker, OutOfOrderAcrossTheWrap) {
  tcp::ZcTracker t;
  t.on_sent((uint64_t{1} << 32) - 1);
  ASSERT_TRUE(t.note(0, 0xFFFFFFFEu, false).ok());
  t.on_sent(3);  // numbered 0xFFFFFFFF, 0, 1
  ASSERT_TRUE(t.note(0, 1, false).ok());
  EXPECT_FALSE(t.idle());
  ASSERT_TRUE(t.note(0xFFFFFFFFu, 0xFFFFFFFFu, false).ok());
  EXPECT_TRUE(t.idle());
}

TEST(ZcTracker, NumbersWrapAt32Bits) {
  tcp::ZcTracker t;
  t.on_sent((uint64_t{1} << 32) - 2);
  ASSERT_TRUE(t.note(0, 0xFFFFFFFDu, false).ok());
  EXPECT_TRUE(t.idle());
  t.on_sent(4);  // numbered 0xFFFFFFFE, 0xFFFFFFFF, 0, 1
  ASSERT_TRUE(t.note(0xFFFFFFFEu, 0, false).ok());
  EXPECT_FALSE(t.idle());
  EXPECT_EQ(t.note(0, 2, false).code(), Code::kInternal);  // number 2 was never issued
  ASSERT_TRUE(t.note(1, 1, false).ok());
  EXPECT_TRUE(t.idle());
}

// A connected loopback TCP pair with SO_ZEROCOPY on the sending end.
TEST(ZeroCopySocket, NotificationsArriveOnTheErrorQueueAndLoopbackReportsCopies) {
  int sv[2] = {-1, -1};
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(lfd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ASSERT_EQ(listen(lfd, 1), 0);
  sv[0] = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(sv[0], reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  sv[1] = accept(lfd, nullptr, nullptr);
  ASSERT_GE(sv[1], 0);
  close(lfd);
  if (!tcp::enable_zerocopy(sv[0])) {
    close(sv[0]);
    close(sv[1]);
    GTEST_SKIP() << "the kernel refuses SO_ZEROCOPY";
  }
  std::vector<char> buf(64 * 1024, 'z'), sink(buf.size());
  tcp::ZcTracker t;
  for (int i = 0; i < 4; ++i) {
    ssize_t n = send(sv[0], buf.data(), buf.size(), MSG_ZEROCOPY);
    ASSERT_GT(n, 0) << std::strerror(errno);
    t.on_sent();
    size_t got = 0;
    while (got < static_cast<size_t>(n)) {
      ssize_t r = recv(sv[1], sink.data(), sink.size(), 0);
      ASSERT_GT(r, 0);
      got += static_cast<size_t>(r);
    }
  }
  int64_t deadline = now_ms() + 5000;
  while (!t.idle() && now_ms() < deadline) {
    pollfd p{sv[0], 0, 0};
    poll(&p, 1, 100);  // POLLERR: the error queue has notifications
    ASSERT_TRUE(tcp::drain_zerocopy(sv[0], &t, "test peer").ok());
  }
  EXPECT_TRUE(t.idle()) << t.completed() << " of " << t.issued();
  // Loopback delivers to a local socket, so the kernel copies and says so.
  EXPECT_EQ(t.copied(), t.issued());
  close(sv[0]);
  close(sv[1]);
}

TransportOptions options() {
  TransportOptions o;
  o.job_token = "zero-copy-test";
  o.timeout_ms = 5000;
  o.host_id = "host-a";
  o.rank = 1;
  return o;
}

uint8_t pattern(size_t i, int seed) { return static_cast<uint8_t>(i * 131 + (i >> 12) + seed); }

// Sends `size` bytes; the moment the send completes, the sender overwrites its buffer. The
// receiver must still get the original bytes: a transport that completed a send while the
// kernel (MSG_ZEROCOPY) or the peer (a single-copy read) could still read the buffer fails here.
void send_then_scribble(Conn& c, size_t size, int seed) {
  ASSERT_TRUE(c.send && c.recv);
  std::vector<uint8_t> src(size), dst(size, 0);
  for (size_t i = 0; i < size; ++i) src[i] = pattern(i, seed);
  auto s = c.send->isend(src.data(), size, 7, nullptr);
  ASSERT_TRUE(s.ok() && *s != nullptr) << s.status().to_string();
  bool sd = false, rd = false, posted = false;
  Request* r = nullptr;
  size_t n = 0;
  int64_t deadline = now_ms() + 20000;
  int rounds = 0;
  while ((!sd || !rd) && now_ms() < deadline) {
    if (!sd) {
      ASSERT_TRUE(c.send->test(*s, &sd, &n).ok());
      if (sd) std::memset(src.data(), 0xEE, size);
    }
    // The receive is posted late, so the sender first has every chance to finish early.
    if (!posted && ++rounds > 200) {
      auto rr = c.recv->irecv(dst.data(), size, 7, nullptr);
      ASSERT_TRUE(rr.ok() && *rr != nullptr);
      r = *rr;
      posted = true;
    }
    if (posted && !rd) {
      ASSERT_TRUE(c.recv->test(r, &rd, &n).ok());
    }
  }
  ASSERT_TRUE(sd && rd);
  EXPECT_EQ(n, size);
  size_t bad = 0;
  for (size_t i = 0; i < size; ++i) bad += dst[i] != pattern(i, seed);
  EXPECT_EQ(bad, 0u) << "bytes changed after the send completed";
}

TEST(TcpZeroCopy, ASendCompletesOnlyAfterTheKernelLetGoOfItsBuffer) {
  ScopedEnv ifname("GW_SOCKET_IFNAME", "lo");
  ScopedEnv mode("GW_SOCKET_ZEROCOPY", "on");
  ScopedEnv min("GW_SOCKET_ZEROCOPY_MIN", "0");
  ScopedEnv buf("GW_SOCKET_BUFSIZE", "64K");  // most of a message waits in the socket queue
  Conn c = connect_self(make_tcp_transport(options()));
  const uint64_t before = tcp::zerocopy_reported();
  for (int i = 0; i < 3; ++i) send_then_scribble(c, size_t{8} << 20, i);
  EXPECT_GT(tcp::zerocopy_reported(), before) << "no MSG_ZEROCOPY send was made";
}

TEST(TcpZeroCopy, AutoModeFallsBackToCopiesWhenTheKernelCopies) {
  ScopedEnv ifname("GW_SOCKET_IFNAME", "lo");
  ScopedEnv mode("GW_SOCKET_ZEROCOPY", "auto");
  ScopedEnv min("GW_SOCKET_ZEROCOPY_MIN", "4K");
  Conn c = connect_self(make_tcp_transport(options()));
  const uint64_t before = tcp::zerocopy_reported();
  for (int i = 0; i < 8; ++i) send_then_scribble(c, size_t{1} << 20, i);
  const uint64_t used = tcp::zerocopy_reported() - before;
  EXPECT_GT(used, 0u);
  // Loopback copies and says so: after the first such report the socket stops asking for
  // zero-copy, so a second batch makes no zero-copy call at all.
  const uint64_t again = tcp::zerocopy_reported();
  for (int i = 0; i < 8; ++i) send_then_scribble(c, size_t{1} << 20, i);
  EXPECT_EQ(tcp::zerocopy_reported(), again);
}

TEST(TcpZeroCopy, UnknownModeIsRejected) {
  ScopedEnv mode("GW_SOCKET_ZEROCOPY", "sometimes");
  auto t = make_tcp_transport(options());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArg);
  EXPECT_NE(t.status().message().find("GW_SOCKET_ZEROCOPY"), std::string::npos);
}

TEST(ShmSingleCopy, LargeMessagesAreReadFromTheSendersBuffer) {
  ScopedEnv min("GW_SHM_CMA_MIN", "64K");
  Conn c = connect_self(make_shm_transport(options()));
  send_then_scribble(c, 1000, 1);  // below the threshold; lets the receiver answer the offer
  const uint64_t before = shm::cma_bytes_read();
  send_then_scribble(c, size_t{3} << 20, 2);
  EXPECT_EQ(shm::cma_bytes_read() - before, size_t{3} << 20);
  send_then_scribble(c, 1000, 3);  // small ones still take the ring
  EXPECT_EQ(shm::cma_bytes_read() - before, size_t{3} << 20);
}

TEST(ShmSingleCopy, TheSenderWaitsUntilTheReceiverHasRead) {
  ScopedEnv min("GW_SHM_CMA_MIN", "4K");
  Conn c = connect_self(make_shm_transport(options()));
  send_then_scribble(c, 10, 1);
  std::vector<uint8_t> src(1 << 20, 3), dst(1 << 20, 0);
  auto s = c.send->isend(src.data(), src.size(), 1, nullptr);
  ASSERT_TRUE(s.ok() && *s);
  bool done = false;
  size_t n = 0;
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(c.send->test(*s, &done, &n).ok());
  EXPECT_FALSE(done) << "the send completed before anyone read its buffer";
  auto r = c.recv->irecv(dst.data(), dst.size(), 1, nullptr);
  ASSERT_TRUE(r.ok() && *r);
  bool rd = false;
  int64_t deadline = now_ms() + 10000;
  while ((!rd || !done) && now_ms() < deadline) {
    if (!rd) {
      ASSERT_TRUE(c.recv->test(*r, &rd, &n).ok());
    }
    if (!done) {
      ASSERT_TRUE(c.send->test(*s, &done, &n).ok());
    }
  }
  EXPECT_TRUE(rd && done);
  EXPECT_EQ(dst, src);
}

TEST(ShmSingleCopy, RefusedReadsFallBackToTheRing) {
  ScopedEnv min("GW_SHM_CMA_MIN", "4K");
  ScopedEnv refuse("GW_SHM_CMA_INJECT_REFUSE", "1");
  Conn c = connect_self(make_shm_transport(options()));
  const uint64_t before = shm::cma_bytes_read();
  for (int i = 0; i < 4; ++i) send_then_scribble(c, size_t{2} << 20, i);
  EXPECT_EQ(shm::cma_bytes_read(), before);
}

TEST(ShmSingleCopy, ZeroThresholdKeepsTheRing) {
  ScopedEnv min("GW_SHM_CMA_MIN", "0");
  Conn c = connect_self(make_shm_transport(options()));
  const uint64_t before = shm::cma_bytes_read();
  for (int i = 0; i < 3; ++i) send_then_scribble(c, size_t{2} << 20, i);
  EXPECT_EQ(shm::cma_bytes_read(), before);
}

}  // namespace
}  // namespace gw::net
