// Point-to-point in daemon mode (issue 29; daemon/job_p2p.h, capi/daemon_session_p2p.cc):
// - the daemon's matching board alone (P2pBoard over plain buffers): order per sender and tag,
//   any-source, eager and rendezvous truncation, self-send, a peer of another host refused when
//   the board has no link to the other hosts, a
//   failure ending every pending request;
// - through the C ABI, trainers as threads on a gradwired of the test's own (1 daemon x 2 and
//   x 3 trainers), each case also run in direct mode: all pairs from 0 B to 4 MiB, order, any
//   source, truncation, a larger receive's real size, self-send, arena (gw_mem_alloc) buffers;
//   every dtype at 1..8 ranks (a ring both ways, values checked);
// - 2 daemons x 2 trainers (child processes, two host identities): same-host pairs work, and a
//   peer on the other host too (the cross-host cases: daemon_p2p_xhost_test.cc);
// - a trainer killed with receives posted from it and sends posted to it: the other's requests
//   end in GW_ERR_PEER within the deadline; abort and destroy end pending ones (GW_ERR_ABORTED);
// - the figure: 8 B round trip and 4 MiB bandwidth, daemon mode against direct mode.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/job_p2p.h"
#include "daemon/p2p_xhost_wire.h"
#include "gradwire/gradwire.h"
#include "tests/support/capi_world.h"
#include "tests/support/exec_child.h"
#include "tests/support/local_daemon.h"
#include "tests/support/test_env.h"
#include "tests/support/two_hosts.h"

