// gradwired's engine in this process (daemon/server.h) against raw protocol clients: the rings and
// the arena end to end, local sums of every kind, and the refusals: garbage hellos, a foreign
// host, out-of-arena offsets, ring overflow, a client that disconnects mid-job (its job's other
// client gets kPeer and its arena is reclaimed), each counted, with other jobs unaffected.
// Also the client's allocator (daemon/arena_allocator.h) and the protocol's own checks.
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "core/net/backend_registry.h"
#include "core/sys/memfd_region.h"
#include "core/sys/unix_socket.h"
#include "daemon/arena_allocator.h"
#include "daemon/control.h"
#include "daemon/counters.h"
#include "daemon/protocol.h"
#include "daemon/reduce_pool.h"
#include "daemon/ring.h"
#include "daemon/server.h"
#include "daemon/transport_offer.h"

namespace gw::daemon {
namespace {

using namespace std::chrono_literals;

// A trainer speaking the protocol by hand.
struct RawClient {
  sys::Fd sock;
  sys::MemfdRegion arena;
  sys::Fd sq, cq;
  Welcome geo;
  ArenaHeader* hdr = nullptr;
  uint8_t* data = nullptr;
  uint64_t seq = 1;
  RingProducer<SqEntry> sq_ring;
  RingConsumer<CqEntry> cq_ring;

  static Result<sys::Fd> dial(const std::string& path) {
    GW_ASSIGN_OR_RETURN(auto addr, sys::UnixAddress::path(path));
    return sys::connect_unix(addr, SOCK_STREAM);
  }

  // Sends `frame` as is; returns the daemon's welcome (and maps the arena when accepted).
  static Result<RawClient> join_raw(const std::string& path, const std::vector<uint8_t>& frame) {
    RawClient c;
    GW_ASSIGN_OR_RETURN(c.sock, dial(path));
    const auto deadline = sys::deadline_after_ms(5000);
    GW_RETURN_IF_ERROR(
        sys::send_with_fds(c.sock.get(), frame.data(), frame.size(), {}, deadline, "test hello"));
    std::vector<sys::Fd> fds;
    std::vector<uint8_t> in;
    uint8_t buf[2048];
    while (in.size() < kFrameHeaderBytes ||
           in.size() < kFrameHeaderBytes + *reinterpret_cast<const uint32_t*>(in.data())) {
      GW_ASSIGN_OR_RETURN(size_t n, sys::recv_with_fds(c.sock.get(), buf, sizeof(buf), &fds,
                                                       deadline, "test welcome"));
      if (n == 0) return peer_error("closed without a welcome");
      in.insert(in.end(), buf, buf + n);
    }
    GW_ASSIGN_OR_RETURN(
        c.geo, decode_welcome(in.data() + kFrameHeaderBytes, in.size() - kFrameHeaderBytes));
    if (c.geo.status != 0) return Status(static_cast<Code>(c.geo.status), c.geo.message);
    if (fds.size() != 3) return peer_error("{} descriptors", fds.size());
    GW_ASSIGN_OR_RETURN(c.arena, sys::MemfdRegion::map(std::move(fds[0]), c.geo.arena_bytes));
    c.sq = std::move(fds[1]);
    c.cq = std::move(fds[2]);
    c.hdr = static_cast<ArenaHeader*>(c.arena.data());
    c.data = static_cast<uint8_t*>(c.arena.data()) + c.geo.data_offset;
    c.sq_ring = RingProducer<SqEntry>(submission_ring(c.arena.data(), c.geo, c.sq.get()));
    c.cq_ring = RingConsumer<CqEntry>(completion_ring(c.arena.data(), c.geo, c.cq.get()));
    return c;
  }

  static Result<RawClient> join(const std::string& path, const Hello& h) {
    return join_raw(path, frame_message(encode_hello(h)));
  }

  // Pushes `e` as is (no check that the ring has room: the overflow tests want that) and signals
  // the eventfd whatever the daemon's polling flag says.
  void post_raw(const SqEntry& e) {
    sq_ring.push(e);
    kick();
  }
  void kick() { ASSERT_TRUE(signal_eventfd(sq.get()).ok()); }
  uint64_t post(SqEntry e) {
    e.seq = seq++;
    post_raw(e);
    return e.seq;
  }
  // The completion of `want`, or kTimeout / kPeer (connection closed).
  Status wait(uint64_t want, int ms = 10000) {
    const auto deadline = sys::deadline_after_ms(ms);
    for (;;) {
      if (cq_ring.posted()) {
        const CqEntry c = cq_ring.front();
        cq_ring.pop();
        Status carried;
        GW_RETURN_IF_ERROR(decode_completion(c, want, &carried));
        return carried;
      }
      if (sys::expired(deadline)) return timeout_error("no completion");
      pollfd p[2] = {{cq.get(), POLLIN, 0}, {sock.get(), POLLIN, 0}};
      ::poll(p, 2, 50);
      if (p[1].revents != 0 && !cq_ring.posted()) {
        return peer_error("daemon closed the connection");
      }
      if (p[0].revents != 0) cq_ring.drain_wake();
    }
  }
  template <typename T>
  T* at(uint64_t off) {
    return reinterpret_cast<T*>(data + off);
  }
};

SqEntry allreduce_entry(coll::DataType t, coll::ReduceOp op, uint64_t count, uint64_t s,
                        uint64_t r) {
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(Opcode::kAllreduce);
  e.dtype = static_cast<uint8_t>(t);
  e.op = static_cast<uint8_t>(op);
  e.count = count;
  e.send_off = s;
  e.recv_off = r;
  return e;
}

class DaemonServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gwd-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    ServerOptions o;
    o.socket_path = dir_ + "/gradwired.sock";
    o.host_id = "test-host";
    o.ring_entries = 8;
    o.max_arena_bytes = 8 << 20;
    o.reduce_threads = 3;  // large sums and copies split over the pool
    o.spin_us = 20;        // the job threads poll the rings before sleeping, as gradwired does
    auto s = Server::create(o);
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(*s);
    thread_ = std::thread([this] { run_status_ = server_->run(); });
  }
  void TearDown() override {
    if (server_) server_->stop();
    if (thread_.joinable()) thread_.join();
    EXPECT_TRUE(run_status_.ok()) << run_status_.message();
    server_.reset();
    ::rmdir(dir_.c_str());
  }

  Hello hello(const std::string& token, int rank = 0, int world = 1) {
    Hello h;
    h.rank = rank;
    h.world_size = world;
    h.local_rank = rank;
    h.local_size = world;
    h.arena_bytes = 2 << 20;
    h.timeout_ms = 5000;
    h.job_token = token;
    h.host_id = "test-host";
    return h;
  }

