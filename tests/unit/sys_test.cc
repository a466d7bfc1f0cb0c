// core/sys (descriptors, time, unix sockets with descriptor passing, memfd regions, huge pages) and
// the two helpers the transports share on top of it: the handshake fields and the comm adapters.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/net/comm_adapter.h"
#include "core/net/handshake.h"
#include "core/store.h"
#include "core/sys/fd.h"
#include "core/sys/huge_pages.h"
#include "core/sys/memfd_region.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"

namespace gw::sys {
namespace {

using namespace std::chrono_literals;

bool is_open(int fd) { return fcntl(fd, F_GETFD) >= 0; }

TEST(SysFd, ClosesOnDestructionAndMovesOwnership) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  {
    Fd a(fds[0]);
    Fd b(std::move(a));
    EXPECT_FALSE(a.valid());
    EXPECT_EQ(b.get(), fds[0]);
    Fd c;
    c = std::move(b);
    EXPECT_TRUE(is_open(fds[0]));
  }
  EXPECT_FALSE(is_open(fds[0]));
  Fd w(fds[1]);
  int raw = w.release();
  EXPECT_FALSE(w.valid());
  EXPECT_TRUE(is_open(raw));
  w.reset(raw);
  w.reset();
  EXPECT_FALSE(is_open(raw));
}

TEST(SysTime, DeadlinesAndRemainingTime) {
  // The lower bounds allow for the time this thread actually spent (it may be preempted).
  const auto before = Clock::now();
  Deadline d = deadline_after_ms(200);
  const bool was_expired = expired(d);
  if (Clock::now() - before < 200ms) {
    EXPECT_FALSE(was_expired);
  }
  int ms = ms_until(d);
  const int64_t ns = ns_until(d);
  const auto spent = Clock::now() - before;
  EXPECT_GE(ms, 200 - std::chrono::duration_cast<std::chrono::milliseconds>(spent).count() - 1);
  EXPECT_LE(ms, 200);
  EXPECT_GE(ns, 200'000'000 - std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count());
  EXPECT_LE(ns, 200'000'000);
  EXPECT_TRUE(expired(kNoWait));
  EXPECT_EQ(ms_until(kNoWait), 0);
  EXPECT_EQ(ns_until(deadline_after_ms(-5)), 0);
  // Far deadlines clamp to what poll() takes.
  EXPECT_EQ(ms_until(Clock::now() + std::chrono::hours(24 * 365 * 100)), INT32_MAX);
  // Rounded up: a deadline 1 ns away still waits 1 ms, never 0 (which would spin).
  const Deadline near = Clock::now() + 500us;
  const int near_ms = ms_until(near);
  if (Clock::now() < near) {  // else preempted past it: 0 is right
    EXPECT_EQ(near_ms, 1);
  }
  // The store's names are these.
  static_assert(std::is_same_v<gw::Deadline, Deadline>);
  int64_t a = now_ns();
  std::this_thread::sleep_for(2ms);
  EXPECT_GE(now_ns() - a, 2'000'000);
}

TEST(SysUnixSocket, PassesDescriptorsOverASocketPair) {
  for (int type : {SOCK_STREAM, SOCK_SEQPACKET}) {
    auto pair = unix_socket_pair(type);
    ASSERT_TRUE(pair.ok()) << pair.status().to_string();
    auto& [a, b] = *pair;
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    Fd read_end(p[0]);
    Fd write_end(p[1]);
    const int lent[] = {write_end.get()};
    ASSERT_TRUE(send_with_fds(a.get(), "hello", 5, lent, deadline_after_ms(1000), "test").ok());
    write_end.reset();  // the peer's duplicate keeps the pipe open

    char buf[16] = {};
    std::vector<Fd> got;
    auto n = recv_with_fds(b.get(), buf, sizeof(buf), &got, deadline_after_ms(1000), "test");
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(*n, 5u);
    EXPECT_EQ(std::string(buf, 5), "hello");
    ASSERT_EQ(got.size(), 1u);
    EXPECT_TRUE(fcntl(got[0].get(), F_GETFD) & FD_CLOEXEC);
    ASSERT_EQ(write(got[0].get(), "x", 1), 1);
    char c = 0;
    ASSERT_EQ(read(read_end.get(), &c, 1), 1);
    EXPECT_EQ(c, 'x');
  }
}

TEST(SysUnixSocket, DeadlinesCloseAndBadInput) {
  auto pair = unix_socket_pair(SOCK_SEQPACKET);
  ASSERT_TRUE(pair.ok());
  auto& [a, b] = *pair;
  char buf[8];
  std::vector<Fd> got;
  auto start = Clock::now();
  auto n = recv_with_fds(b.get(), buf, sizeof(buf), &got, deadline_after_ms(50), "quiet peer");
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), Code::kTimeout);
  EXPECT_NE(n.status().message().find("quiet peer"), std::string::npos);
  EXPECT_GE(Clock::now() - start, 45ms);
  // kNoWait: one attempt, no wait.
  n = recv_with_fds(b.get(), buf, sizeof(buf), &got, kNoWait, "try");
  EXPECT_EQ(n.status().code(), Code::kTimeout);

  std::vector<int> many(kMaxPassedFds + 1, a.get());
  EXPECT_EQ(send_with_fds(a.get(), "x", 1, many, kNoWait, "many").code(), Code::kInvalidArg);
  const int one[] = {a.get()};
  EXPECT_EQ(send_with_fds(a.get(), "", 0, one, kNoWait, "empty").code(), Code::kInvalidArg);

  a.reset();
  n = recv_with_fds(b.get(), buf, sizeof(buf), &got, deadline_after_ms(1000), "closed");
  ASSERT_TRUE(n.ok()) << n.status().to_string();
  EXPECT_EQ(*n, 0u);
  Status s = send_with_fds(b.get(), "x", 1, {}, deadline_after_ms(1000), "to closed");
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
}