namespace {

using gw::testing::get_elem;
using gw::testing::gw_dtype_bytes;
using gw::testing::last_error;
using gw::testing::put_elem;
using gw::testing::RankErrors;

// ---- the board alone --------------------------------------------------------------------------

struct Done {
  size_t member;
  uint64_t seq;
  gw::Code code;
  std::string msg;
  uint64_t bytes;
  int32_t source;
};

struct Board {
  // members with ranks `ranks`, each a 1 MiB data region; host_of_rank as given.
  Board(std::vector<int32_t> ranks, std::vector<int32_t> hosts = {}, int32_t host = 0)
      : regions(ranks.size(), std::vector<uint8_t>(1 << 20, 0)) {
    std::vector<uint8_t*> data;
    for (auto& r : regions) data.push_back(r.data());
    board = std::make_unique<gw::daemon::P2pBoard>(
        ranks, data, hosts, host,
        [this](size_t m, uint64_t seq, const gw::Status& s, const gw::daemon::P2pDone* d) {
          done.push_back(Done{m, seq, s.code(), s.message(), d ? d->bytes : 0, d ? d->source : -9});
        });
  }
  void send(size_t m, uint64_t seq, int32_t peer, int32_t tag, uint64_t off, uint64_t bytes) {
    gw::daemon::Request r;
    r.opcode = gw::daemon::Opcode::kSend;
    r.seq = seq;
    r.root = peer;
    r.tag = tag;
    r.send_off = off;
    r.send_bytes = bytes;
    board->submit(m, r);
  }
  void recv(size_t m, uint64_t seq, int32_t peer, int32_t tag, uint64_t off, uint64_t bytes) {
    gw::daemon::Request r;
    r.opcode = gw::daemon::Opcode::kRecv;
    r.seq = seq;
    r.root = peer;
    r.tag = tag;
    r.recv_off = off;
    r.recv_bytes = bytes;
    board->submit(m, r);
  }
  const Done* find(size_t m, uint64_t seq) const {
    for (const auto& d : done) {
      if (d.member == m && d.seq == seq) return &d;
    }
    return nullptr;
  }
  std::vector<std::vector<uint8_t>> regions;
  std::vector<Done> done;
  std::unique_ptr<gw::daemon::P2pBoard> board;
};

TEST(P2pBoard, OrderPerSenderAndTagAndAnySource) {
  Board b({0, 1, 2});
  // Rank 1 sends three messages with tag 5 (eager and rendezvous mixed), then one with tag 6.
  const uint64_t sizes[] = {10, 100000, 20};
  for (uint64_t i = 0; i < 3; ++i) {
    b.regions[1][i * 200000] = static_cast<uint8_t>(i + 1);
    b.send(1, i + 1, 0, 5, i * 200000, sizes[i]);
  }
  b.regions[1][900000] = 77;
  b.send(1, 4, 0, 6, 900000, 1);
  // The eager ones completed at once, the large one waits.
  EXPECT_TRUE(b.find(1, 1) && b.find(1, 3) && b.find(1, 4));
  EXPECT_EQ(b.find(1, 2), nullptr);
  // Tag 6 first, then the three of tag 5 in order.
  b.recv(0, 1, 1, 6, 0, 100);
  ASSERT_TRUE(b.find(0, 1));
  EXPECT_EQ(b.regions[0][0], 77);
  for (uint64_t i = 0; i < 3; ++i) {
    b.recv(0, 2 + i, i == 1 ? -1 : 1, 5, 1000 + i * 200000, 150000);
    const Done* d = b.find(0, 2 + i);
    ASSERT_TRUE(d) << i;
    EXPECT_EQ(d->code, gw::Code::kOk) << d->msg;
    EXPECT_EQ(d->bytes, sizes[i]);
    EXPECT_EQ(d->source, 1);
    EXPECT_EQ(b.regions[0][1000 + i * 200000], i + 1);
  }
  ASSERT_TRUE(b.find(1, 2));  // the rendezvous send completes once taken
  EXPECT_EQ(b.find(1, 2)->code, gw::Code::kOk);
  // Receives are matched in the order posted: two any-source receives, then two senders.
  b.recv(0, 10, -1, 9, 0, 8);
  b.recv(0, 11, -1, 9, 100, 8);
  b.regions[2][0] = 2;
  b.send(2, 1, 0, 9, 0, 1);
  b.send(1, 5, 0, 9, 0, 1);
  ASSERT_TRUE(b.find(0, 10) && b.find(0, 11));
  EXPECT_EQ(b.find(0, 10)->source, 2);
  EXPECT_EQ(b.find(0, 11)->source, 1);
  EXPECT_EQ(b.board->pending(), 0u);
}

TEST(P2pBoard, TruncationSelfSendAndFailure) {
  Board b({4, 7});
  // Eager: only the receive fails (the receive posted first or second); rendezvous: both,
  // naming both sizes.
  b.recv(1, 7, 4, 8, 0, 50);
  b.send(0, 7, 7, 8, 0, 100);
  ASSERT_TRUE(b.find(0, 7) && b.find(1, 7));
  EXPECT_EQ(b.find(0, 7)->code, gw::Code::kOk);
  EXPECT_EQ(b.find(1, 7)->code, gw::Code::kInvalidArg);
  b.send(0, 1, 7, 1, 0, 100);
  b.recv(1, 1, 4, 1, 0, 50);
  ASSERT_TRUE(b.find(0, 1) && b.find(1, 1));
  EXPECT_EQ(b.find(0, 1)->code, gw::Code::kOk);
  EXPECT_EQ(b.find(1, 1)->code, gw::Code::kInvalidArg);
  EXPECT_NE(b.find(1, 1)->msg.find("truncated"), std::string::npos);
  b.recv(1, 2, 4, 2, 0, 20000);
  b.send(0, 2, 7, 2, 0, 30000);
  ASSERT_TRUE(b.find(0, 2) && b.find(1, 2));
  for (const Done* d : {b.find(0, 2), b.find(1, 2)}) {
    EXPECT_EQ(d->code, gw::Code::kInvalidArg);
    EXPECT_NE(d->msg.find("30000"), std::string::npos) << d->msg;
    EXPECT_NE(d->msg.find("20000"), std::string::npos) << d->msg;
  }
  // Self-send of a rendezvous size, receive posted second.
  for (size_t i = 0; i < 40000; ++i) b.regions[1][i] = static_cast<uint8_t>(i * 7);
  b.send(1, 3, 7, 3, 0, 40000);
  b.recv(1, 4, 7, 3, 500000, 40000);
  ASSERT_TRUE(b.find(1, 3) && b.find(1, 4));
  EXPECT_EQ(b.find(1, 4)->source, 7);
  EXPECT_EQ(std::memcmp(b.regions[1].data(), b.regions[1].data() + 500000, 40000), 0);
  // Pending ones end with the failure; completed eager ones are not answered twice.
  b.send(0, 5, 7, 9, 0, 8);       // eager: done
  b.send(0, 6, 7, 9, 0, 100000);  // rendezvous: pending
  b.recv(1, 5, 4, 10, 0, 8);      // pending
  const size_t before = b.done.size();
  b.board->fail_all(gw::peer_error("rank 4 left the job"));
  ASSERT_EQ(b.done.size(), before + 2);
  EXPECT_EQ(b.find(0, 6)->code, gw::Code::kPeer);
  EXPECT_EQ(b.find(1, 5)->code, gw::Code::kPeer);
  EXPECT_EQ(b.board->pending(), 0u);
}

TEST(P2pBoard, AMemberThatLeavesIsDroppedAlone) {
  Board b({0, 1, 2});
  b.regions[1][0] = 9;
  b.send(1, 1, 0, 1, 0, 8);       // eager, to rank 0: stays receivable
  b.send(1, 2, 0, 2, 0, 100000);  // rendezvous, to rank 0: goes with its arena
  b.send(0, 1, 1, 3, 0, 100000);  // rank 0 to it: ends with kPeer
  b.recv(2, 1, 1, 4, 0, 8);       // rank 2 from it: ends with kPeer
  b.recv(2, 2, -1, 5, 0, 8);      // any source: stays
  b.board->drop_member(1, gw::peer_error("rank 1 (pid 7) left the job"));
  ASSERT_TRUE(b.find(0, 1) && b.find(2, 1));
  EXPECT_EQ(b.find(0, 1)->code, gw::Code::kPeer);
  EXPECT_EQ(b.find(2, 1)->code, gw::Code::kPeer);
  EXPECT_EQ(b.find(2, 2), nullptr);
  b.recv(0, 11, 1, 1, 100, 8);
  ASSERT_TRUE(b.find(0, 11));
  EXPECT_EQ(b.find(0, 11)->code, gw::Code::kOk) << b.find(0, 11)->msg;
  EXPECT_EQ(b.regions[0][100], 9);
  b.recv(0, 12, 1, 2, 0, 200000);  // its rendezvous message went with it
  b.send(2, 3, 1, 7, 0, 8);        // a send to it
  ASSERT_TRUE(b.find(0, 12) && b.find(2, 3));
  EXPECT_EQ(b.find(0, 12)->code, gw::Code::kPeer);
  EXPECT_EQ(b.find(2, 3)->code, gw::Code::kPeer);
  EXPECT_NE(b.find(2, 3)->msg.find("rank 1"), std::string::npos);
  // The others go on: rank 0 to rank 2's any-source receive.
  b.send(0, 4, 2, 5, 0, 8);
  ASSERT_TRUE(b.find(2, 2));
  EXPECT_EQ(b.find(2, 2)->code, gw::Code::kOk);
  EXPECT_EQ(b.find(2, 2)->source, 0);
}

// A client of version 6 (no send and recv) is refused at its hello, naming both versions.
TEST(P2pProtocol, OldClientIsRefusedAtTheHello) {
  gw::daemon::Hello h;
  h.version = 6;
  h.arena_bytes = 1 << 20;
  h.job_token = "t";
  h.host_id = "h";
  const auto bytes = gw::daemon::encode_hello(h);
  auto got = gw::daemon::decode_hello(bytes.data(), bytes.size());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), gw::Code::kUnsupported);
  EXPECT_NE(got.status().message().find("version 6"), std::string::npos) << got.status().message();
  EXPECT_NE(got.status().message().find("speaks 8"), std::string::npos) << got.status().message();
}