  // Waits until pred(stats) holds (the daemon's threads run beside the test).
  template <typename P>
  bool eventually(P pred) {
    for (int i = 0; i < 500; ++i) {
      if (pred(server_->stats())) return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

  std::string dir_;
  std::unique_ptr<Server> server_;
  std::thread thread_;
  Status run_status_;
};

TEST_F(DaemonServerTest, OneTrainerRunsEveryCollectiveThroughTheRings) {
  auto c = RawClient::join(server_->socket_path(), hello("solo"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  float* in = c->at<float>(0);
  for (int i = 0; i < 1000; ++i) in[i] = static_cast<float>(i);
  // More submissions than the ring holds, in batches that fit.
  for (int round = 0; round < 20; ++round) {
    uint64_t seq =
        c->post(allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 1000, 0, 8192));
    ASSERT_TRUE(c->wait(seq).ok());
  }
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(c->at<float>(8192)[i], static_cast<float>(i));
  SqEntry b{};
  b.opcode = static_cast<uint16_t>(Opcode::kBarrier);
  uint64_t s1 = c->post(b);
  SqEntry g{};
  g.opcode = static_cast<uint16_t>(Opcode::kAllgather);
  g.dtype = static_cast<uint8_t>(coll::DataType::kI64);
  g.count = 10;
  g.send_off = 0;
  g.recv_off = 65536;
  uint64_t s2 = c->post(g);
  EXPECT_TRUE(c->wait(s1).ok());
  EXPECT_TRUE(c->wait(s2).ok());
  EXPECT_EQ(0, std::memcmp(c->at<uint8_t>(0), c->at<uint8_t>(65536), 80));
  EXPECT_GE(server_->stats().collectives, 22u);
  EXPECT_EQ(server_->stats().live_arenas, 1u);
}

// Large enough (800 KB) that the local sum and the copy-back run in parts on the pool.
TEST_F(DaemonServerTest, LargeSumsRunOnThePool) {
  auto a = RawClient::join(server_->socket_path(), hello("pool", 0, 2));
  auto b = RawClient::join(server_->socket_path(), hello("pool", 1, 2));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  const int n = 200003;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < n; ++i) {
      a->at<int32_t>(0)[i] = i + round;
      b->at<int32_t>(0)[i] = 2 * i;
    }
    uint64_t sa =
        a->post(allreduce_entry(coll::DataType::kI32, coll::ReduceOp::kSum, n, 0, 1 << 20));
    uint64_t sb = b->post(allreduce_entry(coll::DataType::kI32, coll::ReduceOp::kSum, n, 0, 0));
    ASSERT_TRUE(a->wait(sa).ok());
    ASSERT_TRUE(b->wait(sb).ok());
    for (int i = 0; i < n; ++i) {
      ASSERT_EQ(a->at<int32_t>(1 << 20)[i], 3 * i + round) << i;
      ASSERT_EQ(b->at<int32_t>(0)[i], 3 * i + round) << i;
    }
  }
}

TEST_F(DaemonServerTest, TwoLocalTrainersAreSummed) {
  auto a = RawClient::join(server_->socket_path(), hello("pair", 0, 2));
  auto b = RawClient::join(server_->socket_path(), hello("pair", 1, 2));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  for (int i = 0; i < 513; ++i) {
    a->at<int32_t>(0)[i] = i;
    b->at<int32_t>(0)[i] = 2 * i;
  }
  for (coll::ReduceOp op : {coll::ReduceOp::kSum, coll::ReduceOp::kMax, coll::ReduceOp::kAvg}) {
    uint64_t sa = a->post(allreduce_entry(coll::DataType::kI32, op, 513, 0, 4096));
    uint64_t sb = b->post(allreduce_entry(coll::DataType::kI32, op, 513, 0, 0));  // in place
    ASSERT_TRUE(a->wait(sa).ok());
    ASSERT_TRUE(b->wait(sb).ok());
    for (int i = 0; i < 513; ++i) {
      const int want = op == coll::ReduceOp::kSum   ? 3 * i
                       : op == coll::ReduceOp::kMax ? 2 * i
                                                    : 3 * i / 2;
      ASSERT_EQ(a->at<int32_t>(4096)[i], want) << i;
      ASSERT_EQ(b->at<int32_t>(0)[i], want) << i;
    }
    for (int i = 0; i < 513; ++i) b->at<int32_t>(0)[i] = 2 * i;
  }
  // Broadcast from rank 1.
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(Opcode::kBroadcast);
  e.dtype = static_cast<uint8_t>(coll::DataType::kU8);
  e.root = 1;
  e.count = 100;
  e.send_off = e.recv_off = 1 << 16;
  std::memset(a->at<uint8_t>(1 << 16), 0, 100);
  std::memset(b->at<uint8_t>(1 << 16), 7, 100);
  uint64_t sa = a->post(e);
  uint64_t sb = b->post(e);
  ASSERT_TRUE(a->wait(sa).ok());
  ASSERT_TRUE(b->wait(sb).ok());
  EXPECT_EQ(a->at<uint8_t>(1 << 16)[99], 7);
  // Disagreeing counts fail both, with a message naming them.
  uint64_t da = a->post(allreduce_entry(coll::DataType::kI32, coll::ReduceOp::kSum, 10, 0, 0));
  uint64_t db = b->post(allreduce_entry(coll::DataType::kI32, coll::ReduceOp::kSum, 11, 0, 0));
  Status x = a->wait(da);
  EXPECT_EQ(x.code(), Code::kInvalidArg) << x.message();
  EXPECT_NE(x.message().find("disagree"), std::string::npos) << x.message();
  EXPECT_EQ(b->wait(db).code(), Code::kInvalidArg);
}

TEST_F(DaemonServerTest, StatsCountCollectivesByKindBytesAndPhases) {
  auto a = RawClient::join(server_->socket_path(), hello("metered", 0, 2));
  auto b = RawClient::join(server_->socket_path(), hello("metered", 1, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  for (int k = 0; k < 3; ++k) {
    uint64_t sa = a->post(allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 1000, 0, 0));
    uint64_t sb = b->post(allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 1000, 0, 0));
    ASSERT_TRUE(a->wait(sa).ok() && b->wait(sb).ok());
  }
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(Opcode::kBroadcast);
  e.dtype = static_cast<uint8_t>(coll::DataType::kU8);
  e.root = 1;
  e.count = 100;
  e.send_off = e.recv_off = 1 << 16;
  uint64_t sa = a->post(e);
  uint64_t sb = b->post(e);
  ASSERT_TRUE(a->wait(sa).ok() && b->wait(sb).ok());
  SqEntry bar{};
  bar.opcode = static_cast<uint16_t>(Opcode::kBarrier);
  sa = a->post(bar);
  sb = b->post(bar);
  ASSERT_TRUE(a->wait(sa).ok() && b->wait(sb).ok());
  sa = a->post(allreduce_entry(coll::DataType::kI32, coll::ReduceOp::kSum, 10, 0, 0));
  sb = b->post(allreduce_entry(coll::DataType::kI32, coll::ReduceOp::kSum, 11, 0, 0));
  EXPECT_EQ(a->wait(sa).code(), Code::kInvalidArg);
  EXPECT_EQ(b->wait(sb).code(), Code::kInvalidArg);

  const ServerStats st = server_->stats();
  auto kind = [&](Opcode op, int result) { return st.by_opcode[static_cast<int>(op) - 1][result]; };
  EXPECT_EQ(kind(Opcode::kAllreduce, 0), 3u);
  EXPECT_EQ(kind(Opcode::kAllreduce, 1), 1u);
  EXPECT_EQ(kind(Opcode::kBroadcast, 0), 1u);
  EXPECT_EQ(kind(Opcode::kBarrier, 0), 1u);
  EXPECT_EQ(kind(Opcode::kAllgather, 0), 0u);
  EXPECT_EQ(st.errors[static_cast<int>(ErrorKind::kCollective)], 1u);
  EXPECT_EQ(st.collective_errors[static_cast<int>(Code::kInvalidArg)], 1u);
  // Arena bytes: each allreduce reads both trainers' 4000 bytes and writes both; the broadcast
  // reads the root's 100 and writes the other's.
  EXPECT_EQ(st.arena_bytes_in, 3u * 2 * 4000 + 100);
  EXPECT_EQ(st.arena_bytes_out, 3u * 2 * 4000 + 100);
  // One host: nothing crossed to another daemon; the offered transport is listed, at zero.
  EXPECT_EQ(st.inter_bytes_in + st.inter_bytes_out, 0u);
  ASSERT_EQ(st.inter.size(), 1u);
  EXPECT_EQ(st.inter[0].transport, "tcp");
  EXPECT_EQ(st.inter[0].in + st.inter[0].out, 0u);
  // Phases: the 4 data collectives had a local reduce and a copy-back; nothing went inter-host.
  for (Phase p : {Phase::kLocalReduce, Phase::kCopyBack}) {
    const DurationHistogram& h = st.phases[static_cast<int>(p)];
    EXPECT_EQ(h.count, 4u) << phase_name(p);
    uint64_t in_buckets = 0;
    for (uint64_t c : h.buckets) in_buckets += c;
    EXPECT_EQ(in_buckets, h.count) << phase_name(p);
    EXPECT_GT(h.sum_s, 0) << phase_name(p);
    EXPECT_LT(h.sum_s, 10) << phase_name(p);
  }
  EXPECT_EQ(st.phases[static_cast<int>(Phase::kInterHost)].count, 0u);
}

TEST_F(DaemonServerTest, GarbageAndForeignHellosAreRefusedAndCounted) {
  auto good = RawClient::join(server_->socket_path(), hello("bystander"));
  ASSERT_TRUE(good.ok()) << good.status().message();

  // Random bytes with a plausible length.
  std::vector<uint8_t> junk = {40, 0, 0, 0};
  for (int i = 0; i < 40; ++i) junk.push_back(static_cast<uint8_t>(i * 37));
  auto r1 = RawClient::join_raw(server_->socket_path(), junk);
  EXPECT_FALSE(r1.ok());
  EXPECT_EQ(r1.status().code(), Code::kPeer) << r1.status().message();
  // A length beyond the bound.
  std::vector<uint8_t> huge = {0, 0, 1, 0, 1, 2, 3};
  EXPECT_FALSE(RawClient::join_raw(server_->socket_path(), huge).ok());
  // Another host's trainer.
  Hello foreign = hello("foreign");
  foreign.host_id = "other-host";
  auto r3 = RawClient::join(server_->socket_path(), foreign);
  ASSERT_FALSE(r3.ok());
  EXPECT_NE(r3.status().message().find("host identity"), std::string::npos)
      << r3.status().message();
  // An arena beyond the daemon's cap.
  Hello greedy = hello("greedy");
  greedy.arena_bytes = 64 << 20;
  auto r4 = RawClient::join(server_->socket_path(), greedy);
  ASSERT_FALSE(r4.ok());
  EXPECT_EQ(r4.status().code(), Code::kNoMemory) << r4.status().message();
  EXPECT_TRUE(eventually([](const ServerStats& s) { return s.refused >= 4; }));
  // By kind: junk, the oversized hello and the foreign host are hello errors; the arena, capacity.
  const ServerStats st = server_->stats();
  EXPECT_EQ(st.errors[static_cast<int>(ErrorKind::kHello)], 3u);
  EXPECT_EQ(st.errors[static_cast<int>(ErrorKind::kCapacity)], 1u);
  EXPECT_EQ(st.errors[static_cast<int>(ErrorKind::kProtocol)], 0u);
  EXPECT_EQ(st.errors[static_cast<int>(ErrorKind::kCredentials)], 0u);

  uint64_t seq = good->post(allreduce_entry(coll::DataType::kF64, coll::ReduceOp::kSum, 8, 0, 64));
  EXPECT_TRUE(good->wait(seq).ok());
}

TEST_F(DaemonServerTest, BadSubmissionsCutTheClientOnly) {
  auto good = RawClient::join(server_->socket_path(), hello("good"));
  ASSERT_TRUE(good.ok()) << good.status().message();
  const uint64_t refused0 = server_->stats().refused;

  // An offset past the arena.
  auto out = RawClient::join(server_->socket_path(), hello("out-of-arena"));
  ASSERT_TRUE(out.ok());
  uint64_t s = out->post(
      allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 16, out->geo.data_bytes - 8, 0));
  EXPECT_EQ(out->wait(s).code(), Code::kPeer);
  // Ring overflow: the tail moved further than the ring holds.
  auto over = RawClient::join(server_->socket_path(), hello("overflow"));
  ASSERT_TRUE(over.ok());
  over->hdr->sq_tail.store(over->geo.sq_entries + 5);
  over->kick();
  EXPECT_EQ(over->wait(1).code(), Code::kPeer);
  // A sequence number out of order and an unknown opcode.
  auto seqc = RawClient::join(server_->socket_path(), hello("bad-seq"));
  ASSERT_TRUE(seqc.ok());
  SqEntry bad = allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 1, 0, 0);
  bad.seq = 7;
  seqc->post_raw(bad);
  EXPECT_EQ(seqc->wait(7).code(), Code::kPeer);
  auto opc = RawClient::join(server_->socket_path(), hello("bad-op"));
  ASSERT_TRUE(opc.ok());
  SqEntry weird{};
  weird.opcode = 99;
  EXPECT_EQ(opc->wait(opc->post(weird)).code(), Code::kPeer);

  EXPECT_TRUE(eventually([&](const ServerStats& st) {
    return st.refused >= refused0 + 4 && st.live_clients == 1;
  })) << server_->stats().refused;
  EXPECT_EQ(server_->stats().errors[static_cast<int>(ErrorKind::kProtocol)], 4u);
  EXPECT_EQ(server_->stats().errors[static_cast<int>(ErrorKind::kHello)], 0u);
  uint64_t g = good->post(allreduce_entry(coll::DataType::kU8, coll::ReduceOp::kMax, 3, 0, 64));
  EXPECT_TRUE(good->wait(g).ok());
}

