// What the verbs_emu_test binary's files share: EmuTest, two RC QPs of this process's emulated
// NIC driven through the raw verbs table, with the helpers that post and poll. Defined inline in
// a named namespace, so the fixture is one type in every file (gtest requires it).
#pragma once

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

namespace gw::verbs::emu::test {

inline int64_t now_ms() {
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

}  // namespace gw::verbs::emu::test
