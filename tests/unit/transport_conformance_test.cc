// The transport conformance suite: every point of the contract in core/net/transport.h, checked
// for every backend by name. A backend this build or host cannot run is skipped with the reason
// make_transport() gives. The cases with a peer in another process are in
// transport_conformance_process_test.cc (the same binary); the fixture in transport_conformance.h.
#include "tests/unit/transport_conformance.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/net/transport.h"
#include "tests/support/exec_child.h"
#include "tests/support/netns_link.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_env.h"

namespace gw::net {
namespace {

using namespace ::gw::net::conformance;

TEST_P(TransportConformance, ConnectAndAcceptPolledAlternatelyFromOneThread) {
  EXPECT_EQ(transport_->properties().name, backend());
  Handle handle;
  auto listener = transport_->listen(&handle);
  ASSERT_TRUE(listener.ok()) << listener.status().to_string();
  auto connector = transport_->connect(handle);
  ASSERT_TRUE(connector.ok()) << connector.status().to_string();
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  int64_t deadline = now_ms() + kWaitMs;
  while ((send == nullptr || recv == nullptr) && now_ms() < deadline) {
    if (send == nullptr) {
      auto s = (*connector)->poll();
      ASSERT_TRUE(s.ok()) << s.status().to_string();
      send = std::move(*s);
    }
    if (recv == nullptr) {
      auto r = (*listener)->accept();
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      recv = std::move(*r);
    }
  }
  ASSERT_NE(send, nullptr);
  ASSERT_NE(recv, nullptr);
  EXPECT_NE(send->peer_name().find("via " + backend()), std::string::npos) << send->peer_name();
  EXPECT_NE(recv->peer_name().find("rank 0"), std::string::npos) << recv->peer_name();
  // The listener is done with this peer: further accepts find nobody.
  auto again = (*listener)->accept();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, nullptr);
  // A connector hands its comm out once.
  EXPECT_FALSE((*connector)->poll().ok());
  Pair p{nullptr, std::move(send), std::move(recv)};
  roundtrip(p, 100, 1);
}

TEST_P(TransportConformance, ManyMessagesArriveInPostingOrder) {
  Pair p = pair();
  constexpr int kCount = 1500;
  auto size_of = [](int i) { return static_cast<size_t>((i * 7919) % 9000); };
  std::vector<std::vector<uint8_t>> src(kCount), dst(kCount);
  for (int i = 0; i < kCount; ++i) {
    src[i].resize(size_of(i));
    fill_pattern(src[i].data(), src[i].size(), i);
    dst[i].assign(9000, 0);
  }
  std::vector<Op> sends(kCount), recvs(kCount);
  int posted_s = 0, posted_r = 0, done_s = 0, done_r = 0;
  int64_t deadline = now_ms() + kWaitMs;
  while ((done_s < kCount || done_r < kCount) && now_ms() < deadline) {
    while (posted_s < kCount && posted_s - done_s < kMaxRequests) {
      auto r = p.send->isend(src[posted_s].data(), src[posted_s].size(), posted_s % 5, nullptr);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      if (*r == nullptr) break;
      sends[posted_s].comm = p.send.get();
      sends[posted_s++].req = *r;
    }
    while (posted_r < kCount && posted_r - done_r < kMaxRequests) {
      auto r = p.recv->irecv(dst[posted_r].data(), 9000, posted_r % 5, nullptr);
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      if (*r == nullptr) break;
      recvs[posted_r].comm = p.recv.get();
      recvs[posted_r++].req = *r;
    }
    if (done_s < posted_s) {
      Op& op = sends[done_s];
      ASSERT_TRUE(op.comm->test(op.req, &op.done, &op.size).ok());
      if (op.done) ++done_s;
    }
    if (done_r < posted_r) {
      Op& op = recvs[done_r];
      Status st = op.comm->test(op.req, &op.done, &op.size);
      ASSERT_TRUE(st.ok()) << st.to_string();
      if (op.done) {
        ASSERT_EQ(op.size, size_of(done_r)) << "message " << done_r;
        ASSERT_TRUE(check_pattern(dst[done_r].data(), op.size, done_r)) << "message " << done_r;
        ++done_r;
      }
    }
  }
  EXPECT_EQ(done_s, kCount);
  EXPECT_EQ(done_r, kCount);
}

TEST_P(TransportConformance, TagsMatchAnyTagAndMismatchFails) {
  Pair p = pair();
  char a[16] = "tagged", b[16] = {};
  Op s1 = post_send(p.send.get(), a, 7, 7);
  Op r1 = post_recv(p.recv.get(), b, 16, 7);
  ASSERT_TRUE(run_ops({&s1, &r1}));
  EXPECT_TRUE(r1.status.ok() && r1.done && r1.size == 7) << r1.status.to_string();
  Op s2 = post_send(p.send.get(), a, 5, 12345);
  Op r2 = post_recv(p.recv.get(), b, 16, kAnyTag);
  ASSERT_TRUE(run_ops({&s2, &r2}));
  EXPECT_TRUE(r2.status.ok() && r2.done && r2.size == 5) << r2.status.to_string();

  Op s3 = post_send(p.send.get(), a, 5, 9);
  Op r3 = post_recv(p.recv.get(), b, 16, 10);
  ASSERT_TRUE(run_ops({&s3, &r3}));
  EXPECT_EQ(r3.status.code(), Code::kInternal) << r3.status.to_string();
  EXPECT_NE(r3.status.message().find("tag mismatch"), std::string::npos);
  // The receiving comm stays failed for later receives.
  auto later = p.recv->irecv(b, 16, kAnyTag, nullptr);
  EXPECT_FALSE(later.ok());
}

TEST_P(TransportConformance, ZeroByteMessagesAreDelivered) {
  Pair p = pair();
  char buf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  Op s1 = post_send(p.send.get(), nullptr, 0, 1);
  Op r1 = post_recv(p.recv.get(), buf, sizeof(buf), 1);
  Op s2 = post_send(p.send.get(), nullptr, 0, 2);
  Op r2 = post_recv(p.recv.get(), nullptr, 0, 2);
  ASSERT_TRUE(run_ops({&s1, &r1, &s2, &r2}));
  for (Op* op : {&s1, &r1, &s2, &r2}) {
    EXPECT_TRUE(op->status.ok() && op->done) << op->status.to_string();
    EXPECT_EQ(op->size, 0u);
  }
  EXPECT_EQ(buf[0], 1);
  roundtrip(p, 33, 9);  // the stream is still in step
}

TEST_P(TransportConformance, MessageAtMultiGiBOffsetOfSparseBuffer) {
  constexpr size_t kRegion = size_t{3} << 30;
  void* region = mmap(nullptr, kRegion, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (region == MAP_FAILED) GTEST_SKIP() << "cannot reserve 3 GiB of address space";
  auto* base = static_cast<uint8_t*>(region);
  const size_t src_off = (size_t{1} << 31) + 123;
  const size_t dst_off = (size_t{5} << 29) + 4097;  // 2.5 GiB
  const size_t size = 12345;
  fill_pattern(base + src_off, size, 77);
  Pair p = pair();
  Op s = post_send(p.send.get(), base + src_off, size, 0);
  Op r = post_recv(p.recv.get(), base + dst_off, size + 100, 0);
  ASSERT_TRUE(run_ops({&s, &r}));
  EXPECT_TRUE(s.status.ok() && r.status.ok()) << s.status.to_string() << r.status.to_string();
  EXPECT_EQ(r.size, size);
  EXPECT_TRUE(check_pattern(base + dst_off, size, 77));
  munmap(region, kRegion);
}

TEST_P(TransportConformance, SizesFromOneByteTo64MiBKeepTheirContent) {
  Pair p = pair();
  for (size_t size :
       {size_t{1}, size_t{3}, size_t{4095}, size_t{4096}, size_t{65537}, size_t{262145},
        size_t{1048575}, size_t{3145735}, size_t{16} << 20, size_t{64} << 20}) {
    SCOPED_TRACE(size);
    roundtrip(p, size, size);
  }
}

TEST_P(TransportConformance, ThirtyTwoRequestsInFlightThenRetry) {
  Pair p = pair();
  constexpr size_t kSize = 1024;
  std::vector<std::vector<uint8_t>> src(kMaxRequests + 1, std::vector<uint8_t>(kSize));
  std::vector<std::vector<uint8_t>> dst(kMaxRequests + 1, std::vector<uint8_t>(kSize));
  for (int i = 0; i <= kMaxRequests; ++i) fill_pattern(src[i].data(), kSize, 1000 + i);
  std::vector<Op> sends, recvs;
  for (int i = 0; i < kMaxRequests; ++i) {
    sends.push_back(post_send(p.send.get(), src[i].data(), kSize, 0));
    recvs.push_back(post_recv(p.recv.get(), dst[i].data(), kSize, 0));
  }
  // Over the limit: "no slot now", not an error.
  auto extra_send = p.send->isend(src[kMaxRequests].data(), kSize, 0, nullptr);
  ASSERT_TRUE(extra_send.ok()) << extra_send.status().to_string();
  EXPECT_EQ(*extra_send, nullptr);
  auto extra_recv = p.recv->irecv(dst[kMaxRequests].data(), kSize, 0, nullptr);
  ASSERT_TRUE(extra_recv.ok()) << extra_recv.status().to_string();
  EXPECT_EQ(*extra_recv, nullptr);
  // Completing the oldest frees a slot for the retry.
  ASSERT_TRUE(run_ops({&sends[0], &recvs[0]}));
  ASSERT_TRUE(sends[0].status.ok() && recvs[0].status.ok());
  sends.push_back(post_send(p.send.get(), src[kMaxRequests].data(), kSize, 0));
  recvs.push_back(post_recv(p.recv.get(), dst[kMaxRequests].data(), kSize, 0));
  std::vector<Op*> all;
  // Test newest first: any outstanding request may be tested.
  for (int i = kMaxRequests; i >= 1; --i) all.push_back(&recvs[i]), all.push_back(&sends[i]);
  ASSERT_TRUE(run_ops(all));
  for (int i = 0; i <= kMaxRequests; ++i) {
    EXPECT_TRUE(recvs[i].status.ok() && sends[i].status.ok()) << i;
    EXPECT_TRUE(check_pattern(dst[i].data(), kSize, 1000 + i)) << "message " << i;
  }
}

TEST_P(TransportConformance, ReceiveLargerThanSendReportsRealSize) {
  Pair p = pair();
  std::vector<uint8_t> src(1000), dst(4096, 0xAB);
  fill_pattern(src.data(), src.size(), 5);
  Op s = post_send(p.send.get(), src.data(), src.size(), 0);
  Op r = post_recv(p.recv.get(), dst.data(), dst.size(), 0);
  ASSERT_TRUE(run_ops({&s, &r}));
  ASSERT_TRUE(r.status.ok()) << r.status.to_string();
  EXPECT_EQ(r.size, 1000u);
  EXPECT_EQ(s.size, 1000u);
  EXPECT_TRUE(check_pattern(dst.data(), 1000, 5));
  EXPECT_EQ(dst[1000], 0xAB);
  EXPECT_EQ(dst[4095], 0xAB);
}

TEST_P(TransportConformance, SendLargerThanReceiveFailsBothSides) {
  Pair p = pair();
  std::vector<uint8_t> src(5000), dst(200, 0xCD);
  fill_pattern(src.data(), src.size(), 6);
  Op s = post_send(p.send.get(), src.data(), src.size(), 0);
  Op r = post_recv(p.recv.get(), dst.data(), 100, 0);
  ASSERT_TRUE(run_ops({&s, &r}));
  EXPECT_EQ(r.status.code(), Code::kInvalidArg) << r.status.to_string();
  EXPECT_NE(r.status.message().find("truncated"), std::string::npos) << r.status.to_string();
  // Callers (the executor) tell a truncation by its reason, not by its text.
  EXPECT_TRUE(r.status.truncated()) << r.status.to_string();
  for (size_t i = 100; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xCD) << "overflow at " << i;
  // The sender learns it on this request if it is still outstanding, else on a later call.
  Status sender = s.status;
  int64_t deadline = now_ms() + kWaitMs;
  char byte = 0;
  while (sender.ok() && now_ms() < deadline) {
    auto next = p.send->isend(&byte, 1, 0, nullptr);
    if (!next.ok()) {
      sender = next.status();
      break;
    }
    if (*next == nullptr) continue;
    Op op;
    op.comm = p.send.get();
    op.req = *next;
    ASSERT_TRUE(run_ops({&op}));
    sender = op.status;
  }
  EXPECT_EQ(sender.code(), Code::kInvalidArg) << sender.to_string();
  EXPECT_NE(sender.message().find("truncated"), std::string::npos) << sender.to_string();
  EXPECT_TRUE(sender.truncated()) << sender.to_string();
}

// A NIC (or the emulator's NIC thread) moves a posted message without the owner's help, so on a
// loaded machine the whole message may be placed before the destruction below: then nothing was
// lost and the other end rightly completes. Such an attempt shows nothing about the in-flight
// path and is run again; every attempt completing is a failure (the destruction never raced).
constexpr int kInFlightAttempts = 5;

TEST_P(TransportConformance, DestroyingSendCommInFlightFailsReceiverWithPeer) {
  const size_t size = size_t{512} << 20;  // more than all buffers between the ends hold
  SparseBuffer src(size), dst(size);
  ASSERT_TRUE(src.data() && dst.data());
  for (int attempt = 1;; ++attempt) {
    Pair p = pair();
    Op s = post_send(p.send.get(), src.data(), size, 0);
    Op r = post_recv(p.recv.get(), dst.data(), size, 0);
    (void)p.send->test(s.req, &s.done, &s.size);
    (void)p.recv->test(r.req, &r.done, &r.size);
    if (s.done && attempt < kInFlightAttempts) continue;
    ASSERT_FALSE(s.done);
    int64_t t0 = now_ms();
    p.send.reset();
    EXPECT_LT(now_ms() - t0, 2000) << "destruction lingered";
    ASSERT_TRUE(run_ops({&r}, 10000)) << "receiver did not notice the closed sender";
    if (r.status.ok()) {
      EXPECT_EQ(r.size, size) << "a receive completed without the whole message";
      ASSERT_LT(attempt, kInFlightAttempts) << "the message was delivered before every destruction";
      continue;
    }
    EXPECT_EQ(r.status.code(), Code::kPeer) << r.status.to_string();
    EXPECT_NE(r.status.message().find("rank 0"), std::string::npos) << r.status.to_string();
    // Later receives fail the same way.
    EXPECT_FALSE(p.recv->irecv(dst.data(), 10, 0, nullptr).ok());
    return;
  }
}

TEST_P(TransportConformance, DestroyingRecvCommInFlightFailsSenderWithPeer) {
  const size_t size = size_t{512} << 20;
  SparseBuffer src(size), dst(size);
  ASSERT_TRUE(src.data() && dst.data());
  for (int attempt = 1;; ++attempt) {
    Pair p = pair();
    Op s = post_send(p.send.get(), src.data(), size, 0);
    Op r = post_recv(p.recv.get(), dst.data(), size, 0);
    (void)p.send->test(s.req, &s.done, &s.size);
    (void)p.recv->test(r.req, &r.done, &r.size);
    if ((s.done || r.done) && attempt < kInFlightAttempts) continue;
    ASSERT_FALSE(s.done);
    int64_t t0 = now_ms();
    p.recv.reset();
    EXPECT_LT(now_ms() - t0, 2000) << "destruction lingered";
    ASSERT_TRUE(run_ops({&s}, 10000)) << "sender did not notice the closed receiver";
    if (s.status.ok()) {
      ASSERT_LT(attempt, kInFlightAttempts) << "the message was delivered before every destruction";
      continue;
    }
    EXPECT_EQ(s.status.code(), Code::kPeer) << s.status.to_string();
    // Later requests fail the same way.
    char byte = 0;
    auto later = p.send->isend(&byte, 1, 0, nullptr);
    EXPECT_FALSE(later.ok());
    return;
  }
}

TEST_P(TransportConformance, DestroyingBothEndsWithRequestsInFlightIsSafe) {
  Pair p = pair();
  std::vector<uint8_t> src(8 << 20, 3), dst(8 << 20);
  for (int i = 0; i < 4; ++i) {
    post_send(p.send.get(), src.data() + i * (2 << 20), 2 << 20, 0);
    post_recv(p.recv.get(), dst.data() + i * (2 << 20), 2 << 20, 0);
  }
  int64_t t0 = now_ms();
  p.recv.reset();
  p.send.reset();
  p.listener.reset();
  EXPECT_LT(now_ms() - t0, 2000);
}

TEST_P(TransportConformance, ConnectorToDeadListenerTimesOut) {
  auto t = make(make_options("conformance-token", 300));
  ASSERT_NE(t, nullptr);
  Handle handle;
  {
    auto listener = t->listen(&handle);
    ASSERT_TRUE(listener.ok());
  }                             // the listener is gone before anyone connects
  const int64_t t0 = now_ms();  // before connect(), which starts the connector's deadline
  auto connector = t->connect(handle);
  ASSERT_TRUE(connector.ok()) << connector.status().to_string();
  Status result;
  while (now_ms() - t0 < 5000) {
    auto c = (*connector)->poll();
    if (!c.ok()) {
      result = c.status();
      break;
    }
    ASSERT_EQ(*c, nullptr);
    usleep(500);
  }
  int64_t elapsed = now_ms() - t0;
  EXPECT_EQ(result.code(), Code::kTimeout) << result.to_string();
  EXPECT_GE(elapsed, 250);
  EXPECT_LT(elapsed, 2000);
}

TEST_P(TransportConformance, WrongJobTokenIsRefusedAndListenerKeepsListening) {
  auto good = make(make_options("right-token"));
  auto bad = make(make_options("wrong-token"));
  ASSERT_TRUE(good && bad);
  Handle handle;
  auto listener = good->listen(&handle);
  ASSERT_TRUE(listener.ok());
  auto connector = bad->connect(handle);
  ASSERT_TRUE(connector.ok());
  Status refused;
  int64_t deadline = now_ms() + kWaitMs;
  while (refused.ok() && now_ms() < deadline) {
    auto c = (*connector)->poll();
    if (!c.ok())
      refused = c.status();
    else
      ASSERT_EQ(*c, nullptr) << "connected with a wrong token";
    auto a = (*listener)->accept();
    ASSERT_TRUE(a.ok()) << a.status().to_string();
    ASSERT_EQ(*a, nullptr) << "accepted a wrong token";
  }
  EXPECT_EQ(refused.code(), Code::kPeer) << refused.to_string();
  // The listener still serves a peer with the right token.
  auto right = good->connect(handle);
  ASSERT_TRUE(right.ok());
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
  deadline = now_ms() + kWaitMs;
  while ((send == nullptr || recv == nullptr) && now_ms() < deadline) {
    if (!send) {
      auto c = (*right)->poll();
      ASSERT_TRUE(c.ok()) << c.status().to_string();
      send = std::move(*c);
    }
    if (!recv) {
      auto a = (*listener)->accept();
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      recv = std::move(*a);
    }
  }
  EXPECT_TRUE(send && recv);
}

TEST_P(TransportConformance, BadInputIsRejectedWithInvalidArg) {
  EXPECT_EQ(transport_->listen(nullptr).status().code(), Code::kInvalidArg);
  Handle zeros;
  EXPECT_EQ(transport_->connect(zeros).status().code(), Code::kInvalidArg);
  Handle garbage;
  for (size_t i = 0; i < kHandleSize; ++i) garbage.bytes[i] = static_cast<uint8_t>(i * 37 + 1);
  EXPECT_EQ(transport_->connect(garbage).status().code(), Code::kInvalidArg);

  Pair p = pair();
  Pair other = pair();
  char buf[64] = {};
  EXPECT_EQ(p.send->isend(nullptr, 10, 0, nullptr).status().code(), Code::kInvalidArg);
  EXPECT_EQ(p.send->isend(buf, 10, -5, nullptr).status().code(), Code::kInvalidArg);
  EXPECT_EQ(p.send->isend(buf, 10, kAnyTag, nullptr).status().code(), Code::kInvalidArg);
  EXPECT_EQ(p.recv->irecv(nullptr, 10, 0, nullptr).status().code(), Code::kInvalidArg);
  EXPECT_EQ(p.recv->irecv(buf, 10, -7, nullptr).status().code(), Code::kInvalidArg);
  bool done = false;
  size_t size = 0;
  EXPECT_EQ(p.send->test(nullptr, &done, &size).code(), Code::kInvalidArg);
  // A request of another comm, and a request after it was reported done, are not this comm's.
  Op s = post_send(other.send.get(), buf, 4, 0);
  EXPECT_EQ(p.send->test(s.req, &done, &size).code(), Code::kInvalidArg);
  EXPECT_EQ(other.send->test(s.req, nullptr, &size).code(), Code::kInvalidArg);
  char rbuf[64] = {};  // not buf: a backend may send and receive on threads of its own at once
  Op r = post_recv(other.recv.get(), rbuf, 64, 0);
  ASSERT_TRUE(run_ops({&s, &r}));
  ASSERT_TRUE(s.done && r.done);
  EXPECT_EQ(other.recv->test(r.req, &done, &size).code(), Code::kInvalidArg);

  // Registration: host memory works (optional for these backends), bad input does not.
  auto mr = p.send->reg_mr(buf, sizeof(buf), MemType::kHost);
  ASSERT_TRUE(mr.ok()) << mr.status().to_string();
  EXPECT_EQ(p.send->isend(buf + 32, 64, 0, *mr).status().code(), Code::kInvalidArg);
  EXPECT_TRUE(p.send->dereg_mr(*mr).ok());
  EXPECT_EQ(p.send->dereg_mr(*mr).code(), Code::kInvalidArg);
  EXPECT_EQ(p.send->dereg_mr(nullptr).code(), Code::kInvalidArg);
  EXPECT_EQ(p.send->reg_mr(nullptr, 10, MemType::kHost).status().code(), Code::kInvalidArg);
  if (!transport_->properties().supports_cuda) {
    EXPECT_EQ(p.send->reg_mr(buf, 8, MemType::kCuda).status().code(), Code::kUnsupported);
  }
  // The comms still work after all of that.
  roundtrip(p, 64, 4);
}

TEST_P(TransportConformance, DifferentCommsRunOnDifferentThreadsAtOnce) {
  constexpr int kThreads = 3;
  std::vector<Pair> pairs(kThreads);
  for (Pair& p : pairs) p = pair();
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Pair& p = pairs[t];
      for (int i = 0; i < 100; ++i) {
        size_t size = static_cast<size_t>((i * 4099 + t * 17) % 300000);
        std::vector<uint8_t> src(size), dst(size);
        fill_pattern(src.data(), size, t * 1000 + i);
        Op s = post_send(p.send.get(), src.data(), size, t);
        Op r = post_recv(p.recv.get(), dst.data(), size, t);
        if (s.req == nullptr || r.req == nullptr || !run_ops({&s, &r}) || !s.status.ok() ||
            !r.status.ok() || r.size != size || !check_pattern(dst.data(), size, t * 1000 + i)) {
          ++failures[t];
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST_P(TransportConformance, InvalidTimeoutIsRejected) {
  auto t = make_transport(backend(), make_options("x", 0));
  EXPECT_EQ(t.status().code(), Code::kInvalidArg);
}

INSTANTIATE_TEST_SUITE_P(Backends, TransportConformance, kBackends, param_name);
INSTANTIATE_TEST_SUITE_P(Backends, TransportConformanceAcrossProcesses, kBackends, param_name);
// Across network namespaces: only the backends whose peers reach each other by IP address (shm
// needs one host; dpdk's own namespace tests are tests/dpdk/dpdk_netns_test.cc).
INSTANTIATE_TEST_SUITE_P(Netns, TransportConformanceAcrossProcesses,
                         ::testing::Values(std::string("tcp-netns"),
                                           std::string("verbs-emu-netns")),
                         param_name);

TEST(MakeTransport, UnknownNameListsValidNames) {
  auto t = make_transport("carrier-pigeon", make_options());
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kInvalidArg);
  EXPECT_NE(t.status().message().find("tcp"), std::string::npos) << t.status().to_string();
  EXPECT_NE(t.status().message().find("shm"), std::string::npos) << t.status().to_string();
}

}  // namespace
}  // namespace gw::net
