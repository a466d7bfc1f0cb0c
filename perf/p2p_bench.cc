#include "perf/p2p_bench.h"

#include <fmt/ranges.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/config_snapshot.h"
#include "core/core_config.h"
#include "core/net/backend_registry.h"
#include "core/net/socket_util.h"
#include "core/net/transport.h"
#include "core/store.h"
#include "dpdk/dpdk_config.h"
#include "perf/p2p_rank.h"
#include "perf/rank_launcher.h"

namespace gw::perf {

namespace {

using json = nlohmann::json;

std::string random_token() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}{:08x}{:08x}", rd(), rd(), rd(), rd());
}

// The JSON document of a run; rank 0's result lines are folded into it.
class P2pReport {
 public:
  explicit P2pReport(const P2pConfig& c)
      : c_(c),
        doc_({{"test", "p2p"},
              {"config",
               {{"transport", c.transport},
                {"min_bytes", c.min_bytes},
                {"max_bytes", c.max_bytes},
                {"step_factor", c.factor},
                {"iters", c.iters > 0 ? json(c.iters) : json("adaptive")},
                {"window", c.window},
                {"lat_bytes", c.lat_bytes},
                {"lat_iters", c.lat_iters},
                {"duration_s", c.duration_s},
                {"bidirectional", c.bidirectional},
                {"report_gbits", c.report_gbits},
                {"peer_host", c.peer_host},
                {"port", c.port}}},
              {"bandwidth", json::array()}}) {}

  void absorb(const std::string& line) {
    auto sp = line.find(' ');
    std::string kind = line.substr(0, sp);
    json j = json::parse(sp == std::string::npos ? "" : line.substr(sp + 1), nullptr, false);
    if (j.is_discarded()) return;
    if (kind == "config") doc_["transport_properties"] = j;
    if (kind == "bw") doc_["bandwidth"].push_back(j);
    if (kind == "lat") doc_["latency"] = j;
    if (kind == "error" && j.is_string() && first_error_.empty()) {
      first_error_ = j.get<std::string>();
    }
  }
  const std::string& first_error() const { return first_error_; }
  void set_error(const std::string& e) { doc_["error"] = e; }

  // Writes the document when --json was given; false if that failed.
  bool write() {
    if (c_.json_path.empty()) return true;
    std::ofstream f(c_.json_path, std::ios::trunc);
    f << doc_.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "gradwire-perf: cannot write --json file %s\n", c_.json_path.c_str());
    }
    return static_cast<bool>(f);
  }

  // Reports a failure that happened before any rank ran; returns the exit status 2.
  int fail(const Status& s) {
    std::fprintf(stderr, "gradwire-perf: %s\n", s.to_string().c_str());
    set_error(s.to_string());
    write();
    return 2;
  }

 private:
  const P2pConfig& c_;
  json doc_;
  std::string first_error_;
};

int run_forked_p2p(const P2pConfig& c, int64_t timeout, P2pReport* report) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
    return report->fail(system_error("p2p: socketpair() for the handle exchange", errno));
  }
  std::string token = random_token();
  ForkOptions fo;
  fo.nranks = 2;
  fo.idle_timeout_ms = timeout + 30000;
  Status s = run_forked(
      fo,
      [&](int rank, int msg_fd) {
        close(sv[1 - rank]);
        P2pSetup setup;
        setup.rank = rank;
        setup.pair_fd = sv[rank];
        setup.token = token;
        setup.host_id = "gradwire-perf-p2p";  // both ranks are forked on this host
        setup.origin = "2 forked processes";
        setup.emit = [msg_fd](const std::string& line) { send_message(msg_fd, line); };
        return run_p2p_rank(c, std::move(setup), timeout);
      },
      [&](int, const std::string& line) { report->absorb(line); });
  close(sv[0]);
  close(sv[1]);
  int rc = 0;
  if (!s.ok()) {
    std::fprintf(stderr, "gradwire-perf: run failed: %s\n",
                 run_failure_text(s, report->first_error()).c_str());
    report->set_error(report->first_error().empty()
                          ? s.to_string()
                          : fmt::format("{} ({})", report->first_error(), s.to_string()));
    rc = 2;
  }
  if (!report->write() && rc == 0) rc = 2;
  return rc;
}