TEST(SysUnixSocket, StreamSendWaitsForRoomUntilItsDeadline) {
  auto pair = unix_socket_pair(SOCK_STREAM);
  ASSERT_TRUE(pair.ok());
  auto& [a, b] = *pair;
  std::vector<char> big(8 << 20, 'z');
  Status s = send_with_fds(a.get(), big.data(), big.size(), {}, deadline_after_ms(50), "full");
  EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();

  // With a reader, every byte arrives.
  auto pair2 = unix_socket_pair(SOCK_STREAM);
  ASSERT_TRUE(pair2.ok());
  auto& [c, d] = *pair2;
  size_t total = 0;
  std::thread reader([&, fd = d.get()] {
    std::vector<char> buf(1 << 16);
    std::vector<Fd> got;
    while (total < big.size()) {
      auto n = recv_with_fds(fd, buf.data(), buf.size(), &got, deadline_after_ms(5000), "r");
      if (!n.ok() || *n == 0) break;
      total += *n;
    }
  });
  s = send_with_fds(c.get(), big.data(), big.size(), {}, deadline_after_ms(5000), "all");
  reader.join();
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(total, big.size());
}

TEST(SysUnixSocket, AbstractListenerAcceptsAndNamesItsPeer) {
  std::string name = "gradwire-sys-test-" + std::to_string(getpid());
  auto addr = UnixAddress::abstract(name);
  ASSERT_TRUE(addr.ok());
  EXPECT_EQ(addr->to_string(), "@" + name);
  auto none = connect_unix(*addr, SOCK_SEQPACKET);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kPeer) << none.status().to_string();

  auto l = listen_unix(*addr, SOCK_SEQPACKET, 4);
  ASSERT_TRUE(l.ok()) << l.status().to_string();
  auto nothing = accept_unix(l->get());
  ASSERT_TRUE(nothing.ok());
  EXPECT_FALSE(nothing->valid());
  auto c = connect_unix(*addr, SOCK_SEQPACKET);
  ASSERT_TRUE(c.ok()) << c.status().to_string();
  auto s = accept_unix(l->get());
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(s->valid());
  auto cred = peer_credentials(s->get());
  ASSERT_TRUE(cred.ok());
  EXPECT_EQ(cred->pid, getpid());
  EXPECT_EQ(cred->uid, getuid());

  EXPECT_FALSE(UnixAddress::abstract("").ok());
  EXPECT_FALSE(UnixAddress::path(std::string(200, 'p')).ok());
  auto path = UnixAddress::path("/tmp/x.sock");
  ASSERT_TRUE(path.ok());
  EXPECT_EQ(path->to_string(), "/tmp/x.sock");
}