TEST_F(DaemonServerTest, ADisconnectedTrainerFailsItsJobAndItsArenaIsReclaimed) {
  auto a = RawClient::join(server_->socket_path(), hello("lost", 0, 2));
  auto b = RawClient::join(server_->socket_path(), hello("lost", 1, 2));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(server_->stats().live_arenas, 2u);
  uint64_t s = a->post(allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 100, 0, 0));
  std::this_thread::sleep_for(20ms);
  *b = RawClient();  // b "dies": socket closed, arena unmapped
  Status st = a->wait(s);
  EXPECT_EQ(st.code(), Code::kPeer) << st.message();
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_TRUE(eventually([](const ServerStats& x) { return x.live_arenas == 1; }));
  // Later calls of the job fail the same way, promptly.
  EXPECT_EQ(
      a->wait(a->post(allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 1, 0, 0))).code(),
      Code::kPeer);
  *a = RawClient();
  EXPECT_TRUE(
      eventually([](const ServerStats& x) { return x.live_arenas == 0 && x.live_jobs == 0; }));
}

TEST_F(DaemonServerTest, ASecondDaemonOnTheSameSocketIsRefused) {
  ServerOptions o;
  o.socket_path = server_->socket_path();
  o.host_id = "test-host";
  auto again = Server::create(o);
  EXPECT_FALSE(again.ok());
}