// One of the two ranks of a job started by a launcher (one per host, e.g. over DPDK): the
// handles go through the job's store (rank 0 hosts it), and rank 0 prints and writes the JSON.
int run_launched_p2p(const P2pConfig& c, int64_t timeout, P2pReport* report) {
  auto info = detect_launch();
  if (!info.ok()) return report->fail(info.status().with_context("p2p under a launcher"));
  if (info->world_size != 2) {
    return report->fail(invalid_arg(
        "p2p under a launcher needs a world of exactly 2 ranks ({} says {}); start 2 ranks, or "
        "pass --np 2 to fork both here",
        info->source, info->world_size));
  }
  const int rank = info->rank;
  TcpStoreOptions so;
  so.host = info->store_host;
  so.port = info->store_port;
  so.host_server = rank == 0;
  so.token = config::get_string(core_config::kJobToken);
  so.connect_timeout_ms = timeout;
  auto store = TcpStore::create(so);
  if (!store.ok()) {
    return report->fail(store.status().with_context(
        fmt::format("p2p rank {}: rendezvous store {}:{}", rank, so.host, so.port)));
  }
  auto token = agree_job_token(**store, rank, deadline_after_ms(timeout));
  if (!token.ok()) return report->fail(token.status().with_context("p2p"));
  P2pSetup setup;
  setup.rank = rank;
  setup.store = store->get();
  setup.token = *token;
  setup.host_id = host_identity();
  setup.route_host = info->store_host;  // as a communicator does
  setup.origin =
      fmt::format("2 ranks from the launcher ({}, store {}:{})", info->source, so.host, so.port);
  setup.emit = [report, rank](const std::string& line) {
    if (rank == 0) report->absorb(line);
  };
  int rc = run_p2p_rank(c, std::move(setup), timeout);
  if (rank != 0) return rc;
  if (rc != 0) report->set_error(report->first_error());
  if (!report->write() && rc == 0) rc = 2;
  return rc;
}

