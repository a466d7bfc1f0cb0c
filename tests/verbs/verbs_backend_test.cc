// The verbs backend's own behaviour beyond the conformance suite: device and GID selection on
// fixtures, the "unavailable" reason, and verbs failures (work-completion errors, fatal async
// events) turning into kPeer errors that name the peer, on the emulator.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "core/config_snapshot.h"
#include "core/net/auto_backend.h"
#include "core/net/backend_registry.h"
#include "core/net/transport.h"
#include "gpudirect/cuda_driver.h"
#include "tests/support/test_env.h"
#include "tests/verbs/verbs_test_util.h"
#include "verbs/device_select.h"
#include "verbs/emu/emu_verbs.h"
#include "verbs/ibv_table.h"
#include "verbs/verbs_config.h"
#include "verbs/verbs_transport.h"

namespace gw::verbs {
namespace {

using ::gw::testing::now_ms;
using ::gw::testing::ScopedEnv;

TEST(HcaSpec, NcclSyntax) {
  auto all = HcaSpec::parse("");
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->selects("mlx5_0", 1));
  auto some = HcaSpec::parse("mlx5_0:1,mlx5_1");
  ASSERT_TRUE(some.ok());
  EXPECT_TRUE(some->selects("mlx5_0", 1));
  EXPECT_FALSE(some->selects("mlx5_0", 2));
  EXPECT_TRUE(some->selects("mlx5_1", 2));
  EXPECT_TRUE(some->selects("mlx5_10", 1)) << "prefix match without '='";
  EXPECT_FALSE(some->selects("bnxt_re0", 1));
  auto exact = HcaSpec::parse("=mlx5_1");
  ASSERT_TRUE(exact.ok());
  EXPECT_FALSE(exact->selects("mlx5_10", 1));
  auto excl = HcaSpec::parse("^=mlx5_1:1");
  ASSERT_TRUE(excl.ok());
  EXPECT_FALSE(excl->selects("mlx5_1", 1));
  EXPECT_TRUE(excl->selects("mlx5_1", 2));
  EXPECT_TRUE(excl->selects("mlx5_10", 1));
  EXPECT_EQ(HcaSpec::parse("mlx5_0:x").status().code(), Code::kInvalidArg);
  EXPECT_EQ(HcaSpec::parse(":1").status().code(), Code::kInvalidArg);
}

GidInfo gid(int index, std::vector<uint8_t> head, std::string type, int type_err = 0) {
  GidInfo g;
  g.index = index;
  if (!head.empty()) std::memcpy(g.gid.raw, head.data(), std::min<size_t>(16, head.size()));
  g.type = std::move(type);
  g.type_err = type_err;
  return g;
}

TEST(GidChoice, RoceV2Ipv4SkippingUnsetLinkLocalAndUnreadable) {
  std::vector<uint8_t> ll = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  std::vector<uint8_t> v4 = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
  std::vector<uint8_t> v6 = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  std::vector<GidInfo> table = {gid(0, ll, "IB/RoCE v1"), gid(1, ll, "RoCE v2"),
                                gid(2, {}, "RoCE v2"),    gid(3, v4, "", EINVAL),
                                gid(4, v4, "IB/RoCE v1"), gid(5, v4, "RoCE v2"),
                                gid(6, v6, "RoCE v2")};
  std::string why;
  auto r = choose_gid_index(true, -1, AF_INET, table, &why);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(*r, 5);
  r = choose_gid_index(true, -1, AF_INET6, table, &why);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 6);
  r = choose_gid_index(true, 4, AF_INET, table, &why);
  EXPECT_EQ(*r, 4) << "GW_IB_GID_INDEX wins";
  table.resize(5);  // no v2 of the family: the v1 one
  r = choose_gid_index(true, -1, AF_INET, table, &why);
  EXPECT_EQ(*r, 4);
  table.resize(4);  // only the unreadable one is left
  EXPECT_EQ(choose_gid_index(true, -1, AF_INET, table, &why).status().code(), Code::kInvalidArg);
  EXPECT_EQ(*choose_gid_index(false, -1, AF_INET, table, &why), 0) << "InfiniBand: GID 0";
}