// The daemons' goodbye (daemon/p2p_xhost_wire.h): it names the rank that left (any rank of the
// job) and nothing else; a goodbye with a message's fields, or a flag no daemon sends, is refused.
TEST(P2pXhostHeader, GoodbyeNamesTheRankThatLeftAndNothingElse) {
  using gw::daemon::XhostHeader;
  auto decode = [](const XhostHeader& h) {
    const auto b = gw::daemon::encode_xhost_header(h);
    return gw::daemon::decode_xhost_header(b.data(), b.size(), 4, 1 << 20);
  };
  auto bye = decode(XhostHeader{gw::daemon::kXhostBye, 3, 0, 0, 0});
  ASSERT_TRUE(bye.ok()) << bye.status().to_string();
  EXPECT_EQ(bye->flags, gw::daemon::kXhostBye);
  EXPECT_EQ(bye->src, 3);
  for (const XhostHeader& bad :
       {XhostHeader{gw::daemon::kXhostBye, 3, 1, 0, 0},
        XhostHeader{gw::daemon::kXhostBye, 3, 0, 7, 0},
        XhostHeader{gw::daemon::kXhostBye, 3, 0, 0, 8},
        XhostHeader{gw::daemon::kXhostBye, 4, 0, 0, 0}, XhostHeader{3, 0, 0, 0, 0}}) {
    auto got = decode(bad);
    ASSERT_FALSE(got.ok()) << "flags " << bad.flags << " src " << bad.src;
    EXPECT_EQ(got.status().code(), gw::Code::kPeer);
  }
}

// A payload of 1 to 4 KiB rides behind its header in one daemon message (kXhostInline): the
// message's size must be the header's plus the payload's; a larger one, an empty one, or a small
// one sent apart (flags 0) is refused, as is a header whose size says another length.
TEST(P2pXhostHeader, InlinePayloadIsExactlyTheMessageAfterTheHeader) {
  using gw::daemon::kXhostHeaderBytes;
  using gw::daemon::kXhostInline;
  using gw::daemon::kXhostInlineBytes;
  using gw::daemon::XhostHeader;
  auto decode = [](const XhostHeader& h, size_t payload) {
    const auto b = gw::daemon::encode_xhost_header(h);
    std::vector<uint8_t> msg(b.begin(), b.end());
    msg.resize(msg.size() + payload, 0xab);
    return gw::daemon::decode_xhost_header(msg.data(), msg.size(), 4, 1 << 20);
  };
  for (uint64_t n : {uint64_t{1}, uint64_t{8}, kXhostInlineBytes}) {
    auto got = decode(XhostHeader{kXhostInline, 0, 2, 5, n}, n);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status().to_string();
    EXPECT_EQ(got->flags, kXhostInline);
    EXPECT_EQ(got->bytes, n);
  }
  // Larger messages keep their payload apart; a 0-byte one has none.
  EXPECT_TRUE(decode(XhostHeader{0, 0, 2, 5, kXhostInlineBytes + 1}, 0).ok());
  EXPECT_TRUE(decode(XhostHeader{0, 0, 2, 5, 0}, 0).ok());
  const std::pair<XhostHeader, size_t> bad[] = {
      {XhostHeader{kXhostInline, 0, 2, 5, 8}, 7},  // shorter than it says
      {XhostHeader{kXhostInline, 0, 2, 5, 8}, 9},  // longer
      {XhostHeader{kXhostInline, 0, 2, 5, 8}, 0},  // the header alone
      {XhostHeader{kXhostInline, 0, 2, 5, 0}, 0},  // nothing inline
      {XhostHeader{kXhostInline, 0, 2, 5, kXhostInlineBytes + 1}, kXhostInlineBytes + 1},
      {XhostHeader{0, 0, 2, 5, 8}, 0},                      // small, sent apart
      {XhostHeader{0, 0, 2, 5, kXhostInlineBytes + 1}, 8},  // a header with bytes after it
  };
  for (const auto& [h, payload] : bad) {
    auto got = decode(h, payload);
    ASSERT_FALSE(got.ok()) << "flags " << h.flags << " bytes " << h.bytes << " + " << payload;
    EXPECT_EQ(got.status().code(), gw::Code::kPeer);
  }
  EXPECT_EQ(kXhostHeaderBytes + kXhostInlineBytes, 4128u);
}

// A device message (kXhostDevice) carries its payload tag in the header's u32 at 20 and may be of
// any size of 1 byte or more (never inline); without bytes, with a payload tag below the device
// range, or with bytes behind the header it is refused, and no other header may carry a tag there.
TEST(P2pXhostHeader, DeviceMessageCarriesItsOwnPayloadTag) {
  using gw::daemon::kXhostDevice;
  using gw::daemon::kXhostDeviceTagFirst;
  using gw::daemon::XhostHeader;
  auto decode = [](const XhostHeader& h, size_t payload) {
    const auto b = gw::daemon::encode_xhost_header(h);
    std::vector<uint8_t> msg(b.begin(), b.end());
    msg.resize(msg.size() + payload, 0xab);
    return gw::daemon::decode_xhost_header(msg.data(), msg.size(), 4, 1 << 20);
  };
  for (uint64_t n : {uint64_t{1}, uint64_t{4096}, uint64_t{1 << 20}}) {
    auto got = decode(XhostHeader{kXhostDevice, 0, 2, 5, n, kXhostDeviceTagFirst + 3}, 0);
    ASSERT_TRUE(got.ok()) << n << ": " << got.status().to_string();
    EXPECT_EQ(got->flags, kXhostDevice);
    EXPECT_EQ(got->bytes, n);
    EXPECT_EQ(got->payload_tag, kXhostDeviceTagFirst + 3);
  }
  const std::pair<XhostHeader, size_t> bad[] = {
      {XhostHeader{kXhostDevice, 0, 2, 5, 0, kXhostDeviceTagFirst}, 0},              // no bytes
      {XhostHeader{kXhostDevice, 0, 2, 5, 8, 0x6778}, 0},                            // a low tag
      {XhostHeader{kXhostDevice, 0, 2, 5, 8, kXhostDeviceTagFirst}, 8},              // bytes behind
      {XhostHeader{kXhostDevice, 0, 2, 5, (1 << 20) + 1, kXhostDeviceTagFirst}, 0},  // too big
      {XhostHeader{0, 0, 2, 5, 8192, kXhostDeviceTagFirst}, 0},  // a tag on a host message
  };
  for (const auto& [h, payload] : bad) {
    auto got = decode(h, payload);
    ASSERT_FALSE(got.ok()) << "bytes " << h.bytes << " tag " << h.payload_tag;
    EXPECT_EQ(got.status().code(), gw::Code::kPeer);
  }
}

