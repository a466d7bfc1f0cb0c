// What the transport_conformance_test binary's files share: the fixture that makes a transport for
// each backend (and its -netns and threaded variants), the helpers that post and poll requests, the
// child process of the cross-process cases, the backends the suites are instantiated for. Defined
// inline in a named namespace, so the fixtures are one type in every file (gtest requires it).
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/net/tcp/uring_send.h"
#include "core/net/transport.h"
#include "tests/support/exec_child.h"
#include "tests/support/netns_link.h"
#include "tests/support/sanitizers.h"
#include "tests/support/test_env.h"

namespace gw::net::conformance {

using ::gw::testing::NetnsLink;
using ::gw::testing::now_ms;
using ::gw::testing::ScopedEnv;

// Backends outside gw_core (dpdk) come from gw_backends, which this test links. Without
// GW_DPDK_EAL_ARGS dpdk's default EAL arguments (no hugepages, no PCI) give a loopback net_ring
// port in this process; in a build without dpdk its case is skipped with the registry's reason.

// A loopback net_ring lives inside one process: a forked child gets a copy of the ring that
// leads nowhere. Cross-process and killed-process cases of dpdk run across network namespaces
// (tests/dpdk/dpdk_netns_test.cc) instead.
#define SKIP_IF_ONE_PROCESS_ONLY()                                                             \
  if (GetParam() == "dpdk")                                                                    \
  GTEST_SKIP() << "dpdk here is a loopback net_ring inside this process; cross-process cases " \
                  "run across namespaces in dpdk_netns_test"

constexpr int64_t kWaitMs = 20000;  // generous bound for any single wait in this suite

inline TransportOptions make_options(const std::string& token = "conformance-token",
                                     int64_t timeout_ms = 10000, int rank = 0) {
  TransportOptions o;
  o.job_token = token;
  o.timeout_ms = timeout_ms;
  o.host_id = "conformance-host";
  o.rank = rank;
  return o;
}

// Deterministic content: 8-byte words of a hash of (seed, word index).
inline void fill_pattern(void* buf, size_t size, uint64_t seed) {
  auto* p = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < size; i += 8) {
    uint64_t x = (seed + 1) * 0x9e3779b97f4a7c15ull ^ (i * 0xbf58476d1ce4e5b9ull);
    x ^= x >> 31;
    std::memcpy(p + i, &x, std::min<size_t>(8, size - i));
  }
}

inline bool check_pattern(const void* buf, size_t size, uint64_t seed) {
  std::vector<uint8_t> want(size);
  fill_pattern(want.data(), size, seed);
  return size == 0 || std::memcmp(want.data(), buf, size) == 0;
}

// One posted request and what test() said about it.
struct Op {
  Comm* comm = nullptr;
  Request* req = nullptr;
  bool done = false;
  size_t size = 0;
  Status status;
  bool finished() const { return done || !status.ok(); }
};

// Polls every op until each is done or failed; false when the deadline passed first.
inline bool run_ops(std::vector<Op*> ops, int64_t ms = kWaitMs) {
  int64_t deadline = now_ms() + ms;
  while (now_ms() < deadline) {
    bool all = true;
    for (Op* op : ops) {
      if (op->finished()) continue;
      op->status = op->comm->test(op->req, &op->done, &op->size);
      all &= op->finished();
    }
    if (all) return true;
  }
  return false;
}

inline Op post_send(SendComm* c, const void* data, size_t size, int tag) {
  Op op;
  op.comm = c;
  Result<Request*> r = c->isend(data, size, tag, nullptr);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (r.ok()) {
    op.req = *r;
    EXPECT_NE(op.req, nullptr);
  }
  return op;
}

inline Op post_recv(RecvComm* c, void* data, size_t size, int tag) {
  Op op;
  op.comm = c;
  Result<Request*> r = c->irecv(data, size, tag, nullptr);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  if (r.ok()) {
    op.req = *r;
    EXPECT_NE(op.req, nullptr);
  }
  return op;
}

// Untouched pages of a MAP_NORESERVE mapping cost no memory: big enough to outrun every kernel
// buffer between the two ends without allocating it.
class SparseBuffer {
 public:
  explicit SparseBuffer(size_t size) : size_(size) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~SparseBuffer() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  uint8_t* data() const { return data_; }

 private:
  size_t size_;
  uint8_t* data_;
};

