// Point-to-point in daemon mode, the parts without a daemon (part of daemon_p2p_test; the rest:
// daemon_p2p_test.cc): the daemon's matching board alone (P2pBoard over plain buffers): order per
// sender and tag, any-source, eager and rendezvous truncation, self-send, a member that leaves, a
// peer of another host refused when the board has no link to the other hosts, a failure ending
// every pending request; the hello's version check; the daemons' cross-host header (goodbye,
// inline payloads).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "daemon/job_p2p.h"
#include "daemon/p2p_xhost_wire.h"
#include "gradwire/gradwire.h"

namespace {
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

// Issue 28: device messages of another host held on the board (their bytes wait at the sending
// daemon) are refused through the link when no receive will take them: when their receiving
// member leaves (only its own, with the reason), and when everything fails (all). One a receive
// already claimed is not refused again; host messages held in CPU memory need no refusal.
struct FakeLink : gw::daemon::P2pRemoteLink {
  void touch() override {}
  void forward(size_t, const gw::daemon::Request&, const gw::daemon::P2pDevice&) override {}
  void claim_device(std::shared_ptr<gw::daemon::P2pRemoteMsg> msg) override {
    claimed.push_back(msg->payload_tag);
  }
  void refuse_device(const gw::daemon::P2pRemoteMsg& msg, const gw::Status& why) override {
    refused.push_back({msg.payload_tag, msg.dst, why.message()});
  }
  gw::Status reachable(int32_t) const override { return gw::ok_status(); }
  struct Refusal {
    int32_t payload_tag, dst;
    std::string why;
  };
  std::vector<int32_t> claimed;
  std::vector<Refusal> refused;
};

TEST(P2pBoard, HeldDeviceMessagesAreRefusedWhenNoReceiveWillTakeThem) {
  // Ranks 0 and 2 here (host 0), 1 and 3 on host 1.
  Board b({0, 2}, {0, 1, 0, 1}, 0);
  FakeLink link;
  b.board->set_link(&link);
  auto used = std::make_shared<uint64_t>(0);
  auto held = [&](size_t member, int32_t src, int32_t tag, int32_t payload_tag) {
    auto m = std::make_shared<gw::daemon::P2pRemoteMsg>(0, used);
    m->src = src;
    m->tag = tag;
    m->device = true;
    m->size = 1 << 20;
    m->host = 1;
    m->payload_tag = payload_tag;
    m->dst = b.board->rank_of(member);
    b.board->add_remote(member, src, tag, m);
  };
  held(0, 1, 5, 0x40000001);
  held(0, 3, 6, 0x40000002);
  held(1, 1, 5, 0x40000003);
  held(1, 1, 7, 0x40000004);
  // A host message held in CPU memory for member 0: nothing waits at its sender.
  auto host_msg = std::make_shared<gw::daemon::P2pRemoteMsg>(8, used);
  host_msg->src = 1;
  host_msg->tag = 9;
  b.board->add_remote(0, 1, 9, host_msg);
  // Member 1 (rank 2) takes one of its two: claimed, not refused later.
  b.recv(1, 1, 1, 7, 0, 1 << 20);
  ASSERT_EQ(link.claimed, std::vector<int32_t>{0x40000004});
  // Member 0 leaves: its two device messages are refused, naming it; member 1's stay.
  b.board->drop_member(0, gw::peer_error("rank 0 left the job"));
  ASSERT_EQ(link.refused.size(), 2u);
  EXPECT_EQ(link.refused[0].payload_tag, 0x40000001);
  EXPECT_EQ(link.refused[1].payload_tag, 0x40000002);
  EXPECT_EQ(link.refused[0].dst, 0);
  EXPECT_NE(link.refused[0].why.find("rank 0"), std::string::npos) << link.refused[0].why;
  // Everything fails: member 1's held one is refused with that failure.
  b.board->fail_all(gw::aborted_error("the job has ended"));
  ASSERT_EQ(link.refused.size(), 3u);
  EXPECT_EQ(link.refused[2].payload_tag, 0x40000003);
  EXPECT_EQ(link.refused[2].dst, 2);
  EXPECT_NE(link.refused[2].why.find("the job has ended"), std::string::npos);
  EXPECT_EQ(b.board->pending(), 0u);
  b.board->set_link(nullptr);
}

// The refusal's header (kXhostRefuse, version 3): a device message's ranks, bytes and payload tag
// (in the device range), its reason as the tag, no payload; anything else is refused.
TEST(P2pXhostHeader, RefusalCarriesTheDeviceMessagesPayloadTagAndWhy) {
  using gw::daemon::kXhostDeviceTagFirst;
  using gw::daemon::kXhostRefuse;
  using gw::daemon::kXhostRefuseFailed;
  using gw::daemon::kXhostRefuseGone;
  using gw::daemon::XhostHeader;
  auto decode = [](const XhostHeader& h, size_t payload) {
    const auto b = gw::daemon::encode_xhost_header(h);
    std::vector<uint8_t> msg(b.begin(), b.end());
    msg.resize(msg.size() + payload, 0xab);
    return gw::daemon::decode_xhost_header(msg.data(), msg.size(), 4, 1 << 20);
  };
  for (const int32_t why : {kXhostRefuseGone, kXhostRefuseFailed}) {
    auto got = decode(XhostHeader{kXhostRefuse, 1, 2, why, 4096, kXhostDeviceTagFirst + 9}, 0);
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(got->flags, kXhostRefuse);
    EXPECT_EQ(got->payload_tag, kXhostDeviceTagFirst + 9);
    EXPECT_EQ(got->src, 1);
    EXPECT_EQ(got->dst, 2);
    EXPECT_EQ(got->tag, why);
  }
  const std::pair<XhostHeader, size_t> bad[] = {
      {XhostHeader{kXhostRefuse, 1, 2, 0, 0, kXhostDeviceTagFirst}, 0},  // no bytes
      {XhostHeader{kXhostRefuse, 1, 2, 0, 8, 7}, 0},                     // a low tag
      {XhostHeader{kXhostRefuse, 1, 2, 0, 8, kXhostDeviceTagFirst}, 8},  // bytes behind
      {XhostHeader{kXhostRefuse, 1, 9, 0, 8, kXhostDeviceTagFirst}, 0},  // a rank outside
      {XhostHeader{kXhostRefuse, 1, 2, 2, 8, kXhostDeviceTagFirst}, 0},  // no such reason
  };
  for (const auto& [h, payload] : bad) {
    auto r = decode(h, payload);
    ASSERT_FALSE(r.ok()) << "bytes " << h.bytes << " tag " << h.payload_tag << " why " << h.tag;
    EXPECT_EQ(r.status().code(), gw::Code::kPeer);
  }
}

}  // namespace
