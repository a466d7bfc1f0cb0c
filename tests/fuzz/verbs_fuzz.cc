// verbs set-up wire (fuzz_targets.h): the handle connect() decodes, the listener fed a raw or
// patched hello and ready, the connector fed a fake listener's reply. Over the verbs emulator, so
// a patched hello's port and QP numbers reach the queue pairs' connect. Wire: verbs/verbs_wire.h,
// docs/verbs.md.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/net/handshake.h"
#include "core/net/transport.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"
#include "tests/fuzz/fuzz_socket.h"
#include "tests/fuzz/fuzz_targets.h"
#include "verbs/verbs_transport.h"
#include "verbs/verbs_wire.h"

namespace gw::fuzz {

namespace {

namespace hs = net::handshake;
using verbs::HandleWire;
using verbs::HelloWire;
using verbs::ReadyWire;
using verbs::ReplyWire;

constexpr const char* kToken = "fuzz-token";
constexpr const char* kWho = "verbs fuzz";
constexpr int64_t kStepMs = 30;  // how long one input may keep a socket busy

std::unique_ptr<net::Transport>& transport() {
  static auto* t = [] {
    setenv("GW_VERBS_EMULATE", "1", 1);
    setenv("GW_SOCKET_IFNAME", "lo", 1);
    setenv("GW_IB_QPS_PER_CONN", "1", 1);
    net::TransportOptions o;
    o.job_token = kToken;
    o.timeout_ms = 200;
    o.rank = 0;
    auto made = verbs::make_verbs_transport(o);
    if (!made.ok()) std::fprintf(stderr, "verbs fuzz: %s\n", made.status().to_string().c_str());
    check(made.ok(), "verbs fuzz: transport over the emulator");
    return new std::unique_ptr<net::Transport>(std::move(*made));
  }();
  return *t;
}

// Mode 0: the input as a handle handed to connect(): refused, or a connector that ends within its
// deadline (nobody answers at whatever address the bytes name, or the address is refused).
void handle_decode(const uint8_t* body, size_t n) {
  net::Handle h{};
  std::memcpy(h.bytes.data(), body, std::min(n, h.bytes.size()));
  // Keep every dial on loopback: the input picks everything but the address.
  HandleWire w = wire_of<HandleWire>(h);
  if (w.family == AF_INET) {
    const uint32_t lo = htonl(INADDR_LOOPBACK);
    std::memcpy(w.addr, &lo, 4);
  } else {
    std::memset(w.addr, 0, sizeof(w.addr));
    w.addr[15] = 1;  // ::1
    w.scope_id = 0;
  }
  std::memcpy(h.bytes.data(), &w, sizeof(w));
  auto c = transport()->connect(h);
  if (!c.ok()) return;
  ++counter("verbs.handle_accepted");
  const sys::Deadline until = sys::deadline_after_ms(kStepMs);
  while (!sys::expired(until)) {
    auto r = (*c)->poll();
    if (!r.ok()) return;
    check(*r == nullptr, "verbs fuzz: connected through a handle nobody listens on");
  }
}

// Modes 1/2: a raw connector's bytes to a listener (2: magic, version, nonce, ranks, QP count and
// a loopback GID patched in, so the input's port and QP numbers reach the queue pairs and its
// ready record reaches the proof check). The listener must never hand out a comm.
void listener_side(const uint8_t* body, size_t n, bool patch) {
  RawConnection<HandleWire> raw = connect_raw<HandleWire>(*transport(), kWho);
  std::vector<uint8_t> bytes(body, body + n);
  if (patch && bytes.size() >= sizeof(HelloWire)) {
    HelloWire hello;
    std::memcpy(&hello, bytes.data(), sizeof(hello));
    std::memcpy(hello.magic, "GWVH", 4);
    hello.version = verbs::kWireVersion;
    hello.nonce = raw.wire.nonce;
    hello.rank = 1;
    hello.listener_rank = 0;
    hello.nqps = 1;
    // The emulator routes RoCE by the GID's IPv4 address: keep it on loopback (::ffff:127.0.0.1).
    static const uint8_t kLoopbackGid[16] = {0, 0, 0,    0,    0,   0, 0, 0,
                                             0, 0, 0xff, 0xff, 127, 0, 0, 1};
    std::memcpy(hello.port.gid, kLoopbackGid, sizeof(kLoopbackGid));
    std::memcpy(bytes.data(), &hello, sizeof(hello));
  }
  const sys::Deadline until = sys::deadline_after_ms(kStepMs);
  send_some(raw.sock.get(), bytes.data(), bytes.size(), until);
  ::shutdown(raw.sock.get(), SHUT_WR);
  uint8_t sink[sizeof(ReplyWire)];
  while (!sys::expired(until)) {
    auto a = raw.listener->accept();
    if (!a.ok()) {
      // Only the device may fail a listener (out of QPs); a peer's bytes never do.
      check(a.status().code() != Code::kInvalidArg && a.status().code() != Code::kPeer,
            "verbs fuzz: accept failed on a peer's bytes");
      return;
    }
    check(*a == nullptr, "verbs fuzz: a connector without the token was accepted");
    ssize_t k = recv(raw.sock.get(), sink, sizeof(sink), MSG_DONTWAIT);
    if (k >= 5 && std::memcmp(sink, "GWVR", 4) == 0 && sink[4] == 1) {
      ++counter("verbs.listener_replied");
    }
    if (k == 0) break;  // the listener dropped us
  }
}

// Modes 3/4: a fake listener answers the connector's hello with the input (4: magic and
// acceptance patched in, so it reaches the proof check); the connector must fail (no answer can
// carry the token's proof) and never outlive its deadline.
void connector_side(const uint8_t* body, size_t n, bool patch) {
  sockaddr_in a;
  sys::Fd lfd = fake_listener(&a, kWho);
  HandleWire w{};
  std::memcpy(w.magic, "GWV1", 4);
  w.version = verbs::kWireVersion;
  w.family = AF_INET;
  w.port_be = a.sin_port;
  std::memcpy(w.addr, &a.sin_addr, 4);
  w.nonce = 42;
  w.rank = 0;
  net::Handle h{};
  std::memcpy(h.bytes.data(), &w, sizeof(w));
  auto c = transport()->connect(h);
  check(c.ok(), "verbs fuzz: connect");
  std::vector<uint8_t> reply(body, body + n);
  if (patch && reply.size() >= sizeof(ReplyWire)) {
    std::memcpy(reply.data(), "GWVR", 4);
    reply[4] = 1;  // accepted
  }
  answer_connector(**c, lfd.get(), sizeof(HelloWire), reply, kStepMs,
                   "verbs.connector_refused_answer", kWho);
}

}  // namespace

int verbs_wire(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t n = std::min<size_t>(size - 1, 16 * 1024);
  switch (data[0] % 5) {
    case 0:
      handle_decode(data + 1, n);
      break;
    case 1:
      listener_side(data + 1, n, false);
      break;
    case 2:
      listener_side(data + 1, n, true);
      break;
    case 3:
      connector_side(data + 1, n, false);
      break;
    default:
      connector_side(data + 1, n, true);
      break;
  }
  return 0;
}

std::vector<std::vector<uint8_t>> verbs_seeds() {
  std::vector<std::vector<uint8_t>> out;
  auto with = [](uint8_t mode, const void* p, size_t n, size_t extra, uint8_t fill) {
    std::vector<uint8_t> s{mode};
    s.insert(s.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    s.insert(s.end(), extra, fill);
    return s;
  };
  // Handles: a proper one (port 1 on loopback: refused), IPv6, a wrong version.
  HandleWire w{};
  std::memcpy(w.magic, "GWV1", 4);
  w.version = verbs::kWireVersion;
  w.family = AF_INET;
  w.port_be = htons(1);
  out.push_back(with(0, &w, sizeof(w), 0, 0));
  w.family = AF_INET6;
  out.push_back(with(0, &w, sizeof(w), 0, 0));
  w.version = 1;
  out.push_back(with(0, &w, sizeof(w), 0, 0));
  // Hellos: raw and patched, with a port of each link layer, QP numbers the emulator has and has
  // not, then a ready record with a wrong proof.
  HelloWire hello{};
  std::memcpy(hello.magic, "GWVH", 4);
  hello.version = verbs::kWireVersion;
  hello.nqps = 1;
  hello.rank = 1;
  hello.port.link_layer = 2;  // Ethernet (RoCE)
  hello.port.mtu = 3;
  hello.qpn[0] = 1;
  ReadyWire ready{};
  ready.ready = verbs::kReady;
  for (uint8_t mode : {1, 2}) {
    std::vector<uint8_t> s = with(mode, &hello, sizeof(hello), 0, 0);
    s.insert(s.end(), reinterpret_cast<uint8_t*>(&ready),
             reinterpret_cast<uint8_t*>(&ready) + sizeof(ready));
    out.push_back(s);
  }
  hello.port.link_layer = 1;  // InfiniBand
  hello.port.lid = 7;
  hello.qpn[0] = 0xffffff;
  out.push_back(with(2, &hello, sizeof(hello), sizeof(ready), 0x33));
  hello.nqps = 200;
  out.push_back(with(1, &hello, sizeof(hello), 0, 0));
  // Fake listener answers: a refusal, an acceptance with a wrong proof, garbage.
  ReplyWire reply{};
  std::memcpy(reply.magic, "GWVR", 4);
  out.push_back(with(3, &reply, sizeof(reply), 0, 0));
  reply.accepted = 1;
  reply.nqps = 1;
  out.push_back(with(4, &reply, sizeof(reply), 0, 0));
  out.push_back({3, 'G', 'W'});
  return out;
}

}  // namespace gw::fuzz