// Sends `bytes` on the control socket as they are; returns what the daemon answered (the body of
// its frame) once it closes the connection.
Result<std::vector<uint8_t>> raw_control(const std::string& ctl,
                                         const std::vector<uint8_t>& bytes) {
  GW_ASSIGN_OR_RETURN(sys::Fd sock, RawClient::dial(ctl));
  const auto deadline = sys::deadline_after_ms(10000);
  if (!bytes.empty()) {
    GW_RETURN_IF_ERROR(
        sys::send_with_fds(sock.get(), bytes.data(), bytes.size(), {}, deadline, "test control"));
  }
  std::vector<uint8_t> in;
  uint8_t buf[4096];
  for (;;) {
    std::vector<sys::Fd> fds;
    GW_ASSIGN_OR_RETURN(size_t n, sys::recv_with_fds(sock.get(), buf, sizeof(buf), &fds, deadline,
                                                     "test control answer"));
    if (n == 0) break;
    in.insert(in.end(), buf, buf + n);
  }
  if (in.size() < 4) return peer_error("answer of {} bytes", in.size());
  uint32_t len;
  std::memcpy(&len, in.data(), 4);
  if (in.size() != 4 + size_t{len}) return peer_error("frame of {} for {} bytes", len, in.size());
  return std::vector<uint8_t>(in.begin() + 4, in.end());
}

TEST_F(DaemonServerTest, ControlSocketDescribesTheDaemonItsJobsAndClients) {
  const std::string ctl = control_socket_path(server_->socket_path());
  struct stat st {};
  ASSERT_EQ(::stat(ctl.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 077, 0u);  // its owner's only, like the trainers' socket

  auto a = RawClient::join(server_->socket_path(), hello("pair", 0, 2));
  auto b = RawClient::join(server_->socket_path(), hello("pair", 1, 2));
  auto solo = RawClient::join(server_->socket_path(), hello("solo"));
  ASSERT_TRUE(a.ok() && b.ok() && solo.ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(solo->wait(solo->post(allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum,
                                                      10, 0, 4096)))
                    .ok());
  }

  auto status = control_call(ctl, ControlCommand::kStatus, 5000);
  ASSERT_TRUE(status.ok()) << status.status().message();
  EXPECT_EQ((*status)["pid"].get<int64_t>(), ::getpid());
  EXPECT_EQ((*status)["clients"].get<int>(), 3);
  EXPECT_EQ((*status)["jobs"].get<int>(), 2);
  EXPECT_EQ((*status)["host_id"], "test-host");
  EXPECT_EQ((*status)["socket"], server_->socket_path());
  EXPECT_GE((*status)["collectives"].get<int>(), 3);

  auto jobs = control_call(ctl, ControlCommand::kJobs, 5000);
  ASSERT_TRUE(jobs.ok()) << jobs.status().message();
  ASSERT_EQ(jobs->size(), 2u);
  int pairs = 0;
  for (const auto& j : *jobs) {
    EXPECT_EQ(j["job"].get<std::string>().size(), 16u);  // a hash, never the token
    EXPECT_EQ(j["state"], "running");
    if (j["world"] == 2) {
      ++pairs;
      EXPECT_EQ(j["local_trainers"], 2);
      EXPECT_EQ(j["collectives"], 0);
    } else {
      EXPECT_EQ(j["collectives"], 3);
    }
  }
  EXPECT_EQ(pairs, 1);

  auto clients = control_call(ctl, ControlCommand::kClients, 5000);
  ASSERT_TRUE(clients.ok()) << clients.status().message();
  ASSERT_EQ(clients->size(), 3u);
  int ranks = 0;
  for (const auto& c : *clients) {
    EXPECT_EQ(c["pid"].get<int64_t>(), ::getpid());
    EXPECT_EQ(c["uid"].get<int64_t>(), ::geteuid());
    EXPECT_EQ(c["arena_bytes"], 2 << 20);
    ranks += c["rank"].get<int>();
    if (c["requests"] == 3) {
      EXPECT_EQ(c["rank"], 0);
    }
  }
  EXPECT_EQ(ranks, 1);

  auto cfg = control_call(ctl, ControlCommand::kConfig, 5000);
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  bool socket_row = false;
  for (const auto& r : *cfg) socket_row = socket_row || r["name"] == "GW_DAEMON_SOCKET";
  EXPECT_TRUE(socket_row);

  // The pair's trainers leave: the job goes from the answer.
  *a = RawClient();
  *b = RawClient();
  ASSERT_TRUE(eventually([](const ServerStats& x) { return x.live_jobs == 1; }));
  jobs = control_call(ctl, ControlCommand::kJobs, 5000);
  ASSERT_TRUE(jobs.ok());
  EXPECT_EQ(jobs->size(), 1u);
}