TEST(P2pBoard, PeerOnAnotherHostIsRefused) {
  Board b({0, 2}, {0, 1, 0, 1}, 0);
  b.send(0, 1, 1, 0, 0, 8);
  b.recv(1, 1, 3, 0, 0, 8);
  ASSERT_TRUE(b.find(0, 1) && b.find(1, 1));
  EXPECT_EQ(b.find(0, 1)->code, gw::Code::kUnsupported);
  EXPECT_NE(b.find(0, 1)->msg.find("no link"), std::string::npos);
  EXPECT_EQ(b.find(1, 1)->code, gw::Code::kUnsupported);
}

// ---- through the C ABI ------------------------------------------------------------------------

class DaemonP2pTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new gw::testing::LocalDaemon(GW_GRADWIRED_PATH, "gw-dp");
  }
  static void TearDownTestSuite() {
    delete daemon_;
    daemon_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(daemon_->ready()); }
  static gw::testing::LocalDaemon* daemon_;
};
gw::testing::LocalDaemon* DaemonP2pTest::daemon_ = nullptr;

// `world` ranks as threads in daemon mode on `socket` ("": direct mode).
void run_ranks(int world, const std::string& socket, const gw::testing::WorldFn& fn,
               const char* transport = "tcp") {
  gw::testing::CleanEnv env;
  if (!socket.empty()) ::setenv("GW_DAEMON", ("unix:" + socket).c_str(), 1);
  ::setenv("GW_DAEMON_ARENA", "64M", 1);
  gw::testing::run_world_in_env(world, socket.empty() ? transport : nullptr, 30000, fn);
  ::unsetenv("GW_DAEMON_ARENA");
}

uint8_t pattern(int src, int dst, int tag, size_t i) {
  return static_cast<uint8_t>(src * 31 + dst * 17 + tag * 7 + i * 13 + (i >> 8));
}

// Every rank sends to every rank (itself too) and receives from every rank, all posted before
// any wait, receives first on odd ranks.
void all_pairs(gw_comm_t c, int rank, int world, RankErrors& e, size_t bytes, int tag) {
  std::vector<std::vector<uint8_t>> out(world), in(world);
  std::vector<gw_request_t> reqs;
  auto sends = [&] {
    for (int p = 0; p < world; ++p) {
      out[p].resize(bytes);
      for (size_t i = 0; i < bytes; ++i) out[p][i] = pattern(rank, p, tag, i);
      gw_request_t q = nullptr;
      GW_CHECK_RANK(rank, e, gw_isend(c, out[p].data(), bytes, GW_UINT8, p, tag, &q));
      if (q) reqs.push_back(q);
    }
  };
  auto recvs = [&] {
    for (int p = 0; p < world; ++p) {
      in[p].assign(bytes, 0);
      gw_request_t q = nullptr;
      GW_CHECK_RANK(rank, e, gw_irecv(c, in[p].data(), bytes, GW_UINT8, p, tag, &q));
      if (q) reqs.push_back(q);
    }
  };
  if (rank % 2) {
    recvs();
    sends();
  } else {
    sends();
    recvs();
  }
  for (auto q : reqs) GW_CHECK_RANK(rank, e, gw_wait(q, -1));
  for (int p = 0; p < world; ++p) {
    for (size_t i = 0; i < bytes; ++i) {
      if (in[p][i] != pattern(p, rank, tag, i)) {
        int like = -1;
        for (int o = 0; o < world; ++o) {
          if (in[p][i] == pattern(o, rank, tag, i) && in[p][i + 1] == pattern(o, rank, tag, i + 1))
            like = o;
        }
        e.add(rank, "wrong byte " + std::to_string(i) + " of " + std::to_string(bytes) +
                        " from rank " + std::to_string(p) + " (got " + std::to_string(in[p][i]) +
                        ", rank " + std::to_string(like) + "'s pattern)");
        break;
      }
    }
  }
}

