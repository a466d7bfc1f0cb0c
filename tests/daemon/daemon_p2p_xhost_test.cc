// Point-to-point between trainers of different hosts in daemon mode (issue 29;
// daemon/job_p2p_remote.h): the board's side alone (a fake link: forwarding, messages of another
// host matched in order, a receive that takes one before its payload landed, a host gone); then two
// gradwired of the test's own with two host identities, trainers as
// child processes (this binary again, as DaemonP2pXhostChild.Run), rank r on host r % 2.
// - every pair of 2 daemons x 2 trainers (self and same-host pairs too) from 0 B to 4 MiB with
//   content checks, each size posted around an allreduce that crosses the daemons;
// - order per (sender, tag) across hosts (eager and rendezvous mixed, sent before the receives),
//   any-source taking messages of both hosts, truncation with the receive posted first (a send
//   over 16 KiB fails too) and after the message landed (the send completed), both sizes named;
// - a remote trainer killed with a receive from it posted: GW_ERR_PEER within the deadline, and
//   a later send to it too;
// - one daemon stopped (SIGTERM) with receives pending across hosts: both end with GW_ERR_PEER
//   long before the deadline;
// - the unexpected cap (GW_DAEMON_P2P_UNEXPECTED_MAX): the job's cross-host point-to-point fails
//   naming it, the collectives go on;
// - the figure: 8 B latency and 4 MiB bandwidth, 2 trainers on 2 daemons, against direct mode
//   tcp in the same run, beside the machine's memcpy.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "daemon/job_p2p.h"
#include "gradwire/gradwire.h"
#include "tests/support/capi_world.h"
#include "tests/support/local_daemon.h"
#include "tests/support/test_env.h"
#include "tests/support/two_hosts.h"