TEST_F(DaemonServerTest, ControlSocketRefusesMalformedRequestsAndGoesOn) {
  const std::string ctl = control_socket_path(server_->socket_path());
  auto refused = [&](const std::vector<uint8_t>& bytes, const std::string& why) {
    auto body = raw_control(ctl, bytes);
    ASSERT_TRUE(body.ok()) << body.status().message();
    auto r = decode_control_response(body->data(), body->size(), ControlCommand::kStatus);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kInvalidArg) << r.status().message();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  };
  auto text = [](const std::string& s) { return frame_control(s); };
  refused(text("{not json"), "not valid JSON");
  refused(text("[1,2]"), "not a JSON object");
  refused(text(R"({"version":2,"command":"status"})"), "version 2");
  refused(text(R"({"version":1,"command":"reboot"})"), "unknown control command");
  refused(text(R"({"version":1})"), "no string 'command'");
  refused(text(std::string(40, '[')), "deeper");
  std::vector<uint8_t> huge = {0xff, 0xff, 0xff, 0x7f, '{'};
  refused(huge, "at most");
  std::vector<uint8_t> extra = text(encode_control_request(ControlCommand::kStatus));
  extra.push_back('x');
  refused(extra, "bytes after");
  // Silence: the daemon answers with a timeout after its deadline rather than holding on.
  refused({}, "within");
  // The daemon still answers a good request.
  auto ok = raw_control(ctl, text(encode_control_request(ControlCommand::kJobs)));
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(decode_control_response(ok->data(), ok->size(), ControlCommand::kJobs).ok());
  // None of that touched the trainers' side.
  EXPECT_EQ(server_->stats().refused, 0u);
  auto c = RawClient::join(server_->socket_path(), hello("after"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(control_call(ctl, ControlCommand::kStatus, 5000).ok());
}

TEST(DaemonControl, NoDaemonIsAClearError) {
  auto r = control_call("/tmp/gwd-no-such-dir/x.sock.ctl", ControlCommand::kStatus, 1000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kPeer);
  EXPECT_NE(r.status().message().find("no gradwired listens on /tmp/gwd-no-such-dir/x.sock.ctl"),
            std::string::npos)
      << r.status().message();
}

TEST(DaemonControl, AnswersAreCheckedAgainstTheirCommand) {
  nlohmann::json st = {{"version", "0"},
                       {"pid", 1},
                       {"uptime_s", 0.5},
                       {"socket", "s"},
                       {"control_socket", "c"},
                       {"transport", "tcp"},
                       {"host_id", "h"},
                       {"clients", 0},
                       {"jobs", 0},
                       {"arenas", 0},
                       {"accepted", 0},
                       {"refused", 0},
                       {"collectives", 0},
                       {"failed", 0}};
  auto dec = [](const std::string& body, ControlCommand c) {
    return decode_control_response(reinterpret_cast<const uint8_t*>(body.data()), body.size(), c);
  };
  EXPECT_TRUE(
      dec(encode_control_result(ControlCommand::kStatus, st), ControlCommand::kStatus).ok());
  // The answer to another command, a missing field, a field of the wrong type.
  EXPECT_EQ(dec(encode_control_result(ControlCommand::kStatus, st), ControlCommand::kJobs)
                .status()
                .code(),
            Code::kPeer);
  nlohmann::json missing = st;
  missing.erase("pid");
  EXPECT_EQ(dec(encode_control_result(ControlCommand::kStatus, missing), ControlCommand::kStatus)
                .status()
                .code(),
            Code::kPeer);
  nlohmann::json wrong = st;
  wrong["clients"] = "three";
  EXPECT_EQ(dec(encode_control_result(ControlCommand::kStatus, wrong), ControlCommand::kStatus)
                .status()
                .code(),
            Code::kPeer);
  EXPECT_EQ(dec(encode_control_result(ControlCommand::kJobs, nlohmann::json::array({1})),
                ControlCommand::kJobs)
                .status()
                .code(),
            Code::kPeer);
  auto refusal = dec(encode_control_error(invalid_arg("nope")), ControlCommand::kStatus);
  EXPECT_EQ(refusal.status().code(), Code::kInvalidArg);
  EXPECT_NE(refusal.status().message().find("nope"), std::string::npos);
  // A request: bounded, versioned, a known command.
  const std::string req = encode_control_request(ControlCommand::kClients);
  auto back = decode_control_request(reinterpret_cast<const uint8_t*>(req.data()), req.size());
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, ControlCommand::kClients);
  std::string big = R"({"version":1,"command":"status","pad":")" + std::string(2000, 'x') + R"("})";
  EXPECT_FALSE(
      decode_control_request(reinterpret_cast<const uint8_t*>(big.data()), big.size()).ok());
}

TEST(DaemonServerRestart, AStaleSocketFileIsReplaced) {
  char tmpl[] = "/tmp/gwd-stale-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/s.sock";
  {
    // A daemon that died: its socket file stays, nobody listens on it.
    auto addr = sys::UnixAddress::path(path);
    ASSERT_TRUE(addr.ok());
    auto fd = sys::listen_unix(*addr, SOCK_STREAM, 1);
    ASSERT_TRUE(fd.ok());
  }
  ASSERT_EQ(::access(path.c_str(), F_OK), 0);
  ServerOptions o;
  o.socket_path = path;
  o.host_id = "h";
  auto s = Server::create(o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  s->reset();
  EXPECT_NE(::access(path.c_str(), F_OK), 0);  // removed on the way out
  // A file that is not a socket is left alone.
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  EXPECT_FALSE(Server::create(o).ok());
  ::unlink(path.c_str());
  ::rmdir(tmpl);
}

TEST(DaemonProtocol, HelloRoundTripAndBounds) {
  Hello h;
  h.rank = 2;
  h.world_size = 4;
  h.num_hosts = 2;
  h.host_index = 1;
  h.local_rank = 1;
  h.local_size = 2;
  h.arena_bytes = 1 << 24;
  h.job_token = "t";
  h.store_host = "127.0.0.1";
  h.store_port = 1234;
  h.host_id = "h";
  auto bytes = encode_hello(h);
  auto back = decode_hello(bytes.data(), bytes.size());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->store_host, "127.0.0.1");
  EXPECT_EQ(back->local_size, 2);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(decode_hello(bytes.data(), cut).ok()) << cut;
  }
  Hello bad = h;
  bad.rank = 4;
  auto b1 = encode_hello(bad);
  EXPECT_FALSE(decode_hello(b1.data(), b1.size()).ok());
  bad = h;
  bad.store_host.clear();
  auto b2 = encode_hello(bad);
  EXPECT_FALSE(decode_hello(b2.data(), b2.size()).ok());
  bad = h;
  bad.version = kProtocolVersion + 1;
  auto b3 = encode_hello(bad);
  EXPECT_EQ(decode_hello(b3.data(), b3.size()).status().code(), Code::kUnsupported);
}