struct Pair {
  std::unique_ptr<Listener> listener;
  std::unique_ptr<SendComm> send;
  std::unique_ptr<RecvComm> recv;
};

// Listens on `a`, connects from `b`, polling both alternately from this one thread.
inline Status connect_pair(Transport& a, Transport& b, Pair* out) {
  Handle handle;
  GW_ASSIGN_OR_RETURN(out->listener, a.listen(&handle));
  GW_ASSIGN_OR_RETURN(std::unique_ptr<Connector> connector, b.connect(handle));
  int64_t deadline = now_ms() + kWaitMs;
  while (out->send == nullptr || out->recv == nullptr) {
    if (now_ms() > deadline) return timeout_error("connect_pair: no connection");
    if (out->send == nullptr) {
      GW_ASSIGN_OR_RETURN(out->send, connector->poll());
    }
    if (out->recv == nullptr) {
      GW_ASSIGN_OR_RETURN(out->recv, out->listener->accept());
    }
  }
  return ok_status();
}

// Where a cross-process case's child runs: in this process's network namespace (netns empty),
// or in the namespace at path `netns` with `env` ("NAME=value") replacing this process's values.
struct ChildPlace {
  std::string netns;
  std::vector<std::string> env;
};

// The other end of a cross-process case, in a helper process (tests/support/exec_child.h) that
// runs ConformanceChild.Run: `role` is connect-stream or connect-sequence (connect to `handle`
// and send), listen-stream or listen-sequence (write the handle of a new listener to descriptor
// `handle_fd`, then receive).
class Child : public ::gw::testing::ExecChild {
 public:
  Child(const std::string& role, const std::string& backend, const Handle* handle, int handle_fd,
        const ChildPlace& place)
      : ExecChild(
            "ConformanceChild.Run",
            with(place.env, {"GW_CONFORMANCE_CHILD=" + role, "GW_CONFORMANCE_BACKEND=" + backend,
                             "GW_CONFORMANCE_HANDLE=" + hex(handle),
                             "GW_CONFORMANCE_FD=" + std::to_string(handle_fd)}),
            place.netns) {}
  int wait(int64_t ms = kWaitMs) { return ExecChild::wait(ms); }

