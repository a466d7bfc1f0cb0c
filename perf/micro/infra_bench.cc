// The non-kernel hot paths: schedule building, the daemon's submission ring, the store's frame
// codec, the DPDK engine's frame codec and the shm backend's slot ring (one thread; the ring
// benchmarks measure the slot mechanics and copies a message costs, not the cross-core wake-ups).
#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/schedule.h"
#include "core/net/shm_wire.h"
#include "core/store_wire.h"
#include "daemon/protocol.h"
#include "daemon/ring.h"
#include "dpdk/engine.h"
#include "dpdk/engine_transport.h"
#include "dpdk/wire.h"
#include "perf/micro/micro_util.h"

namespace gw::micro {
namespace {

// ---- Schedule building: what a communicator computes per (collective, size) on a cache miss.
void bench_ring_schedule(benchmark::State& state) {
  const int nranks = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto s = coll::ring_allreduce(nranks / 2, nranks, size_t{64} << 20);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bench_ring_schedule)->Name("schedule/ring_allreduce")->Arg(8)->Arg(64)->Arg(512);

void bench_rhd_schedule(benchmark::State& state) {
  const int nranks = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto s = coll::rhd_allreduce(nranks / 2, nranks, size_t{64} << 20);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bench_rhd_schedule)->Name("schedule/rhd_allreduce")->Arg(8)->Arg(64)->Arg(512);

void bench_hier_schedule(benchmark::State& state) {
  const int nhosts = static_cast<int>(state.range(0)), per_host = 8;
  std::vector<int> host_of_rank;
  for (int r = 0; r < nhosts * per_host; ++r) host_of_rank.push_back(r / per_host);
  const coll::HostRanks hosts = coll::hosts_from_map(host_of_rank);
  for (auto _ : state) {
    auto s = coll::hier_allreduce(hosts, per_host + 1, size_t{64} << 20);
    benchmark::DoNotOptimize(s.data());
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bench_hier_schedule)->Name("schedule/hier_allreduce_8_per_host")->Arg(2)->Arg(16);

// ---- The daemon's submission ring: push, consume, decode one 64-byte entry, through a real
// arena header (the client's and the daemon's sides in one thread).
void bench_daemon_ring(benchmark::State& state) {
  constexpr uint32_t kEntries = 256;
  std::vector<uint8_t> slots(kEntries * sizeof(daemon::SqEntry));
  std::vector<uint8_t> data(4096);
  std::atomic<uint64_t> tail{0}, head{0};
  std::atomic<uint32_t> polling{1};  // busy-polling consumer: no eventfd kick
  daemon::RingView view{slots.data(), kEntries, &tail, &head, &polling, -1, "submission"};
  daemon::RingProducer<daemon::SqEntry> prod(view);
  daemon::RingConsumer<daemon::SqEntry> cons(view);
  uint64_t seq = 0;
  for (auto _ : state) {
    daemon::SqEntry e{};
    e.seq = ++seq;
    e.opcode = static_cast<uint16_t>(daemon::Opcode::kAllreduce);
    e.count = 256;
    e.send_off = 0;
    e.recv_off = 1024;
    prod.push(e);
    if (!prod.kick().ok()) return state.SkipWithError("kick");
    auto ready = cons.ready();
    if (!ready.ok() || *ready != 1) return state.SkipWithError("ring: nothing ready");
    auto req = daemon::decode_request(cons.front(), seq, data.data(), data.size(), 2);
    if (!req.ok()) return state.SkipWithError(req.status().message().c_str());
    cons.pop();
    benchmark::DoNotOptimize(req->count);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bench_daemon_ring)->Name("daemon_ring/submit_decode");

// ---- The store's frame codec: encode a set request, decode it back (the server's side).
void bench_store_codec(benchmark::State& state) {
  store_wire::Request req;
  req.op = store_wire::Op::kSet;
  req.key = "gradwire/job/rank/17/address";
  req.value.assign(static_cast<size_t>(state.range(0)), 0x5a);
  for (auto _ : state) {
    auto frame = store_wire::encode_request(req);
    if (!frame.ok()) return state.SkipWithError(frame.status().message().c_str());
    const uint8_t* body = frame->data() + store_wire::kHeaderSize;
    auto back = store_wire::decode_request(body, frame->size() - store_wire::kHeaderSize);
    if (!back.ok()) return state.SkipWithError(back.status().message().c_str());
    benchmark::DoNotOptimize(back->value.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(bench_store_codec)->Name("store_codec/set_roundtrip")->Arg(64)->Arg(64 << 10);

// ---- The shm backend's ring: a message cut into slots, each copied in by the sender (header,
// payload, head published) and out by the receiver (tail released), as the transport does.
void bench_shm_ring(benchmark::State& state) {
  const size_t msg = static_cast<size_t>(state.range(0));
  net::shm::Geometry g{8, size_t{1} << 20};  // GW_SHM_NSLOTS, GW_SHM_SLOT_SIZE defaults
  auto region = sys::MemfdRegion::create("gw-micro-ring", g.total());
  if (!region.ok()) return state.SkipWithError(region.status().message().c_str());
  net::shm::Ring ring(std::move(*region), g);
  const std::vector<float> src_f = gaussian(msg / 4 + 1, 6);
  const auto* src = reinterpret_cast<const uint8_t*>(src_f.data());
  std::vector<uint8_t> dst(msg);
  net::shm::RingCtrl* ctrl = ring.ctrl();
  uint64_t seq = 0;
  for (auto _ : state) {
    ++seq;
    for (size_t off = 0; off < msg; off += g.slot_size) {
      const uint64_t h = ctrl->head.load(std::memory_order_relaxed);
      const uint64_t slot = h % g.nslots;
      const uint32_t len = static_cast<uint32_t>(std::min<size_t>(g.slot_size, msg - off));
      *ring.header(slot) = net::shm::SlotHeader{seq, msg, off, len, 0};
      std::memcpy(ring.data(slot), src + off, len);
      ctrl->head.store(h + 1, std::memory_order_release);
      // Receiver.
      const uint64_t t = ctrl->tail.load(std::memory_order_relaxed);
      if (ctrl->head.load(std::memory_order_acquire) == t) return state.SkipWithError("empty");
      const net::shm::SlotHeader sh = *ring.header(t % g.nslots);
      if (sh.offset + sh.len > dst.size()) return state.SkipWithError("bad slot");
      std::memcpy(dst.data() + sh.offset, ring.data(t % g.nslots), sh.len);
      ctrl->tail.store(t + 1, std::memory_order_release);
    }
    benchmark::DoNotOptimize(dst.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(msg));
}
BENCHMARK(bench_shm_ring)->Name("shm_ring/copy_through")->Arg(4 << 10)->Arg(16 << 20);

// ---- The DPDK engine's frame codec: one DATA frame encoded (headers, payload copy, IPv4 and UDP
// checksums in software, as over AF_XDP) and decoded (both checksums verified), at the payload
// of an MTU 3498 frame (AF_XDP on veth) and of a 9000-byte one; and the checksum alone.
void bench_dpdk_frame(benchmark::State& state) {
  const size_t payload = static_cast<size_t>(state.range(0));
  const std::vector<float> src_f = gaussian(payload / 4 + 1, 8);
  const auto* src = reinterpret_cast<const uint8_t*>(src_f.data());
  std::vector<uint8_t> frame(payload + dpdk::kHeadersLen);
  const dpdk::Endpoint a{{2, 0, 0, 0, 0, 1}, 0x0a000001, 47000};
  const dpdk::Endpoint b{{2, 0, 0, 0, 0, 2}, 0x0a000002, 47000};
  dpdk::GwHeader h;
  h.type = dpdk::FrameType::kData;
  h.msg_len = payload;
  for (auto _ : state) {
    const size_t n = dpdk::encode_frame(frame.data(), frame.size(), a, b, h, src, payload, 1);
    dpdk::Frame f;
    if (n == 0 || dpdk::decode_frame(frame.data(), n, false, &f) != dpdk::DecodeError::kOk) {
      return state.SkipWithError("the frame did not round-trip");
    }
    benchmark::DoNotOptimize(f.payload);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(payload));
}
BENCHMARK(bench_dpdk_frame)->Name("dpdk_frame/encode_decode")->Arg(3384)->Arg(8886);

void bench_dpdk_checksum(benchmark::State& state) {
  const size_t len = static_cast<size_t>(state.range(0));
  const std::vector<float> src_f = gaussian(len / 4 + 1, 9);
  for (auto _ : state) {
    benchmark::DoNotOptimize(dpdk::cksum_partial(src_f.data(), len, 0));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(len));
}
BENCHMARK(bench_dpdk_checksum)->Name("dpdk_frame/checksum")->Arg(3384)->Arg(8886);

// ---- The DPDK engine's idle pass: what a rank waiting for a frame repeats (receive burst,
// timers and acknowledgements of every connection), over the in-memory switch with a
// ping-pong's two connections open and nothing arriving; no background thread.
void bench_dpdk_idle_pass(benchmark::State& state) {
  auto sw = std::make_shared<dpdk::MemSwitch>();
  dpdk::EngineConfig ca, cb;
  ca.ip = 0x0a000001;
  cb.ip = 0x0a000002;
  ca.progress_interval_us = cb.progress_interval_us = 0;
  auto a = dpdk::Engine::create(sw->attach({2, 0, 0, 0, 0, 1}), ca);
  auto b = dpdk::Engine::create(sw->attach({2, 0, 0, 0, 0, 2}), cb);
  if (!a.ok() || !b.ok()) return state.SkipWithError("no engine");
  net::TransportOptions o;
  o.job_token = "micro";
  auto ta = dpdk::make_engine_transport(*a, o), tb = dpdk::make_engine_transport(*b, o);
  std::unique_ptr<net::SendComm> s_ab, s_ba;
  std::unique_ptr<net::RecvComm> r_ab, r_ba;
  auto link = [&](net::Transport& from, net::Transport& to, std::unique_ptr<net::SendComm>* s,
                  std::unique_ptr<net::RecvComm>* r) {
    net::Handle h;
    auto l = to.listen(&h);
    auto c = from.connect(h);
    if (!l.ok() || !c.ok()) return false;
    for (int i = 0; i < 1000000 && (!*s || !*r); ++i) {
      if (!*s) *s = std::move(*(*c)->poll());
      if (!*r) *r = std::move(*(*l)->accept());
    }
    return *s && *r;
  };
  if (!link(*ta, *tb, &s_ab, &r_ab) || !link(*tb, *ta, &s_ba, &r_ba)) {
    return state.SkipWithError("the engines did not connect");
  }
  for (int i = 0; i < 1000; ++i) (*a)->progress(), (*b)->progress();  // the handshakes' tails
  for (auto _ : state) (*a)->progress();
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(bench_dpdk_idle_pass)->Name("dpdk_engine/idle_pass");

}  // namespace
}  // namespace gw::micro