// The rules, in either mode, on 2 ranks.
void rules(gw_comm_t c, int rank, int, RankErrors& e) {
  const int peer = 1 - rank;
  // Order per sender and tag, eager and rendezvous mixed, sent before the receives are posted.
  constexpr int kN = 12;
  if (rank == 1) {
    std::vector<std::vector<int64_t>> bufs(2 * kN);
    std::vector<gw_request_t> reqs;
    for (int i = 0; i < kN; ++i) {
      for (int t = 0; t < 2; ++t) {
        auto& b = bufs[2 * i + t];
        b.assign(i % 3 == 0 ? 5000 : 3, 100 * t + i);
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_isend(c, b.data(), b.size(), GW_INT64, 0, 7 + t, &q));
        if (q) reqs.push_back(q);
      }
    }
    for (auto q : reqs) GW_CHECK_RANK(rank, e, gw_wait(q, -1));
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (int t : {1, 0}) {
      for (int i = 0; i < kN; ++i) {
        std::vector<int64_t> b(5000, -1);
        gw_request_t q = nullptr;
        GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), b.size(), GW_INT64, 1, 7 + t, &q));
        size_t n = 0;
        int from = -2;
        GW_CHECK_RANK(rank, e, gw_wait_recv(q, -1, &n, &from));
        const size_t want = i % 3 == 0 ? 5000 : 3;
        if (n != want || from != 1 || b[0] != 100 * t + i || b[want - 1] != b[0]) {
          e.add(rank, "message " + std::to_string(i) + " tag " + std::to_string(7 + t) +
                          " out of order or wrong: " + std::to_string(b[0]) + ", " +
                          std::to_string(n) + " elements");
          return;
        }
      }
    }
  }
  // Any source, reporting it; a larger receive gets the real size.
  if (rank == 0) {
    std::vector<int32_t> b(100, -1);
    size_t n = 0;
    int src = -2;
    gw_request_t q = nullptr;
    GW_CHECK_RANK(rank, e, gw_irecv(c, b.data(), b.size(), GW_INT32, GW_ANY_SOURCE, 3, &q));
    GW_CHECK_RANK(rank, e, gw_wait_recv(q, -1, &n, &src));
    if (n != 10 || src != 1 || b[9] != 41) {
      e.add(rank, "any source: " + std::to_string(n) + " from " + std::to_string(src));
    }
  } else {
    std::vector<int32_t> b(10, 41);
    GW_CHECK_RANK(rank, e, gw_send(c, b.data(), b.size(), GW_INT32, 0, 3));
  }
  // Truncation: eager fails the receive only, rendezvous both, naming both sizes.
  for (size_t count : {size_t{100}, size_t{300000}}) {
    std::vector<int32_t> b(count, rank);
    if (rank == 0) {
      const bool eager = count * 4 <= 16384;
      gw_status_t s = gw_send(c, b.data(), count, GW_INT32, peer, 1);
      if (eager ? s != GW_OK
                : s != GW_ERR_INVALID_ARG || last_error().find("truncated") == std::string::npos) {
        e.add(rank, "truncated send of " + std::to_string(count) + ": " + std::to_string(s) + " " +
                        last_error());
      }
      GW_CHECK_RANK(rank, e, gw_send(c, b.data(), count, GW_INT32, peer, 1));
    } else {
      gw_status_t s = gw_recv(c, b.data(), count / 2, GW_INT32, peer, 1);
      if (s != GW_ERR_INVALID_ARG || last_error().find("truncated") == std::string::npos ||
          last_error().find(std::to_string(count * 4)) == std::string::npos) {
        e.add(rank, "truncated receive: " + std::to_string(s) + " " + last_error());
      }
      GW_CHECK_RANK(rank, e, gw_recv(c, b.data(), count, GW_INT32, peer, 1));
      if (b[count - 1] != 0) e.add(rank, "the message after the truncated one is wrong");
    }
  }
  // Self-send, receive posted second and first, both sizes.
  for (size_t bytes : {size_t{8}, size_t{1} << 20}) {
    std::vector<uint8_t> out(bytes), in(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) out[i] = pattern(rank, rank, 2, i);
    gw_request_t qs = nullptr, qr = nullptr;
    GW_CHECK_RANK(rank, e, gw_isend(c, out.data(), bytes, GW_UINT8, rank, 2, &qs));
    GW_CHECK_RANK(rank, e, gw_irecv(c, in.data(), bytes, GW_UINT8, rank, 2, &qr));
    GW_CHECK_RANK(rank, e, gw_wait(qr, -1));
    GW_CHECK_RANK(rank, e, gw_wait(qs, -1));
    if (in != out) e.add(rank, "self-send of " + std::to_string(bytes) + " bytes wrong");
  }
  // gw_mem_alloc buffers (in the arena in daemon mode: moved without staging).
  void* a = nullptr;
  GW_CHECK_RANK(rank, e, gw_mem_alloc(c, 1 << 20, &a));
  if (a != nullptr) {
    auto* p = static_cast<uint8_t*>(a);
    if (rank == 0) {
      for (size_t i = 0; i < (1u << 20); ++i) p[i] = pattern(0, 1, 4, i);
      GW_CHECK_RANK(rank, e, gw_send(c, p, 1 << 20, GW_UINT8, 1, 4));
    } else {
      GW_CHECK_RANK(rank, e, gw_recv(c, p, 1 << 20, GW_UINT8, 0, 4));
      for (size_t i = 0; i < (1u << 20); ++i) {
        if (p[i] != pattern(0, 1, 4, i)) {
          e.add(rank, "arena buffer wrong at " + std::to_string(i));
          break;
        }
      }
    }
    GW_CHECK_RANK(rank, e, gw_mem_free(c, a));
  }
}

TEST_F(DaemonP2pTest, AllPairsFromZeroBytesToFourMiB) {
  for (int world : {2, 3}) {
    for (bool daemon : {true, false}) {
      SCOPED_TRACE(std::string(daemon ? "daemon" : "direct") + " mode, " + std::to_string(world) +
                   " ranks");
      run_ranks(world, daemon ? daemon_->socket() : "",
                [](gw_comm_t c, int rank, int world, RankErrors& e) {
                  int tag = 20;
                  for (size_t bytes : {size_t{0}, size_t{8}, size_t{16384}, size_t{16385},
                                       size_t{1000003}, size_t{4} << 20}) {
                    all_pairs(c, rank, world, e, bytes, tag++);
                  }
                });
    }
  }
}