TEST(DaemonProtocol, GeometryAndRequestsStayInsideTheArena) {
  auto g = arena_geometry(1 << 20, 64);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->data_offset % kDataAlign, 0u);
  EXPECT_EQ(g->data_offset + g->data_bytes, uint64_t{1} << 20);
  EXPECT_FALSE(arena_geometry(1 << 20, 63).ok());
  EXPECT_FALSE(arena_geometry(8192, 64).ok());
  auto w = encode_welcome(*g);
  EXPECT_TRUE(decode_welcome(w.data(), w.size()).ok());
  Welcome shifted = *g;
  shifted.data_offset += 4096;
  auto w2 = encode_welcome(shifted);
  EXPECT_FALSE(decode_welcome(w2.data(), w2.size()).ok());

  std::vector<uint8_t> region(4096, 0);
  const uint8_t* d = region.data();
  SqEntry e = allreduce_entry(coll::DataType::kF64, coll::ReduceOp::kSum, 16, 0, 128);
  e.seq = 1;
  EXPECT_TRUE(decode_request(e, 1, d, 256, 1).ok());
  EXPECT_FALSE(decode_request(e, 1, d, 255, 1).ok());  // recv range ends past the region
  SqEntry coded = e;
  coded.key_len = 1;  // codec fields on a plain allreduce
  EXPECT_FALSE(decode_request(coded, 1, d, 256, 1).ok());
  coded = e;
  coded.stride = 1;  // a stride on an allreduce
  EXPECT_FALSE(decode_request(coded, 1, d, 256, 1).ok());
  e.count = (1ull << 61) + 1;  // bytes overflow
  EXPECT_FALSE(decode_request(e, 1, d, ~0ull, 1).ok());
  SqEntry ag{};
  ag.seq = 1;
  ag.opcode = static_cast<uint16_t>(Opcode::kAllgather);
  ag.dtype = static_cast<uint8_t>(coll::DataType::kF32);
  ag.count = 8;
  ag.recv_off = 64;
  EXPECT_TRUE(decode_request(ag, 1, d, 64 + 32 * 4, 4).ok());
  EXPECT_FALSE(decode_request(ag, 1, d, 64 + 32 * 4, 5).ok());  // 5 blocks do not fit
  // alltoall: world blocks on both sides.
  SqEntry a2a = ag;
  a2a.opcode = static_cast<uint16_t>(Opcode::kAlltoall);
  a2a.send_off = 0;
  a2a.recv_off = 128;
  auto a = decode_request(a2a, 1, d, 256, 4);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->send_bytes, 128u);
  EXPECT_EQ(a->recv_bytes, 128u);
  EXPECT_FALSE(decode_request(a2a, 1, d, 255, 4).ok());
  a2a.recv_off = 0;
  a2a.send_off = 129;  // the send side (4 blocks) ends past the region
  EXPECT_FALSE(decode_request(a2a, 1, d, 256, 4).ok());
  // A stride: the blocks of a slice lie that far apart (allgather's receive side,
  // reduce_scatter's send side, both of an alltoall's); 0 is packed.
  SqEntry st = ag;
  st.stride = 100;  // 4 blocks of 32 bytes, 100 apart: the last ends 332 bytes after recv_off
  auto sr = decode_request(st, 1, d, 64 + 332, 4);
  ASSERT_TRUE(sr.ok()) << sr.status().message();
  EXPECT_EQ(sr->recv_stride, 100u);
  EXPECT_EQ(sr->recv_bytes, 332u);
  EXPECT_EQ(sr->send_bytes, 32u);
  EXPECT_FALSE(decode_request(st, 1, d, 64 + 331, 4).ok());
  st.stride = 31;  // blocks that would overlap
  EXPECT_FALSE(decode_request(st, 1, d, 4096, 4).ok());
  st.stride = ~0ull / 2;  // the span overflows
  EXPECT_FALSE(decode_request(st, 1, d, ~0ull, 4).ok());
  SqEntry rs = st;
  rs.opcode = static_cast<uint16_t>(Opcode::kReduceScatter);
  rs.stride = 40;
  rs.send_off = 0;
  rs.recv_off = 200;
  auto rr = decode_request(rs, 1, d, 232, 4);
  ASSERT_TRUE(rr.ok()) << rr.status().message();
  EXPECT_EQ(rr->send_stride, 40u);
  EXPECT_EQ(rr->send_bytes, 3u * 40 + 32);
  EXPECT_EQ(rr->recv_bytes, 32u);
  a2a.send_off = 0;
  a2a.recv_off = 0;
  a2a.stride = 64;
  auto ar = decode_request(a2a, 1, d, 3 * 64 + 32, 4);
  ASSERT_TRUE(ar.ok()) << ar.status().message();
  EXPECT_EQ(ar->send_stride, 64u);
  EXPECT_EQ(ar->recv_stride, 64u);
  EXPECT_FALSE(decode_request(a2a, 1, d, 3 * 64 + 31, 4).ok());
  SqEntry bc{};
  bc.seq = 1;
  bc.opcode = static_cast<uint16_t>(Opcode::kBroadcast);
  bc.dtype = static_cast<uint8_t>(coll::DataType::kF32);
  bc.count = 8;
  EXPECT_TRUE(decode_request(bc, 1, d, 256, 4).ok());
  bc.stride = 32;  // only the collectives of world_size blocks take one
  EXPECT_FALSE(decode_request(bc, 1, d, 256, 4).ok());
  // An allreduce or a broadcast is one block however many ranks there are: up to the whole data
  // region, even where world_size of them would not fit (a chunk of a large world, an iallreduce).
  bc.stride = 0;
  bc.count = 64;  // 256 bytes: the whole region, of 64 ranks
  EXPECT_TRUE(decode_request(bc, 1, d, 256, 64).ok());
  SqEntry big = allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 64, 0, 0);
  big.seq = 1;
  auto bg = decode_request(big, 1, d, 256, 64);
  ASSERT_TRUE(bg.ok()) << bg.status().message();
  EXPECT_EQ(bg->send_bytes, 256u);
  EXPECT_EQ(bg->recv_bytes, 256u);
  EXPECT_FALSE(decode_request(big, 1, d, 255, 64).ok());
  SqEntry barrier{};
  barrier.seq = 1;
  barrier.opcode = static_cast<uint16_t>(Opcode::kBarrier);
  EXPECT_TRUE(decode_request(barrier, 1, d, 256, 4).ok());
  barrier.stride = 8;  // a barrier takes no arguments
  EXPECT_FALSE(decode_request(barrier, 1, d, 256, 4).ok());
  // allreduce_compressed: one buffer, float types, the spec and key copied out of the region.
  const std::string meta = "topk:0.01grad/layer1";
  std::memcpy(region.data() + 1024, meta.data(), meta.size());
  SqEntry c{};
  c.seq = 1;
  c.opcode = static_cast<uint16_t>(Opcode::kAllreduceCompressed);
  c.dtype = static_cast<uint8_t>(coll::DataType::kF32);
  c.count = 16;
  c.meta_off = 1024;
  c.spec_len = 9;
  c.key_len = 11;
  auto cr = decode_request(c, 1, d, region.size(), 2);
  ASSERT_TRUE(cr.ok()) << cr.status().message();
  EXPECT_EQ(cr->spec, "topk:0.01");
  EXPECT_EQ(cr->key, "grad/layer1");
  EXPECT_TRUE(decode_request(c, 1, d, region.size(), 100).ok());  // 100 x 64 bytes: one block
  SqEntry bad_c = c;
  bad_c.recv_off = 64;  // two buffers
  EXPECT_FALSE(decode_request(bad_c, 1, d, region.size(), 2).ok());
  bad_c = c;
  bad_c.dtype = static_cast<uint8_t>(coll::DataType::kI32);
  EXPECT_FALSE(decode_request(bad_c, 1, d, region.size(), 2).ok());
  bad_c = c;
  bad_c.key_len = 0;
  EXPECT_FALSE(decode_request(bad_c, 1, d, region.size(), 2).ok());
  bad_c = c;
  bad_c.spec_len = kMaxCodecSpecBytes + 1;
  EXPECT_FALSE(decode_request(bad_c, 1, d, region.size(), 2).ok());
  bad_c = c;
  bad_c.meta_off = region.size() - 10;  // the key runs past the region
  EXPECT_FALSE(decode_request(bad_c, 1, d, region.size(), 2).ok());
  // Its completion carries this trainer's share of the bytes sent; nothing else does.
  CompressedDone sent{12345, 1};
  CqEntry done = make_completion(7, ok_status(), &sent);
  Status carried = internal_error("unset");
  CompressedDone got;
  ASSERT_TRUE(decode_completion(done, 7, &carried, &got).ok());
  EXPECT_TRUE(carried.ok());
  EXPECT_EQ(got.bytes_sent, 12345u);
  EXPECT_EQ(got.nonfinite, 1u);
  done.msg_len = 5;
  EXPECT_FALSE(decode_completion(done, 7, &carried, &got).ok());
  EXPECT_FALSE(check_ring(10, 20, 8, "t").ok());
  EXPECT_FALSE(check_ring(10, 9, 8, "t").ok());  // tail behind head
  EXPECT_TRUE(check_ring(10, 18, 8, "t").ok());
}

