// tcp handshake (both sides) and message stream (fuzz_targets.h). Wire: docs/wire-tcp.md.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/net/handshake.h"
#include "core/net/tcp/wire.h"
#include "core/net/tcp_transport.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"
#include "tests/fuzz/fuzz_socket.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

namespace hs = net::handshake;

constexpr const char* kToken = "fuzz-token";
constexpr int64_t kStepMs = 30;  // how long one input may keep a socket busy
constexpr size_t kGuard = 256;
constexpr size_t kRecvCap = 8192;
constexpr uint8_t kGuardByte = 0x5a;

constexpr const char* kWho = "tcp fuzz";
// The wire's shapes (docs/wire-tcp.md), as the backend itself declares them.
using net::tcp::Challenge;
using net::tcp::HandleWire;
using net::tcp::Hello;
using net::tcp::MsgHeader;

std::unique_ptr<net::Transport>& transport() {
  static auto* t = [] {
    setenv("GW_SOCKET_IFNAME", "lo", 1);
    setenv("GW_SOCKET_NSOCKS", "1", 1);
    net::TransportOptions o;
    o.job_token = kToken;
    o.timeout_ms = 200;
    o.rank = 0;
    auto made = net::make_tcp_transport(o);
    check(made.ok(), "tcp fuzz: transport");
    return new std::unique_ptr<net::Transport>(std::move(*made));
  }();
  return *t;
}

// Reads exactly n bytes while polling `tick` (which drives the other side); false at EOF or the
// deadline.
template <typename Tick>
bool read_driving(int fd, void* out, size_t n, sys::Deadline until, Tick&& tick) {
  size_t got = 0;
  while (got < n && !sys::expired(until)) {
    tick();
    ssize_t k = recv(fd, static_cast<char*>(out) + got, n - got, MSG_DONTWAIT);
    if (k == 0) return false;
    if (k > 0) got += static_cast<size_t>(k);
  }
  return got == n;
}

// Mode 0/1: a raw connector's bytes to a listener (1: the handle's nonce and ranks patched in, so
// the input reaches the proof). The listener must never hand out a comm.
void listener_side(const uint8_t* body, size_t n, bool patch) {
  RawConnection<HandleWire> raw = connect_raw<HandleWire>(*transport(), kWho);
  std::vector<uint8_t> bytes(body, body + n);
  if (patch && bytes.size() >= sizeof(Hello)) {
    Hello hello;
    std::memcpy(&hello, bytes.data(), sizeof(hello));
    std::memcpy(hello.magic, "GWH2", 4);
    hello.nonce = raw.wire.nonce;
    hello.nsocks = 1;
    hello.sock_index = 0;
    hello.rank = 1;
    hello.listener_rank = 0;
    std::memcpy(bytes.data(), &hello, sizeof(hello));
  }
  const sys::Deadline until = sys::deadline_after_ms(kStepMs);
  send_some(raw.sock.get(), bytes.data(), bytes.size(), until);
  ::shutdown(raw.sock.get(), SHUT_WR);
  uint8_t sink[256];
  while (!sys::expired(until)) {
    auto a = raw.listener->accept();
    check(a.ok(), "tcp fuzz: accept never fails on a peer's bytes");
    check(*a == nullptr, "tcp fuzz: a connector without the token was accepted");
    ssize_t k = recv(raw.sock.get(), sink, sizeof(sink), MSG_DONTWAIT);
    if (k > 0 && sink[0] == hs::kChallenge) ++counter("tcp.challenged");
    if (k == 0) break;  // the listener dropped us
  }
}