// Every dtype at 1..8 ranks, in both modes: a ring both ways (1 rank: to itself), counts of
// elements (the C ABI's bytes are count x the dtype's size), every element's value checked.
TEST_F(DaemonP2pTest, EveryDtypeAtOneToEightRanks) {
  const gw_dtype_t dtypes[] = {GW_FLOAT32, GW_FLOAT64, GW_FLOAT16, GW_BFLOAT16,
                               GW_INT32,   GW_INT64,   GW_UINT8};
  for (int world = 1; world <= 8; ++world) {
    for (bool daemon : {true, false}) {
      SCOPED_TRACE(std::string(daemon ? "daemon" : "direct") + " mode, " + std::to_string(world) +
                   " ranks");
      run_ranks(
          world, daemon ? daemon_->socket() : "",
          [&](gw_comm_t c, int rank, int world, RankErrors& e) {
            const int right = (rank + 1) % world, left = (rank + world - 1) % world;
            for (int k = 0; k < 7; ++k) {
              const gw_dtype_t d = dtypes[k];
              const size_t count = 1000 + static_cast<size_t>(world) * 37;
              const size_t es = gw_dtype_bytes(d);
              std::vector<uint8_t> out(count * es), from_left(count * es), from_right(count * es);
              // Small integers: exact in every dtype (uint8 too).
              auto value = [&](int src, size_t i) {
                return static_cast<int>((src * 7 + k * 3 + i) % 100);
              };
              for (size_t i = 0; i < count; ++i) put_elem(d, out.data(), i, value(rank, i));
              gw_request_t q[4] = {};
              GW_CHECK_RANK(rank, e, gw_irecv(c, from_left.data(), count, d, left, 2 * k, &q[0]));
              GW_CHECK_RANK(rank, e,
                            gw_irecv(c, from_right.data(), count, d, right, 2 * k + 1, &q[1]));
              GW_CHECK_RANK(rank, e, gw_isend(c, out.data(), count, d, right, 2 * k, &q[2]));
              GW_CHECK_RANK(rank, e, gw_isend(c, out.data(), count, d, left, 2 * k + 1, &q[3]));
              for (gw_request_t r : q) {
                if (r != nullptr) GW_CHECK_RANK(rank, e, gw_wait(r, 30000));
              }
              for (size_t i = 0; i < count; ++i) {
                if (get_elem(d, from_left.data(), i) != value(left, i) ||
                    get_elem(d, from_right.data(), i) != value(right, i)) {
                  e.add(rank, "dtype " + std::to_string(static_cast<int>(d)) + ": element " +
                                  std::to_string(i) + " wrong");
                  break;
                }
              }
            }
          });
    }
  }
}

TEST_F(DaemonP2pTest, OrderAnySourceTruncationSelfSendArenaBuffers) {
  for (bool daemon : {true, false}) {
    SCOPED_TRACE(daemon ? "daemon mode" : "direct mode");
    run_ranks(2, daemon ? daemon_->socket() : "", rules);
  }
}

TEST_F(DaemonP2pTest, InterleavedWithCollectives) {
  run_ranks(2, daemon_->socket(), [](gw_comm_t c, int rank, int, RankErrors& e) {
    for (int i = 0; i < 20; ++i) {
      std::vector<int32_t> m(1000, rank * 100 + i), got(1000, -1);
      gw_request_t qs = nullptr, qr = nullptr;
      GW_CHECK_RANK(rank, e, gw_irecv(c, got.data(), got.size(), GW_INT32, 1 - rank, i, &qr));
      float x = 1.0f;
      GW_CHECK_RANK(rank, e, gw_allreduce(c, &x, &x, 1, GW_FLOAT32, GW_SUM));
      GW_CHECK_RANK(rank, e, gw_isend(c, m.data(), m.size(), GW_INT32, 1 - rank, i, &qs));
      GW_CHECK_RANK(rank, e, gw_barrier(c));
      GW_CHECK_RANK(rank, e, gw_wait(qr, -1));
      GW_CHECK_RANK(rank, e, gw_wait(qs, -1));
      if (x != 2.0f || got[999] != (1 - rank) * 100 + i) {
        e.add(rank, "round " + std::to_string(i) + " wrong");
        return;
      }
    }
  });
}

// Abort and destroy end every pending send and receive with GW_ERR_ABORTED (a world of one: no
// other trainer can leave first).
TEST_F(DaemonP2pTest, AbortAndDestroyEndPendingRequests) {
  gw::testing::CleanEnv env;
  ::setenv("GW_DAEMON", ("unix:" + daemon_->socket()).c_str(), 1);
  for (bool destroy : {false, true}) {
    SCOPED_TRACE(destroy ? "destroy" : "abort");
    gw_config_t cfg = GW_CONFIG_INIT;
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.timeout_ms = 20000;
    gw_comm_t c = nullptr;
    ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
    int32_t x = 0, y = 0;
    std::vector<int32_t> z(8192);  // past the eager size: waits for its receive
    gw_request_t r1 = nullptr, r2 = nullptr, s1 = nullptr;
    ASSERT_EQ(gw_irecv(c, &x, 1, GW_INT32, 0, 1, &r1), GW_OK) << last_error();
    ASSERT_EQ(gw_irecv(c, &y, 1, GW_INT32, GW_ANY_SOURCE, 2, &r2), GW_OK) << last_error();
    ASSERT_EQ(gw_isend(c, z.data(), z.size(), GW_INT32, 0, 3, &s1), GW_OK) << last_error();
    if (destroy) {
      EXPECT_EQ(gw_comm_destroy(c), GW_OK) << last_error();
    } else {
      gw_comm_abort(c);
    }
    EXPECT_EQ(gw_wait(r1, -1), GW_ERR_ABORTED) << last_error();
    EXPECT_EQ(gw_wait(r2, -1), GW_ERR_ABORTED) << last_error();
    int done = 0;
    EXPECT_EQ(gw_test(s1, &done), GW_ERR_ABORTED) << last_error();
    EXPECT_EQ(done, 1);
    if (!destroy) {
      EXPECT_EQ(gw_comm_destroy(c), GW_OK) << last_error();
    }
  }
}