// perftest's form across hosts: the server (no HOST) hosts the rendezvous on --port and waits for
// one client until the timeout; the client connects to HOST:--port. The client is rank 0 (it
// sends, times, prints and writes the JSON, as perftest's client reports), the server rank 1.
int run_server_client_p2p(const P2pConfig& c, int64_t timeout, P2pReport* report) {
  const bool server = c.peer_host.empty();
  const int rank = server ? 1 : 0;
  TcpStoreOptions so;
  so.host = server ? "0.0.0.0" : c.peer_host;
  so.port = c.port;
  so.host_server = server;
  so.token = config::get_string(core_config::kJobToken);
  so.connect_timeout_ms = timeout;
  const Deadline deadline = deadline_after_ms(timeout);
  if (server) {
    std::printf(
        "# gradwire-perf p2p server: transport %s, waiting up to %lld ms for a client on "
        "port %d (on the other host: gradwire-perf p2p --transport %s THIS_HOST%s)\n",
        c.transport.c_str(), static_cast<long long>(timeout), c.port, c.transport.c_str(),
        c.port == P2pConfig{}.port ? "" : fmt::format(" --port {}", c.port).c_str());
    std::fflush(stdout);
  }
  Result<std::shared_ptr<TcpStore>> store = invalid_arg("unset");
  if (!server) {
    // As perftest's client: a refused connection means no server is there (yet), which is said at
    // once; anything else (no answer: a firewall, a host still booting) is waited for until the
    // deadline, the store client saying so every few seconds.
    TcpStoreOptions first = so;
    first.connect_timeout_ms = std::min<int64_t>(timeout, 1000);
    store = TcpStore::create(first);
    if (!store.ok() && store.status().message().find("refused") != std::string::npos &&
        store.status().message().find("could not reach") != std::string::npos) {
      return report->fail(peer_error(
          "p2p client: no p2p server at {}:{}: connection refused (start `gradwire-perf p2p "
          "--transport {}{}` there first, or check HOST and --port)",
          c.peer_host, c.port, c.transport,
          c.port == P2pConfig{}.port ? "" : fmt::format(" --port {}", c.port)));
    }
  }
  if (server || !store.ok()) store = TcpStore::create(so);
  if (!store.ok()) {
    return report->fail(store.status().with_context(
        server ? fmt::format("p2p server: rendezvous on port {}", c.port)
               : fmt::format("p2p client: no p2p server at {}:{} (start `gradwire-perf p2p "
                             "--transport {}` there first)",
                             c.peer_host, c.port, c.transport)));
  }
  // The client announces itself with its settings, which the server takes (as perftest's server
  // takes the client's): sizes, iterations, window, direction.
  const std::string key = "gw/p2p/client";
  P2pConfig run = c;
  std::string client_addr;  // the server's way back: the address the client sends from
  if (server) {
    auto hello = (*store)->get(key, deadline);
    if (!hello.ok()) {
      const Status why =
          hello.status().code() == Code::kTimeout
              ? timeout_error(
                    "p2p server: no client connected to port {} within {} ms (run "
                    "`gradwire-perf p2p --transport {} THIS_HOST` on the other host, "
                    "or raise --timeout-ms)",
                    c.port, timeout, c.transport)
              : hello.status().with_context("p2p server: waiting for a client");
      return report->fail(why);
    }
    json h = json::parse(std::string(hello->begin(), hello->end()), nullptr, false);
    if (!h.is_object() || h.value("transport", "") != c.transport) {
      return report->fail(
          invalid_arg("p2p server: the client asked for transport {} (this server runs {})",
                      h.is_object() ? h.value("transport", "?") : std::string("?"), c.transport));
    }
    run.min_bytes = h.value("min_bytes", c.min_bytes);
    run.max_bytes = h.value("max_bytes", c.max_bytes);
    run.factor = h.value("factor", c.factor);
    run.iters = h.value("iters", c.iters);
    run.window = h.value("window", c.window);
    run.lat_bytes = h.value("lat_bytes", c.lat_bytes);
    run.lat_iters = h.value("lat_iters", c.lat_iters);
    run.duration_s = h.value("duration_s", c.duration_s);
    run.bidirectional = h.value("bidirectional", c.bidirectional);
    client_addr = h.value("client_addr", std::string());
    Status ok = validate(run);
    if (!ok.ok()) return report->fail(ok.with_context("p2p server: the client's settings"));
  } else {
    // The address this host uses to reach the server, so the server picks the interface that
    // routes back here (as the client's own transport follows the route to the server).
    if (auto src = net::route_source(c.peer_host); src.ok()) {
      const std::string a = net::format_sockaddr(reinterpret_cast<const sockaddr*>(&*src));
      const size_t colon = a.rfind(':');
      client_addr = a.substr(0, colon);
      if (client_addr.size() > 2 && client_addr.front() == '[') {
        client_addr = client_addr.substr(1, client_addr.size() - 2);
      }
    }
    json h = {{"client_addr", client_addr},
              {"transport", c.transport},
              {"min_bytes", c.min_bytes},
              {"max_bytes", c.max_bytes},
              {"factor", c.factor},
              {"iters", c.iters},
              {"window", c.window},
              {"lat_bytes", c.lat_bytes},
              {"lat_iters", c.lat_iters},
              {"duration_s", c.duration_s},
              {"bidirectional", c.bidirectional}};
    const std::string text = h.dump();
    Status st = (*store)->set(key, Bytes(text.begin(), text.end()), deadline);
    if (!st.ok()) return report->fail(st.with_context("p2p client: greeting the server"));
  }
  auto token = agree_job_token(**store, rank, deadline);
  if (!token.ok()) return report->fail(token.status().with_context("p2p"));
  P2pSetup setup;
  setup.rank = rank;
  setup.store = store->get();
  setup.token = *token;
  setup.host_id = host_identity();
  setup.route_host = server ? client_addr : c.peer_host;
  setup.server = server;
  setup.origin = server ? fmt::format("server on port {}", c.port)
                        : fmt::format("client of {}:{}", c.peer_host, c.port);
  setup.emit = [report, rank](const std::string& line) {
    if (rank == 0) report->absorb(line);
  };
  int rc = run_p2p_rank(run, std::move(setup), timeout);
  if (server) {
    if (rc == 0) std::printf("# p2p server: done (the client printed the results)\n");
    return rc;
  }
  if (rc != 0) report->set_error(report->first_error());
  if (!report->write() && rc == 0) rc = 2;
  return rc;
}

}  // namespace