namespace {

using gw::testing::last_error;
using Clock = std::chrono::steady_clock;

const std::array<std::string, 2> kHosts = {"dpx-host-a", "dpx-host-b"};

uint8_t pattern(int src, int dst, int tag, size_t i) {
  return static_cast<uint8_t>(src * 31 + dst * 17 + tag * 7 + i * 13 + (i >> 8));
}

// ---- the board's side alone ---------------------------------------------------------------------

struct FakeLink : gw::daemon::P2pRemoteLink {
  void touch() override { ++touched; }
  void forward(size_t member, const gw::daemon::Request& r,
               const gw::daemon::P2pDevice& dev) override {
    forwarded.push_back({member, r.seq});
    forwarded_dev.push_back(dev.mr);
  }
  void claim_device(std::shared_ptr<gw::daemon::P2pRemoteMsg> msg) override {
    claimed.push_back(msg);
  }
  void refuse_device(const gw::daemon::P2pRemoteMsg& msg, const gw::Status&) override {
    refused.push_back(msg.payload_tag);
  }
  std::vector<int32_t> refused;  // the held device messages refused, by payload tag
  std::vector<gw::net::MemRegion*> forwarded_dev;
  std::vector<std::shared_ptr<gw::daemon::P2pRemoteMsg>> claimed;
  gw::Status reachable(int32_t rank) const override {
    return rank == down ? gw::peer_error("host of rank {} gone", rank) : gw::ok_status();
  }
  std::vector<std::pair<size_t, uint64_t>> forwarded;
  int32_t down = -1;
  int touched = 0;
};

// Device buffers on the board (version 8): a device send goes to the link with its region; a
// device message of another host waits as unexpected without bytes and, once a receive takes it
// (in per-tag order with the host messages around it), goes back to the link to be fetched into
// that receive's buffer; a host message taken by a device receive fails it (kUnsupported) and is
// consumed; a device buffer with a peer of this host or any source is refused.
TEST(P2pBoardLink, DeviceMessagesWaitForTheirReceiveInTagOrder) {
  std::vector<std::vector<uint8_t>> regions(2, std::vector<uint8_t>(4096, 0));
  std::vector<std::pair<uint64_t, gw::Code>> done;
  gw::daemon::P2pBoard b(
      {0, 2}, {regions[0].data(), regions[1].data()}, {0, 1, 0, 1}, 0,
      [&](size_t, uint64_t seq, const gw::Status& s, const gw::daemon::P2pDone*) {
        done.push_back({seq, s.code()});
      });
  FakeLink link;
  b.set_link(&link);
  auto req = [](gw::daemon::Opcode op, uint64_t seq, int32_t peer, int32_t tag, uint64_t n) {
    gw::daemon::Request r;
    r.opcode = op;
    r.seq = seq;
    r.root = peer;
    r.tag = tag;
    (op == gw::daemon::Opcode::kSend ? r.send_bytes : r.recv_bytes) = n;
    return r;
  };
  auto* region = reinterpret_cast<gw::net::MemRegion*>(uintptr_t{0x1000});
  gw::daemon::P2pDevice dev{region, reinterpret_cast<uint8_t*>(uintptr_t{0x2000}), nullptr};
  b.submit(0, req(gw::daemon::Opcode::kSend, 1, 1, 5, 64), dev);
  ASSERT_EQ(link.forwarded_dev.size(), 1u);
  EXPECT_EQ(link.forwarded_dev[0], region);
  // Refused: a device send to a rank of this host, a device receive from any source.
  b.submit(0, req(gw::daemon::Opcode::kSend, 2, 2, 5, 64), dev);
  b.submit(0, req(gw::daemon::Opcode::kRecv, 3, -1, 5, 64), dev);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_EQ(done[0].second, gw::Code::kUnsupported);
  EXPECT_EQ(done[1].second, gw::Code::kUnsupported);
  done.clear();
  // On tag 7 from rank 1: a device message, a host one (landed), a device one.
  auto used = std::make_shared<uint64_t>(0);
  auto d1 = std::make_shared<gw::daemon::P2pRemoteMsg>(0, used);
  auto h2 = std::make_shared<gw::daemon::P2pRemoteMsg>(8, used);
  auto d3 = std::make_shared<gw::daemon::P2pRemoteMsg>(0, used);
  for (auto* m : {d1.get(), h2.get(), d3.get()}) {
    m->src = 1;
    m->tag = 7;
  }
  d1->device = d3->device = true;
  d1->size = 1 << 20;
  d3->size = 10;
  b.add_remote(0, 1, 7, d1);
  b.add_remote(0, 1, 7, h2);
  b.add_remote(0, 1, 7, d3);
  b.landed(*h2);
  EXPECT_EQ(*used, 8u) << "a device message holds no bytes here";
  // The first receive (a device one) takes d1: the link fetches it into that receive.
  b.submit(0, req(gw::daemon::Opcode::kRecv, 4, 1, 7, 2 << 20), dev);
  ASSERT_EQ(link.claimed.size(), 1u);
  EXPECT_EQ(link.claimed[0], d1);
  EXPECT_EQ(d1->seq, 4u);
  EXPECT_EQ(d1->cap, 2u << 20);
  EXPECT_EQ(d1->dev.mr, region);
  EXPECT_TRUE(done.empty());
  // The next device receive takes the host message: refused, consumed.
  b.submit(0, req(gw::daemon::Opcode::kRecv, 5, 1, 7, 64), dev);
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0], std::make_pair(uint64_t{5}, gw::Code::kUnsupported));
  // A host receive takes the last device message (fetched into the arena: dev.mr null).
  b.submit(0, req(gw::daemon::Opcode::kRecv, 6, 1, 7, 64));
  ASSERT_EQ(link.claimed.size(), 2u);
  EXPECT_EQ(link.claimed[1], d3);
  EXPECT_EQ(d3->dev.mr, nullptr);
  EXPECT_EQ(b.pending(), 0u);
}