TEST(GidChoice, SysfsTypeReaderOnAFixtureTree) {
  std::string root = ::testing::TempDir() + "gw_sysfs_fixture";
  std::string dir = root + "/class/infiniband/mlx5_0/ports/1/gid_attrs/types";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/3") << "RoCE v2\n";
  std::string type;
  EXPECT_EQ(read_sysfs_gid_type(root, "mlx5_0", 1, 3, &type), 0);
  EXPECT_EQ(type, "RoCE v2");
  EXPECT_EQ(read_sysfs_gid_type(root, "mlx5_0", 1, 4, &type), ENOENT);
}

TEST(VerbsBackend, UnavailableSaysWhy) {
  ScopedEnv real("GW_VERBS_EMULATE", "0");
  net::TransportOptions o;
  o.job_token = "t";
  auto t = make_verbs_transport(o);
  if (t.ok()) GTEST_SKIP() << "this host has a usable RDMA device";
  EXPECT_EQ(t.status().code(), Code::kUnsupported);
  EXPECT_NE(t.status().message().find("verbs unavailable: "), std::string::npos)
      << t.status().to_string();
}

TEST(VerbsBackend, ProbeSaysWhyWithoutOpeningAnything) {
  ScopedEnv real("GW_VERBS_EMULATE", "0");
  Status s = net::backend_status("verbs");
  if (s.ok()) GTEST_SKIP() << "this host has libibverbs and an RDMA device";
  EXPECT_EQ(s.code(), Code::kUnsupported);
  const bool known_reason = s.message().rfind("libibverbs.so.1 not found", 0) == 0 ||
                            s.message().rfind("libibverbs.so.1 lacks", 0) == 0 ||
                            s.message().rfind("no RDMA devices", 0) == 0;
  EXPECT_TRUE(known_reason) << s.message();
  // auto passes over it across hosts, saying why.
  auto c = net::choose_auto_backend(false);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  EXPECT_EQ(c->name, "tcp");
  EXPECT_NE(c->reason.find("verbs unavailable: " + s.message()), std::string::npos) << c->reason;
}

TEST(VerbsBackend, AutoPicksTheEmulatorAcrossHostsButNeverWithinAHost) {
  ScopedEnv emulate("GW_VERBS_EMULATE", "1");
  EXPECT_TRUE(net::backend_status("verbs").ok());
  auto across = net::choose_auto_backend(false);
  ASSERT_TRUE(across.ok()) << across.status().to_string();
  EXPECT_EQ(across->name, "verbs");
  auto within = net::choose_auto_backend(true);
  ASSERT_TRUE(within.ok()) << within.status().to_string();
  EXPECT_EQ(within->name, "shm");
  // A verbs factory that failed is left out: tcp then.
  EXPECT_EQ(net::choose_auto_backend(false, {"verbs"})->name, "tcp");
}

