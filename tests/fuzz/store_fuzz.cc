// Store frames, server side and client side (fuzz_targets.h).
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/store.h"
#include "core/store_socket.h"
#include "core/store_wire.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

constexpr const char* kToken = "fuzz-token";

struct StoreState {
  std::shared_ptr<TcpStore> server;  // hosts the server; also the health-check client
  uint64_t inputs = 0;
};

StoreState& store_state() {
  static StoreState* st = [] {
    auto* s = new StoreState();
    TcpStoreOptions o;
    o.host_server = true;
    o.token = kToken;
    o.hello_timeout_ms = 2000;
    auto created = TcpStore::create(o);
    check(created.ok(), "store fuzz: server start");
    s->server = *created;
    return s;
  }();
  return *st;
}

// Frames of the exchange a client makes; the server reads them.
Result<Bytes> frame(const store_wire::Request& r) { return store_wire::encode_request(r); }

bool read_reply(int fd, store_wire::Op op, store_wire::Response* out, Deadline d) {
  uint8_t h[store_wire::kHeaderSize];
  if (!store_socket::recv_all(fd, h, sizeof(h), d, "fuzz").ok()) return false;
  auto len = store_wire::decode_length(h);
  if (!len.ok()) return false;
  Bytes body(*len);
  if (!store_socket::recv_all(fd, body.data(), body.size(), d, "fuzz").ok()) return false;
  auto r = store_wire::decode_response(op, body.data(), body.size());
  if (!r.ok()) return false;
  *out = *r;
  return true;
}

// The hello exchange with the right token on a fresh connection.
bool authenticate(int fd) {
  namespace hs = net::handshake;
  const Deadline d = deadline_after_ms(2000);
  store_wire::Request hello;
  if (!hs::fresh_nonce(&hello.challenge).ok()) return false;
  Bytes f = *frame(hello);
  if (!store_socket::send_all(fd, f.data(), f.size(), d, "fuzz").ok()) return false;
  store_wire::Response r;
  if (!read_reply(fd, store_wire::Op::kHello, &r, d) || r.code != store_wire::ReplyCode::kOk) {
    return false;
  }
  store_wire::Request auth;
  auth.op = store_wire::Op::kAuth;
  auth.proof =
      hs::prove(kToken, hs::Role::kConnector, store_wire::transcript(hello.challenge, r.challenge));
  f = *frame(auth);
  if (!store_socket::send_all(fd, f.data(), f.size(), d, "fuzz").ok()) return false;
  return read_reply(fd, store_wire::Op::kAuth, &r, d) && r.code == store_wire::ReplyCode::kOk;
}

}  // namespace

int store_server_frames(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0];
  const uint8_t* body = data + 1;
  const size_t n = size - 1;
  // 1. The decoder alone: whatever it accepts re-encodes to the same body.
  if (n >= store_wire::kHeaderSize) {
    auto len = store_wire::decode_length(body);
    check(!len.ok() || (*len > 0 && *len <= store_wire::kMaxBody), "store: length limits");
  }
  auto req = store_wire::decode_request(body, n);
  if (req.ok() && !(req->op == store_wire::Op::kHello && req->version != store_wire::kVersion)) {
    auto again = store_wire::encode_request(*req);
    check(again.ok(), "store: a decoded request encodes");
    ++counter("store.decoded");
    check(again->size() == n + store_wire::kHeaderSize &&
              std::memcmp(again->data() + store_wire::kHeaderSize, body, n) == 0,
          "store: request round trip");
  }
  // 2. The live server: the bytes as a connection's stream, before or after the hello exchange.
  StoreState& st = store_state();
  auto fd = store_socket::connect_tcp("127.0.0.1", st.server->port(), deadline_after_ms(2000));
  check(fd.ok(), "store: connect to the server");
  if ((mode & 1) != 0) {
    check(authenticate(fd->get()), "store: a proper hello is accepted");
    ++counter("store.authenticated");
  }
  (void)store_socket::send_all(fd->get(), body, n, deadline_after_ms(50), "fuzz");
  ::shutdown(fd->get(), SHUT_WR);
  uint8_t sink[4096];
  const Deadline until = deadline_after_ms(20);
  while (store_socket::recv_all(fd->get(), sink, 1, until, "fuzz").ok()) {
  }
  fd->reset();
  // 3. The server still serves a well-behaved client.
  if (++st.inputs % 64 == 0) {
    check(st.server->add("fuzz/health", 1, deadline_after_ms(5000)).ok(), "store: still serving");
  }
  return 0;
}

int store_client_frames(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto op = static_cast<store_wire::Op>(1 + data[0] % 6);
  auto r = store_wire::decode_response(op, data + 1, size - 1);
  if (r.ok()) {
    check(r->message.size() <= store_wire::kMaxMessage, "store: message limit");
    check(r->value.size() <= store_wire::kMaxValue, "store: value limit");
    Bytes again = store_wire::encode_response(op, *r);
    check(again.size() == size - 1 + store_wire::kHeaderSize &&
              std::memcmp(again.data() + store_wire::kHeaderSize, data + 1, size - 1) == 0,
          "store: reply round trip");
  }
  if (size >= 1 + store_wire::kHeaderSize) (void)store_wire::decode_length(data + 1);
  return 0;
}

std::vector<std::vector<uint8_t>> store_server_seeds() {
  std::vector<std::vector<uint8_t>> out;
  auto add = [&](uint8_t mode, const store_wire::Request& r) {
    Bytes f = *store_wire::encode_request(r);
    // The server-side target takes a body for the decoder and a stream for the server: a seed
    // is one frame, whose body alone also decodes.
    std::vector<uint8_t> s{mode};
    s.insert(s.end(), f.begin(), f.end());
    out.push_back(s);
    std::vector<uint8_t> b{mode};
    b.insert(b.end(), f.begin() + store_wire::kHeaderSize, f.end());
    out.push_back(b);
  };
  store_wire::Request r;
  add(0, r);  // hello
  r.op = store_wire::Op::kAuth;
  add(0, r);
  r.op = store_wire::Op::kSet;
  r.key = "fuzz/k";
  r.value = {1, 2, 3};
  add(1, r);
  r.op = store_wire::Op::kGet;
  r.wait_ms = 5;
  add(1, r);
  r.op = store_wire::Op::kAdd;
  r.key = "fuzz/ctr";
  r.delta = -3;
  add(1, r);
  r.op = store_wire::Op::kErase;
  add(1, r);
  return out;
}

std::vector<std::vector<uint8_t>> store_client_seeds() {
  std::vector<std::vector<uint8_t>> out;
  auto add = [&](store_wire::Op op, const store_wire::Response& r) {
    Bytes f = store_wire::encode_response(op, r);
    std::vector<uint8_t> s{static_cast<uint8_t>(static_cast<uint8_t>(op) - 1)};
    s.insert(s.end(), f.begin() + store_wire::kHeaderSize, f.end());
    out.push_back(s);
  };
  store_wire::Response r;
  add(store_wire::Op::kHello, r);
  add(store_wire::Op::kSet, r);
  r.value = {'v', 'a', 'l'};
  add(store_wire::Op::kGet, r);
  r.number = -42;
  add(store_wire::Op::kAdd, r);
  r.code = store_wire::ReplyCode::kError;
  r.message = "store set 'k': the key is already set";
  add(store_wire::Op::kSet, r);
  r.code = store_wire::ReplyCode::kNotFound;
  add(store_wire::Op::kGet, r);
  return out;
}

}  // namespace gw::fuzz