// Mode 2: a proper handshake, then the input as the sender's message stream; receives are
// posted into a guarded buffer and must never write outside it.
void message_stream(const uint8_t* body, size_t n) {
  net::Handle h;
  auto l = listen_or_abort(*transport(), &h, kWho);
  const HandleWire hw = wire_of<HandleWire>(h);
  sys::Fd fd = dial_loopback(hw.port_be, kWho);
  Hello hello{};
  std::memcpy(hello.magic, "GWH2", 4);
  hello.nsocks = 1;
  hello.nonce = hw.nonce;
  hello.conn_id = 1;
  hello.rank = 1;
  hello.listener_rank = 0;
  check(hs::fresh_nonce(&hello.challenge).ok(), "tcp fuzz: nonce");
  const sys::Deadline until = sys::deadline_after_ms(2000);
  send_some(fd.get(), reinterpret_cast<const uint8_t*>(&hello), sizeof(hello), until);
  std::unique_ptr<net::RecvComm> comm;
  auto tick = [&] {
    if (comm) return;
    auto a = l->accept();
    check(a.ok(), "tcp fuzz: accept");
    if (*a) comm = std::move(*a);
  };
  Challenge ch{};
  check(read_driving(fd.get(), &ch, sizeof(ch), until, tick), "tcp fuzz: challenge");
  hs::Transcript t = net::tcp::transcript(hello);
  t.listener_challenge = ch.challenge;
  check(hs::verify(kToken, hs::Role::kListener, t, ch.proof.data()), "tcp fuzz: listener proof");
  hs::Mac proof = hs::prove(kToken, hs::Role::kConnector, t);
  send_some(fd.get(), proof.data(), proof.size(), until);
  uint8_t verdict = 0;
  check(read_driving(fd.get(), &verdict, 1, until, tick) && verdict == hs::kAccept,
        "tcp fuzz: accepted");
  while (!comm && !sys::expired(until)) tick();
  check(comm != nullptr, "tcp fuzz: comm");
  // The stream, then EOF.
  const sys::Deadline step = sys::deadline_after_ms(kStepMs);
  send_some(fd.get(), body, n, step);
  ::shutdown(fd.get(), SHUT_WR);
  std::vector<uint8_t> arena(kGuard + kRecvCap + kGuard, kGuardByte);
  for (int msg = 0; msg < 4 && !sys::expired(step); ++msg) {
    auto r = comm->irecv(arena.data() + kGuard, kRecvCap, net::kAnyTag, nullptr);
    if (!r.ok() || *r == nullptr) break;
    bool done = false;
    size_t got = 0;
    Status s;
    while (!done && !sys::expired(step)) {
      s = comm->test(*r, &done, &got);
      if (!s.ok()) break;
    }
    if (!s.ok() || !done) break;
    check(got <= kRecvCap, "tcp fuzz: reported size within the receive");
    ++counter("tcp.message");
  }
  fd.reset();  // a reset, before the comm's end answers this side's FIN (no TIME_WAIT)
  comm.reset();
  for (size_t i = 0; i < kGuard; ++i) {
    check(arena[i] == kGuardByte && arena[kGuard + kRecvCap + i] == kGuardByte,
          "tcp fuzz: a receive wrote outside its buffer");
  }
}

// Mode 3: a fake listener answers the connector's hello with the input; the connector must fail
// (no answer can carry the token's proof) and never hang past its deadline.
void connector_side(const uint8_t* body, size_t n) {
  sockaddr_in a;
  sys::Fd lfd = fake_listener(&a, kWho);
  HandleWire w{};
  std::memcpy(w.magic, "GWT1", 4);
  w.version = net::tcp::kVersion;
  w.nsocks = 1;
  w.family = AF_INET;
  w.port_be = a.sin_port;
  std::memcpy(w.addr, &a.sin_addr, 4);
  w.rank = 0;
  net::Handle h{};
  std::memcpy(h.bytes.data(), &w, sizeof(w));
  auto c = transport()->connect(h);
  check(c.ok(), "tcp fuzz: connect");
  answer_connector(**c, lfd.get(), sizeof(Hello), std::vector<uint8_t>(body, body + n), kStepMs,
                   "tcp.connector_refused_answer", kWho);
}

}  // namespace

int tcp_wire(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t n = std::min<size_t>(size - 1, 64 * 1024);
  switch (data[0] % 4) {
    case 0:
      listener_side(data + 1, n, false);
      break;
    case 1:
      listener_side(data + 1, n, true);
      break;
    case 2:
      message_stream(data + 1, n);
      break;
    default:
      connector_side(data + 1, n);
      break;
  }
  return 0;
}

std::vector<std::vector<uint8_t>> tcp_seeds() {
  std::vector<std::vector<uint8_t>> out;
  Hello hello{};
  std::memcpy(hello.magic, "GWH2", 4);
  hello.nsocks = 1;
  hello.rank = 1;
  for (uint8_t mode : {0, 1}) {
    std::vector<uint8_t> s{mode};
    s.insert(s.end(), reinterpret_cast<uint8_t*>(&hello),
             reinterpret_cast<uint8_t*>(&hello) + sizeof(hello));
    s.insert(s.end(), 32, 0x11);  // a proof that is wrong
    out.push_back(s);
  }
  // Message streams: a header {magic "GWM1", tag, size} and its payload, twice; a header larger
  // than the receive; a notice on the wrong side; a short header.
  auto msg = [](std::vector<uint8_t>& s, uint32_t magic, int32_t tag, uint64_t sz, size_t pay) {
    const MsgHeader h{magic, tag, sz};
    s.insert(s.end(), reinterpret_cast<const uint8_t*>(&h),
             reinterpret_cast<const uint8_t*>(&h) + sizeof(h));
    s.insert(s.end(), pay, 0xab);
  };
  std::vector<uint8_t> s{2};
  msg(s, net::tcp::kHeaderMagic, 7, 100, 100);
  msg(s, net::tcp::kHeaderMagic, 8, 0, 0);
  out.push_back(s);
  s = {2};
  msg(s, net::tcp::kHeaderMagic, 7, 1u << 20, 64);
  out.push_back(s);
  s = {2};
  msg(s, net::tcp::kNoticeMagic, 1, 0, 0);
  out.push_back(s);
  out.push_back({2, 0x31, 0x4d});
  // Fake listener answers: a refusal, a challenge with a wrong proof, garbage.
  out.push_back({3, 'R'});
  s = {3, 'C'};
  s.insert(s.end(), 71, 0x22);
  out.push_back(s);
  out.push_back({3, 'A'});
  return out;
}

}  // namespace gw::fuzz
