// shm, the decoders shm_handshake does not reach (fuzz_targets.h): the connector fed a fake
// listener's packets (challenge, answer and the descriptor it carries), and a receiver fed the
// ring's control block and slot headers as its peer writes them. Wire: docs/wire-shm.md.
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>

#include "core/net/handshake.h"
#include "core/net/shm_transport.h"
#include "core/sys/memfd_region.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

namespace hs = net::handshake;

constexpr char kToken[] = "fuzz-token";
constexpr int64_t kStepMs = 20;
constexpr size_t kGuard = 256;
constexpr size_t kRecvCap = 8192;
constexpr uint8_t kGuardByte = 0x5c;

// The wire structs (docs/wire-shm.md), as a peer writes them.
struct Hello {
  char magic[4];
  uint32_t reserved;
  uint64_t nonce;
  int32_t rank;
  int32_t listener_rank;
  hs::Nonce challenge;
};
struct Challenge {
  char magic[4];
  uint32_t reserved;
  hs::Nonce challenge;
  hs::Mac proof;
};
struct Proof {
  char magic[4];
  uint32_t reserved;
  hs::Mac proof;
};
struct Reply {
  char magic[4];
  uint8_t answer;
  uint8_t reserved[3];
  uint32_t nslots;
  uint32_t reserved2;
  uint64_t slot_size;
  uint64_t total_size;
};
static_assert(sizeof(Hello) == 56 && sizeof(Challenge) == 72 && sizeof(Proof) == 40 &&
              sizeof(Reply) == 32);

// The ring as the receiver's peer sees it: the geometry the fuzz transport asks for.
constexpr uint32_t kNslots = 4;
constexpr uint64_t kSlotSize = 4096;
constexpr size_t kHeaders = 256;
constexpr size_t kDataOffset = 4096;  // round_up(256 + 32 * 4, 4096)
constexpr size_t kTotal = kDataOffset + kNslots * kSlotSize;

std::unique_ptr<net::Transport>& transport() {
  static auto* t = [] {
    setenv("GW_SHM_NSLOTS", "4", 1);
    setenv("GW_SHM_SLOT_SIZE", "4096", 1);
    net::TransportOptions o;
    o.job_token = kToken;
    o.timeout_ms = 200;
    o.rank = 0;
    o.host_id = "fuzz-host";
    auto made = net::make_shm_transport(o);
    check(made.ok(), "shm peer fuzz: transport");
    return new std::unique_ptr<net::Transport>(std::move(*made));
  }();
  return *t;
}

std::string sock_name(const net::Handle& h) {
  const char* p = reinterpret_cast<const char*>(h.bytes.data()) + 24;
  return std::string(p, strnlen(p, 32));
}

hs::Transcript transcript(const Hello& h, const hs::Nonce& listener_challenge) {
  hs::Transcript t;
  t.protocol = "shm";
  t.handle_nonce = h.nonce;
  t.connector_rank = h.rank;
  t.listener_rank = h.listener_rank;
  t.connector_challenge = h.challenge;
  t.listener_challenge = listener_challenge;
  return t;
}

// A real listener's RecvComm and the segment its fake connector (this file) holds.
struct RingPeer {
  std::unique_ptr<net::Listener> listener;
  std::unique_ptr<net::RecvComm> comm;
  sys::Fd sock;
  uint8_t* base = nullptr;
  std::vector<uint8_t> arena = std::vector<uint8_t>(kGuard + kRecvCap + kGuard, kGuardByte);
  net::Request* pending = nullptr;
  uint64_t head = 0;

  ~RingPeer() {
    if (base != nullptr) munmap(base, kTotal);
  }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (arena[i] != kGuardByte || arena[kGuard + kRecvCap + i] != kGuardByte) return false;
    }
    return true;
  }
};

