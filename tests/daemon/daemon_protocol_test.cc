// gradwired's parts without a running daemon: the control client's checks, the protocol's
// encoders, decoders and bounds, the reduce pool, the client's arena allocator, the counters and
// the transport offer of a job's daemons. Part of the daemon_server_test binary.
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
#include "daemon/control_trace.h"
#include "daemon/counters.h"
#include "daemon/job_trace.h"
#include "daemon/protocol.h"
#include "daemon/reduce_pool.h"
#include "daemon/ring.h"
#include "daemon/server.h"
#include "daemon/transport_offer.h"
#include "tests/daemon/raw_client.h"

namespace gw::daemon {
namespace {

using namespace std::chrono_literals;
using test::allreduce_entry;

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

// Version 8: the descriptor record (16 bytes: magic, ticket, zeros) and the two dma-buf opcodes,
// whose every field is bounded; what the daemon answers (not a refusal) is the job's to check.
TEST(DaemonProtocol, DmabufRecordAndRequestsAreBounded) {
  std::vector<uint8_t> rec = encode_fd_record(42);
  ASSERT_EQ(rec.size(), kFdRecordBytes);
  auto t = decode_fd_record(rec.data());
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  EXPECT_EQ(*t, 42u);
  for (size_t at : {size_t{0}, size_t{9}, size_t{15}}) {  // magic, reserved bytes
    std::vector<uint8_t> bad = rec;
    bad[at] ^= 1;
    EXPECT_EQ(decode_fd_record(bad.data()).status().code(), Code::kPeer) << at;
  }
  EXPECT_FALSE(decode_fd_record(encode_fd_record(0).data()).ok());
  EXPECT_FALSE(decode_fd_record(encode_fd_record(0x80000000u).data()).ok());

  uint8_t d[64] = {};
  SqEntry reg{};
  reg.seq = 1;
  reg.opcode = static_cast<uint16_t>(Opcode::kRegisterDmabuf);
  reg.root = 1;
  reg.spec_len = 7;
  reg.send_off = 4096;
  reg.count = 1 << 20;
  reg.key_len = kDmabufSends | kDmabufReceives;
  auto r = decode_request(reg, 1, d, sizeof(d), 2);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->ticket, 7u);
  EXPECT_EQ(r->dmabuf_use, kDmabufSends | kDmabufReceives);
  EXPECT_EQ(r->alloc_bytes, 1u << 20);
  EXPECT_EQ(r->send_off, 4096u);
  auto refused = [&](auto change) {
    SqEntry e = reg;
    change(e);
    return decode_request(e, 1, d, sizeof(d), 2).status().code() == Code::kPeer;
  };
  EXPECT_TRUE(refused([](SqEntry& e) { e.root = 2; }));  // not a rank of the job
  EXPECT_TRUE(refused([](SqEntry& e) { e.root = -1; }));
  EXPECT_TRUE(refused([](SqEntry& e) { e.spec_len = 0; }));  // no ticket
  EXPECT_TRUE(refused([](SqEntry& e) { e.count = 0; }));     // empty
  EXPECT_TRUE(refused([](SqEntry& e) { e.count = (1ull << 48) + 1; }));
  EXPECT_TRUE(refused([](SqEntry& e) { e.send_off = (1ull << 48) + 1; }));
  EXPECT_TRUE(refused([](SqEntry& e) { e.key_len = 0; }));   // for nothing
  EXPECT_TRUE(refused([](SqEntry& e) { e.key_len = 4; }));   // unknown use
  EXPECT_TRUE(refused([](SqEntry& e) { e.recv_off = 8; }));  // collective fields
  EXPECT_TRUE(refused([](SqEntry& e) { e.dtype = 1; }));
  SqEntry dereg{};
  dereg.seq = 1;
  dereg.opcode = static_cast<uint16_t>(Opcode::kDeregisterDmabuf);
  dereg.spec_len = 3;
  auto dr = decode_request(dereg, 1, d, sizeof(d), 2);
  ASSERT_TRUE(dr.ok()) << dr.status().to_string();
  EXPECT_EQ(dr->alloc_id, 3u);
  dereg.spec_len = 0;
  EXPECT_FALSE(decode_request(dereg, 1, d, sizeof(d), 2).ok());
  dereg.spec_len = 3;
  dereg.count = 1;
  EXPECT_FALSE(decode_request(dereg, 1, d, sizeof(d), 2).ok());
  // flush_dmabuf: an id and a range received into (inside 2^48), nothing else.
  SqEntry flush{};
  flush.seq = 1;
  flush.opcode = static_cast<uint16_t>(Opcode::kFlushDmabuf);
  flush.spec_len = 5;
  flush.recv_off = 4096;
  flush.count = 1 << 20;
  auto fr = decode_request(flush, 1, d, sizeof(d), 2);
  ASSERT_TRUE(fr.ok()) << fr.status().to_string();
  EXPECT_EQ(fr->alloc_id, 5u);
  EXPECT_EQ(fr->recv_off, 4096u);
  EXPECT_EQ(fr->recv_bytes, 1u << 20);
  for (auto change : std::initializer_list<void (*)(SqEntry&)>{
           [](SqEntry& e) { e.spec_len = 0; }, [](SqEntry& e) { e.send_off = 8; },
           [](SqEntry& e) { e.root = 1; }, [](SqEntry& e) { e.key_len = 1; },
           [](SqEntry& e) { e.count = (1ull << 48) - 4095; }}) {
    SqEntry e = flush;
    change(e);
    EXPECT_EQ(decode_request(e, 1, d, sizeof(d), 2).status().code(), Code::kPeer);
  }
  // A send naming a dma-buf registration (key_len): its range is the registration's to check.
  SqEntry dsend{};
  dsend.seq = 1;
  dsend.opcode = static_cast<uint16_t>(Opcode::kSend);
  dsend.root = 1;
  dsend.key_len = 9;
  dsend.send_off = 1 << 30;
  dsend.count = 4096;
  auto ds = decode_request(dsend, 1, d, sizeof(d), 2);
  ASSERT_TRUE(ds.ok()) << ds.status().to_string();
  EXPECT_EQ(ds->dmabuf, 9u);
  dsend.key_len = 0;  // the data region's range then
  EXPECT_EQ(decode_request(dsend, 1, d, sizeof(d), 2).status().code(), Code::kPeer);
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

TEST(DaemonProtocol, DeviceImportsAndTheirBuffersAreChecked) {
  // Version 5: an import names an allocation by a record in the data region; collectives name
  // (allocation, offset) in spec_len / key_len; a release frees the id.
  std::vector<uint8_t> region(4096, 0);
  ImportWire w{};
  w.kind = kImportCudaIpc;
  w.alloc_id = 7;
  w.bytes = 1 << 20;
  w.device = 0;
  w.handle[0] = 0xab;
  std::memcpy(region.data() + 512, &w, sizeof(w));
  SqEntry imp{};
  imp.seq = 1;
  imp.opcode = static_cast<uint16_t>(Opcode::kImport);
  imp.meta_off = 512;
  imp.spec_len = sizeof(ImportWire);
  AllocSizes allocs;
  auto r = decode_request(imp, 1, region.data(), region.size(), 2, &allocs);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->alloc_id, 7u);
  EXPECT_EQ(r->alloc_bytes, uint64_t{1} << 20);
  EXPECT_EQ(r->handle[0], 0xab);
  // Bad imports: a record outside the region or of another size, an unknown kind, id 0, an id in
  // use, no bytes, a device out of range, reserved bits, collective arguments.
  auto bad = [&](auto mutate) {
    SqEntry e = imp;
    ImportWire x = w;
    mutate(e, x);
    std::vector<uint8_t> copy = region;
    std::memcpy(copy.data() + 512, &x, sizeof(x));
    return !decode_request(e, 1, copy.data(), copy.size(), 2, &allocs).ok();
  };
  EXPECT_TRUE(bad([](SqEntry& e, ImportWire&) { e.meta_off = 4096 - 80; }));
  EXPECT_TRUE(bad([](SqEntry& e, ImportWire&) { e.spec_len = 87; }));
  EXPECT_TRUE(bad([](SqEntry&, ImportWire& x) { x.kind = 2; }));
  EXPECT_TRUE(bad([](SqEntry&, ImportWire& x) { x.alloc_id = 0; }));
  EXPECT_TRUE(bad([](SqEntry&, ImportWire& x) { x.bytes = 0; }));
  EXPECT_TRUE(bad([](SqEntry&, ImportWire& x) { x.device = -1; }));
  EXPECT_TRUE(bad([](SqEntry&, ImportWire& x) { x.reserved = 1; }));
  EXPECT_TRUE(bad([](SqEntry& e, ImportWire&) { e.count = 1; }));
  allocs[7] = 1 << 20;
  EXPECT_TRUE(bad([](SqEntry&, ImportWire&) {}));  // id 7 is in use now
  // A collective on the allocation: inside it, not past it; an id not imported is refused.
  SqEntry ar = allreduce_entry(coll::DataType::kF32, coll::ReduceOp::kSum, 1024, 4096, 0);
  ar.seq = 2;
  ar.spec_len = 7;
  ar.key_len = 7;
  auto a = decode_request(ar, 2, region.data(), region.size(), 2, &allocs);
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->send_alloc, 7u);
  EXPECT_EQ(a->recv_off, 0u);
  ar.send_off = (1 << 20) - 4095;  // 4096 bytes from there pass the allocation's end
  EXPECT_FALSE(decode_request(ar, 2, region.data(), region.size(), 2, &allocs).ok());
  ar.send_off = 0;
  ar.key_len = 8;
  EXPECT_FALSE(decode_request(ar, 2, region.data(), region.size(), 2, &allocs).ok());
  ar.key_len = 0;  // device in, arena out: the receive range must fit the data region
  ar.recv_off = 64;
  EXPECT_FALSE(decode_request(ar, 2, region.data(), region.size(), 2, &allocs).ok());
  ar.count = 16;
  EXPECT_TRUE(decode_request(ar, 2, region.data(), region.size(), 2, &allocs).ok());
  EXPECT_FALSE(decode_request(ar, 2, region.data(), region.size(), 2, nullptr).ok());
  // A broadcast is one buffer: one allocation.
  SqEntry bc = ar;
  bc.opcode = static_cast<uint16_t>(Opcode::kBroadcast);
  bc.op = 0;
  bc.key_len = 7;
  bc.recv_off = bc.send_off;
  EXPECT_TRUE(decode_request(bc, 2, region.data(), region.size(), 2, &allocs).ok());
  bc.key_len = 0;
  EXPECT_FALSE(decode_request(bc, 2, region.data(), region.size(), 2, &allocs).ok());
  // A barrier names no allocation.
  SqEntry br{};
  br.seq = 2;
  br.opcode = static_cast<uint16_t>(Opcode::kBarrier);
  br.spec_len = 7;
  EXPECT_FALSE(decode_request(br, 2, region.data(), region.size(), 2, &allocs).ok());
  // Releases: of an imported id only, with nothing else set.
  SqEntry rel{};
  rel.seq = 2;
  rel.opcode = static_cast<uint16_t>(Opcode::kRelease);
  rel.spec_len = 7;
  auto rr = decode_request(rel, 2, region.data(), region.size(), 2, &allocs);
  ASSERT_TRUE(rr.ok()) << rr.status().message();
  EXPECT_EQ(rr->alloc_id, 7u);
  rel.spec_len = 8;
  EXPECT_FALSE(decode_request(rel, 2, region.data(), region.size(), 2, &allocs).ok());
  rel.spec_len = 7;
  rel.meta_off = 64;
  EXPECT_FALSE(decode_request(rel, 2, region.data(), region.size(), 2, &allocs).ok());
  // No more than kMaxImportsPerClient at once.
  AllocSizes full;
  for (uint32_t id = 100; id < 100 + kMaxImportsPerClient; ++id) full[id] = 1;
  EXPECT_FALSE(decode_request(imp, 1, region.data(), region.size(), 2, &full).ok());
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

// Device buffers through the daemon: yes only when verbs is offered and its NIC takes dma-bufs;
// the NIC is not even asked when verbs is not offered; every answer is one line that says why.
TEST(DaemonTransportOffer, DeviceBuffersNeedAVerbsOfferAndANicThatTakesDmabufs) {
  int asked = 0;
  auto nic = [&](bool yes) {
    return [&asked, yes] {
      ++asked;
      return DeviceBuffers{yes, yes ? "emu0 takes dma-bufs" : "emu0 does not take dma-bufs"};
    };
  };
  TransportOffer tcp{{"tcp"}, ""};
  DeviceBuffers d = device_buffers_verdict(tcp, nic(true));
  EXPECT_FALSE(d.yes);
  EXPECT_EQ(asked, 0);
  EXPECT_EQ(d.why.rfind("no: this daemon offers tcp between hosts", 0), 0u) << d.why;
  EXPECT_NE(d.why.find("need verbs"), std::string::npos) << d.why;
  TransportOffer dpdk{{"dpdk", "tcp"}, ""};
  d = device_buffers_verdict(dpdk, nic(true));
  EXPECT_FALSE(d.yes);
  EXPECT_NE(d.why.find("offers dpdk,tcp"), std::string::npos) << d.why;
  TransportOffer verbs{{"verbs", "tcp"}, ""};
  d = device_buffers_verdict(verbs, nic(true));
  EXPECT_TRUE(d.yes);
  EXPECT_EQ(asked, 1);
  EXPECT_EQ(d.why, "yes: emu0 takes dma-bufs");
  d = device_buffers_verdict(verbs, nic(false));
  EXPECT_FALSE(d.yes);
  EXPECT_EQ(d.why, "no: emu0 does not take dma-bufs");
  for (const DeviceBuffers& v : {d, device_buffers_verdict(tcp, nic(true))}) {
    EXPECT_EQ(v.why.find('\n'), std::string::npos) << "one line";
  }
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
// gradwirectl trace answers at its deadline while the job thread may be inside a collective: the
// answer holds a collective with all of its phases or not at all (a phase without its collective
// made DaemonTrace's check fail under load).
TEST(JobTraceTest, AnAnswerHoldsACollectiveWithItsPhasesOrNothingOfIt) {
  JobTrace t("j", 0, 2, 2, 1.0);
  TraceEvent phase;
  phase.name = "local_reduce";
  phase.ts_us = 10;
  phase.dur_us = 5;
  t.add(phase);
  EXPECT_EQ(t.result()["otherData"]["events"], 0) << "a phase staged, its collective not ended";
  TraceEvent c;
  c.name = "allreduce";
  c.cat = "collective";
  c.ts_us = 9;
  c.dur_us = 20;
  c.dtype = "float32";
  t.add(c);
  t.commit();
  const nlohmann::json r = t.result();
  EXPECT_EQ(r["otherData"]["events"], 2);
  EXPECT_EQ(r["otherData"]["dropped"], 0);
  int complete = 0;
  for (const auto& e : r["traceEvents"]) complete += e["ph"] == "X" ? 1 : 0;
  EXPECT_EQ(complete, 2);
  // Over the cap, the rest is counted as dropped at commit.
  for (size_t i = 0; i < kMaxTraceEvents; ++i) t.add(phase);
  t.commit();
  EXPECT_EQ(t.result()["otherData"]["events"], kMaxTraceEvents);
  EXPECT_EQ(t.result()["otherData"]["dropped"], 2);
}
}  // namespace gw::daemon