 private:
  static std::vector<std::string> with(std::vector<std::string> a,
                                       const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
  static std::string hex(const Handle* h) {
    static const char kDigits[] = "0123456789abcdef";
    std::string out;
    if (h != nullptr) {
      for (uint8_t b : h->bytes) {
        out += kDigits[b >> 4];
        out += kDigits[b & 15];
      }
    }
    return out;
  }
};

// Reads a handle a child writes to `fd`; false if none came within `ms`.
inline bool read_handle(int fd, Handle* h, int64_t ms = kWaitMs) {
  size_t got = 0;
  int64_t deadline = now_ms() + ms;
  while (got < kHandleSize && now_ms() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = read(fd, h->bytes.data() + got, kHandleSize - got);
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return got == kHandleSize;
}

// The namespace and link of the "-netns" variants: made on this process's first use, removed at
// its exit (so a verbs emulator NIC started on this end's address keeps it while the process
// lives); nullptr with the reason when it cannot be made here.
inline const NetnsLink* process_netns(std::string* why) {
  static std::string reason;
  static const std::unique_ptr<NetnsLink> link = NetnsLink::create(&reason);
  *why = reason;
  return link.get();
}

// Whether `text` names IPv4 address `ip` (not merely a longer one that starts with it).
inline bool mentions_address(const std::string& text, const std::string& ip) {
  for (size_t p = text.find(ip); p != std::string::npos; p = text.find(ip, p + 1)) {
    size_t end = p + ip.size();
    bool before_ok =
        p == 0 || !(std::isdigit(static_cast<unsigned char>(text[p - 1])) || text[p - 1] == '.');
    bool after_ok = end == text.size() ||
                    !(std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.');
    if (before_ok && after_ok) return true;
  }
  return false;
}

// A parameter names a backend, optionally with a variant: "tcp-threads" is tcp with two I/O
// worker threads per comm over four sockets (so each thread owns two), set through the
// environment for the whole test, forked children included. "verbs-emu" is verbs over the
// emulator; "tcp-zc"/"tcp-zc-threads" send every message with MSG_ZEROCOPY (GW_SOCKET_ZEROCOPY=on),
// "tcp-uring"/"tcp-uring-threads" by io_uring SEND_ZC (=uring; copying where io_uring is
// unavailable, and skipped in builds without it);
// "shm-cma" reads every message from the sender's buffer, "shm-refused" has that refused (the
// ring carries all), "shm-ring" never offers it. "verbs-emu-striped" stripes every message over
// three queue pairs. A "-netns" variant
// ("tcp-netns", "verbs-emu-netns") runs the cross-process cases with the child in a network
// namespace of its own (tests/support/netns_link.h): this process binds to its end of the veth
// pair (GW_SOCKET_IFNAME, and GW_VERBS_EMU_ADDR for the emulator's NIC), the child to the other,
// and each case checks that its bytes crossed the link.
class TransportConformance : public ::testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    // Keep every byte of this suite on loopback (the -netns variants: on their own veth pair).
    setenv("GW_SOCKET_IFNAME", "lo", 1);
  }

  static bool netns() {
    const std::string& p = GetParam();
    const std::string suffix = "-netns";
    return p.size() > suffix.size() &&
           p.compare(p.size() - suffix.size(), suffix.size(), suffix) == 0;
  }

  // The backend's name as make_transport and Properties know it.
  static std::string backend() {
    const std::string& p = GetParam();
    return p.substr(0, p.find('-'));
  }

  void SetUp() override {
    if (GetParam() == "tcp-threads") {
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_NTHREADS", "2"));
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_NSOCKS", "4"));
    }
    if (GetParam().rfind("tcp-zc", 0) == 0) {  // every message by MSG_ZEROCOPY, even copied
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_ZEROCOPY", "on"));
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_ZEROCOPY_MIN", "0"));
    }
    if (GetParam().rfind("tcp-uring", 0) == 0) {  // every message by io_uring SEND_ZC
      if (!tcp::uring_built()) GTEST_SKIP() << "built without io_uring (GW_WITH_URING=OFF)";
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_ZEROCOPY", "uring"));
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_ZEROCOPY_MIN", "0"));
    }
    if (GetParam() == "tcp-zc-threads" || GetParam() == "tcp-uring-threads") {
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_NTHREADS", "2"));
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_NSOCKS", "4"));
    }
    if (GetParam() == "shm-cma" || GetParam() == "shm-refused") {  // single-copy from 1 byte
      env_.push_back(std::make_unique<ScopedEnv>("GW_SHM_CMA_MIN", "1"));
    }
    if (GetParam() == "shm-refused") {  // ... offered, refused: the ring
      env_.push_back(std::make_unique<ScopedEnv>("GW_SHM_CMA_INJECT_REFUSE", "1"));
    }
    if (GetParam() == "shm-ring") {  // the two-copy ring only
      env_.push_back(std::make_unique<ScopedEnv>("GW_SHM_CMA_MIN", "0"));
    }
    if (GetParam().rfind("verbs-emu", 0) == 0) {
      env_.push_back(std::make_unique<ScopedEnv>("GW_VERBS_EMULATE", "1"));
    }
    if (GetParam() == "verbs-emu-striped") {
      env_.push_back(std::make_unique<ScopedEnv>("GW_IB_QPS_PER_CONN", "3"));
    }
    if (netns()) {
      std::string why;
      link_ = process_netns(&why);
      if (link_ == nullptr) GTEST_SKIP() << GetParam() << " cannot run here: " << why;
      const std::string ifname = "=" + link_->here_ifname();
      env_.push_back(std::make_unique<ScopedEnv>("GW_SOCKET_IFNAME", ifname.c_str()));
      env_.push_back(std::make_unique<ScopedEnv>("GW_VERBS_EMU_ADDR", link_->here_ip().c_str()));
      place_.netns = link_->path();
      place_.env = {"GW_SOCKET_IFNAME==" + link_->there_ifname(),
                    "GW_VERBS_EMU_ADDR=" + link_->there_ip()};
    }
    Result<std::unique_ptr<Transport>> t = make_transport(backend(), make_options());
    if (!t.ok() && t.status().code() == Code::kUnsupported) {
      GTEST_SKIP() << GetParam() << " cannot run here: " << t.status().to_string();
    }
    ASSERT_TRUE(t.ok()) << t.status().to_string();
    transport_ = std::move(*t);
    if (netns()) {
      const std::string& where = transport_->properties().interfaces;
      if (backend() == "verbs" && !mentions_address(where, link_->here_ip())) {
        GTEST_SKIP() << "this process's emulated NIC was started earlier on another address ("
                     << where << "): one NIC per process, so run the -netns cases in a process "
                     << "of their own (ctest does; or --gtest_filter='*netns*')";
      }
      ASSERT_TRUE(mentions_address(where, link_->here_ip()))
          << where << " is not this end of the link, " << link_->here_ip();
      link_before_ = link_->here_bytes();
    }
    if (GetParam() == "tcp-threads") {
      ASSERT_EQ(transport_->properties().io_threads, 2);
      ASSERT_EQ(transport_->properties().sockets_per_conn, 4);
    }
  }

  std::unique_ptr<Transport> make(const TransportOptions& o) {
    Result<std::unique_ptr<Transport>> t = make_transport(backend(), o);
    EXPECT_TRUE(t.ok()) << t.status().to_string();
    return t.ok() ? std::move(*t) : nullptr;
  }

  Pair pair() {
    Pair p;
    Status s = connect_pair(*transport_, *transport_, &p);
    EXPECT_TRUE(s.ok()) << s.to_string();
    return p;
  }

  // Sends and receives one message of `size` bytes from this thread; checks content and size.
  void roundtrip(Pair& p, size_t size, uint64_t seed) {
    std::vector<uint8_t> src(size), dst(size + 1, 0xEE);
    fill_pattern(src.data(), size, seed);
    Op s = post_send(p.send.get(), src.data(), size, 3);
    Op r = post_recv(p.recv.get(), dst.data(), size, 3);
    ASSERT_TRUE(run_ops({&s, &r})) << "size " << size;
    ASSERT_TRUE(s.status.ok()) << s.status.to_string();
    ASSERT_TRUE(r.status.ok()) << r.status.to_string();
    EXPECT_EQ(r.size, size);
    EXPECT_TRUE(check_pattern(dst.data(), size, seed)) << "content differs, size " << size;
    EXPECT_EQ(dst[size], 0xEE) << "wrote past the message";
  }

  // The -netns variants: at least `rx` bytes came in and `tx` went out through this end of the
  // link since SetUp (payload only; headers make the real figures larger), waiting up to 5 s for
  // what a sender's kernel may still hold in its buffers. Elsewhere nothing.
  void expect_link_carried(uint64_t rx, uint64_t tx) {
    if (link_ == nullptr) return;
    NetnsLink::Bytes now = link_->here_bytes();
    for (int64_t deadline = now_ms() + 5000;
         (now.rx - link_before_.rx < rx || now.tx - link_before_.tx < tx) && now_ms() < deadline;
         now = link_->here_bytes()) {
      usleep(1000);
    }
    EXPECT_GE(now.rx - link_before_.rx, rx)
        << "the bytes did not come in over " << link_->here_ifname();
    EXPECT_GE(now.tx - link_before_.tx, tx)
        << "the bytes did not go out over " << link_->here_ifname();
  }

  std::unique_ptr<Transport> transport_;
  std::vector<std::unique_ptr<ScopedEnv>> env_;  // restored after the test's transports are gone
  const NetnsLink* link_ = nullptr;              // the -netns variants' link
  NetnsLink::Bytes link_before_;
  ChildPlace place_;  // where cross-process cases start their child
};

// The cases with a peer in another process: instantiated for the backends above and for the
// -netns variants, which run only these.
// These cases fork() once the process runs threads, which ThreadSanitizer does not support; the
// release and ASan builds run them.
class TransportConformanceAcrossProcesses : public TransportConformance {
 protected:
  void SetUp() override {
    if (::gw::testing::kThreadSanitizer) GTEST_SKIP() << "fork() after threads under TSan";
    TransportConformance::SetUp();
  }
};

// The backends every suite is instantiated for.
inline const auto kBackends = ::testing::Values(
    std::string("tcp"), std::string("tcp-threads"), std::string("tcp-zc"),
    std::string("tcp-zc-threads"), std::string("tcp-uring"), std::string("tcp-uring-threads"),
    std::string("shm"), std::string("shm-cma"), std::string("shm-refused"), std::string("shm-ring"),
    std::string("dpdk"), std::string("verbs"), std::string("verbs-emu"),
    std::string("verbs-emu-striped"));

inline std::string param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

}  // namespace gw::net::conformance