// Connects to a fresh listener as rank 1 with the token, the way ShmConnector does, and maps the
// segment of the answer. Aborts when an honest handshake fails (a bug, not an input).
std::unique_ptr<RingPeer> ring_peer() {
  auto rp = std::make_unique<RingPeer>();
  net::Handle h;
  auto l = transport()->listen(&h);
  check(l.ok(), "shm peer fuzz: listen");
  rp->listener = std::move(*l);
  rp->listener->expect_peer(1);
  auto addr = sys::UnixAddress::abstract(sock_name(h));
  check(addr.ok(), "shm peer fuzz: address");
  auto fd = sys::connect_unix(*addr, SOCK_SEQPACKET);
  check(fd.ok(), "shm peer fuzz: connect");
  rp->sock = std::move(*fd);
  Hello hello{};
  std::memcpy(hello.magic, "GWSI", 4);
  std::memcpy(&hello.nonce, h.bytes.data() + 8, 8);
  hello.rank = 1;
  hello.listener_rank = 0;
  check(hs::fresh_nonce(&hello.challenge).ok(), "shm peer fuzz: nonce");
  check(sys::send_with_fds(rp->sock.get(), &hello, sizeof(hello), {}, sys::kNoWait, "f").ok(),
        "shm peer fuzz: hello");
  const sys::Deadline until = sys::deadline_after_ms(5000);
  bool proved = false;
  while (!sys::expired(until) && rp->base == nullptr) {
    auto a = rp->listener->accept();
    check(a.ok(), "shm peer fuzz: accept");
    if (*a) rp->comm = std::move(*a);
    uint8_t in[128];
    std::vector<sys::Fd> fds;
    auto got = sys::recv_with_fds(rp->sock.get(), in, sizeof(in), &fds, sys::kNoWait, "f");
    if (!got.ok() && got.status().code() == Code::kTimeout) continue;
    check(got.ok() && *got > 0, "shm peer fuzz: the listener answered");
    if (!proved) {
      check(*got == sizeof(Challenge), "shm peer fuzz: a challenge");
      Challenge ch;
      std::memcpy(&ch, in, sizeof(ch));
      Proof proof{};
      std::memcpy(proof.magic, "GWSP", 4);
      proof.proof = hs::prove(kToken, hs::Role::kConnector, transcript(hello, ch.challenge));
      check(sys::send_with_fds(rp->sock.get(), &proof, sizeof(proof), {}, sys::kNoWait, "f").ok(),
            "shm peer fuzz: proof");
      proved = true;
      continue;
    }
    Reply reply;
    std::memcpy(&reply, in, sizeof(reply));
    check(*got == sizeof(Reply) && fds.size() == 1 && reply.nslots == kNslots &&
              reply.slot_size == kSlotSize && reply.total_size == kTotal,
          "shm peer fuzz: the answer has the asked geometry");
    void* m = mmap(nullptr, kTotal, PROT_READ | PROT_WRITE, MAP_SHARED, fds[0].get(), 0);
    check(m != MAP_FAILED, "shm peer fuzz: map");
    rp->base = static_cast<uint8_t*>(m);
  }
  while (!rp->comm && !sys::expired(until)) {
    auto a = rp->listener->accept();
    check(a.ok(), "shm peer fuzz: accept");
    if (*a) rp->comm = std::move(*a);
  }
  check(rp->base != nullptr && rp->comm != nullptr, "shm peer fuzz: honest handshake");
  return rp;
}

// Posts the receive into the guarded arena when none is outstanding; false when the comm died.
bool repost(RingPeer& rp) {
  if (rp.pending != nullptr) {
    bool done = false;
    size_t n = 0;
    Status s = rp.comm->test(rp.pending, &done, &n);
    if (!s.ok()) return false;
    if (!done) return true;
    check(n <= kRecvCap, "shm peer fuzz: a receive reported more than its capacity");
    ++counter("shm.ring_delivered");
    rp.pending = nullptr;
  }
  auto r = rp.comm->irecv(rp.arena.data() + kGuard, kRecvCap, net::kAnyTag, nullptr);
  if (!r.ok()) return false;
  rp.pending = *r;
  return true;
}

}  // namespace

// Input: records of [u8 op][32 bytes slot header][u8 payload fill]: op bit 0..1 = how far head
// moves (0..3 slots, published after the header is written), bit 2 = also overwrite the control
// block's magic/nslots/slot_size with the header bytes, bit 3 = set error_code. The receiver's
// irecv/test must fail or deliver, never write outside its buffer or crash.
int shm_ring(const uint8_t* data, size_t size) {
  static std::unique_ptr<RingPeer> rp;
  if (!rp) rp = ring_peer();
  if (!repost(*rp)) {
    rp = ring_peer();
    check(repost(*rp), "shm peer fuzz: a fresh comm posts");
  }
  constexpr size_t kRecord = 34;
  auto* head = reinterpret_cast<std::atomic<uint64_t>*>(rp->base + 64);
  auto* error_code = reinterpret_cast<std::atomic<uint32_t>*>(rp->base + 192);
  bool alive = true;
  for (size_t off = 0; off + kRecord <= size && off < 64 * kRecord && alive; off += kRecord) {
    const uint8_t op = data[off];
    const uint64_t slot = rp->head % kNslots;
    std::memcpy(rp->base + kHeaders + slot * 32, data + off + 1, 32);
    std::memset(rp->base + kDataOffset + slot * kSlotSize, data[off + 33], kSlotSize);
    if (op & 4) std::memcpy(rp->base, data + off + 1, 16);
    if (op & 8) error_code->store(data[off + 33], std::memory_order_release);
    rp->head += op & 3;
    head->store(rp->head, std::memory_order_release);
    ++counter("shm.ring_published");
    for (int i = 0; i < 3 && alive; ++i) alive = repost(*rp);
    check(rp->guards_intact(), "shm peer fuzz: a receive wrote outside its buffer");
  }
  if (!alive) rp.reset();  // a comm the peer corrupted is dead: the next input gets a new one
  return 0;
}

