// shm handshake, listener side (fuzz_targets.h). Wire: docs/wire-shm.md.
#include <sys/socket.h>

#include <cstring>
#include <memory>

#include "core/net/handshake.h"
#include "core/net/shm_transport.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

constexpr int64_t kStepMs = 20;

std::unique_ptr<net::Transport>& shm_transport() {
  static auto* t = [] {
    net::TransportOptions o;
    o.job_token = "fuzz-token";
    o.timeout_ms = 200;
    o.rank = 0;
    o.host_id = "fuzz-host";
    auto made = net::make_shm_transport(o);
    check(made.ok(), "shm fuzz: transport");
    return new std::unique_ptr<net::Transport>(std::move(*made));
  }();
  return *t;
}

}  // namespace

int shm_handshake(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const bool patch = (data[0] & 1) != 0;
  const uint8_t* rest = data + 2;
  const size_t n = std::min<size_t>(size - 2, 4096);
  const size_t n1 = std::min<size_t>(n, data[1]);
  net::Handle h;
  auto l = shm_transport()->listen(&h);
  check(l.ok(), "shm fuzz: listen");
  (*l)->expect_peer(1);
  // Handle layout: nonce at 8, listener rank at 16, socket name at 24 (32 bytes).
  std::string name(reinterpret_cast<const char*>(h.bytes.data()) + 24,
                   strnlen(reinterpret_cast<const char*>(h.bytes.data()) + 24, 32));
  auto addr = sys::UnixAddress::abstract(name);
  check(addr.ok(), "shm fuzz: address");
  auto fd = sys::connect_unix(*addr, SOCK_SEQPACKET);
  check(fd.ok(), "shm fuzz: connect");
  std::vector<uint8_t> first(rest, rest + n1);
  if (patch && first.size() >= 56) {
    std::memcpy(first.data(), "GWSI", 4);
    std::memcpy(first.data() + 8, h.bytes.data() + 8, 8);  // nonce
    int32_t rank = 1, listener = 0;
    std::memcpy(first.data() + 16, &rank, 4);
    std::memcpy(first.data() + 20, &listener, 4);
  }
  std::vector<uint8_t> second(rest + n1, rest + n);
  auto drive = [&] {
    auto a = (*l)->accept();
    check(a.ok(), "shm fuzz: accept never fails on a peer's bytes");
    check(*a == nullptr, "shm fuzz: a connector without the token was accepted");
  };
  (void)sys::send_with_fds(fd->get(), first.data(), first.size(), {}, sys::kNoWait, "fuzz");
  const sys::Deadline until = sys::deadline_after_ms(kStepMs);
  bool sent_second = false;
  uint8_t reply[128];
  while (!sys::expired(until)) {
    drive();
    std::vector<sys::Fd> fds;
    auto got = sys::recv_with_fds(fd->get(), reply, sizeof(reply), &fds, sys::kNoWait, "fuzz");
    if (!got.ok()) {
      if (got.status().code() == Code::kTimeout) continue;
      break;
    }
    if (*got == 0) break;              // the listener dropped us
    if (*got == 72 && !sent_second) {  // a challenge: answer with the rest of the input
      (void)sys::send_with_fds(fd->get(), second.data(), second.size(), {}, sys::kNoWait, "f");
      sent_second = true;
      ++counter("shm.challenged");
      continue;
    }
    break;  // a refusal
  }
  fd->reset();
  for (int i = 0; i < 3; ++i) drive();
  return 0;
}

std::vector<std::vector<uint8_t>> shm_seeds() {
  std::vector<std::vector<uint8_t>> out;
  std::vector<uint8_t> hello(56, 0);
  std::memcpy(hello.data(), "GWSI", 4);
  std::vector<uint8_t> proof(40, 0x33);
  std::memcpy(proof.data(), "GWSP", 4);
  for (uint8_t mode : {0, 1}) {
    std::vector<uint8_t> s{mode, 56};
    s.insert(s.end(), hello.begin(), hello.end());
    s.insert(s.end(), proof.begin(), proof.end());
    out.push_back(s);
  }
  std::vector<uint8_t> old{1, 255};  // a version-1 hello (280 bytes, token in clear)
  old.resize(2 + 280, 0);
  std::memcpy(old.data() + 2, "GWSH", 4);
  out.push_back(old);
  return out;
}

}  // namespace gw::fuzz