// The NIC-only dma-buf probe (gradwired's: no CUDA driver in the process): yes where the
// emulated device takes dma-bufs (its ibv_reg_dmabuf_mr of fd -1 answers EBADF, as a kernel that
// looks the descriptor up does), no with the reason where it does not (EOPNOTSUPP, rdma-core's
// answer for a provider without the verb). The emulator answers a closed descriptor truthfully
// too (EBADF, never a registration).
TEST(VerbsBackend, TheNicDmabufProbeNeedsNoCudaDriver) {
  ScopedEnv emulate("GW_VERBS_EMULATE", "1");
  net::TransportOptions o;
  o.job_token = "t";
  auto t = make_verbs_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  ASSERT_EQ(cuda::resident_driver(), nullptr) << "this test binary must not load a CUDA driver";
  EXPECT_FALSE((*t)->device_memory().reg) << "no CUDA driver: no GPUDirect for this process";
  emu::set_dmabuf_supported(true);
  net::Transport::NicDmabuf yes = (*t)->nic_dmabuf();
  EXPECT_TRUE(yes.ok) << yes.why;
  EXPECT_NE(yes.why.find("takes dma-bufs"), std::string::npos) << yes.why;
  EXPECT_NE(yes.why.find("EBADF"), std::string::npos) << yes.why;
  // A descriptor number that was open and is closed: EBADF, not a registration.
  const IbvTable* ibv = emu::emu_table();
  ibv_device** list = nullptr;
  int n = 0;
  list = ibv->get_device_list(&n);
  ASSERT_GT(n, 0);
  ibv_context* ctx = ibv->open_device(list[0]);
  ibv->free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv->alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  int fds[2] = {-1, -1};
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  ::close(fds[1]);
  errno = 0;
  EXPECT_EQ(ibv->reg_dmabuf_mr(pd, 0, 4096, 0x10000, fds[0], IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EBADF);
  emu::set_dmabuf_supported(false);
  net::Transport::NicDmabuf no = (*t)->nic_dmabuf();
  errno = 0;
  EXPECT_EQ(ibv->reg_dmabuf_mr(pd, 0, 0, 0, -1, 0), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  emu::set_dmabuf_supported(true);
  EXPECT_FALSE(no.ok);
  EXPECT_NE(no.why.find("does not take dma-bufs"), std::string::npos) << no.why;
  EXPECT_NE(no.why.find(std::strerror(EOPNOTSUPP)), std::string::npos) << no.why;
  ibv->dealloc_pd(pd);
  ibv->close_device(ctx);
  // Only verbs registers dma-bufs with a NIC: tcp says so.
  auto tcp = net::make_transport("tcp", o);
  ASSERT_TRUE(tcp.ok()) << tcp.status().to_string();
  EXPECT_FALSE((*tcp)->nic_dmabuf().ok);
}

TEST(VerbsBackend, ReadsItsRowsFromTheOptionsSnapshot) {
  ScopedEnv real("GW_VERBS_EMULATE", "0");
  config::Snapshot base = config::Snapshot::capture();
  auto emulated = base.with(verbs_config::kVerbsEmulate, "1");
  ASSERT_TRUE(emulated.ok()) << emulated.status().to_string();
  net::TransportOptions o;
  o.job_token = "t";
  o.config = *emulated;
  auto t = make_verbs_transport(o);
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ((*t)->properties().name, "verbs");
  auto bad = emulated->with(verbs_config::kIbQpsPerConn, "17");
  ASSERT_TRUE(bad.ok());
  o.config = *bad;
  auto rejected = make_verbs_transport(o);
  ASSERT_EQ(rejected.status().code(), Code::kInvalidArg);
  EXPECT_NE(rejected.status().message().find("GW_IB_QPS_PER_CONN=17"), std::string::npos)
      << rejected.status().to_string();
}

using test::connect_pair;
using test::finish;
using test::Pair;

class VerbsEmuBackend : public ::testing::Test {
 protected:
  ScopedEnv emulate_{"GW_VERBS_EMULATE", "1"};
  ScopedEnv timeout_{"GW_IB_TIMEOUT", "8"};  // about 1 ms per try
  ScopedEnv retry_{"GW_IB_RETRY_CNT", "2"};
  std::unique_ptr<net::Transport> make() {
    net::TransportOptions o;
    o.job_token = "t";
    o.rank = 5;
    auto t = make_verbs_transport(o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }
};

TEST_F(VerbsEmuBackend, WorkCompletionErrorIsPeerNamingThePeer) {
  auto t = make();
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> src(4096, 1), dst(4096);
  // Every transmission from now on vanishes. Dropping before the receive is posted (not after)
  // leaves the emulated NIC no chance to send the CTS first on a loaded machine: the CTS write
  // is then the first one dropped, so the receiver's QP exhausts its retries.
  emu::inject_drop_all(1000);
  auto r = p.recv->irecv(dst.data(), dst.size(), 0, nullptr);
  ASSERT_TRUE(r.ok());
  auto s = p.send->isend(src.data(), src.size(), 0, nullptr);
  ASSERT_TRUE(s.ok());
  Status rs = finish(p.recv.get(), *r);
  EXPECT_EQ(rs.code(), Code::kPeer) << rs.to_string();
  EXPECT_NE(rs.message().find("IBV_WC_RETRY_EXC_ERR"), std::string::npos) << rs.to_string();
  EXPECT_NE(rs.message().find("rank 5"), std::string::npos) << rs.to_string();
}

TEST_F(VerbsEmuBackend, FatalAsyncEventFailsTheNextCall) {
  auto t = make();
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> buf(64);
  auto r = p.recv->irecv(buf.data(), buf.size(), 0, nullptr);
  ASSERT_TRUE(r.ok());
  emu::force_error_all();
  Status rs = finish(p.recv.get(), *r);
  EXPECT_EQ(rs.code(), Code::kPeer) << rs.to_string();
  EXPECT_NE(rs.message().find("rank 5"), std::string::npos) << rs.to_string();
}

TEST_F(VerbsEmuBackend, ASendTheReceiverTookSucceedsThoughTheReceiverClosedBeforeItsAck) {
  // The end of a collective: the receiver has its data and closes at once, while the ACK that
  // completes the send here is still on its way (held back for 300 ms).
  auto t = make();
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> src(4096, 3), dst(4096);
  auto r = p.recv->irecv(dst.data(), dst.size(), 0, nullptr);
  ASSERT_TRUE(r.ok());
  emu::inject_ack_delay_all(300);
  auto s = p.send->isend(src.data(), src.size(), 0, nullptr);
  ASSERT_TRUE(s.ok());
  // Drives both sides until the receive is done (the sender issues its write once the CTS lands).
  bool send_done = false, recv_done = false;
  for (int64_t end = now_ms() + 10000; !recv_done && now_ms() < end;) {
    if (!send_done) {
      ASSERT_TRUE(p.send->test(*s, &send_done, nullptr).ok());
    }
    ASSERT_TRUE(p.recv->test(*r, &recv_done, nullptr).ok());
  }
  ASSERT_TRUE(recv_done);
  ASSERT_FALSE(send_done) << "the ACK is held back";
  EXPECT_EQ(dst, src);
  p.recv.reset();  // closes the set-up socket and destroys the receiver's QPs
  // The close is visible to the sender now (it checks the socket every millisecond).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const int64_t start = now_ms();
  Status ss = finish(p.send.get(), *s);
  EXPECT_TRUE(ss.ok()) << ss.to_string();
  EXPECT_LT(now_ms() - start, 5000);
  // What is sent after the close fails, naming the close.
  auto late = p.send->isend(src.data(), 64, 0, nullptr);
  Status ls = late.ok() ? finish(p.send.get(), *late) : late.status();
  EXPECT_EQ(ls.code(), Code::kPeer) << ls.to_string();
  EXPECT_NE(ls.message().find("closed the connection"), std::string::npos) << ls.to_string();
}

TEST_F(VerbsEmuBackend, RegisteredBuffersShareTheCacheAndStillMoveBytes) {
  auto t = make();
  Pair p = connect_pair(*t);
  ASSERT_TRUE(p.send && p.recv);
  std::vector<uint8_t> src(1 << 20, 7), dst(1 << 20);
  auto ms = p.send->reg_mr(src.data(), src.size(), net::MemType::kHost);
  auto md = p.recv->reg_mr(dst.data(), dst.size(), net::MemType::kHost);
  ASSERT_TRUE(ms.ok() && md.ok());
  emu::Counters before = emu::counters();
  for (int i = 0; i < 10; ++i) {
    auto r = p.recv->irecv(dst.data() + 4096, 65536, 1, *md);
    auto s = p.send->isend(src.data() + 100, 65536, 1, *ms);
    ASSERT_TRUE(r.ok() && s.ok());
    ASSERT_TRUE(finish(p.send.get(), *s).ok());
    ASSERT_TRUE(finish(p.recv.get(), *r).ok());
  }
  emu::Counters after = emu::counters();
  // One QP: per message one data WRITE_WITH_IMM and one CTS write posted, one receive reposted.
  EXPECT_EQ(after.send_wrs - before.send_wrs, 20u);
  EXPECT_EQ(after.recv_wrs - before.recv_wrs, 10u);
  EXPECT_EQ(after.inline_wrs - before.inline_wrs, 10u) << "CTS records go inline";
  EXPECT_TRUE(p.send->dereg_mr(*ms).ok());
  EXPECT_TRUE(p.recv->dereg_mr(*md).ok());
}

}  // namespace
}  // namespace gw::verbs