TEST(SysMemfdRegion, MappedTwiceSeesTheSameBytes) {
  auto region = MemfdRegion::create("gradwire-sys-test", 64 << 10);
  ASSERT_TRUE(region.ok()) << region.status().to_string();
  EXPECT_EQ(region->size(), 64u << 10);
  std::memcpy(region->data(), "first", 5);

  // Share it the way the processes do: over a unix socket.
  auto pair = unix_socket_pair(SOCK_SEQPACKET);
  ASSERT_TRUE(pair.ok());
  const int lent[] = {region->fd()};
  ASSERT_TRUE(send_with_fds(pair->first.get(), "m", 1, lent, kNoWait, "share").ok());
  region->close_fd();
  EXPECT_EQ(region->fd(), -1);
  char byte;
  std::vector<Fd> got;
  ASSERT_TRUE(recv_with_fds(pair->second.get(), &byte, 1, &got, kNoWait, "share").ok());
  ASSERT_EQ(got.size(), 1u);

  auto peer = MemfdRegion::map(std::move(got[0]), 64 << 10);
  ASSERT_TRUE(peer.ok()) << peer.status().to_string();
  EXPECT_NE(peer->data(), region->data());
  EXPECT_EQ(std::memcmp(peer->data(), "first", 5), 0);
  std::memcpy(static_cast<char*>(peer->data()) + 1000, "second", 6);
  EXPECT_EQ(std::memcmp(static_cast<char*>(region->data()) + 1000, "second", 6), 0);

  // The size is sealed: nobody can shrink the file under a mapping.
  EXPECT_NE(ftruncate(peer->fd(), 4096), 0);
  EXPECT_EQ(fcntl(peer->fd(), F_GET_SEALS) & (F_SEAL_SHRINK | F_SEAL_GROW),
            F_SEAL_SHRINK | F_SEAL_GROW);

  MemfdRegion moved = std::move(*peer);
  EXPECT_FALSE(peer->mapped());
  EXPECT_EQ(std::memcmp(static_cast<char*>(moved.data()) + 1000, "second", 6), 0);
}

TEST(SysMemfdRegion, RefusesADescriptorOfAnotherSize) {
  auto region = MemfdRegion::create("gradwire-sys-test", 8192);
  ASSERT_TRUE(region.ok());
  auto wrong = MemfdRegion::map(Fd(dup(region->fd())), 16384);
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().code(), Code::kPeer);
  EXPECT_NE(wrong.status().message().find("8192"), std::string::npos) << wrong.status().to_string();
  EXPECT_EQ(MemfdRegion::map(Fd(), 8192).status().code(), Code::kInvalidArg);
  EXPECT_EQ(MemfdRegion::create("empty", 0).status().code(), Code::kInvalidArg);
}

// The collapser's policy with a stand-in for madvise: which ranges it hands to MADV_COLLAPSE,
// when, and what a refusal does.
struct AdviseLog {
  std::vector<std::pair<uintptr_t, size_t>> calls;
  int answer = 0;
  HugePageCollapser::Advise fn() {
    return [this](void* a, size_t n) {
      calls.emplace_back(reinterpret_cast<uintptr_t>(a), n);
      return answer;
    };
  }
};

TEST(SysHugePages, CollapsesTheAlignedInsideOfABufferSeenTwiceThenEverySixtyFourth) {
  AdviseLog log;
  HugePageCollapser c(true, log.fn());
  constexpr size_t kMiB = size_t{1} << 20;
  const auto* p = reinterpret_cast<const void*>(0x7f0000100000);  // 1 MiB past a 2 MiB boundary
  c.note(p, 20 * kMiB);
  EXPECT_TRUE(log.calls.empty()) << "a buffer seen once is not worth a copy";
  c.note(p, 20 * kMiB);
  ASSERT_EQ(log.calls.size(), 1u);
  EXPECT_EQ(log.calls[0].first, 0x7f0000200000u);  // rounded up to 2 MiB
  EXPECT_EQ(log.calls[0].second, 18 * kMiB);       // to the last whole huge page inside
  for (int i = 3; i < 64; ++i) c.note(p, 20 * kMiB);
  EXPECT_EQ(log.calls.size(), 1u);
  c.note(p, 20 * kMiB);  // the 64th sighting
  EXPECT_EQ(log.calls.size(), 2u);
  // Another length at the same address is another buffer; small buffers are left alone.
  c.note(p, 10 * kMiB);
  c.note(p, 10 * kMiB);
  EXPECT_EQ(log.calls.size(), 3u);
  const auto* small = reinterpret_cast<const void*>(0x7f1000000000);
  for (int i = 0; i < 4; ++i) c.note(small, HugePageCollapser::kMinBytes - 1);
  EXPECT_EQ(log.calls.size(), 3u);
  // 8 MiB starting 1 byte past a boundary holds only three whole huge pages.
  const auto* odd = reinterpret_cast<const void*>(0x7f2000000001);
  c.note(odd, 8 * kMiB);
  c.note(odd, 8 * kMiB);
  ASSERT_EQ(log.calls.size(), 4u);
  EXPECT_EQ(log.calls[3].first, 0x7f2000200000u);
  EXPECT_EQ(log.calls[3].second, 6 * kMiB);
}

