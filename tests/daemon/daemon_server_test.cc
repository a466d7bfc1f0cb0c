// gradwired's engine in this process (daemon/server.h) against raw protocol clients: the rings and
// the arena end to end, local sums of every kind, and the refusals: garbage hellos, a foreign
// host, out-of-arena offsets, ring overflow, a client that disconnects mid-job (its job's other
// client gets kPeer and its arena is reclaimed), each counted, with other jobs unaffected.
// The protocol, allocator and other parts without a running daemon: daemon_protocol_test.cc.
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
#include "tests/daemon/raw_client.h"
#include "tests/daemon/server_fixture.h"

namespace gw::daemon {
namespace {

using namespace std::chrono_literals;
using test::allreduce_entry;
using test::RawClient;

class DaemonServerTest : public test::ServerFixture {
 protected:
  void SetUp() override {
    ServerOptions o = options("gwd-test");
    o.reduce_threads = 3;  // large sums and copies split over the pool
    o.spin_us = 20;        // the job threads poll the rings before sleeping, as gradwired does
    run(o);
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

TEST_F(DaemonServerTest, DeviceImportsTheDaemonCannotOpenAreAnsweredAndBadOnesCut) {
  // No CUDA driver in this process (or a handle no driver opens): the import is answered with
  // the driver's error, the trainer goes on (it would stage that allocation), nothing is counted
  // as imported, and a collective naming the id is a protocol error.
  auto c = RawClient::join(server_->socket_path(), hello("import"));
  ASSERT_TRUE(c.ok()) << c.status().message();
  ImportWire w{};
  w.kind = kImportCudaIpc;
  w.alloc_id = 5;
  w.bytes = 1 << 20;
  std::memset(w.handle, 0x5a, sizeof(w.handle));
  std::memcpy(c->data, &w, sizeof(w));
  SqEntry imp{};
  imp.opcode = static_cast<uint16_t>(Opcode::kImport);
  imp.spec_len = sizeof(w);
  Status st = c->wait(c->post(imp));
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.code(), Code::kPeer) << st.message();
  EXPECT_EQ(server_->stats().live_imports, 0u);
  uint64_t g = c->post(allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 4, 256, 512));
  EXPECT_TRUE(c->wait(g).ok());
  SqEntry dev = allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 4, 0, 0);
  dev.spec_len = 5;
  dev.key_len = 5;
  EXPECT_EQ(c->wait(c->post(dev)).code(), Code::kPeer);
  // A release of an id never imported cuts its client too.
  auto r = RawClient::join(server_->socket_path(), hello("release"));
  ASSERT_TRUE(r.ok());
  SqEntry rel{};
  rel.opcode = static_cast<uint16_t>(Opcode::kRelease);
  rel.spec_len = 3;
  EXPECT_EQ(r->wait(r->post(rel)).code(), Code::kPeer);
  EXPECT_TRUE(eventually([](const ServerStats& x) { return x.live_clients == 0; }));
  EXPECT_EQ(server_->stats().live_imports, 0u);
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
  GW_ASSIGN_OR_RETURN(sys::Fd sock, test::dial(ctl));
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

}  // namespace
}  // namespace gw::daemon
