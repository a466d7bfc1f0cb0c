// The verbs emulator fails where hardware fails: each test drives raw verbs through the table
// (as the backend does) on two RC QPs of this process's emulated NIC and asserts one failure.
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
#include "verbs/emu/emu_verbs.h"

namespace gw::verbs::emu {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

class EmuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    t_ = emu_table();
    int n = 0;
    ibv_device** list = t_->get_device_list(&n);
    ASSERT_EQ(n, 1);
    ctx_ = t_->open_device(list[0]);
    t_->free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    pd_ = t_->alloc_pd(ctx_);
    cq_a_ = t_->create_cq(ctx_, 64, nullptr, nullptr, 0);
    cq_b_ = t_->create_cq(ctx_, 64, nullptr, nullptr, 0);
    ASSERT_TRUE(pd_ && cq_a_ && cq_b_);
  }
  void TearDown() override {
    for (ibv_qp* q : qps_) t_->destroy_qp(q);
    for (ibv_mr* m : mrs_) t_->dereg_mr(m);
    t_->destroy_cq(cq_a_);
    t_->destroy_cq(cq_b_);
    t_->dealloc_pd(pd_);
    t_->close_device(ctx_);
  }

  ibv_qp* make_qp(ibv_cq* cq, uint32_t send_wr = 16) {
    ibv_qp_init_attr a{};
    a.send_cq = cq;
    a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = send_wr;
    a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = 64;
    ibv_qp* q = t_->create_qp(pd_, &a);
    if (q != nullptr) qps_.push_back(q);
    return q;
  }

  int to_init(ibv_qp* q, int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE,
              int drop_mask = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = static_cast<unsigned>(access);
    return t_->modify_qp(
        q, &a, (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) & ~drop_mask);
  }

  int to_rtr(ibv_qp* q, uint32_t dest, int drop_mask = 0, int rd_atomic = 0, uint32_t psn = 0) {
    ibv_port_attr pa{};
    ibv_gid gid{};
    t_->query_port(ctx_, 1, &pa);
    t_->query_gid(ctx_, 1, 3, &gid);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = dest;
    a.min_rnr_timer = 1;  // 10 us
    a.max_dest_rd_atomic = static_cast<uint8_t>(rd_atomic);
    a.rq_psn = psn;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = gid;
    a.ah_attr.grh.sgid_index = 3;
    a.ah_attr.dlid = pa.lid;
    a.ah_attr.port_num = 1;
    return t_->modify_qp(q, &a,
                         (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                          IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) &
                             ~drop_mask);
  }

  int to_rts(ibv_qp* q, int timeout = 14, int retry = 7, int rnr = 7, int drop_mask = 0,
             uint32_t psn = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = psn;
    a.timeout = static_cast<uint8_t>(timeout);
    a.retry_cnt = static_cast<uint8_t>(retry);
    a.rnr_retry = static_cast<uint8_t>(rnr);
    a.max_rd_atomic = 1;
    return t_->modify_qp(q, &a,
                         (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                          IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) &
                             ~drop_mask);
  }

  // a -> b connected both ways; a's requester settings given.
  void connect(int timeout = 14, int retry = 7, int rnr = 7) {
    a_ = make_qp(cq_a_);
    b_ = make_qp(cq_b_);
    ASSERT_TRUE(a_ && b_);
    ASSERT_EQ(to_init(a_), 0);
    ASSERT_EQ(to_init(b_), 0);
    ASSERT_EQ(to_rtr(a_, b_->qp_num), 0);
    ASSERT_EQ(to_rtr(b_, a_->qp_num), 0);
    ASSERT_EQ(to_rts(a_, timeout, retry, rnr), 0);
    ASSERT_EQ(to_rts(b_), 0);
  }

  ibv_mr* reg(void* p, size_t n, int access) {
    ibv_mr* m = t_->reg_mr(pd_, p, n, access);
    if (m != nullptr) mrs_.push_back(m);
    return m;
  }

  int write(ibv_qp* q, const void* src, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
            bool imm, int flags = IBV_SEND_SIGNALED, uint64_t id = 1) {
    ibv_sge sge{reinterpret_cast<uint64_t>(src), len, lkey};
    ibv_send_wr wr{};
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = len > 0 ? 1 : 0;
    wr.opcode = imm ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.send_flags = static_cast<unsigned>(flags);
    wr.imm_data = 0x12345678;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return t_->post_send(q, &wr, &bad);
  }

  int rdma_read(ibv_qp* q, void* dst, uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey,
                int flags = IBV_SEND_SIGNALED) {
    ibv_sge sge{reinterpret_cast<uint64_t>(dst), len, lkey};
    ibv_send_wr wr{};
    wr.wr_id = 9;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_READ;
    wr.send_flags = static_cast<unsigned>(flags);
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    return t_->post_send(q, &wr, &bad);
  }

  // a -> b for RDMA READ: both QPs take remote reads (unless `qp_access` says otherwise) and b
  // answers `rd_atomic` reads at once.
  void connect_for_read(int qp_access = kRwr, int rd_atomic = 1) {
    a_ = make_qp(cq_a_);
    b_ = make_qp(cq_b_);
    ASSERT_TRUE(a_ && b_);
    ASSERT_EQ(to_init(a_, kRwr), 0);
    ASSERT_EQ(to_init(b_, qp_access), 0);
    ASSERT_EQ(to_rtr(a_, b_->qp_num, 0, 1), 0);
    ASSERT_EQ(to_rtr(b_, a_->qp_num, 0, rd_atomic), 0);
    ASSERT_EQ(to_rts(a_), 0);
    ASSERT_EQ(to_rts(b_), 0);
  }
  static constexpr int kRwr =
      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;

  int post_recv(ibv_qp* q, uint64_t id = 7) {
    ibv_recv_wr wr{};
    wr.wr_id = id;
    ibv_recv_wr* bad = nullptr;
    return t_->post_recv(q, &wr, &bad);
  }

  // The next completion of `cq` within `ms`, or status -1.
  ibv_wc next_wc(ibv_cq* cq, int64_t ms = 5000) {
    ibv_wc wc{};
    int64_t end = now_ms() + ms;
    while (now_ms() < end) {
      int n = t_->poll_cq(cq, 1, &wc);
      if (n == 1) return wc;
      if (n < 0) break;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    wc.status = static_cast<ibv_wc_status>(-1);
    return wc;
  }

  bool async_event(ibv_event_type want, int64_t ms = 2000) {
    int64_t end = now_ms() + ms;
    while (now_ms() < end) {
      ibv_async_event ev{};
      if (t_->get_async_event(ctx_, &ev) == 0) {
        t_->ack_async_event(&ev);
        if (ev.event_type == want) return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  const IbvTable* t_ = nullptr;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_a_ = nullptr;
  ibv_cq* cq_b_ = nullptr;
  ibv_qp* a_ = nullptr;
  ibv_qp* b_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::vector<ibv_mr*> mrs_;
};

constexpr int kRw = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

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

// EmuChild.HoldQp, in a helper process: opens the emulated device, creates a QP, writes its
// number and LID to descriptor GW_EMU_CHILD_FD and waits to be killed.
const bool kHoldQpRegistered = ::gw::testing::register_child_case("EmuChild", "HoldQp", [] {
  const int fd = atoi(::gw::testing::env_or_empty("GW_EMU_CHILD_FD").c_str());
  const IbvTable* t = emu_table();
  int n = 0;
  ibv_device** list = t->get_device_list(&n);
  if (list == nullptr || n < 1) return 2;
  ibv_context* ctx = t->open_device(list[0]);
  ibv_pd* pd = t->alloc_pd(ctx);
  ibv_cq* cq = t->create_cq(ctx, 8, nullptr, nullptr, 0);
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  ibv_qp* q = t->create_qp(pd, &a);
  if (q == nullptr) return 3;
  ibv_port_attr pa{};
  t->query_port(ctx, 1, &pa);
  uint32_t info[2] = {q->qp_num, pa.lid};
  if (::write(fd, info, sizeof(info)) != static_cast<ssize_t>(sizeof(info))) return 4;
  sleep(60);  // until killed (bounded in case the parent is gone)
  return 0;
});

// EmuChild.InfiniBandPort, in a helper process with GW_VERBS_EMU_LINK=ib: the port reads as an
// InfiniBand port (LID in the unicast range, a subnet manager, GID 0 = fe80::/64 + GUID of type
// "IB/RoCE v1", the rest unset), two QPs connect by LID alone (no GRH) and move a write, and a
// path without a LID is refused. Its exit code says which check failed.
const bool kIbPortRegistered = ::gw::testing::register_child_case("EmuChild", "InfiniBandPort", [] {
  const IbvTable* t = emu_table();
  int n = 0;
  ibv_device** list = t->get_device_list(&n);
  if (list == nullptr || n < 1) return 2;
  ibv_context* ctx = t->open_device(list[0]);
  if (ctx == nullptr) return 3;
  ibv_port_attr pa{};
  if (t->query_port(ctx, 1, &pa) != 0 || pa.link_layer != IBV_LINK_LAYER_INFINIBAND) return 4;
  if (pa.lid == 0 || pa.lid > 0xBFFF || pa.sm_lid == 0) return 5;
  ibv_gid g0{}, g1{};
  char type[32] = {};
  if (t->query_gid(ctx, 1, 0, &g0) != 0 || g0.raw[0] != 0xfe || g0.raw[1] != 0x80) return 6;
  if (t->query_gid(ctx, 1, 1, &g1) != 0 || g1.raw[0] != 0 || g1.raw[15] != 0) return 7;
  if (t->query_gid_type(ctx, 1, 0, type, sizeof(type)) != 0 || std::string(type) != "IB/RoCE v1") {
    return 8;
  }
  ibv_pd* pd = t->alloc_pd(ctx);
  ibv_cq* cq = t->create_cq(ctx, 16, nullptr, nullptr, 0);
  ibv_qp* q[2];
  for (ibv_qp*& x : q) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = a.cap.max_recv_wr = 4;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    x = t->create_qp(pd, &a);
    if (x == nullptr) return 9;
    ibv_qp_attr i{};
    i.qp_state = IBV_QPS_INIT;
    i.port_num = 1;
    i.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    if (t->modify_qp(x, &i, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
      return 10;
    }
  }
  const int rtr_mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  for (int k = 0; k < 2; ++k) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_2048;
    a.dest_qp_num = q[1 - k]->qp_num;
    a.ah_attr.is_global = 0;  // InfiniBand within a subnet: the LID routes
    a.ah_attr.dlid = 0;
    a.ah_attr.port_num = 1;
    if (t->modify_qp(q[k], &a, rtr_mask) != EINVAL) return 11;  // no LID, no path
    a.ah_attr.dlid = pa.lid;
    if (t->modify_qp(q[k], &a, rtr_mask) != 0) return 12;
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    r.timeout = 14;
    r.retry_cnt = 7;
    r.rnr_retry = 7;
    if (t->modify_qp(q[k], &r,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                         IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
      return 13;
    }
  }
  std::vector<uint8_t> src(4096, 0x5a), dst(4096, 0);
  ibv_mr* ms = t->reg_mr(pd, src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  ibv_mr* md =
      t->reg_mr(pd, dst.data(), dst.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_sge sge{reinterpret_cast<uint64_t>(src.data()), 4096, ms->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst.data());
  wr.wr.rdma.rkey = md->rkey;
  ibv_send_wr* bad = nullptr;
  if (t->post_send(q[0], &wr, &bad) != 0) return 14;
  ibv_wc wc{};
  int64_t end = now_ms() + 10000;
  int got = 0;
  while (got == 0 && now_ms() < end) got = t->poll_cq(cq, 1, &wc);
  if (got != 1 || wc.status != IBV_WC_SUCCESS) return 15;
  return dst == src ? 0 : 16;
});

TEST(EmuLinkLayer, InfiniBandPortRoutesByLid) {
  ::gw::testing::ExecChild child("EmuChild.InfiniBandPort", {"GW_VERBS_EMU_LINK=ib"});
  ASSERT_TRUE(child.started());
  EXPECT_EQ(child.wait(30000), 0) << "see EmuChild.InfiniBandPort for what the code means";
}

TEST(EmuLinkLayer, UnknownLinkLayerIsRefused) {
  ::gw::testing::ExecChild child("EmuChild.InfiniBandPort", {"GW_VERBS_EMU_LINK=omnipath"});
  ASSERT_TRUE(child.started());
  EXPECT_EQ(child.wait(30000), 3) << "the device must not open";
}

TEST_F(EmuTest, PeerProcessGoneEndsInRetryExceeded) {
  // The responder QP lives in a helper process that is killed before the write.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  a_ = make_qp(cq_a_);
  ASSERT_EQ(to_init(a_), 0);
  ::gw::testing::ExecChild child("EmuChild.HoldQp", {"GW_EMU_CHILD_FD=" + std::to_string(fds[1])});
  close(fds[1]);
  uint32_t info[2];
  pollfd p{fds[0], POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 20000), 1) << "the helper process gave no QP within 20 s";
  ASSERT_EQ(read(fds[0], info, sizeof(info)), static_cast<ssize_t>(sizeof(info)));
  close(fds[0]);
  child.kill_now();
  ibv_port_attr pa{};
  ibv_gid gid{};
  t_->query_port(ctx_, 1, &pa);
  t_->query_gid(ctx_, 1, 3, &gid);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = info[0];
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = 3;
  a.ah_attr.dlid = static_cast<uint16_t>(info[1]);
  ASSERT_EQ(t_->modify_qp(a_, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
            0);
  ASSERT_EQ(to_rts(a_, 8, 2), 0);
  ASSERT_EQ(write(a_, nullptr, 0, 0, 0, 0, true), 0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_RETRY_EXC_ERR);
}

TEST_F(EmuTest, InjectedDropsAreRetransmittedThenExhaustRetries) {
  connect(/*timeout=*/8, /*retry=*/3);
  std::vector<uint8_t> src(1000, 9), dst(1000, 0);
  ibv_mr* md = reg(dst.data(), dst.size(), kRw);
  ibv_mr* ms = reg(src.data(), src.size(), IBV_ACCESS_LOCAL_WRITE);
  auto raddr = reinterpret_cast<uint64_t>(dst.data());
  inject_drop(a_, 2);
  ASSERT_EQ(post_recv(b_), 0);
  ASSERT_EQ(write(a_, src.data(), 1000, ms->lkey, raddr, md->rkey, true), 0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(next_wc(cq_b_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(src, dst);
  inject_drop(a_, 10);  // more than 1 + retry_cnt transmissions
  ASSERT_EQ(write(a_, src.data(), 1000, ms->lkey, raddr, md->rkey, false), 0);
  EXPECT_EQ(next_wc(cq_a_).status, IBV_WC_RETRY_EXC_ERR);
}

TEST_F(EmuTest, InjectedDelayHoldsTransmission) {
  connect();
  inject_delay(a_, 60);
  ASSERT_EQ(post_recv(b_), 0);
  int64_t t0 = now_ms();
  ASSERT_EQ(write(a_, nullptr, 0, 0, 0, 0, true), 0);
  EXPECT_EQ(next_wc(cq_b_).status, IBV_WC_SUCCESS);
  EXPECT_GE(now_ms() - t0, 55);
}

TEST_F(EmuTest, ForcedQpErrorFlushesAndRaisesQpFatal) {
  connect();
  ASSERT_EQ(post_recv(b_, 1), 0);
  ASSERT_EQ(post_recv(b_, 2), 0);
  force_qp_error(b_);
  EXPECT_TRUE(async_event(IBV_EVENT_QP_FATAL));
  for (uint64_t id : {1, 2}) {
    ibv_wc wc = next_wc(cq_b_);
    EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
    EXPECT_EQ(wc.wr_id, id);
  }
  EXPECT_EQ(post_recv(b_, 3), 0);
  EXPECT_EQ(next_wc(cq_b_).status, IBV_WC_WR_FLUSH_ERR) << "receives posted in ERR flush";
}

// As libibverbs: destroying a QP waits until the affiliated events handed out for it were acked,
// so a consumer never records an error against an address the next QP may receive.
TEST_F(EmuTest, DestroyQpWaitsForItsEventsToBeAcked) {
  connect();
  force_qp_error(b_);
  ibv_async_event ev{};
  int64_t end = now_ms() + 2000;
  while (t_->get_async_event(ctx_, &ev) != 0 && now_ms() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  ASSERT_EQ(ev.element.qp, b_);
  std::atomic<bool> destroyed{false};
  ibv_qp* victim = b_;
  b_ = nullptr;
  std::erase(qps_, victim);
  std::thread destroyer([&] {
    EXPECT_EQ(t_->destroy_qp(victim), 0);
    destroyed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  EXPECT_FALSE(destroyed.load()) << "destroy_qp returned with an event about its QP not acked";
  t_->ack_async_event(&ev);
  destroyer.join();
  EXPECT_TRUE(destroyed.load());
}

TEST_F(EmuTest, CqOverrunRaisesCqErr) {
  ibv_cq* small = t_->create_cq(ctx_, 2, nullptr, nullptr, 0);
  a_ = make_qp(cq_a_);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = small;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 8;
  b_ = t_->create_qp(pd_, &ia);
  ASSERT_EQ(to_init(a_), 0);
  ASSERT_EQ(to_init(b_), 0);
  ASSERT_EQ(to_rtr(a_, b_->qp_num), 0);
  ASSERT_EQ(to_rtr(b_, a_->qp_num), 0);
  ASSERT_EQ(to_rts(a_), 0);
  ASSERT_EQ(to_rts(b_), 0);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(post_recv(b_), 0);
    ASSERT_EQ(write(a_, nullptr, 0, 0, 0, 0, true), 0);
  }
  EXPECT_TRUE(async_event(IBV_EVENT_CQ_ERR));
  std::vector<ibv_wc> wc(4);
  EXPECT_LT(t_->poll_cq(small, 4, wc.data()), 0);
  t_->destroy_qp(b_);
  t_->destroy_cq(small);
}

TEST_F(EmuTest, DmabufProbeAndRegistrationAreRecorded) {
  set_dmabuf_supported(true);
  EXPECT_EQ(t_->reg_dmabuf_mr(pd_, 0, 0, 0, -1, 0), nullptr);
  EXPECT_EQ(errno, EBADF) << "supported: the probe's fd=-1 is a bad descriptor";
  set_dmabuf_supported(false);
  EXPECT_EQ(t_->reg_dmabuf_mr(pd_, 0, 0, 0, -1, 0), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  set_dmabuf_supported(true);
  int fd = memfd_create("gw-dmabuf-test", 0);
  ASSERT_GE(fd, 0);
  std::vector<uint8_t> host(8192);
  ibv_mr* mr = t_->reg_dmabuf_mr(pd_, 4096, 4096, reinterpret_cast<uint64_t>(host.data()), fd, kRw);
  ASSERT_NE(mr, nullptr);
  mrs_.push_back(mr);
  std::vector<DmabufRecord> rec = dmabuf_records();
  ASSERT_FALSE(rec.empty());
  EXPECT_EQ(rec.back().fd, fd);
  EXPECT_EQ(rec.back().offset, 4096u);
  EXPECT_EQ(rec.back().length, 4096u);
  EXPECT_EQ(rec.back().access, kRw);
  close(fd);
}

}  // namespace
}  // namespace gw::verbs::emu