TEST(SysHugePages, ARefusedBufferIsNotTriedAgainAndTheTableForgetsTheOldest) {
  AdviseLog log;
  HugePageCollapser c(true, log.fn());
  constexpr size_t kBytes = size_t{16} << 20;
  const auto* a = reinterpret_cast<const void*>(0x7f0000000000);
  log.answer = EINVAL;  // a file mapping, MADV_NOHUGEPAGE, an old kernel
  for (int i = 0; i < 200; ++i) c.note(a, kBytes);
  EXPECT_EQ(log.calls.size(), 1u);
  // Out of memory for huge pages now: tried again at the next retry.
  log.answer = EAGAIN;
  const auto* b = reinterpret_cast<const void*>(0x7f1000000000);
  for (int i = 0; i < 64; ++i) c.note(b, kBytes);
  EXPECT_EQ(log.calls.size(), 3u);
  // kSlots other buffers push `b` out: seen again, it starts from its first sighting.
  log.answer = 0;
  for (size_t k = 0; k < HugePageCollapser::kSlots; ++k) {
    c.note(reinterpret_cast<const void*>(0x7e0000000000 + k * kBytes * 2), kBytes);
  }
  const size_t before = log.calls.size();
  c.note(b, kBytes);
  EXPECT_EQ(log.calls.size(), before);
  c.note(b, kBytes);
  EXPECT_EQ(log.calls.size(), before + 1);
  // Off: nothing, ever.
  AdviseLog off_log;
  HugePageCollapser off(false, off_log.fn());
  for (int i = 0; i < 100; ++i) off.note(a, kBytes);
  EXPECT_TRUE(off_log.calls.empty());
}

// The real call: a heap-like anonymous buffer, touched, seen twice, ends up in huge pages (where
// the kernel has MADV_COLLAPSE and a free huge page), with its bytes unchanged.
TEST(SysHugePages, TheKernelCollapsesAReusedBufferAndKeepsItsBytes) {
  constexpr size_t kBytes = size_t{16} << 20;
  std::vector<uint8_t> buf(kBytes);
  for (size_t i = 0; i < kBytes; ++i) buf[i] = static_cast<uint8_t>(i * 7 + 3);
  int err = 0;
  HugePageCollapser c(true, [&](void* a, size_t n) {
    err = madvise(a, n, 25 /* MADV_COLLAPSE */) == 0 ? 0 : errno;
    return err;
  });
  c.note(buf.data(), kBytes);
  c.note(buf.data(), kBytes);
  if (err != 0) GTEST_SKIP() << "MADV_COLLAPSE refused here: " << std::strerror(err);
  for (size_t i = 0; i < kBytes; ++i) {
    ASSERT_EQ(buf[i], static_cast<uint8_t>(i * 7 + 3)) << "at " << i;
  }
  // /proc/self/smaps: the mapping that holds the buffer has anonymous huge pages now.
  FILE* f = fopen("/proc/self/smaps", "r");
  ASSERT_NE(f, nullptr);
  const auto at = reinterpret_cast<uintptr_t>(buf.data());
  char line[512];
  bool inside = false;
  long huge_kb = -1;
  while (fgets(line, sizeof line, f) != nullptr) {
    unsigned long lo = 0, hi = 0;
    if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
      inside = lo <= at && at < hi;
      continue;
    }
    long kb = 0;
    if (inside && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) huge_kb = kb;
  }
  fclose(f);
  EXPECT_GE(huge_kb, 2048) << "no huge page in the buffer's mapping";
}

}  // namespace
}  // namespace gw::sys

