// The verbs emulator fails where hardware fails: each test drives raw verbs through the table
// (as the backend does) on two RC QPs of this process's emulated NIC and asserts one failure.
// Failures with a peer process, the link layer, injected faults and events:
// verbs_emu_fault_test.cc (the same binary).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/exec_child.h"
#include "tests/verbs/verbs_emu_fixture.h"
#include "verbs/emu/emu_verbs.h"

namespace gw::verbs::emu {
namespace {

using namespace ::gw::verbs::emu::test;

TEST_F(EmuTest, ModifyQpNeedsEveryRequiredMaskBit) {
  ibv_qp* q = make_qp(cq_a_);
  ibv_qp* p = make_qp(cq_b_);
  EXPECT_EQ(to_init(q, kRw, IBV_QP_ACCESS_FLAGS), EINVAL);
  EXPECT_EQ(to_init(q, kRw, IBV_QP_PORT), EINVAL);
  EXPECT_EQ(to_rtr(q, p->qp_num), EINVAL) << "RESET -> RTR skips INIT";
  ASSERT_EQ(to_init(q), 0);
  EXPECT_EQ(to_rts(q), EINVAL) << "INIT -> RTS skips RTR";
  EXPECT_EQ(to_rtr(q, p->qp_num, IBV_QP_MIN_RNR_TIMER), EINVAL);
  EXPECT_EQ(to_rtr(q, p->qp_num, IBV_QP_AV), EINVAL);
  EXPECT_EQ(to_rtr(q, p->qp_num, IBV_QP_DEST_QPN), EINVAL);
  ASSERT_EQ(to_rtr(q, p->qp_num), 0);
  EXPECT_EQ(to_rts(q, 14, 7, 7, IBV_QP_TIMEOUT), EINVAL);
  EXPECT_EQ(to_rts(q, 14, 7, 7, IBV_QP_RNR_RETRY), EINVAL);
  EXPECT_EQ(to_rts(q), 0);
}

TEST_F(EmuTest, PostingBeforeRtsFails) {
  ibv_qp* q = make_qp(cq_a_);
  char buf[8] = {};
  EXPECT_EQ(write(q, buf, 8, 0, 0, 0, false, IBV_SEND_INLINE | IBV_SEND_SIGNALED), EINVAL);
  EXPECT_EQ(post_recv(q), EINVAL) << "RESET takes no receives";
  ASSERT_EQ(to_init(q), 0);
  EXPECT_EQ(write(q, buf, 8, 0, 0, 0, false, IBV_SEND_INLINE | IBV_SEND_SIGNALED), EINVAL);
  EXPECT_EQ(post_recv(q), 0) << "INIT takes receives";
}

TEST_F(EmuTest, WriteWithImmPlacesBytesAndConsumesAReceive) {
  connect();
  std::vector<uint8_t> src(100000), dst(100000, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7);
  ibv_mr* ms = reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* md = reg(dst.data(), dst.size(), kRw);
  ASSERT_EQ(post_recv(b_, 42), 0);
  ASSERT_EQ(post_recv(b_, 43), 0);
  ASSERT_EQ(write(a_, src.data(), 100000, ms->lkey, reinterpret_cast<uint64_t>(dst.data()),
                  md->rkey, true),
            0);
  ibv_wc wc = next_wc(cq_b_);
  ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(wc.wr_id, 42u);
  EXPECT_EQ(wc.byte_len, 100000u);
  EXPECT_EQ(wc.imm_data, 0x12345678u);
  EXPECT_TRUE(wc.wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(src, dst);
  ibv_wc sent = next_wc(cq_a_);
  EXPECT_EQ(sent.status, IBV_WC_SUCCESS);
  EXPECT_EQ(sent.opcode, IBV_WC_RDMA_WRITE);
  // Zero bytes with immediate: no SGE, no rkey, still a completion.
  ASSERT_EQ(write(a_, nullptr, 0, 0, 0, 0, true), 0);
  wc = next_wc(cq_b_);
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.wr_id, 43u);
  EXPECT_EQ(wc.byte_len, 0u);
}

TEST_F(EmuTest, ReceiverNotReadyRetriesUntilAReceiveIsPosted) {
  connect();
  uint64_t before = counters().retransmits;
  ASSERT_EQ(write(a_, nullptr, 0, 0, 0, 0, true), 0);
  // The emulated NIC's thread must have been refused (RNR) at least once before the receive is
  // posted: wait for that, with a deadline, rather than for a fixed time.
  const int64_t end = now_ms() + 5000;
  while (counters().retransmits == before && now_ms() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(counters().retransmits, before) << "no RNR retry while no receive was posted";
  EXPECT_EQ(t_->poll_cq(cq_a_, 1, std::vector<ibv_wc>(1).data()), 0) << "completed without RQ";
  ASSERT_EQ(post_recv(b_), 0);
  EXPECT_EQ(next_wc(cq_b_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
}

TEST_F(EmuTest, FiniteRnrRetryEndsInRnrRetryExceeded) {
  connect(14, 7, /*rnr=*/2);
  ASSERT_EQ(write(a_, nullptr, 0, 0, 0, 0, true), 0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_RNR_RETRY_EXC_ERR);
}

TEST_F(EmuTest, RemoteKeyBoundsAndAccessAreChecked) {
  std::vector<uint8_t> src(64, 1), dst(64, 0), ro(64, 0);
  for (int c = 0; c < 3; ++c) {
    SCOPED_TRACE(c);
    connect();
    ibv_mr* ms = reg(src.data(), 64, IBV_ACCESS_LOCAL_WRITE);
    ibv_mr* md = reg(dst.data(), 64, kRw);
    ibv_mr* mro = reg(ro.data(), 64, IBV_ACCESS_LOCAL_WRITE);  // no remote write
    uint64_t raddr = reinterpret_cast<uint64_t>(c == 2 ? ro.data() : dst.data());
    uint32_t rkey = c == 0 ? md->rkey + 1 : c == 1 ? md->rkey : mro->rkey;
    uint32_t len = c == 1 ? 65 : 64;  // c == 1: one byte past the registration
    ASSERT_EQ(
        write(a_, src.data(), len > 64 ? 64 : len, ms->lkey, raddr + (c == 1 ? 1 : 0), rkey, false),
        0);
    EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_REM_ACCESS_ERR);
    // The QP is in error now: later work flushes.
    ASSERT_EQ(write(a_, src.data(), 8, ms->lkey, raddr, rkey, false), 0);
    EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(dst, std::vector<uint8_t>(64, 0));
    EXPECT_EQ(ro, std::vector<uint8_t>(64, 0));
    while (t_->poll_cq(cq_b_, 1, std::vector<ibv_wc>(1).data()) > 0) {
    }
  }
}

TEST_F(EmuTest, LocalKeyIsCheckedButInlineSkipsIt) {
  connect();
  std::vector<uint8_t> src(32, 5), dst(32, 0);
  ibv_mr* md = reg(dst.data(), 32, kRw);
  auto raddr = reinterpret_cast<uint64_t>(dst.data());
  ASSERT_EQ(write(a_, src.data(), 32, /*lkey=*/0, raddr, md->rkey, false,
                  IBV_SEND_INLINE | IBV_SEND_SIGNALED),
            0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(dst, src);
  ASSERT_EQ(write(a_, src.data(), 32, /*lkey=*/0xdead, raddr, md->rkey, false), 0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_LOC_PROT_ERR);
}

// RDMA READ: the responder's bytes land in the requester's buffer, across several socket
// steps for a large read, and complete as IBV_WC_RDMA_READ with the length.
TEST_F(EmuTest, RdmaReadFetchesTheRemoteBytes) {
  connect_for_read();
  for (uint32_t len : {1u, 4096u, 3u << 20}) {
    SCOPED_TRACE(len);
    std::vector<uint8_t> remote(len), local(len + 1, 0xEE);
    for (uint32_t i = 0; i < len; ++i) remote[i] = static_cast<uint8_t>(i * 7 + 3);
    ibv_mr* mr = reg(remote.data(), len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    ibv_mr* ml = reg(local.data(), len + 1, IBV_ACCESS_LOCAL_WRITE);
    ASSERT_TRUE(mr && ml);
    ASSERT_EQ(rdma_read(a_, local.data(), len, ml->lkey, reinterpret_cast<uint64_t>(remote.data()),
                        mr->rkey),
              0);
    ibv_wc wc = next_wc(cq_a_);
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(wc.byte_len, len);
    EXPECT_TRUE(std::equal(remote.begin(), remote.end(), local.begin()));
    EXPECT_EQ(local[len], 0xEE) << "wrote past the read";
  }
  ibv_wc none{};
  EXPECT_EQ(t_->poll_cq(cq_b_, 1, &none), 0) << "a READ completes nothing at the responder";
}

// What hardware refuses: a remote registration or QP without REMOTE_READ (remote access error),
// a local buffer without LOCAL_WRITE (local protection error), a responder that takes no reads
// (max_dest_rd_atomic 0: remote invalid request), and an inline READ (EINVAL at the post).
TEST_F(EmuTest, RdmaReadChecksAccessAndResponderLimits) {
  std::vector<uint8_t> remote(64, 9), local(64, 0);
  struct Case {
    const char* what;
    int remote_access, qp_access, local_access, rd_atomic;
    ibv_wc_status want;
  } cases[] = {
      {"remote MR without REMOTE_READ", kRw, kRwr, IBV_ACCESS_LOCAL_WRITE, 1,
       IBV_WC_REM_ACCESS_ERR},
      {"remote QP without REMOTE_READ", IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, kRw,
       IBV_ACCESS_LOCAL_WRITE, 1, IBV_WC_REM_ACCESS_ERR},
      {"local MR without LOCAL_WRITE", IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, kRwr, 0, 1,
       IBV_WC_LOC_PROT_ERR},
      {"responder takes no reads", IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, kRwr,
       IBV_ACCESS_LOCAL_WRITE, 0, IBV_WC_REM_INV_REQ_ERR},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    connect_for_read(c.qp_access, c.rd_atomic);
    ibv_mr* mr = reg(remote.data(), 64, c.remote_access);
    ibv_mr* ml = reg(local.data(), 64, c.local_access);
    ASSERT_TRUE(mr && ml);
    ASSERT_EQ(rdma_read(a_, local.data(), 64, ml->lkey, reinterpret_cast<uint64_t>(remote.data()),
                        mr->rkey),
              0);
    EXPECT_EQ(next_wc(cq_a_).status, c.want);
    EXPECT_EQ(local, std::vector<uint8_t>(64, 0));
  }
  connect_for_read();
  ibv_mr* mr = reg(remote.data(), 64, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr* ml = reg(local.data(), 64, IBV_ACCESS_LOCAL_WRITE);
  EXPECT_EQ(rdma_read(a_, local.data(), 8, ml->lkey, reinterpret_cast<uint64_t>(remote.data()),
                      mr->rkey, IBV_SEND_SIGNALED | IBV_SEND_INLINE),
            EINVAL);
}

// The GDR flush's shape: one QP connected to itself reads a word of its own registration.
TEST_F(EmuTest, QpConnectedToItselfReadsItsOwnMemory) {
  ibv_qp* q = make_qp(cq_a_);
  ASSERT_NE(q, nullptr);
  ASSERT_EQ(to_init(q, kRwr), 0);
  ASSERT_EQ(to_rtr(q, q->qp_num, 0, 1), 0);
  ASSERT_EQ(to_rts(q), 0);
  uint32_t word = 0xfeedf00d, into = 0;
  ibv_mr* mr = reg(&word, sizeof(word), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr* ml = reg(&into, sizeof(into), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_EQ(
      rdma_read(q, &into, sizeof(into), ml->lkey, reinterpret_cast<uint64_t>(&word), mr->rkey), 0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(into, word);
}

// PSNs are 24 bits: a requester and responder starting just below 2^24 keep agreeing across the
// wrap, for writes and reads.
TEST_F(EmuTest, PsnsWrapAtTwentyFourBits) {
  a_ = make_qp(cq_a_);
  b_ = make_qp(cq_b_);
  ASSERT_TRUE(a_ && b_);
  const uint32_t start = 0xfffffd;
  ASSERT_EQ(to_init(a_, kRwr), 0);
  ASSERT_EQ(to_init(b_, kRwr), 0);
  ASSERT_EQ(to_rtr(a_, b_->qp_num, 0, 1, start), 0);
  ASSERT_EQ(to_rtr(b_, a_->qp_num, 0, 1, start), 0);
  ASSERT_EQ(to_rts(a_, 14, 1, 7, 0, start), 0);  // one retry: a lost agreement fails quickly
  ASSERT_EQ(to_rts(b_, 14, 1, 7, 0, start), 0);
  std::vector<uint8_t> src(16, 3), dst(16, 0);
  ibv_mr* ms = reg(src.data(), 16, kRwr);
  ibv_mr* md = reg(dst.data(), 16, kRwr);
  for (int i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    src[0] = static_cast<uint8_t>(i);
    if (i % 2 == 0) {
      ASSERT_EQ(write(a_, src.data(), 16, ms->lkey, reinterpret_cast<uint64_t>(dst.data()),
                      md->rkey, false),
                0);
    } else {
      ASSERT_EQ(
          rdma_read(a_, dst.data(), 16, md->lkey, reinterpret_cast<uint64_t>(src.data()), ms->rkey),
          0);
    }
    ASSERT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
    EXPECT_EQ(dst[0], i);
  }
}

TEST_F(EmuTest, RegistrationAndDeviceLimits) {
  char buf[64];
  EXPECT_EQ(t_->reg_mr(pd_, buf, 64, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL) << "remote write needs local write";
  ibv_device_attr attr{};
  ASSERT_EQ(t_->query_device(ctx_, &attr), 0);
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq_a_;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = 4;
  a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = static_cast<uint32_t>(attr.max_sge) + 1;
  EXPECT_EQ(t_->create_qp(pd_, &a), nullptr) << "more SGEs than ibv_query_device allows";
  a.cap.max_send_sge = 1;
  a.cap.max_inline_data = 4096;
  EXPECT_EQ(t_->create_qp(pd_, &a), nullptr) << "inline beyond the device's limit";
  connect();
  std::vector<uint8_t> big(65, 0);
  EXPECT_EQ(write(a_, big.data(), 65, 0, 0, 0, false, IBV_SEND_INLINE), EINVAL)
      << "inline beyond the QP's max_inline_data";
}

TEST_F(EmuTest, UnsignaledWorkHoldsSendQueueSlotsUntilASignaledCompletion) {
  a_ = make_qp(cq_a_, /*send_wr=*/4);
  b_ = make_qp(cq_b_);
  ASSERT_EQ(to_init(a_), 0);
  ASSERT_EQ(to_init(b_), 0);
  ASSERT_EQ(to_rtr(a_, b_->qp_num), 0);
  ASSERT_EQ(to_rtr(b_, a_->qp_num), 0);
  ASSERT_EQ(to_rts(a_), 0);
  ASSERT_EQ(to_rts(b_), 0);
  std::vector<uint8_t> dst(8);
  ibv_mr* md = reg(dst.data(), 8, kRw);
  auto raddr = reinterpret_cast<uint64_t>(dst.data());
  char b = 1;
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(write(a_, &b, 1, 0, raddr, md->rkey, false, IBV_SEND_INLINE), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // all four are done by now
  EXPECT_EQ(write(a_, &b, 1, 0, raddr, md->rkey, false, IBV_SEND_INLINE), ENOMEM)
      << "completed unsignaled WRs still hold their slots";
  // With one signaled in every four, the queue drains.
  a_ = make_qp(cq_a_, 4);
  ASSERT_EQ(to_init(a_), 0);
  ASSERT_EQ(to_rtr(a_, b_->qp_num), 0);
  ASSERT_EQ(to_rts(a_), 0);
  for (int i = 0; i < 12; ++i) {
    int flags = IBV_SEND_INLINE | (i % 4 == 3 ? IBV_SEND_SIGNALED : 0);
    int rc = write(a_, &b, 1, 0, raddr, md->rkey, false, flags);
    ASSERT_EQ(rc, 0) << i;
    if (i % 4 == 3) {
      ASSERT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
    }
  }
}

TEST_F(EmuTest, DeadPeerEndsInRetryExceededAfterTimeoutTimesRetries) {
  connect(/*timeout=*/8, /*retry=*/3);  // 1.05 ms per try
  t_->destroy_qp(b_);                   // the peer's QP is gone: packets vanish, no answer
  qps_.erase(std::find(qps_.begin(), qps_.end(), b_));
  int64_t t0 = now_ms();
  ASSERT_EQ(write(a_, nullptr, 0, 0, 0, 0, true), 0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_GE(now_ms() - t0, 3);  // (1 + 3 retries) x 1.05 ms
}

}  // namespace
}  // namespace gw::verbs::emu
