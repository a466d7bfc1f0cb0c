// The verbs emulator's failures with a peer process (gone, holding a QP), its InfiniBand link
// layer, injected drops and delays, forced QP errors, CQ overruns, asynchronous events and dma-buf
// registration. Part of the verbs_emu_test binary (the fixture in verbs_emu_fixture.h).
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/exec_child.h"
#include "tests/verbs/verbs_emu_fixture.h"
#include "verbs/emu/emu_verbs.h"
#include "verbs/emu/wire.h"

namespace gw::verbs::emu {
namespace {

using namespace ::gw::verbs::emu::test;

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
  ASSERT_EQ(ftruncate(fd, 8192), 0);
  std::vector<uint8_t> host(8192);
  const auto iova = reinterpret_cast<uint64_t>(host.data());
  // Past the buffer's end, or empty: refused as a driver refuses the attachment.
  EXPECT_EQ(t_->reg_dmabuf_mr(pd_, 4096, 8192, iova, fd, kRw), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(t_->reg_dmabuf_mr(pd_, 0, 0, iova, fd, kRw), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_mr* mr = t_->reg_dmabuf_mr(pd_, 4096, 4096, iova, fd, kRw);
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

// The NIC reaches a dma-buf MR's bytes through the fd, never through the CPU address its iova
// happens to be: a write into it lands in the memfd at the registered offset, a read and a write
// from it take the memfd's bytes, and the memory at the iova's CPU address is never touched.
TEST_F(EmuTest, DmabufMrIsReachedThroughTheFdNotTheIova) {
  set_dmabuf_supported(true);
  connect_for_read();
  const size_t n = 10000;
  int fd = memfd_create("gw-dmabuf-reach", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 6 * 4096), 0);
  auto* buf =
      static_cast<uint8_t*>(mmap(nullptr, 6 * 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(buf, MAP_FAILED);
  const size_t off = 4096 + 100;        // not page aligned: the NIC's mapping starts mid-page
  std::vector<uint8_t> decoy(n, 0xdd);  // the iova's CPU address: must stay as it is
  const auto iova = reinterpret_cast<uint64_t>(decoy.data());
  ibv_mr* dm = t_->reg_dmabuf_mr(pd_, off, n, iova, fd, kRwr);
  ASSERT_NE(dm, nullptr) << strerror(errno);
  close(fd);  // the registration holds the buffer
  std::vector<uint8_t> src(n), back(n, 0);
  for (size_t i = 0; i < n; ++i) src[i] = static_cast<uint8_t>(i * 11 + 3);
  ibv_mr* ms = reg(src.data(), n, kRwr);
  ibv_mr* mb = reg(back.data(), n, kRwr);
  ASSERT_TRUE(ms && mb);
  // a writes into the dma-buf MR (remote side b's registration; same PD, same NIC).
  ASSERT_EQ(write(a_, src.data(), n, ms->lkey, iova, dm->rkey, false), 0);
  ASSERT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(buf + off, src.data(), n), 0) << "the bytes are in the dma-buf";
  EXPECT_TRUE(std::all_of(decoy.begin(), decoy.end(), [](uint8_t b) { return b == 0xdd; }));
  // a reads the dma-buf MR back into host memory.
  ASSERT_EQ(rdma_read(a_, back.data(), n, mb->lkey, iova + 0, dm->rkey), 0);
  ASSERT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(back, src);
  // a writes from the dma-buf MR (a local SGE of it) into host memory.
  buf[off + 7] = 0x42;
  std::fill(back.begin(), back.end(), 0);
  ASSERT_EQ(write(a_, reinterpret_cast<const void*>(iova), n, dm->lkey,
                  reinterpret_cast<uint64_t>(back.data()), mb->rkey, false),
            0);
  ASSERT_EQ(next_wc(cq_a_).status, IBV_WC_SUCCESS);
  EXPECT_EQ(back[7], 0x42);
  EXPECT_EQ(std::memcmp(back.data() + 8, src.data() + 8, n - 8), 0);
  EXPECT_TRUE(std::all_of(decoy.begin(), decoy.end(), [](uint8_t b) { return b == 0xdd; }));
  EXPECT_EQ(t_->dereg_mr(dm), 0);
  munmap(buf, 6 * 4096);
}

// The port's bytes not yet read by the socket of this host's TCP connection from local port
// `from` to local port `to` (/proc/net/tcp's rx_queue of the `to` end); -1 when not found.
long rx_queue(uint16_t to, uint16_t from) {
  FILE* f = std::fopen("/proc/net/tcp", "r");
  if (f == nullptr) return -1;
  char line[512];
  long found = -1;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned local_port = 0, rem_port = 0;
    unsigned long txq = 0, rxq = 0;
    if (std::sscanf(line, " %*d: %*8x:%4x %*8x:%4x %*x %lx:%lx", &local_port, &rem_port, &txq,
                    &rxq) == 4 &&
        local_port == to && rem_port == from) {
      found = static_cast<long>(rxq);
    }
  }
  std::fclose(f);
  return found;
}

// A small RDMA WRITE is buffered by the responder until its last byte, then placed: an MR
// deregistered after the request's header was read must not be written then. The requester here
// is a raw connection speaking the emulated wire, so that the header and all but the last byte are
// read by the NIC (the socket's receive queue empties) before the deregistration: the write gets
// a remote access NAK, the responder's QP goes to error, and the freed region keeps its bytes.
TEST_F(EmuTest, SmallWriteToAnMrDeregisteredMidRequestIsARemoteAccessError) {
  connect();
  std::vector<uint8_t> target(256, 0x5a);
  ibv_mr* mr = t_->reg_mr(pd_, target.data(), target.size(), kRw);
  ASSERT_NE(mr, nullptr);
  ASSERT_EQ(post_recv(b_), 0);
  ibv_port_attr pa{};
  ibv_gid gid{};
  ASSERT_EQ(t_->query_port(ctx_, 1, &pa), 0);
  ASSERT_EQ(t_->query_gid(ctx_, 1, 3, &gid), 0);
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  std::memcpy(&sa.sin_addr, &gid.raw[12], 4);
  sa.sin_port = htons(pa.lid);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)), 0) << strerror(errno);
  sockaddr_in me{};
  socklen_t len = sizeof(me);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len), 0);
  constexpr uint32_t kLen = 64;
  WireRequest h{kMagic, kOpWrite, {},       b_->qp_num,
                0,      0,        mr->rkey, reinterpret_cast<uint64_t>(target.data()),
                kLen};
  std::vector<uint8_t> payload(kLen, 0xee);
  ASSERT_EQ(send(fd, &h, sizeof(h), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(h)));
  ASSERT_EQ(send(fd, payload.data(), kLen - 1, MSG_NOSIGNAL), static_cast<ssize_t>(kLen - 1));
  // The NIC has read the header and buffered the payload's first kLen - 1 bytes.
  long q = -1;
  for (const int64_t end = now_ms() + 5000; now_ms() < end;) {
    q = rx_queue(pa.lid, ntohs(me.sin_port));
    if (q == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(q, 0) << "the responder did not read the request";
  ASSERT_EQ(t_->dereg_mr(mr), 0);
  ASSERT_EQ(send(fd, payload.data() + kLen - 1, 1, MSG_NOSIGNAL), 1);
  WireResponse r{};
  size_t got = 0;
  for (const int64_t end = now_ms() + 5000; got < sizeof(r) && now_ms() < end;) {
    pollfd p{fd, POLLIN, 100};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, reinterpret_cast<char*>(&r) + got, sizeof(r) - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fd);
  ASSERT_EQ(got, sizeof(r)) << "no response";
  EXPECT_EQ(r.magic, kMagic);
  EXPECT_EQ(r.type, kNakAccess) << "a write to a deregistered MR is a remote access error";
  EXPECT_EQ(r.psn, 0u);
  EXPECT_TRUE(std::all_of(target.begin(), target.end(), [](uint8_t b) { return b == 0x5a; }))
      << "the deregistered region was written";
  // The responder's QP is in error: its posted receive is flushed.
  EXPECT_EQ(next_wc(cq_b_).status, IBV_WC_WR_FLUSH_ERR);
}

}  // namespace
}  // namespace gw::verbs::emu
