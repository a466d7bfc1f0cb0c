// nccl_plugin_peer's two-process bench (bench-listen / bench-connect) and the ceilings beside it
// (daemon_scenarios.h says what each prints).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "tests/plugin/daemon_scenarios.h"
#include "tests/plugin/plugin_harness.h"
#include "tests/plugin/scenario_util.h"

// The ends of one plugin connection in two processes, as on two hosts (perf/plugin_daemon_netns.sh
// runs them in two namespace hosts); see daemon_scenarios.h for what each prints.

namespace gw::plugin_test {

namespace {

using scenario::Clock;
using scenario::connect_to;
using scenario::fail;
using scenario::unhex;

constexpr auto kBenchWait = std::chrono::seconds(60);  // the other end's start, its handle
constexpr int kBenchMsgMs = 60000;                     // one message (1 GiB at 1 Gb/s: 9 s)
constexpr uint32_t kBenchMagic = 0x47574e42;           // "GWNB"

// What the connecting end sends first: the transfers it will make, and its own listen handle
// (the connection back, for the go tokens and the ping-pong's answers).
struct BenchHello {
  uint32_t magic = kBenchMagic;
  uint32_t transfers = 0;
  uint64_t bytes = 0;
  uint64_t rounds = 0;
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
};

struct BenchArgs {
  std::string file;
  size_t bytes = 0;
  int transfers = 0;
  int rounds = 0;
};

// "64M", "4194304", "512K": bytes, or 0 when it is not a size.
size_t parse_size(const std::string& s) {
  size_t used = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &used);
  } catch (const std::exception&) {
    return 0;
  }
  const std::string unit = s.substr(used);
  if (unit == "K")
    v <<= 10;
  else if (unit == "M")
    v <<= 20;
  else if (unit == "G")
    v <<= 30;
  else if (!unit.empty())
    return 0;
  return static_cast<size_t>(v);
}

// The scenario's arguments as strings ("" when it takes none), each checked against the plugin's
// limits: "" or what is wrong.
Error parse_bench_args(const std::string& file, const std::string& bytes,
                       const std::string& transfers, const std::string& rounds, BenchArgs* a) {
  a->file = file;
  a->bytes = parse_size(bytes);
  try {
    a->transfers = std::stoi(transfers);
    a->rounds = rounds.empty() ? 1 : std::stoi(rounds);
  } catch (const std::exception&) {
    return "TRANSFERS and ROUNDS must be numbers";
  }
  // NCCL's sizes are int, and a message must fit the daemon's arena whole (GW_DAEMON_ARENA).
  if (a->bytes < 8 || a->bytes > (size_t{1} << 30)) return "BYTES '" + bytes + "' must be 8 to 1G";
  if (a->transfers < 1 || a->transfers > 1000) return "TRANSFERS must be 1 to 1000";
  if (a->rounds < 1 || a->rounds > 1000000) return "ROUNDS must be 1 to 1000000";
  return "";
}

// Writes `text` to `path` whole (a temporary file renamed over it), so a reader never sees half.
Error write_whole(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return "cannot write " + tmp + ": " + std::strerror(errno);
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  if (std::fclose(f) != 0 || !ok) return "cannot write " + tmp;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return "cannot rename " + tmp + ": " + std::strerror(errno);
  }
  return "";
}