TEST(P2pBoardLink, MessagesOfAnotherHostMatchInOrder) {
  // Ranks 0 and 2 here (host 0), 1 and 3 on host 1.
  std::vector<std::vector<uint8_t>> regions(2, std::vector<uint8_t>(4096, 0));
  struct Done {
    size_t member;
    uint64_t seq;
    gw::Code code;
    uint64_t bytes;
    int32_t source;
  };
  std::vector<Done> done;
  gw::daemon::P2pBoard b(
      {0, 2}, {regions[0].data(), regions[1].data()}, {0, 1, 0, 1}, 0,
      [&](size_t m, uint64_t seq, const gw::Status& s, const gw::daemon::P2pDone* d) {
        done.push_back({m, seq, s.code(), d ? d->bytes : 0, d ? d->source : -9});
      });
  FakeLink link;
  b.set_link(&link);
  auto req = [](gw::daemon::Opcode op, uint64_t seq, int32_t peer, int32_t tag, uint64_t off,
                uint64_t n) {
    gw::daemon::Request r;
    r.opcode = op;
    r.seq = seq;
    r.root = peer;
    r.tag = tag;
    (op == gw::daemon::Opcode::kSend ? r.send_off : r.recv_off) = off;
    (op == gw::daemon::Opcode::kSend ? r.send_bytes : r.recv_bytes) = n;
    return r;
  };
  // A send to rank 1 is forwarded, not refused.
  b.submit(0, req(gw::daemon::Opcode::kSend, 1, 1, 5, 0, 8));
  ASSERT_EQ(link.forwarded.size(), 1u);
  EXPECT_TRUE(done.empty());
  // Two messages of rank 1 with tag 7 arrive before any receive: unexpected, in order; the second
  // lands first, the first is claimed before it lands.
  auto used = std::make_shared<uint64_t>(0);
  auto m1 = std::make_shared<gw::daemon::P2pRemoteMsg>(4, used);
  auto m2 = std::make_shared<gw::daemon::P2pRemoteMsg>(6, used);
  m1->src = m2->src = 1;
  m1->tag = m2->tag = 7;
  gw::daemon::P2pBoard::Recv none;
  EXPECT_FALSE(b.take_posted(0, 1, 7, &none));
  b.add_remote(0, 1, 7, m1);
  b.add_remote(0, 1, 7, m2);
  EXPECT_EQ(*used, 10u);
  std::fill(m2->bytes.begin(), m2->bytes.end(), 22);
  b.landed(*m2);
  EXPECT_EQ(link.touched, 0);  // the board forwards sends: the link says its hellos itself
  b.submit(0, req(gw::daemon::Opcode::kRecv, 2, 1, 7, 100, 16));  // takes m1: not landed yet
  EXPECT_TRUE(done.empty());
  EXPECT_EQ(link.touched, 1);  // a receive naming another host's rank
  b.submit(0, req(gw::daemon::Opcode::kRecv, 3, -1, 7, 200, 4));  // takes m2 (6 > 4): truncated
  EXPECT_EQ(link.touched, 2);  // any source may be another host's
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].seq, 3u);
  EXPECT_EQ(done[0].code, gw::Code::kInvalidArg);
  std::fill(m1->bytes.begin(), m1->bytes.end(), 11);
  b.landed(*m1);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_TRUE(done[1].seq == 2 && done[1].code == gw::Code::kOk && done[1].bytes == 4 &&
              done[1].source == 1);
  EXPECT_EQ(regions[0][100], 11);
  EXPECT_EQ(regions[0][103], 11);
  // A receive posted first is what an arriving header takes (any source, in posting order).
  b.submit(1, req(gw::daemon::Opcode::kRecv, 1, -1, 9, 0, 8));
  b.submit(1, req(gw::daemon::Opcode::kRecv, 2, 3, 9, 8, 8));
  gw::daemon::P2pBoard::Recv got;
  ASSERT_TRUE(b.take_posted(1, 3, 9, &got));
  EXPECT_EQ(got.seq, 1u);
  // A host gone: the receive naming its rank ends, and a later one at once.
  link.down = 3;
  b.fail_receives_from([](int32_t r) { return r == 3; }, gw::peer_error("host 1 gone"));
  ASSERT_EQ(done.size(), 3u);
  EXPECT_TRUE(done[2].member == 1 && done[2].seq == 2 && done[2].code == gw::Code::kPeer);
  b.submit(1, req(gw::daemon::Opcode::kRecv, 3, 3, 9, 0, 8));
  ASSERT_EQ(done.size(), 4u);
  EXPECT_EQ(done[3].code, gw::Code::kPeer);
  EXPECT_EQ(b.pending(), 0u);
  m1.reset();
  m2.reset();
  EXPECT_EQ(*used, 0u);  // the board let go of the unexpected bytes
}