// Input: [u8 flags][u8 n1][challenge bytes (n1)][answer bytes][...]: flags bit 0 = give the
// challenge a valid magic and a valid proof of the token (so the answer is read), bit 1 = attach
// a memfd of the size the answer's total_size field names (below 1 MiB, filled with the input),
// bit 2 = make the answer's magic and geometry, and the segment's control block, valid. The
// connector must fail with a status or connect, never crash, hang past its deadline or accept a
// listener that did not prove the token.
int shm_connector(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t flags = data[0];
  const uint8_t* rest = data + 2;
  const size_t n = std::min<size_t>(size - 2, 4096);
  const size_t n1 = std::min<size_t>(n, data[1]);
  // A fake listener at a fresh abstract name, and a handle naming it (docs/wire-shm.md).
  static std::atomic<uint64_t> seq{0};
  const std::string name =
      "gradwire-shm-fuzz" + std::to_string(getpid()) + "-" + std::to_string(seq.fetch_add(1));
  auto addr = sys::UnixAddress::abstract(name);
  check(addr.ok(), "shm peer fuzz: address");
  auto lfd = sys::listen_unix(*addr, SOCK_SEQPACKET, 4);
  check(lfd.ok(), "shm peer fuzz: fake listener");
  net::Handle h{};
  std::memcpy(h.bytes.data(), "GWS1", 4);
  const uint16_t version = 2;
  std::memcpy(h.bytes.data() + 4, &version, 2);
  const uint64_t nonce = 0x1234;
  std::memcpy(h.bytes.data() + 8, &nonce, 8);
  std::memcpy(h.bytes.data() + 24, name.data(), std::min<size_t>(name.size(), 32));
  std::memcpy(h.bytes.data() + 56, "fuzz-host", 9);
  net::TransportOptions o;
  o.job_token = kToken;
  o.timeout_ms = 100;
  o.rank = 1;
  o.host_id = "fuzz-host";
  static auto* connecting = new std::unique_ptr<net::Transport>(
      std::move(*net::make_shm_transport(o)));  // checked by transport() in spirit: same rows
  auto c = (*connecting)->connect(h);
  if (!c.ok()) return 0;  // a name the handle cannot hold
  sys::Fd peer;
  Hello hello{};
  bool challenged = false, answered = false;
  const sys::Deadline until = sys::deadline_after_ms(5 * kStepMs + 100);
  while (!sys::expired(until)) {
    auto polled = (*c)->poll();
    if (!polled.ok()) break;  // refused, malformed, timed out: all fine
    if (*polled != nullptr) {
      check((flags & 1) != 0, "shm peer fuzz: connected to a listener that proved nothing");
      ++counter("shm.connector_connected");
      break;
    }
    if (!peer.valid()) {
      auto a = sys::accept_unix(lfd->get());
      if (a.ok() && a->valid()) peer = std::move(*a);
      continue;
    }
    if (!challenged) {
      std::vector<sys::Fd> fds;
      auto got = sys::recv_with_fds(peer.get(), &hello, sizeof(hello), &fds, sys::kNoWait, "f");
      if (!got.ok() || *got != sizeof(hello)) continue;
      std::vector<uint8_t> first(rest, rest + n1);
      if ((flags & 1) && first.size() >= sizeof(Challenge)) {
        Challenge ch;
        std::memcpy(&ch, first.data(), sizeof(ch));
        std::memcpy(ch.magic, "GWSC", 4);
        ch.proof = hs::prove(kToken, hs::Role::kListener, transcript(hello, ch.challenge));
        std::memcpy(first.data(), &ch, sizeof(ch));
        ++counter("shm.connector_challenged");
      }
      (void)sys::send_with_fds(peer.get(), first.data(), first.size(), {}, sys::kNoWait, "f");
      challenged = true;
      continue;
    }
    if (!answered) {
      Proof proof;
      std::vector<sys::Fd> fds;
      auto got = sys::recv_with_fds(peer.get(), &proof, sizeof(proof), &fds, sys::kNoWait, "f");
      if (!got.ok() || *got == 0) continue;
      ++counter("shm.connector_proved");
      std::vector<uint8_t> second(rest + n1, rest + n);
      if ((flags & 4) && second.size() >= sizeof(Reply)) {
        Reply r;
        std::memcpy(&r, second.data(), sizeof(r));
        std::memcpy(r.magic, "GWSR", 4);
        r.answer = 'A';
        r.nslots = 1 + r.nslots % 8;
        r.slot_size = 4096;
        r.total_size = kDataOffset + r.nslots * 4096;
        std::memcpy(second.data(), &r, sizeof(r));
      }
      std::vector<sys::Fd> attach;
      if ((flags & 2) && second.size() >= sizeof(Reply)) {
        uint64_t total;
        std::memcpy(&total, second.data() + 24, 8);
        auto region =
            sys::MemfdRegion::create("fuzz", std::min<uint64_t>(total % (1 << 20), 1 << 20));
        if (region.ok()) {
          auto* seg = static_cast<uint8_t*>(region->data());
          std::memcpy(seg, rest, std::min<size_t>(n, region->size()));
          if ((flags & 4) && region->size() >= 16) {  // a ring's control block, as the answer says
            const uint32_t magic = 0x47575231;        // "GWR1"
            Reply r;
            std::memcpy(&r, second.data(), sizeof(r));
            std::memcpy(seg, &magic, 4);
            std::memcpy(seg + 4, &r.nslots, 4);
            std::memcpy(seg + 8, &r.slot_size, 8);
          }
          attach.emplace_back(dup(region->fd()));
        }
      }
      std::vector<int> raw;
      for (const sys::Fd& f : attach) raw.push_back(f.get());
      (void)sys::send_with_fds(peer.get(), second.data(), second.size(), raw, sys::kNoWait, "f");
      answered = true;
    }
  }
  return 0;
}

