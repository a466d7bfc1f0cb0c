// Fuzz target for the DPDK packet decoder and the protocol state behind it. Every input is fed
// twice to a live engine: as is, and with its checksums recomputed. Build with clang
// -fsanitize=fuzzer to run it under libFuzzer; CI runs it from dpdk_decoder_fuzz_test (g++).
#include "tests/fuzz/dpdk_decoder_fuzz.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/net/transport.h"
#include "dpdk/engine_transport.h"

namespace gw::dpdk::fuzz {

namespace {

constexpr size_t kGuard = 4096;
constexpr size_t kRecvCap = 64 * 1024;
constexpr uint8_t kGuardByte = 0xa5;

struct State {
  std::shared_ptr<MemSwitch> sw;
  std::unique_ptr<net::Transport> ta, tb;
  std::unique_ptr<net::Listener> l;
  std::unique_ptr<net::SendComm> s;
  std::unique_ptr<net::RecvComm> r;
  std::vector<uint8_t> arena = std::vector<uint8_t>(kGuard + kRecvCap + kGuard, kGuardByte);
  net::Request* pending = nullptr;
  std::mutex mu;
};

State* state = nullptr;

void repost(State& st) {
  bool done = false;
  size_t n = 0;
  if (st.pending != nullptr) {
    Status s = st.r->test(st.pending, &done, &n);
    if (!s.ok() || done) st.pending = nullptr;
  }
  if (st.pending == nullptr) {
    auto rr = st.r->irecv(st.arena.data() + kGuard, kRecvCap, net::kAnyTag, nullptr);
    if (rr.ok()) st.pending = *rr;
  }
}

}  // namespace

bool Fixture::guards_intact() const {
  for (size_t i = 0; i < kGuard; ++i) {
    if (state->arena[i] != kGuardByte || state->arena[kGuard + kRecvCap + i] != kGuardByte) {
      return false;
    }
  }
  return true;
}

Fixture& Fixture::get() {
  static Fixture* f = [] {
    auto* fx = new Fixture();
    state = new State();
    State& st = *state;
    st.sw = std::make_shared<MemSwitch>();
    st.sw->set_tap([fx](const uint8_t* d, size_t n) {
      if (fx->seeds.size() < 4096) fx->seeds.emplace_back(d, d + n);
    });
    EngineConfig c;
    c.progress_interval_us = 0;  // single-threaded: the fuzzer drives progress
    c.peer_timeout_ms = 1000000;
    c.heartbeat_ms = 1000000;
    c.mtu = 1500;
    c.ip = 0x0a000001;
    fx->a = *Engine::create(st.sw->attach({2, 0, 0, 0, 0, 1}, 1500), c);
    c.ip = 0x0a000002;
    fx->b = *Engine::create(st.sw->attach({2, 0, 0, 0, 0, 2}, 1500), c);
    net::TransportOptions o;
    o.job_token = "fuzz-token";
    o.timeout_ms = 1000000;
    st.ta = make_engine_transport(fx->a, o);
    st.tb = make_engine_transport(fx->b, o);
    net::Handle h;
    st.l = std::move(*st.ta->listen(&h));
    auto conn = std::move(*st.tb->connect(h));
    for (int i = 0; i < 1000 && (!st.s || !st.r); ++i) {
      if (!st.s) st.s = std::move(*conn->poll());
      if (!st.r) st.r = std::move(*st.l->accept());
    }
    if (!st.s || !st.r) std::abort();
    // A few real messages of several shapes, to seed the corpus with DATA/CTS/ACK frames.
    std::vector<uint8_t> src(5000);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i);
    for (size_t len : {0, 1, 1400, 5000}) {
      repost(st);
      auto sr = *st.s->isend(src.data(), len, 3, nullptr);
      bool done = false;
      size_t n;
      for (int i = 0; i < 10000 && !done; ++i) {
        fx->a->progress();
        fx->b->progress();
        if (!st.s->test(sr, &done, &n).ok()) std::abort();
      }
      repost(st);
    }
    repost(st);
    st.sw->set_tap(nullptr);
    return fx;
  }();
  return *f;
}

void fix_checksums(std::vector<uint8_t>& f) {
  if (f.size() < kEthLen + kIpLen + kUdpLen) return;
  uint8_t* ip = f.data() + kEthLen;
  if ((ip[0] & 0xf) != 5) return;
  ip[10] = ip[11] = 0;
  uint16_t ipsum = static_cast<uint16_t>(~cksum_fold(cksum_partial(ip, kIpLen, 0)));
  std::memcpy(ip + 10, &ipsum, 2);
  uint8_t* udp = ip + kIpLen;
  size_t udp_len = (size_t(udp[4]) << 8) | udp[5];
  if (udp_len < kUdpLen || kEthLen + kIpLen + udp_len > f.size()) return;
  udp[6] = udp[7] = 0;
  uint8_t ph[12];
  std::memcpy(ph, ip + 12, 8);
  ph[8] = 0;
  ph[9] = 17;
  ph[10] = udp[4];
  ph[11] = udp[5];
  uint32_t sum = cksum_partial(ph, 12, 0);
  sum = cksum_partial(udp, udp_len, sum);
  uint16_t c = static_cast<uint16_t>(~cksum_fold(sum));
  if (c == 0) c = 0xffff;
  std::memcpy(udp + 6, &c, 2);
}

}  // namespace gw::dpdk::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gw::dpdk;
  fuzz::Fixture& fx = fuzz::Fixture::get();
  std::lock_guard<std::mutex> lock(fuzz::state->mu);
  Frame f;
  (void)decode_frame(data, size, false, &f);  // the pure decoder on raw bytes
  fx.a->inject_rx(data, size);
  std::vector<uint8_t> fixed(data, data + size);
  fuzz::fix_checksums(fixed);
  fx.a->inject_rx(fixed.data(), fixed.size());
  fx.b->inject_rx(fixed.data(), fixed.size());
  fx.a->progress();
  fx.b->progress();
  fuzz::repost(*fuzz::state);
  if (!fx.guards_intact()) std::abort();  // a frame wrote outside the receive buffer
  return 0;
}