namespace gw::net {
namespace {

TEST(Handshake, VerdictOnHelloFields) {
  struct Hello {
    char magic[4];
    uint64_t nonce;
    int32_t rank;
    int32_t listener_rank;
  } h{};
  handshake::put_magic(h.magic, "GWH2");
  h.nonce = 7;
  h.rank = 2;
  h.listener_rank = 5;
  auto verdict = [&](uint64_t nonce, int32_t me, int32_t expected) {
    return handshake::refusal({h.magic, h.nonce, h.rank, h.listener_rank},
                              {"tcp", "GWH2", nonce, me, expected});
  };
  EXPECT_EQ(verdict(7, 5, 2), "");
  EXPECT_EQ(verdict(7, -1, -1), "");
  EXPECT_EQ(verdict(8, 5, 2), "handshake for another listener (nonce mismatch)");
  EXPECT_EQ(verdict(7, 4, 2), "handshake meant for rank 5 (this listener is rank 4)");
  EXPECT_EQ(verdict(7, 5, 3), "rank 2 connected where rank 3 was expected");
  handshake::put_magic(h.magic, "GWH1");
  EXPECT_EQ(verdict(7, 5, 2), "not a gradwire tcp handshake of this version");
}

// RFC 4231, test case 2: the HMAC is OpenSSL's HMAC-SHA256.
TEST(Handshake, HmacSha256MatchesRfc4231) {
  const std::string msg = "what do ya want for nothing?";
  handshake::Mac mac =
      handshake::hmac_sha256("Jefe", reinterpret_cast<const uint8_t*>(msg.data()), msg.size());
  std::string hex;
  for (uint8_t b : mac) hex += fmt::format("{:02x}", b);
  EXPECT_EQ(hex, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(Handshake, ProofsDependOnTokenRoleAndEveryField) {
  handshake::Transcript t;
  t.protocol = "tcp";
  t.handle_nonce = 1;
  t.conn_id = 2;
  t.index = 3;
  t.connector_rank = 4;
  t.listener_rank = 5;
  ASSERT_TRUE(handshake::fresh_nonce(&t.connector_challenge).ok());
  ASSERT_TRUE(handshake::fresh_nonce(&t.listener_challenge).ok());
  EXPECT_NE(t.connector_challenge, t.listener_challenge);  // 2^-256
  const handshake::Mac mac = handshake::prove("tok", handshake::Role::kConnector, t);
  EXPECT_TRUE(handshake::verify("tok", handshake::Role::kConnector, t, mac.data()));
  EXPECT_FALSE(handshake::verify("toK", handshake::Role::kConnector, t, mac.data()));
  EXPECT_FALSE(handshake::verify("tok", handshake::Role::kListener, t, mac.data()));  // reflection
  auto changed = [&](auto&& edit) {
    handshake::Transcript u = t;
    edit(u);
    return !handshake::verify("tok", handshake::Role::kConnector, u, mac.data());
  };
  EXPECT_TRUE(changed([](auto& u) { u.protocol = "shm"; }));
  EXPECT_TRUE(changed([](auto& u) { u.handle_nonce = 9; }));
  EXPECT_TRUE(changed([](auto& u) { u.conn_id = 9; }));
  EXPECT_TRUE(changed([](auto& u) { u.index = 9; }));
  EXPECT_TRUE(changed([](auto& u) { u.connector_rank = 9; }));
  EXPECT_TRUE(changed([](auto& u) { u.listener_rank = 9; }));
  EXPECT_TRUE(changed([](auto& u) { u.connector_challenge[0] ^= 1; }));
  EXPECT_TRUE(changed([](auto& u) { u.listener_challenge[31] ^= 1; }));
  // An empty token is a key like any other (tokenless jobs still run the exchange).
  const handshake::Mac empty = handshake::prove("", handshake::Role::kConnector, t);
  EXPECT_TRUE(handshake::verify("", handshake::Role::kConnector, t, empty.data()));
  EXPECT_FALSE(handshake::verify("tok", handshake::Role::kConnector, t, empty.data()));
}

TEST(Handshake, CommonChecksAndErrors) {
  EXPECT_TRUE(handshake::tokens_equal("", ""));
  EXPECT_FALSE(handshake::tokens_equal("a", "ab"));

  char magic[4];
  handshake::put_magic(magic, "GWT1");
  EXPECT_TRUE(handshake::check_handle("tcp", magic, "GWT1", 1, 1).ok());
  EXPECT_EQ(handshake::check_handle("shm", magic, "GWS1", 1, 1).code(), Code::kInvalidArg);
  Status v = handshake::check_handle("tcp", magic, "GWT1", 2, 1);
  EXPECT_NE(v.message().find("version 2"), std::string::npos) << v.message();

  TransportOptions o;
  o.job_token = std::string(handshake::kMaxToken + 1, 't');
  EXPECT_EQ(handshake::check_options("tcp", o).code(), Code::kInvalidArg);
  o.job_token = "t";
  o.timeout_ms = 0;
  EXPECT_EQ(handshake::check_options("tcp", o).code(), Code::kInvalidArg);
  o.timeout_ms = 1;
  EXPECT_TRUE(handshake::check_options("tcp", o).ok());

  EXPECT_EQ(handshake::peer_label(3, "shm", "pid 9"), "rank 3 via shm pid 9");
  EXPECT_EQ(handshake::refused_error("p").code(), Code::kPeer);
  EXPECT_EQ(handshake::connect_timeout_error("p", 5, "").code(), Code::kTimeout);
}

// A core that records what the adapters forward to it.
struct FakeCore {
  explicit FakeCore(std::string name) : name(std::move(name)) {}
  Result<MemRegion*> reg_mr(void*, size_t, MemType) { return &region; }
  Status dereg_mr(MemRegion* mr) { return mr == &region ? ok_status() : invalid_arg("no"); }
  Status test(Request*, bool* done, size_t* size) {
    *done = true;
    *size = last_size;
    return ok_status();
  }
  std::string peer_name() const { return name; }
  Result<Request*> isend(const void*, size_t size, int, MemRegion*) {
    last_size = size;
    return static_cast<Request*>(nullptr);
  }
  Result<Request*> irecv(void*, size_t size, int, MemRegion*) {
    last_size = size + 1;
    return static_cast<Request*>(nullptr);
  }
  bool wait_fds(std::vector<pollfd>* fds) const {
    fds->push_back(pollfd{-1, POLLIN, 0});
    return true;
  }
  std::string name;
  MemRegion region;
  size_t last_size = 0;
};

TEST(CommAdapter, ForwardsEveryCallToItsCore) {
  SendCommAdapter<FakeCore> send("to rank 1");
  RecvCommAdapter<FakeCore> recv("from rank 0");
  SendComm& s = send;
  RecvComm& r = recv;
  EXPECT_EQ(s.peer_name(), "to rank 1");
  EXPECT_EQ(r.peer_name(), "from rank 0");
  auto mr = s.reg_mr(nullptr, 0, MemType::kHost);
  ASSERT_TRUE(mr.ok());
  EXPECT_EQ(*mr, &send.core().region);
  EXPECT_TRUE(s.dereg_mr(*mr).ok());
  ASSERT_TRUE(s.isend(nullptr, 42, 0, nullptr).ok());
  ASSERT_TRUE(r.irecv(nullptr, 42, 0, nullptr).ok());
  bool done = false;
  size_t size = 0;
  ASSERT_TRUE(s.test(nullptr, &done, &size).ok());
  EXPECT_EQ(size, 42u);
  ASSERT_TRUE(r.test(nullptr, &done, &size).ok());
  EXPECT_EQ(size, 43u);
  std::vector<pollfd> fds;
  EXPECT_TRUE(s.wait_fds(&fds));
  EXPECT_EQ(fds.size(), 1u);
}

struct MinimalCore {
  Result<MemRegion*> reg_mr(void*, size_t, MemType) { return unsupported("no"); }
  Status dereg_mr(MemRegion*) { return unsupported("no"); }
  Status test(Request*, bool*, size_t*) { return unsupported("no"); }
  std::string peer_name() const { return "minimal"; }
  Result<Request*> isend(const void*, size_t, int, MemRegion*) { return unsupported("no"); }
};

TEST(CommAdapter, CoreWithoutWaitFdsCannotBeWaitedOn) {
  SendCommAdapter<MinimalCore> send;
  std::vector<pollfd> fds;
  EXPECT_FALSE(static_cast<Comm&>(send).wait_fds(&fds));
  EXPECT_TRUE(fds.empty());
}

}  // namespace
}  // namespace gw::net