std::vector<std::vector<uint8_t>> shm_ring_seeds() {
  std::vector<std::vector<uint8_t>> out;
  // Honest: one message of 100 bytes in one slot, then two of a two-slot message.
  auto record = [](uint8_t op, uint64_t seq, uint64_t msg_size, uint64_t offset, uint32_t len,
                   int32_t tag, uint8_t fill) {
    std::vector<uint8_t> r(34);
    r[0] = op;
    std::memcpy(r.data() + 1, &seq, 8);
    std::memcpy(r.data() + 9, &msg_size, 8);
    std::memcpy(r.data() + 17, &offset, 8);
    std::memcpy(r.data() + 25, &len, 4);
    std::memcpy(r.data() + 29, &tag, 4);
    r[33] = fill;
    return r;
  };
  std::vector<uint8_t> s;
  for (auto r : {record(1, 0, 100, 0, 100, 0, 7), record(1, 1, 6000, 0, 4096, 0, 8),
                 record(1, 1, 6000, 4096, 1904, 0, 9)}) {
    s.insert(s.end(), r.begin(), r.end());
  }
  out.push_back(s);
  out.push_back(record(1, 0, 1 << 20, 0, 4096, 0, 1));    // larger than the receive
  out.push_back(record(1, 0, 100, 4000, 100, 0, 1));      // past its message
  out.push_back(record(3, 0, 100, 0, 100, 0, 1));         // head jumps three slots
  out.push_back(record(5, 0x47575231, 4, 0, 100, 0, 1));  // control block rewritten
  out.push_back(record(9, 0, 100, 0, 100, 0, 1));         // an error code
  out.push_back(record(1, 0, 100, 0, 0xFFFFFFFF, 0, 1));  // a single-copy descriptor unasked
  return out;
}

std::vector<std::vector<uint8_t>> shm_connector_seeds() {
  std::vector<std::vector<uint8_t>> out;
  for (uint8_t flags : {0, 1, 3, 5, 7}) {
    std::vector<uint8_t> s{flags, 72};
    s.resize(2 + 72 + 32, 0);
    std::memcpy(s.data() + 2, "GWSC", 4);
    std::memcpy(s.data() + 2 + 72, "GWSR", 4);
    s[2 + 72 + 4] = 'A';
    out.push_back(s);
  }
  std::vector<uint8_t> refused{0, 32};
  refused.resize(2 + 32, 0);
  std::memcpy(refused.data() + 2, "GWSR", 4);
  refused[2 + 4] = 'R';
  out.push_back(refused);
  return out;
}

}  // namespace gw::fuzz