TEST(DaemonReducePool, EveryPartRunsOnceAndRangesCoverTheBuffer) {
  ReducePool pool(3);
  EXPECT_EQ(pool.threads(), 3);
  std::vector<std::atomic<int>> hits(50);
  for (int round = 0; round < 200; ++round) {
    pool.run(hits.size(), [&](size_t p) { hits[p].fetch_add(1); });
  }
  for (auto& h : hits) EXPECT_EQ(h.load(), 200);
  // The caller's part 0 waits for part 1: only a worker can run it.
  std::atomic<bool> second{false};
  bool met = false;
  pool.run(2, [&](size_t p) {
    if (p == 1) {
      second.store(true);
      return;
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!second.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    met = second.load();
  });
  EXPECT_TRUE(met) << "no worker ran part 1 within 10 s";
  // Two callers at once: the one that finds the pool busy runs its parts itself; both complete.
  std::vector<std::atomic<int>> a(64), b(64);
  std::thread other([&] {
    for (int i = 0; i < 100; ++i) pool.run(a.size(), [&](size_t p) { a[p].fetch_add(1); });
  });
  for (int i = 0; i < 100; ++i) pool.run(b.size(), [&](size_t p) { b[p].fetch_add(1); });
  other.join();
  for (size_t p = 0; p < a.size(); ++p) EXPECT_EQ(a[p].load() + 0, 100) << p;
  for (size_t p = 0; p < b.size(); ++p) EXPECT_EQ(b[p].load() + 0, 100) << p;
  // Ranges: every element exactly once, whole cache lines but the last, small ones inline.
  for (size_t count : {size_t{1}, size_t{15}, size_t{1000003}, size_t{1} << 20}) {
    std::vector<uint8_t> seen(count, 0);
    std::atomic<int> calls{0};
    parallel_ranges(&pool, count, 4, 4096, [&](size_t first, size_t n) {
      calls.fetch_add(1);
      EXPECT_EQ(first % 16, 0u);
      for (size_t i = first; i < first + n; ++i) seen[i]++;
    });
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(seen[i], 1) << "count " << count << " at " << i;
    if (count * 4 < 8192) {
      EXPECT_EQ(calls.load(), 1) << count;
    }
  }
}

TEST(DaemonArenaAllocator, FirstFitCoalescesAndRefusesForeignOffsets) {
  ArenaAllocator a(1 << 12);
  auto x = a.alloc(100);
  auto y = a.alloc(1000);
  auto z = a.alloc(64);
  ASSERT_TRUE(x.ok() && y.ok() && z.ok());
  EXPECT_EQ(*x % 64, 0u);
  EXPECT_EQ(*y, 128u);
  EXPECT_FALSE(a.alloc(4096).ok());
  EXPECT_FALSE(a.free(*x + 64).ok());
  EXPECT_TRUE(a.free(*y).ok());
  EXPECT_FALSE(a.free(*y).ok());  // twice
  EXPECT_TRUE(a.free(*x).ok());
  EXPECT_TRUE(a.free(*z).ok());
  EXPECT_EQ(a.free_bytes(), 4096u);
  auto all = a.alloc(4096);  // coalesced back into one range
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 0u);
}