// The figure (docs/perf.md): 8 B round trip (half of it: one-way latency) and 4 MiB one-way
// bandwidth between 2 ranks of one host, medians of 5 runs, daemon mode against direct mode over
// tcp and shm. Printed, not asserted (the machine is shared).
TEST_F(DaemonP2pTest, FigureLatencyAndBandwidthAgainstDirectMode) {
  struct Mode {
    const char* name;
    bool daemon;
    const char* transport;
    bool arena;  // buffers from gw_mem_alloc (daemon mode: in the arena, no staging copy)
  };
  {
    // The machine's ceiling for a copy of 4 MiB (one core), measured beside the figures.
    std::vector<uint8_t> a(4u << 20, 1), b(4u << 20, 2);
    double gbs[5] = {};
    for (double& g : gbs) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 20; ++i)
        std::memcpy(i % 2 ? a.data() : b.data(), i % 2 ? b.data() : a.data(), a.size());
      g = 20.0 * a.size() /
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
    }
    std::sort(gbs, gbs + 5);
    std::printf("FIGURE p2p ceiling: memcpy of 4 MiB %7.2f GB/s\n", gbs[2]);
  }
  for (const Mode& m :
       {Mode{"daemon", true, nullptr, false}, Mode{"daemon arena", true, nullptr, true},
        Mode{"direct tcp", false, "tcp", false}, Mode{"direct shm", false, "shm", false}}) {
    double lat_us[5] = {}, bw_gbs[5] = {};
    run_ranks(
        2, m.daemon ? daemon_->socket() : "",
        [&](gw_comm_t c, int rank, int, RankErrors& e) {
          std::vector<uint8_t> heap(8 + (4u << 20), 3);
          uint8_t* mem = heap.data();
          void* arena = nullptr;
          if (m.arena) {
            GW_CHECK_RANK(rank, e, gw_mem_alloc(c, heap.size(), &arena));
            if (arena == nullptr) return;
            mem = static_cast<uint8_t*>(arena);
          }
          uint8_t* x = mem;
          struct {
            uint8_t* p;
            size_t n;
            uint8_t* data() const { return p; }
            size_t size() const { return n; }
          } big{mem + 8, 4u << 20};
          const int peer = 1 - rank;
          for (int run = 0; run < 5; ++run) {
            GW_CHECK_RANK(rank, e, gw_barrier(c));
            constexpr int kIters = 200;
            auto t0 = std::chrono::steady_clock::now();
            for (int i = 0; i < kIters; ++i) {
              if (rank == 0) {
                GW_CHECK_RANK(rank, e, gw_send(c, x, 8, GW_UINT8, peer, 1));
                GW_CHECK_RANK(rank, e, gw_recv(c, x, 8, GW_UINT8, peer, 1));
              } else {
                GW_CHECK_RANK(rank, e, gw_recv(c, x, 8, GW_UINT8, peer, 1));
                GW_CHECK_RANK(rank, e, gw_send(c, x, 8, GW_UINT8, peer, 1));
              }
            }
            auto t1 = std::chrono::steady_clock::now();
            constexpr int kBig = 10;
            for (int i = 0; i < kBig; ++i) {
              if (rank == 0) {
                GW_CHECK_RANK(rank, e, gw_send(c, big.data(), big.size(), GW_UINT8, peer, 2));
              } else {
                GW_CHECK_RANK(rank, e, gw_recv(c, big.data(), big.size(), GW_UINT8, peer, 2));
              }
            }
            // The last message's end as rank 1 saw it: a 0-byte answer.
            if (rank == 0) {
              GW_CHECK_RANK(rank, e, gw_recv(c, nullptr, 0, GW_UINT8, peer, 3));
            } else {
              GW_CHECK_RANK(rank, e, gw_send(c, nullptr, 0, GW_UINT8, peer, 3));
            }
            auto t2 = std::chrono::steady_clock::now();
            if (rank == 0) {
              lat_us[run] = std::chrono::duration<double, std::micro>(t1 - t0).count() / kIters / 2;
              bw_gbs[run] =
                  double(big.size()) * kBig / std::chrono::duration<double>(t2 - t1).count() / 1e9;
            }
          }
          if (arena != nullptr) GW_CHECK_RANK(rank, e, gw_mem_free(c, arena));
        },
        m.transport ? m.transport : "tcp");
    std::sort(lat_us, lat_us + 5);
    std::sort(bw_gbs, bw_gbs + 5);
    std::printf("FIGURE p2p %-12s 8 B one-way latency %8.2f us   4 MiB bandwidth %7.2f GB/s\n",
                m.name, lat_us[2], bw_gbs[2]);
    EXPECT_GT(bw_gbs[2], 0.0) << m.name;
  }
}

// A trainer (a child process: this binary again, as DaemonP2pChild.Killed) killed with a send
// from rank 0 waiting for it and a receive from it posted: both end in GW_ERR_PEER in time.
TEST_F(DaemonP2pTest, KilledPeerEndsPendingSendsAndReceivesWithPeer) {
  gw::testing::CleanEnv env;
  const std::string addr = "127.0.0.1:" + std::to_string(gw::testing::free_port());
  ::setenv("GW_DAEMON", ("unix:" + daemon_->socket()).c_str(), 1);
  ::setenv("GW_DP_CHILD_STORE", addr.c_str(), 1);
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof(self) - 1), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl(self, self, "--gtest_filter=DaemonP2pChild.Killed", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ASSERT_GT(child, 0);
  ::unsetenv("GW_DP_CHILD_STORE");
  constexpr int kTimeoutMs = 8000;
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 0;
  cfg.world_size = 2;
  cfg.store_addr = addr.c_str();
  cfg.timeout_ms = kTimeoutMs;
  gw_comm_t c = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  std::vector<uint8_t> big(1 << 20, 1), in(64, 0);
  gw_request_t qs = nullptr, qr = nullptr;
  ASSERT_EQ(gw_isend(c, big.data(), big.size(), GW_UINT8, 1, 5, &qs), GW_OK) << last_error();
  ASSERT_EQ(gw_irecv(c, in.data(), in.size(), GW_UINT8, 1, 6, &qr), GW_OK) << last_error();
  ASSERT_EQ(gw_barrier(c), GW_OK) << last_error();  // the child then dies
  const auto t0 = std::chrono::steady_clock::now();
  const gw_status_t ss = gw_wait(qs, -1);
  const std::string se = last_error();
  const gw_status_t rs = gw_wait(qr, -1);
  const std::string re = last_error();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(ss, GW_ERR_PEER) << se;
  EXPECT_EQ(rs, GW_ERR_PEER) << re;
  EXPECT_NE(re.find("rank 1"), std::string::npos) << re;
  EXPECT_LT(ms, kTimeoutMs + 4000);
  std::printf("FIGURE killed peer: pending send and receive ended after %.0f ms\n", ms);
  EXPECT_EQ(gw_comm_destroy(c), GW_OK) << last_error();
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
}