// Starts `world` trainers as children in case `what`, rank r on host r % 2 through its daemon
// of d (nullptr: direct mode over tcp); `env` ("NAME=value") added.
std::vector<pid_t> start(const std::string& what, int world, const gw::testing::TwoHosts* d,
                         int timeout_ms = 30000, std::vector<std::string> env = {}) {
  env.push_back("GW_DAEMON_ARENA=64M");
  env.push_back("GW_DPX_CASE=" + what);
  env.push_back("GW_DPX_TIMEOUT=" + std::to_string(timeout_ms));
  return gw::testing::start_trainers("DaemonP2pXhostChild.Run", world, kHosts, env, d);
}

// Each child's wait status (-1: killed after 150 s).
std::vector<int> reap(const std::string& what, const std::vector<pid_t>& kids) {
  std::vector<int> statuses(kids.size(), -1);
  const auto until = Clock::now() + std::chrono::seconds(150);
  for (size_t r = 0; r < kids.size(); ++r) {
    while (::waitpid(kids[r], &statuses[r], WNOHANG) == 0) {
      if (Clock::now() > until) {
        ADD_FAILURE() << what << ": trainer " << r << " still running after 150 s";
        for (pid_t k : kids) ::kill(k, SIGKILL);
        ::waitpid(kids[r], &statuses[r], 0);
        statuses[r] = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  return statuses;
}

std::vector<int> spawn(const std::string& what, int world, const gw::testing::TwoHosts* d,
                       int timeout_ms = 30000, std::vector<std::string> env = {}) {
  return reap(what, start(what, world, d, timeout_ms, std::move(env)));
}

bool exited_ok(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// Two daemons with two host identities; `env` ("NAME=value") is daemon b's (both: a's too).
struct TwoDaemons {
  explicit TwoDaemons(std::vector<std::string> env = {}, bool both = false)
      : hosts(GW_GRADWIRED_PATH, "gw-dpx", kHosts, env, both) {}
  bool ready() const { return hosts.ready(); }
  gw::testing::CleanEnv clean;
  gw::testing::TwoHosts hosts;
};

TEST(DaemonP2pXhost, EveryPairZeroBytesToFourMiBBesideAllreduce) {
  TwoDaemons d;
  ASSERT_TRUE(d.ready());
  for (int s : spawn("pairs", 4, &d.hosts)) EXPECT_TRUE(exited_ok(s)) << s;
}

TEST(DaemonP2pXhost, OrderAnySourceTruncationAcrossHosts) {
  TwoDaemons d;
  ASSERT_TRUE(d.ready());
  for (int s : spawn("rules", 4, &d.hosts)) EXPECT_TRUE(exited_ok(s)) << s;
}

TEST(DaemonP2pXhost, KilledRemoteTrainerEndsPendingReceiveWithPeer) {
  TwoDaemons d;
  ASSERT_TRUE(d.ready());
  const auto st = spawn("killed", 2, &d.hosts, 8000);
  ASSERT_EQ(st.size(), 2u);
  EXPECT_TRUE(exited_ok(st[0])) << st[0];
  EXPECT_TRUE(st[1] != -1 && WIFSIGNALED(st[1]) && WTERMSIG(st[1]) == SIGKILL) << st[1];
}

// Daemon a stopped (SIGTERM) while its trainer waits on a receive from the other host, and the
// other host's trainer on one from it: both end with GW_ERR_PEER at once, not at the deadline.
TEST(DaemonP2pXhost, StopCompletesPendingReceivesOnBothHosts) {
  TwoDaemons d;
  ASSERT_TRUE(d.ready());
  const std::string flag = "/tmp/gw-dpx-stop-" + std::to_string(::getpid());
  ::unlink(flag.c_str());
  const auto kids = start("stop", 2, &d.hosts, 30000, {"GW_DPX_FLAG=" + flag});
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (::access(flag.c_str(), F_OK) != 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both receives reach the daemons
  d.hosts.stop(0);                                              // SIGTERM, and waits for it to exit
  for (int s : reap("stop", kids)) EXPECT_TRUE(exited_ok(s)) << s;
  ::unlink(flag.c_str());
}

TEST(DaemonP2pXhost, UnexpectedCapFailsTheJobsPointToPointNamingIt) {
  TwoDaemons d({"GW_DAEMON_P2P_UNEXPECTED_MAX=1M"});
  ASSERT_TRUE(d.ready());
  for (int s : spawn("cap", 2, &d.hosts)) EXPECT_TRUE(exited_ok(s)) << s;
}

TEST(DaemonP2pXhost, FigureLatencyAndBandwidthAgainstDirectMode) {
  // The machine's ceiling in the same run: memcpy of 4 MiB (median of 5).
  std::vector<uint8_t> x(4 << 20, 1), y(4 << 20);
  double gbs[5];
  for (double& g : gbs) {
    const auto t0 = Clock::now();
    for (int i = 0; i < 20; ++i) std::memcpy(y.data(), x.data(), x.size());
    g = 20.0 * x.size() / std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  }
  std::sort(gbs, gbs + 5);
  std::printf("FIGURE xhost memcpy 4 MiB %.2f GB/s; load: %s\n", gbs[2], [] {
    double l[3] = {0, 0, 0};
    static char buf[64];
    if (::getloadavg(l, 3) > 0) std::snprintf(buf, sizeof(buf), "%.2f %.2f %.2f", l[0], l[1], l[2]);
    return static_cast<const char*>(buf);
  }());
  {
    TwoDaemons d;
    ASSERT_TRUE(d.ready());
    for (int s : spawn("figure", 2, &d.hosts)) EXPECT_TRUE(exited_ok(s)) << s;
  }
  {
    // The job threads never spin (GW_DAEMON_POLL_US=0): every message waits on a wake-up, which
    // shows a daemon-side look that is periodic rather than woken (a 1 ms one: ~500 us here).
    TwoDaemons d({"GW_DAEMON_POLL_US=0"}, /*both=*/true);
    ASSERT_TRUE(d.ready());
    for (int s : spawn("figure", 2, &d.hosts, 30000, {"GW_DPX_LABEL=no spin"})) {
      EXPECT_TRUE(exited_ok(s)) << s;
    }
  }
  gw::testing::CleanEnv env;
  for (int s : spawn("figure", 2, nullptr)) EXPECT_TRUE(exited_ok(s)) << s;
}

// ---- the trainers -----------------------------------------------------------------------------

#define CHECK_OK(call) ASSERT_EQ((call), GW_OK) << #call << ": " << last_error()

void pairs(gw_comm_t c, int rank, int world) {
  int tag = 40;
  for (size_t bytes :
       // 4096 / 4097: the largest payload sent inline behind its header, and the smallest not.
       {size_t{0}, size_t{8}, size_t{4096}, size_t{4097}, size_t{16384}, size_t{16385},
        size_t{1} << 20, size_t{4} << 20}) {
    std::vector<std::vector<uint8_t>> out(world), in(world);
    std::vector<gw_request_t> reqs;
    auto sends = [&] {
      for (int p = 0; p < world; ++p) {
        out[p].resize(bytes);
        for (size_t i = 0; i < bytes; ++i) out[p][i] = pattern(rank, p, tag, i);
        gw_request_t q = nullptr;
        CHECK_OK(gw_isend(c, out[p].data(), bytes, GW_UINT8, p, tag, &q));
        reqs.push_back(q);
      }
    };
    auto recvs = [&] {
      for (int p = 0; p < world; ++p) {
        in[p].assign(bytes, 0);
        gw_request_t q = nullptr;
        CHECK_OK(gw_irecv(c, in[p].data(), bytes, GW_UINT8, p, tag, &q));
        reqs.push_back(q);
      }
    };
    if (rank % 2) {
      recvs();
      sends();
    } else {
      sends();
      recvs();
    }
    float v = 1.0f;
    CHECK_OK(gw_allreduce(c, &v, &v, 1, GW_FLOAT32, GW_SUM));
    EXPECT_EQ(v, static_cast<float>(world));
    for (auto q : reqs) CHECK_OK(gw_wait(q, -1));
    for (int p = 0; p < world; ++p) {
      for (size_t i = 0; i < bytes; ++i) {
        if (in[p][i] != pattern(p, rank, tag, i)) {
          ADD_FAILURE() << "rank " << rank << ": " << bytes << " bytes from rank " << p
                        << " wrong at byte " << i;
          break;
        }
      }
    }
    ++tag;
  }
}

void rules(gw_comm_t c, int rank, int) {
  // Order per sender and tag across hosts: rank 1 (host b) to rank 0 (host a), eager and
  // rendezvous mixed, all sent before rank 0 posts; rank 0 takes tag 8 first.
  constexpr int kN = 12;
  if (rank == 1) {
    std::vector<std::vector<int64_t>> bufs(2 * kN);
    std::vector<gw_request_t> reqs;
    for (int i = 0; i < kN; ++i) {
      for (int t = 0; t < 2; ++t) {
        auto& b = bufs[2 * i + t];
        b.assign(i % 3 == 0 ? 5000 : 3, 100 * t + i);
        gw_request_t q = nullptr;
        CHECK_OK(gw_isend(c, b.data(), b.size(), GW_INT64, 0, 7 + t, &q));
        reqs.push_back(q);
      }
    }
    for (auto q : reqs) CHECK_OK(gw_wait(q, -1));
  } else if (rank == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    for (int t : {1, 0}) {
      for (int i = 0; i < kN; ++i) {
        std::vector<int64_t> b(5000, -1);
        gw_request_t q = nullptr;
        CHECK_OK(gw_irecv(c, b.data(), b.size(), GW_INT64, 1, 7 + t, &q));
        size_t n = 0;
        int from = -2;
        CHECK_OK(gw_wait_recv(q, -1, &n, &from));
        const size_t want = i % 3 == 0 ? 5000 : 3;
        ASSERT_TRUE(n == want && from == 1 && b[0] == 100 * t + i && b[want - 1] == b[0])
            << "message " << i << " tag " << 7 + t << ": " << b[0] << ", " << n << " elements";
      }
    }
  }
  CHECK_OK(gw_barrier(c));
  // Any source: rank 0 takes one message from each other rank (both hosts), reporting each.
  if (rank == 0) {
    std::set<int> seen;
    for (int k = 0; k < 3; ++k) {
      std::vector<int32_t> b(100, -1);
      size_t n = 0;
      int src = -2;
      gw_request_t q = nullptr;
      CHECK_OK(gw_irecv(c, b.data(), b.size(), GW_INT32, GW_ANY_SOURCE, 3, &q));
      CHECK_OK(gw_wait_recv(q, -1, &n, &src));
      EXPECT_TRUE(n == 10 && src >= 1 && src <= 3 && b[9] == 100 * src) << n << " from " << src;
      seen.insert(src);
    }
    EXPECT_EQ(seen.size(), 3u);
  } else {
    std::vector<int32_t> b(10, 100 * rank);
    CHECK_OK(gw_send(c, b.data(), b.size(), GW_INT32, 0, 3));
  }
  CHECK_OK(gw_barrier(c));
  // Truncation with the receive posted first: eager (the send completes), rendezvous (both fail,
  // as in direct mode); both sizes named on the receive.
  for (size_t count : {size_t{100}, size_t{300000}}) {
    const int tag = count == 100 ? 4 : 5;
    std::vector<int32_t> b(count, rank);
    gw_request_t q = nullptr;
    if (rank == 0) {
      CHECK_OK(gw_irecv(c, b.data(), count / 2, GW_INT32, 1, tag, &q));
    }
    CHECK_OK(gw_barrier(c));
    if (rank == 1) {
      const gw_status_t s = gw_send(c, b.data(), count, GW_INT32, 0, tag);
      if (count == 100) {
        EXPECT_EQ(s, GW_OK) << last_error();
      } else {
        EXPECT_EQ(s, GW_ERR_INVALID_ARG) << last_error();
        EXPECT_NE(last_error().find("truncated"), std::string::npos) << last_error();
      }
    }
    if (rank == 0) {
      EXPECT_EQ(gw_wait(q, -1), GW_ERR_INVALID_ARG);
      const std::string e = last_error();
      EXPECT_NE(e.find("truncated"), std::string::npos) << e;
      EXPECT_NE(e.find(std::to_string(count * 4)), std::string::npos) << e;
      EXPECT_NE(e.find(std::to_string(count * 2)), std::string::npos) << e;
    }
    CHECK_OK(gw_barrier(c));
  }
  // Truncation after the message landed in the unexpected buffer: the send completed; the next
  // message of the pair arrives whole.
  {
    std::vector<int32_t> b(300000, 7);
    if (rank == 1) {
      CHECK_OK(gw_send(c, b.data(), b.size(), GW_INT32, 0, 6));
      CHECK_OK(gw_send(c, b.data(), 10, GW_INT32, 0, 6));
    }
    CHECK_OK(gw_barrier(c));
    if (rank == 0) {
      EXPECT_EQ(gw_recv(c, b.data(), 1000, GW_INT32, 1, 6), GW_ERR_INVALID_ARG);
      const std::string e = last_error();
      EXPECT_NE(e.find("1200000"), std::string::npos) << e;
      EXPECT_NE(e.find("4000"), std::string::npos) << e;
      std::fill(b.begin(), b.end(), 0);
      CHECK_OK(gw_recv(c, b.data(), 10, GW_INT32, 1, 6));
      EXPECT_EQ(b[9], 7);
    }
  }
  CHECK_OK(gw_barrier(c));
}

void killed(gw_comm_t c, int rank, int timeout_ms) {
  // Both directions once (the daemons' connections both ways), then rank 1 dies.
  int32_t v = rank, w = -1;
  gw_request_t q = nullptr;
  CHECK_OK(gw_irecv(c, &w, 1, GW_INT32, 1 - rank, 1, &q));
  CHECK_OK(gw_send(c, &v, 1, GW_INT32, 1 - rank, 1));
  CHECK_OK(gw_wait(q, -1));
  EXPECT_EQ(w, 1 - rank);
  std::vector<uint8_t> in(64);
  CHECK_OK(gw_irecv(c, in.data(), in.size(), GW_UINT8, 1 - rank, 9, &q));  // never matched
  CHECK_OK(gw_barrier(c));
  if (rank == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::raise(SIGKILL);
  }
  const auto t0 = Clock::now();
  EXPECT_EQ(gw_wait(q, -1), GW_ERR_PEER) << last_error();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(ms, timeout_ms + 4000.0);
  std::printf("FIGURE xhost killed peer: the pending receive ended after %.0f ms: %s\n", ms,
              last_error().c_str());
  std::vector<uint8_t> big(1 << 20, 1);
  EXPECT_EQ(gw_send(c, big.data(), big.size(), GW_UINT8, 1, 10), GW_ERR_PEER) << last_error();
}

void cap(gw_comm_t c, int rank) {
  std::vector<uint8_t> b(768 << 10, 5);
  if (rank == 0) {
    CHECK_OK(gw_send(c, b.data(), b.size(), GW_UINT8, 1, 1));  // held by daemon b: 768 KiB
    EXPECT_EQ(gw_send(c, b.data(), b.size(), GW_UINT8, 1, 1), GW_ERR_INVALID_ARG);
    EXPECT_NE(last_error().find("GW_DAEMON_P2P_UNEXPECTED_MAX"), std::string::npos) << last_error();
  }
  CHECK_OK(gw_barrier(c));
  if (rank == 1) {
    EXPECT_EQ(gw_recv(c, b.data(), b.size(), GW_UINT8, 0, 1), GW_ERR_NO_MEMORY);
    EXPECT_NE(last_error().find("GW_DAEMON_P2P_UNEXPECTED_MAX"), std::string::npos) << last_error();
    EXPECT_EQ(gw_send(c, b.data(), 8, GW_UINT8, 0, 2), GW_ERR_NO_MEMORY) << last_error();
  }
  // The collectives go on.
  float v = 1.0f;
  CHECK_OK(gw_allreduce(c, &v, &v, 1, GW_FLOAT32, GW_SUM));
  EXPECT_EQ(v, 2.0f);
}

void stop(gw_comm_t c, int rank, int timeout_ms) {
  std::vector<uint8_t> in(64);
  gw_request_t q = nullptr;
  CHECK_OK(gw_irecv(c, in.data(), in.size(), GW_UINT8, 1 - rank, 99, &q));  // never sent
  CHECK_OK(gw_barrier(c));
  if (rank == 0) {
    FILE* f = std::fopen(::getenv("GW_DPX_FLAG"), "w");
    if (f != nullptr) std::fclose(f);
  }
  const auto t0 = Clock::now();
  EXPECT_EQ(gw_wait(q, -1), GW_ERR_PEER) << last_error();
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  EXPECT_LT(ms, timeout_ms / 2.0);  // promptly: not the deadline
  std::printf("FIGURE xhost stop: rank %d's pending receive ended after %.0f ms: %s\n", rank, ms,
              last_error().c_str());
}

void figure(gw_comm_t c, int rank) {
  const char* label = ::getenv("GW_DPX_LABEL");
  const char* mode = !::getenv("GW_DAEMON") ? "direct tcp" : label ? label : "2 daemons";
  const int peer = 1 - rank;
  int64_t v = 0;
  double lat_us[5], bw_gbs[5];
  for (int rep = 0; rep < 5; ++rep) {
    constexpr int kIters = 300;
    const auto t0 = Clock::now();
    for (int i = 0; i < kIters; ++i) {
      if (rank == 0) {
        CHECK_OK(gw_send(c, &v, 1, GW_INT64, peer, 1));
        CHECK_OK(gw_recv(c, &v, 1, GW_INT64, peer, 1));
      } else {
        CHECK_OK(gw_recv(c, &v, 1, GW_INT64, peer, 1));
        CHECK_OK(gw_send(c, &v, 1, GW_INT64, peer, 1));
      }
    }
    lat_us[rep] =
        std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / (2.0 * kIters);
  }
  std::vector<uint8_t> big(4 << 20, 3);
  for (int rep = 0; rep < 5; ++rep) {
    constexpr int kIters = 10;
    const auto t0 = Clock::now();
    for (int i = 0; i < kIters; ++i) {
      if (rank == 0) {
        CHECK_OK(gw_send(c, big.data(), big.size(), GW_UINT8, peer, 2));
      } else {
        CHECK_OK(gw_recv(c, big.data(), big.size(), GW_UINT8, peer, 2));
      }
    }
    // The receiver's acknowledgement ends the round (a send may complete before it lands).
    if (rank == 0) {
      CHECK_OK(gw_recv(c, &v, 1, GW_INT64, peer, 3));
    } else {
      CHECK_OK(gw_send(c, &v, 1, GW_INT64, peer, 3));
    }
    bw_gbs[rep] = kIters * static_cast<double>(big.size()) /
                  std::chrono::duration<double>(Clock::now() - t0).count() / 1e9;
  }
  std::sort(lat_us, lat_us + 5);
  std::sort(bw_gbs, bw_gbs + 5);
  if (rank == 0) {
    std::printf(
        "FIGURE xhost p2p %-10s 8 B one-way latency %8.2f us (%.2f-%.2f)   4 MiB "
        "bandwidth %6.2f GB/s (%.2f-%.2f)\n",
        mode, lat_us[2], lat_us[0], lat_us[4], bw_gbs[2], bw_gbs[0], bw_gbs[4]);
  }
}

TEST(DaemonP2pXhostChild, Run) {
  const char* what = ::getenv("GW_DPX_CASE");
  if (what == nullptr) GTEST_SKIP() << "started only by the DaemonP2pXhost cases";
  const auto place = gw::testing::trainer_place();
  ASSERT_TRUE(place.has_value());
  const int rank = place->rank;
  const int world = place->world;
  const int timeout_ms = std::atoi(::getenv("GW_DPX_TIMEOUT"));
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.store_addr = place->store.c_str();
  cfg.timeout_ms = timeout_ms;
  if (::getenv("GW_DAEMON") == nullptr) cfg.transport = "tcp";
  gw_comm_t c = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  const std::string w = what;
  if (w == "pairs") pairs(c, rank, world);
  if (w == "rules") rules(c, rank, world);
  if (w == "killed") killed(c, rank, timeout_ms);
  if (w == "cap") cap(c, rank);
  if (w == "stop") stop(c, rank, timeout_ms);
  if (w == "figure") figure(c, rank);
  if (w != "killed" && w != "stop") {
    EXPECT_EQ(gw_barrier(c), GW_OK) << last_error();
  }
  gw_comm_destroy(c);
}

}  // namespace