int p2p_adaptive_iters(uint64_t bytes) {
  double it = 2e9 / static_cast<double>(std::max<uint64_t>(bytes, 1));
  return static_cast<int>(std::clamp(it, 20.0, 1000.0));
}

Status validate(const P2pConfig& c) {
  const std::vector<std::string> names = net::backend_names();
  if (std::find(names.begin(), names.end(), c.transport) == names.end()) {
    return invalid_arg("p2p --transport {}: use one of {}", c.transport, fmt::join(names, ", "));
  }
  if (c.np != 0 && c.np != 2) {
    return invalid_arg("p2p --np {}: p2p runs between exactly 2 ranks", c.np);
  }
  if (c.min_bytes > c.max_bytes) {
    return invalid_arg("-b {} is larger than -e {}", c.min_bytes, c.max_bytes);
  }
  if (c.factor < 2) return invalid_arg("-f {}: the step factor must be at least 2", c.factor);
  if (c.max_bytes > (uint64_t{1} << 32)) return invalid_arg("-e {}: at most 4 GiB", c.max_bytes);
  if (c.iters < 0) return invalid_arg("--iters {}: must be >= 0 (0 = adaptive)", c.iters);
  if (c.window < 1 || c.window > net::kMaxRequests - 1) {
    return invalid_arg("--window {}: must be in 1..{}", c.window, net::kMaxRequests - 1);
  }
  if (c.lat_iters < 1) return invalid_arg("--lat-iters {}: must be >= 1", c.lat_iters);
  if (c.lat_bytes > (uint64_t{1} << 20)) {
    return invalid_arg("--lat-size {}: at most 1 MiB", c.lat_bytes);
  }
  if (c.timeout_ms < 0) return invalid_arg("--timeout-ms {}: must be >= 0", c.timeout_ms);
  if (c.duration_s < 0 || c.duration_s > 3600) {
    return invalid_arg("-D {}: seconds per size, 0 (off) to 3600", c.duration_s);
  }
  if (c.duration_s > 0 && c.iters > 0) {
    return invalid_arg("-D and --iters both set: -D streams each size for a time, --iters a count");
  }
  if (c.all_sizes && c.size > 0) return invalid_arg("-a and -s both set: all sizes or one");
  if (c.port < 1 || c.port > 65535) return invalid_arg("--port {}: 1-65535", c.port);
  if (!c.peer_host.empty() && c.np != 0) {
    return invalid_arg(
        "HOST {} with --np: a client connects to a server on another host; --np 2 "
        "forks both ranks here",
        c.peer_host);
  }
  if (!c.peer_host.empty() && c.transport == "shm") {
    return invalid_arg("HOST {} with --transport shm: shared memory works within one host",
                       c.peer_host);
  }
  return config::validate();
}

P2pConfig resolve_sizes(P2pConfig c) {
  if (c.size > 0) c.min_bytes = c.max_bytes = c.size;
  if (c.all_sizes) {
    c.min_bytes = 2;
    c.max_bytes = 8ull << 20;
    c.factor = 2;
  }
  return c;
}

int run_p2p(const P2pConfig& given) {
  const P2pConfig c = resolve_sizes(given);
  P2pReport report(c);
  Status s = validate(c);
  if (!s.ok()) return report.fail(s);
  int64_t timeout = c.timeout_ms > 0 ? c.timeout_ms : config::get_int(core_config::kTimeoutMs);
  if (c.np == 2) return run_forked_p2p(c, timeout, &report);
  if (!c.peer_host.empty()) return run_server_client_p2p(c, timeout, &report);
  if (launched_by_launcher()) return run_launched_p2p(c, timeout, &report);
  // shm works within one host only: both ranks are forked here. Any other transport waits as
  // perftest's server for a client from another host.
  if (c.transport == "shm") return run_forked_p2p(c, timeout, &report);
  return run_server_client_p2p(c, timeout, &report);
}

}  // namespace gw::perf