TEST(DaemonP2pChild, Killed) {
  const char* store = ::getenv("GW_DP_CHILD_STORE");
  if (store == nullptr) GTEST_SKIP() << "started only by KilledPeerEndsPendingSends...";
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = 1;
  cfg.world_size = 2;
  cfg.store_addr = store;
  cfg.timeout_ms = 8000;
  gw_comm_t c = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  std::vector<uint8_t> in(64);
  gw_request_t q = nullptr;
  ASSERT_EQ(gw_irecv(c, in.data(), in.size(), GW_UINT8, 0, 99, &q), GW_OK);  // never matched
  ASSERT_EQ(gw_barrier(c), GW_OK) << last_error();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::raise(SIGKILL);
}

// 2 daemons (two host identities) x 2 trainers (child processes: this binary again, as
// DaemonP2pChild.TwoHosts), ranks interleaved over the hosts (0 and 2 on host a, 1 and 3 on b):
// the pairs of one host exchange every size, through their daemon, beside an allreduce that
// crosses the daemons; a peer on the other host gets its message through the daemons.
TEST(DaemonP2pTwoHosts, TwoDaemonsTwoTrainersEach) {
  gw::testing::CleanEnv env;
  gw::testing::TwoHosts hosts(GW_GRADWIRED_PATH, "gw-dp", {"dp-host-a", "dp-host-b"});
  ASSERT_TRUE(hosts.ready());
  gw::testing::reap_within(hosts.start("DaemonP2pChild.TwoHosts", 4, {"GW_DAEMON_ARENA=64M"}), 120,
                           "trainer");
}

TEST(DaemonP2pChild, TwoHosts) {
  const auto place = gw::testing::trainer_place();
  if (!place) GTEST_SKIP() << "started only by TwoDaemonsTwoTrainersEach";
  const int rank = place->rank;
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = place->world;
  cfg.store_addr = place->store.c_str();
  cfg.timeout_ms = 30000;
  gw_comm_t c = nullptr;
  ASSERT_EQ(gw_comm_init(&c, &cfg), GW_OK) << last_error();
  const int mate = rank ^ 2;   // the other trainer of this host
  const int other = rank ^ 1;  // a trainer of the other host
  int tag = 30;
  for (size_t bytes : {size_t{0}, size_t{8}, size_t{16385}, size_t{4} << 20}) {
    std::vector<uint8_t> out(bytes), in(bytes, 0);
    for (size_t i = 0; i < bytes; ++i) out[i] = pattern(rank, mate, tag, i);
    gw_request_t qs = nullptr, qr = nullptr;
    ASSERT_EQ(gw_irecv(c, in.data(), bytes, GW_UINT8, mate, tag, &qr), GW_OK) << last_error();
    ASSERT_EQ(gw_isend(c, out.data(), bytes, GW_UINT8, mate, tag, &qs), GW_OK) << last_error();
    float x = 1.0f;
    ASSERT_EQ(gw_allreduce(c, &x, &x, 1, GW_FLOAT32, GW_SUM), GW_OK) << last_error();
    EXPECT_EQ(x, 4.0f);
    ASSERT_EQ(gw_wait(qr, -1), GW_OK) << last_error();
    ASSERT_EQ(gw_wait(qs, -1), GW_OK) << last_error();
    for (size_t i = 0; i < bytes; ++i) {
      if (in[i] != pattern(mate, rank, tag, i)) {
        ADD_FAILURE() << bytes << " bytes from rank " << mate << ": wrong at " << i;
        break;
      }
    }
    ++tag;
  }
  int32_t v = rank * 10, w = -1;
  gw_request_t q = nullptr;
  ASSERT_EQ(gw_irecv(c, &w, 1, GW_INT32, other, 1, &q), GW_OK) << last_error();
  EXPECT_EQ(gw_send(c, &v, 1, GW_INT32, other, 1), GW_OK) << last_error();
  EXPECT_EQ(gw_wait(q, -1), GW_OK) << last_error();
  EXPECT_EQ(w, other * 10);
  EXPECT_EQ(gw_barrier(c), GW_OK) << last_error();
  EXPECT_EQ(gw_comm_destroy(c), GW_OK) << last_error();
}

}  // namespace

// A test killed by ctest's timeout must not leave its gradwired behind (LocalDaemon's
// PR_SET_PDEATHSIG): a child test starts a daemon and says its pid; the child is killed; the
// daemon must be gone (or a zombie waiting for a reaper) within 5 s.
TEST(LocalDaemonLife, DaemonDiesWithAKilledTest) {
  char path[] = "/tmp/gw-ldl-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  gw::testing::ExecChild child("LocalDaemonLifeChild.Run",
                               {std::string("GW_LDL_PID_FILE=") + path});
  ASSERT_TRUE(child.started());
  pid_t daemon = 0;
  for (int i = 0; i < 200 && daemon <= 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (FILE* f = std::fopen(path, "r")) {
      if (std::fscanf(f, "%d", &daemon) != 1) daemon = 0;
      std::fclose(f);
    }
  }
  ::unlink(path);
  ASSERT_GT(daemon, 0) << "the child never said its daemon's pid";
  child.kill_now();
  auto alive = [daemon] {
    FILE* f = std::fopen(("/proc/" + std::to_string(daemon) + "/stat").c_str(), "r");
    if (f == nullptr) return false;
    char state = '?';
    const int n = std::fscanf(f, "%*d (%*[^)]) %c", &state);
    std::fclose(f);
    return n == 1 && state != 'Z' && state != 'X';
  };
  bool gone = false;
  for (int i = 0; i < 100 && !(gone = !alive()); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!gone) ::kill(daemon, SIGKILL);
  EXPECT_TRUE(gone) << "gradwired " << daemon << " outlived the test that started it";
}

TEST(LocalDaemonLifeChild, Run) {
  const char* out = ::getenv("GW_LDL_PID_FILE");
  if (out == nullptr) GTEST_SKIP() << "started only by LocalDaemonLife.DaemonDiesWithAKilledTest";
  gw::testing::LocalDaemon d(GW_GRADWIRED_PATH, "gw-ldl");
  ASSERT_TRUE(d.ready());
  FILE* f = std::fopen(out, "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f, "%d\n", static_cast<int>(d.pid()));
  std::fclose(f);
  std::this_thread::sleep_for(std::chrono::seconds(60));  // killed long before
}