// The first line of `path` once it exists (the other end writes it whole), within kBenchWait.
Error read_when_there(const std::string& path, std::string* line) {
  const auto until = Clock::now() + kBenchWait;
  for (;;) {
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[512] = {};
      const bool got = std::fgets(buf, sizeof(buf), f) != nullptr;
      std::fclose(f);
      *line = buf;
      while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
      if (got && !line->empty()) return "";
    }
    if (Clock::now() > until) {
      return path + " did not appear within " + std::to_string(kBenchWait.count()) +
             " s (the other end did not start?)";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

Error accept_from(NetApi& api, void* lc, void** rc) {
  *rc = nullptr;
  const auto until = Clock::now() + kBenchWait;
  while (*rc == nullptr) {
    if (api.accept(lc, rc) != ncclSuccess) return "accept failed";
    if (*rc != nullptr) break;
    if (Clock::now() > until) return "nobody connected within 60 s";
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return "";
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

const char* bench_mode() {
  const char* d = std::getenv("GW_DAEMON");
  return d != nullptr && *d != '\0' ? "daemon" : "direct";
}

// The plugin's own INFO lines of its first init (backend, daemon mode), for the log.
void say_first_init() {
  for (const std::string& line : plugin().first_init_log) {
    std::fprintf(stderr, "  %s\n", line.c_str());
  }
}

// Two 8-byte messages' worth of space: the go tokens and the ping-pong.
struct Small {
  Buffer out{8}, in{8};
};

constexpr int kTagData = 1, kTagGo = 2, kTagPing = 3, kTagHello = 9;

// The listening end: receives the transfers (each timed from posting its go token to the data's
// arrival, every one pattern-checked) and answers the connecting end's pings.
int run_bench_listen(const BenchArgs& a) {
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  say_first_init();
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE] = {};
  void* lc = nullptr;
  if (api->listen(ctx, 0, handle, &lc) != ncclSuccess) return fail("listen");
  if (Error e = write_whole(a.file, handle_hex(handle) + "\n"); !e.empty()) return fail(e);
  void* rc = nullptr;
  if (Error e = accept_from(*api, lc, &rc); !e.empty()) return fail(e);
  api->close_listen(lc);
  BenchHello hello;
  void* req = nullptr;
  std::vector<int> sizes;
  if (Error e = post_recv(*api, rc, &hello, sizeof(hello), kTagHello, nullptr, &req); !e.empty()) {
    return fail(e);
  }
  if (Error e = wait_all(*api, {req}, &sizes, kBenchMsgMs); !e.empty()) return fail("hello: " + e);
  if (sizes[0] != static_cast<int>(sizeof(hello)) || hello.magic != kBenchMagic) {
    return fail("the connecting end's first message is not a bench hello");
  }
  if (hello.bytes != a.bytes || hello.transfers != static_cast<uint32_t>(a.transfers) ||
      hello.rounds != static_cast<uint64_t>(a.rounds)) {
    return fail("the ends disagree: this end expects " + std::to_string(a.bytes) + " bytes x " +
                std::to_string(a.transfers) + ", " + std::to_string(a.rounds) +
                " rounds; the connecting end sends " + std::to_string(hello.bytes) + " x " +
                std::to_string(hello.transfers) + ", " + std::to_string(hello.rounds));
  }
  void* sc = nullptr;
  if (connect_to(*api, ctx, hello.handle, &sc) != ncclSuccess || sc == nullptr) {
    return fail("connecting back to the connecting end failed");
  }
  Buffer in(a.bytes);
  Small s;
  std::vector<double> gbps;
  int checked = 0;
  // Transfer 0 is the warm-up (checked, not timed). The sender alternates two buffers filled
  // once (seeds 100 and 101), so a transfer that delivered nothing leaves the other seed here.
  for (int i = 0; i <= a.transfers; ++i) {
    void *rreq = nullptr, *greq = nullptr;
    if (Error e = post_recv(*api, rc, in.data, a.bytes, kTagData, nullptr, &rreq); !e.empty()) {
      return fail(e);
    }
    const auto t0 = Clock::now();
    if (Error e = post_send(*api, sc, s.out.data, 8, kTagGo, nullptr, &greq); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {greq, rreq}, &sizes, kBenchMsgMs); !e.empty()) {
      return fail("transfer " + std::to_string(i) + ": " + e);
    }
    const double secs = seconds_since(t0);
    if (sizes[1] != static_cast<int>(a.bytes)) {
      return fail("transfer " + std::to_string(i) + " brought " + std::to_string(sizes[1]) +
                  " bytes");
    }
    if (int64_t bad = check_pattern(in.data, a.bytes, 100 + i % 2); bad >= 0) {
      return fail("transfer " + std::to_string(i) + ": byte " + std::to_string(bad) + " differs");
    }
    ++checked;
    if (i > 0) gbps.push_back(double(a.bytes) / secs / 1e9);
  }
  // Ping-pong, the connecting end pinging: the time between two pings' arrivals here is one
  // round trip (this end's answer, then the other end's next ping).
  std::vector<double> rtt_us;
  void* ping = nullptr;
  if (Error e = post_recv(*api, rc, s.in.data, 8, kTagPing, nullptr, &ping); !e.empty()) {
    return fail(e);
  }
  Clock::time_point last{};
  for (int k = 0; k < a.rounds; ++k) {
    if (Error e = wait_all(*api, {ping}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("ping " + std::to_string(k) + ": " + e);
    }
    const auto now = Clock::now();
    if (k > 0) rtt_us.push_back(std::chrono::duration<double, std::micro>(now - last).count());
    last = now;
    ping = nullptr;
    if (k + 1 < a.rounds) {
      if (Error e = post_recv(*api, rc, s.in.data, 8, kTagPing, nullptr, &ping); !e.empty()) {
        return fail(e);
      }
    }
    void* pong = nullptr;
    if (Error e = post_send(*api, sc, s.out.data, 8, kTagPing, nullptr, &pong); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {pong}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("pong " + std::to_string(k) + ": " + e);
    }
  }
  const double best = gbps.empty() ? 0 : *std::max_element(gbps.begin(), gbps.end());
  const double rtt = median(rtt_us);
  std::printf(
      "bench-listen mode=%s bytes=%zu transfers=%d checked=%d gbps_median=%.3f gbps_best=%.3f "
      "rounds=%d rtt_us_median=%.1f oneway_us=%.1f\n",
      bench_mode(), a.bytes, a.transfers, checked, median(gbps), best, a.rounds, rtt, rtt / 2);
  std::fflush(stdout);
  if (api->close_send(sc) != ncclSuccess || api->close_recv(rc) != ncclSuccess) {
    return fail("close");
  }
  return api->finalize(ctx) == ncclSuccess ? 0 : fail("finalize");
}

// The connecting end: sends each transfer when its go token arrives, then pings (8 bytes) and
// times each round trip to the other end's answer.
int run_bench_connect(const BenchArgs& a) {
  if (plugin().first_init != ncclSuccess) return fail("init failed");
  say_first_init();
  // Both buffers filled before anything is timed (the pattern costs more than a transfer).
  Buffer out0(a.bytes), out1(a.bytes);
  fill_pattern(out0.data, a.bytes, 100);
  fill_pattern(out1.data, a.bytes, 101);
  std::string hex;
  if (Error e = read_when_there(a.file, &hex); !e.empty()) return fail(e);
  BenchHello hello;
  hello.bytes = a.bytes;
  hello.transfers = static_cast<uint32_t>(a.transfers);
  hello.rounds = static_cast<uint64_t>(a.rounds);
  uint8_t handle[NCCL_NET_HANDLE_MAXSIZE];
  if (!unhex(hex, handle)) return fail(a.file + " does not hold a handle");
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  void* lc = nullptr;
  if (api->listen(ctx, 0, hello.handle, &lc) != ncclSuccess) return fail("listen");
  void* sc = nullptr;
  // The connection's set-up, as NCCL's proxy sees it: from the first connect call to the comm
  // (in daemon mode both daemons' job meeting through the store).
  const auto c0 = Clock::now();
  const ncclResult_t r = connect_to(*api, ctx, handle, &sc);
  if (sc == nullptr) return fail("connect returned " + std::to_string(r) + " and no comm");
  const double connect_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
  void* req = nullptr;
  if (Error e = post_send(*api, sc, &hello, sizeof(hello), kTagHello, nullptr, &req); !e.empty()) {
    return fail(e);
  }
  if (Error e = wait_all(*api, {req}, nullptr, kBenchMsgMs); !e.empty()) {
    return fail("hello: " + e);
  }
  void* rc = nullptr;
  if (Error e = accept_from(*api, lc, &rc); !e.empty()) return fail("the connection back: " + e);
  api->close_listen(lc);
  Small s;
  for (int i = 0; i <= a.transfers; ++i) {
    void *go = nullptr, *sreq = nullptr;
    if (Error e = post_recv(*api, rc, s.in.data, 8, kTagGo, nullptr, &go); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {go}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("go " + std::to_string(i) + ": " + e);
    }
    Buffer& out = i % 2 == 0 ? out0 : out1;
    if (Error e = post_send(*api, sc, out.data, a.bytes, kTagData, nullptr, &sreq); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {sreq}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("transfer " + std::to_string(i) + ": " + e);
    }
  }
  std::vector<double> rtt_us;
  for (int k = 0; k < a.rounds; ++k) {
    void *pong = nullptr, *ping = nullptr;
    if (Error e = post_recv(*api, rc, s.in.data, 8, kTagPing, nullptr, &pong); !e.empty()) {
      return fail(e);
    }
    const auto t0 = Clock::now();
    if (Error e = post_send(*api, sc, s.out.data, 8, kTagPing, nullptr, &ping); !e.empty()) {
      return fail(e);
    }
    if (Error e = wait_all(*api, {ping, pong}, nullptr, kBenchMsgMs); !e.empty()) {
      return fail("round " + std::to_string(k) + ": " + e);
    }
    rtt_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  const double rtt = median(rtt_us);
  std::printf(
      "bench-connect mode=%s bytes=%zu transfers=%d rounds=%d rtt_us_median=%.1f "
      "oneway_us=%.1f connect_ms=%.1f\n",
      bench_mode(), a.bytes, a.transfers, a.rounds, rtt, rtt / 2, connect_ms);
  std::fflush(stdout);
  if (api->close_send(sc) != ncclSuccess || api->close_recv(rc) != ncclSuccess) {
    return fail("close");
  }
  return api->finalize(ctx) == ncclSuccess ? 0 : fail("finalize");
}

// One memcpy of BYTES, TRANSFERS times: the median and best GB/s.
int run_ceiling_memcpy(const BenchArgs& a) {
  std::vector<uint8_t> src(a.bytes, 1), dst(a.bytes, 0);
  std::vector<double> gbps;
  for (int i = 0; i < a.transfers; ++i) {
    src[static_cast<size_t>(i) % a.bytes] = static_cast<uint8_t>(i);
    const auto t0 = Clock::now();
    std::memcpy(dst.data(), src.data(), a.bytes);
    gbps.push_back(double(a.bytes) / seconds_since(t0) / 1e9);
  }
  if (std::memcmp(dst.data(), src.data(), a.bytes) != 0) return fail("memcpy copied wrong");
  std::printf("ceiling-memcpy bytes=%zu transfers=%d gbps_median=%.3f gbps_best=%.3f\n", a.bytes,
              a.transfers, median(gbps), *std::max_element(gbps.begin(), gbps.end()));
  std::fflush(stdout);
  return 0;
}

// A socket closed when it goes out of scope (the peer links no gradwire library).
struct Sock {
  explicit Sock(int d) : fd(d) {}
  ~Sock() {
    if (fd >= 0) ::close(fd);
  }
  Sock(const Sock&) = delete;
  Sock& operator=(const Sock&) = delete;
  int get() const { return fd; }
  bool valid() const { return fd >= 0; }
  int fd;
};

// Every read and write of the raw TCP ceiling gives up after this long.
constexpr int kTcpIoSeconds = 60;

void set_io_deadline(int fd) {
  timeval tv{kTcpIoSeconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

Error io_all(int fd, uint8_t* p, size_t n, bool write) {
  for (size_t off = 0; off < n;) {
    const ssize_t k =
        write ? ::send(fd, p + off, n - off, MSG_NOSIGNAL) : ::recv(fd, p + off, n - off, 0);
    if (k == 0) return "the other end closed the connection";
    if (k < 0) {
      if (errno == EINTR) continue;
      return std::string(write ? "send" : "recv") + ": " + std::strerror(errno) +
             (errno == EAGAIN ? " (no progress for 60 s)" : "");
    }
    off += static_cast<size_t>(k);
  }
  return "";
}

// The raw TCP ceiling, one connection: the sink listens on every interface (port in FILE), and
// times each transfer from writing its one-byte go to the last byte's arrival, as bench-listen.
int run_tcp_sink(const BenchArgs& a) {
  Sock ls(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof(addr);
  if (!ls.valid() || ::bind(ls.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(ls.get(), 1) != 0 ||
      ::getsockname(ls.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return fail(std::string("tcp-sink: listening: ") + std::strerror(errno));
  }
  if (Error e = write_whole(a.file, std::to_string(ntohs(addr.sin_port)) + "\n"); !e.empty()) {
    return fail(e);
  }
  pollfd p{ls.get(), POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(kBenchWait.count() * 1000)) != 1) {
    return fail("tcp-sink: nobody connected within 60 s");
  }
  Sock c(::accept4(ls.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!c.valid()) return fail(std::string("tcp-sink: accept: ") + std::strerror(errno));
  set_io_deadline(c.get());
  std::vector<uint8_t> in(a.bytes);
  uint8_t go = 1;
  std::vector<double> gbps;
  for (int i = 0; i <= a.transfers; ++i) {
    const auto t0 = Clock::now();
    if (Error e = io_all(c.get(), &go, 1, true); !e.empty()) return fail("tcp-sink: " + e);
    if (Error e = io_all(c.get(), in.data(), a.bytes, false); !e.empty()) {
      return fail("tcp-sink: " + e);
    }
    if (i > 0) gbps.push_back(double(a.bytes) / seconds_since(t0) / 1e9);
  }
  if (check_pattern(in.data(), a.bytes, 7) != -1) return fail("tcp-sink: the bytes arrived wrong");
  std::printf("tcp-sink bytes=%zu transfers=%d gbps_median=%.3f gbps_best=%.3f\n", a.bytes,
              a.transfers, median(gbps), *std::max_element(gbps.begin(), gbps.end()));
  std::fflush(stdout);
  return 0;
}

int run_tcp_source(const BenchArgs& a, const std::string& ip) {
  std::vector<uint8_t> out(a.bytes);
  fill_pattern(out.data(), a.bytes, 7);
  std::string port;
  if (Error e = read_when_there(a.file, &port); !e.empty()) return fail(e);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  int p = 0;
  try {
    p = std::stoi(port);
  } catch (const std::exception&) {
  }
  if (p <= 0 || p > 65535 || ::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    return fail("tcp-source: bad address " + ip + ":" + port);
  }
  addr.sin_port = htons(static_cast<uint16_t>(p));
  Sock c(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  set_io_deadline(c.get());  // also bounds connect (SO_SNDTIMEO)
  if (!c.valid() || ::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return fail("tcp-source: connect to " + ip + ":" + port + ": " + std::strerror(errno));
  }
  uint8_t go = 0;
  for (int i = 0; i <= a.transfers; ++i) {
    if (Error e = io_all(c.get(), &go, 1, false); !e.empty()) return fail("tcp-source: " + e);
    if (Error e = io_all(c.get(), out.data(), a.bytes, true); !e.empty()) {
      return fail("tcp-source: " + e);
    }
  }
  return 0;
}

}  // namespace

int run_bench_scenario(int argc, char** argv) {
  const std::string mode = argv[1];
  std::vector<std::string> v(argv + 2, argv + argc);
  BenchArgs a;
  auto usage = [&](const char* args) {
    fail("usage: " + mode + " " + args);
    return 2;
  };
  auto parsed = [&](const std::string& f, const std::string& b, const std::string& t,
                    const std::string& r) {
    Error e = parse_bench_args(f, b, t, r, &a);
    if (!e.empty()) fail(mode + ": " + e);
    return e.empty();
  };
  if (mode == "bench-listen" || mode == "bench-connect") {
    if (v.size() != 4) return usage("FILE BYTES TRANSFERS ROUNDS");
    if (!parsed(v[0], v[1], v[2], v[3])) return 2;
    return mode == "bench-listen" ? run_bench_listen(a) : run_bench_connect(a);
  }
  if (mode == "ceiling-memcpy") {
    if (v.size() != 2) return usage("BYTES TRANSFERS");
    return parsed("", v[0], v[1], "") ? run_ceiling_memcpy(a) : 2;
  }
  if (mode == "tcp-sink") {
    if (v.size() != 3) return usage("FILE BYTES TRANSFERS");
    return parsed(v[0], v[1], v[2], "") ? run_tcp_sink(a) : 2;
  }
  if (mode == "tcp-source") {
    if (v.size() != 4) return usage("IP FILE BYTES TRANSFERS");
    return parsed(v[1], v[2], v[3], "") ? run_tcp_source(a, v[0]) : 2;
  }
  return -1;
}

}  // namespace gw::plugin_test