// Inter-host bytes are counted by the registry's backend names (not a list of the daemon's own):
// every registered backend has a slot, anything else is "other"; stats list the offered ones
// and any that carried bytes.
TEST(DaemonCounters, InterHostBytesByTheRegistrysTransports) {
  Counters registry;
  for (const std::string& name : net::backend_names()) {
    EXPECT_NE(registry.transport_slot(name), registry.other_slot()) << name;
  }
  Counters c({"tcp", "shm", "verbs"});
  EXPECT_EQ(c.transport_slot("no-such"), c.other_slot());
  c.inter(c.transport_slot("shm"), 3, 4);
  c.inter(c.transport_slot("no-such"), 1, 2);
  const ServerStats s = c.snapshot({"verbs", "tcp"});
  ASSERT_EQ(s.inter.size(), 4u);  // in slot order: tcp, shm, verbs, other
  EXPECT_EQ(s.inter[0].transport, "tcp");
  EXPECT_EQ(s.inter[0].in + s.inter[0].out, 0u);
  EXPECT_EQ(s.inter[1].transport, "shm");
  EXPECT_EQ(s.inter[1].in, 3u);
  EXPECT_EQ(s.inter[1].out, 4u);
  EXPECT_EQ(s.inter[2].transport, "verbs");
  EXPECT_EQ(s.inter[3].transport, "other");
  EXPECT_EQ(s.inter[3].in, 1u);
  EXPECT_EQ(s.inter_bytes_in, 4u);
  EXPECT_EQ(s.inter_bytes_out, 6u);
  EXPECT_EQ(s.transport, "verbs,tcp");
}

}  // namespace

// ---- which transport the daemons of a job use (daemon/transport_offer.h) ----------------------

namespace {

// A probe table: names given here have that verdict, others are unknown (kInvalidArg).
std::function<Status(const std::string&)> probes(std::map<std::string, Status> verdicts) {
  return [verdicts](const std::string& name) {
    auto it = verdicts.find(name);
    return it == verdicts.end() ? invalid_arg("transport '{}': unknown", name) : it->second;
  };
}

}  // namespace

TEST(DaemonTransportOffer, AutoOffersWhatThisDaemonOwnsBestFirstAndAlwaysTcp) {
  const auto none = probes(
      {{"tcp", ok_status()}, {"verbs", unsupported("no RDMA device")}, {"dpdk", ok_status()}});
  auto o = offer_transports("auto", none, /*dpdk_port=*/false);
  ASSERT_TRUE(o.ok()) << o.status().to_string();
  EXPECT_EQ(o->names, (std::vector<std::string>{"tcp"}));
  EXPECT_NE(o->reason.find("no RDMA device"), std::string::npos) << o->reason;
  EXPECT_NE(o->reason.find("GW_DPDK_EAL_ARGS is empty"), std::string::npos) << o->reason;
  o = offer_transports("auto", none, /*dpdk_port=*/true);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->names, (std::vector<std::string>{"dpdk", "tcp"}));
  const auto all = probes({{"tcp", ok_status()}, {"verbs", ok_status()}, {"dpdk", ok_status()}});
  o = offer_transports("auto", all, true);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->names, (std::vector<std::string>{"verbs", "dpdk", "tcp"}));
  // A build without dpdk or verbs (unknown names) still offers tcp.
  o = offer_transports("auto", probes({{"tcp", ok_status()}}), true);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->names, (std::vector<std::string>{"tcp"}));
}

TEST(DaemonTransportOffer, ANamedTransportIsOfferedAloneAndMustBeUsableHere) {
  const auto here = probes({{"tcp", ok_status()},
                            {"shm", ok_status()},
                            {"verbs", unsupported("no RDMA device")},
                            {"dpdk", ok_status()}});
  auto o = offer_transports("dpdk", here, false);
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->names, (std::vector<std::string>{"dpdk"}));
  o = offer_transports("verbs", here, false);
  EXPECT_EQ(o.status().code(), Code::kUnsupported);
  EXPECT_NE(o.status().message().find("no RDMA device"), std::string::npos);
  o = offer_transports("shm", here, false);
  EXPECT_EQ(o.status().code(), Code::kInvalidArg);
  EXPECT_NE(o.status().message().find("does not cross hosts"), std::string::npos);
  o = offer_transports("nosuch", here, false);
  EXPECT_EQ(o.status().code(), Code::kInvalidArg);
  EXPECT_NE(o.status().message().find("GW_DAEMON_TRANSPORT"), std::string::npos);
}

TEST(DaemonTransportOffer, AJobTakesHostZerosFirstChoiceThatEveryHostOffers) {
  using V = std::vector<std::string>;
  EXPECT_EQ(*agree_transport({V{"dpdk", "tcp"}, V{"dpdk", "tcp"}}), "dpdk");
  EXPECT_EQ(*agree_transport({V{"dpdk", "tcp"}, V{"tcp"}}), "tcp");
  EXPECT_EQ(*agree_transport({V{"tcp"}, V{"verbs", "tcp"}}), "tcp");
  EXPECT_EQ(*agree_transport({V{"verbs", "dpdk", "tcp"}, V{"dpdk", "verbs", "tcp"}}), "verbs");
  EXPECT_EQ(*agree_transport({V{"verbs", "tcp"}, V{"verbs", "tcp"}, V{"tcp"}}), "tcp");
  auto none = agree_transport({V{"dpdk"}, V{"tcp"}});
  EXPECT_EQ(none.status().code(), Code::kUnsupported);
  EXPECT_NE(none.status().message().find("host 0: dpdk; host 1: tcp"), std::string::npos)
      << none.status().message();
}

TEST(DaemonTransportOffer, OffersFromTheStoreAreChecked) {
  EXPECT_EQ(*decode_offer("dpdk,tcp"), (std::vector<std::string>{"dpdk", "tcp"}));
  EXPECT_EQ(encode_offer({"verbs", "tcp"}), "verbs,tcp");
  for (const std::string& bad : std::vector<std::string>{
           "", ",", "tcp,", ",tcp", "tcp,,dpdk", "TCP", "tcp dpdk", "tcp,tcp", "a,b,c,d,e,f,g,h,i",
           std::string(33, 'a'), std::string("tc\0p", 4), std::string(300, 'a')}) {
    EXPECT_EQ(decode_offer(bad).status().code(), Code::kInvalidArg) << "'" << bad << "'";
  }
}
}  // namespace gw::daemon
