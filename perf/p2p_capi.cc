// gradwire-perf p2p --capi: the point-to-point calls of the C ABI (gw_send / gw_recv, gw_isend /
// gw_irecv) between 2 ranks, as a user's job makes them, in perftest's columns: a bandwidth sweep
// with a window of outstanding gw_isends, then a ping-pong of blocking gw_send / gw_recv. The
// bare transport's figures (gradwire-perf p2p without --capi) are its ceiling.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/core_config.h"
#include "gradwire/gradwire.h"
#include "perf/p2p_bench.h"
#include "perf/rank_launcher.h"

namespace gw::perf {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One rank: rank 0 sends (bandwidth) and starts every round trip (latency), and prints.
class CapiRank {
 public:
  CapiRank(const P2pConfig& c, int msg_fd) : c_(c), msg_fd_(msg_fd) {}
  ~CapiRank() {
    if (comm_) gw_comm_destroy(comm_);
  }

  int run(const gw_config_t* cfg) {
    gw_status_t s = cfg ? gw_comm_init(&comm_, cfg) : gw_comm_init_from_env(&comm_);
    if (s != GW_OK) {
      comm_ = nullptr;
      return fail("gw_comm_init", s);
    }
    int world = 0;
    if ((s = gw_comm_rank(comm_, &rank_)) != GW_OK) return fail("gw_comm_rank", s);
    if ((s = gw_comm_size(comm_, &world)) != GW_OK) return fail("gw_comm_size", s);
    if (world != 2) return fail_msg(fmt::format("p2p --capi runs 2 ranks, the job has {}", world));
    peer_ = 1 - rank_;
    buf_.assign(std::max<uint64_t>({c_.max_bytes, c_.lat_bytes, 1}), 1);
    if (rank_ == 0) {
      std::printf(
          "# gradwire-perf p2p --capi: transport %s, 2 ranks, window %d, gw_isend/gw_irecv "
          "(bandwidth) and gw_send/gw_recv (latency)\n",
          c_.transport.c_str(), c_.window);
      std::printf("#bytes     #messages      BW average[%s]\n", c_.report_gbits ? "Gb/s" : "MB/s");
      std::fflush(stdout);
    }
    for (uint64_t b = c_.min_bytes; b <= c_.max_bytes;) {
      if (int rc = bandwidth(b); rc != 0) return rc;
      if (b > c_.max_bytes / static_cast<uint64_t>(c_.factor)) break;
      b = b == 0 ? 1 : b * static_cast<uint64_t>(c_.factor);
    }
    return latency();
  }

 private:
  int fail(const char* what, gw_status_t s) {
    return fail_msg(fmt::format("{}: {} ({})", what, gw_status_string(s), gw_last_error()));
  }
  int fail_msg(const std::string& m) {
    std::fprintf(stderr, "gradwire-perf: rank %d: %s\n", rank_, m.c_str());
    send_message(msg_fd_, "error " + json(m).dump());
    return 2;
  }

  // rounds x window messages of b bytes, rank 0 to rank 1; every send and receive shares one
  // buffer (the bytes are not checked), as perftest does. Rank 0's clock stops when rank 1's
  // 1-byte reply after its last receive arrived, so the bytes are counted as delivered.
  int bandwidth(uint64_t b) {
    const int window = std::max(1, c_.window);
    const int msgs = c_.iters > 0 ? c_.iters : p2p_adaptive_iters(b);
    const int rounds = std::max(1, msgs / window);
    std::vector<gw_request_t> reqs(static_cast<size_t>(window));
    auto round = [&]() -> int {
      for (auto& r : reqs) {
        gw_status_t s = rank_ == 0 ? gw_isend(comm_, buf_.data(), b, GW_UINT8, peer_, 1, &r)
                                   : gw_irecv(comm_, buf_.data(), b, GW_UINT8, peer_, 1, &r);
        if (s != GW_OK) return fail(rank_ == 0 ? "gw_isend" : "gw_irecv", s);
      }
      for (auto& r : reqs) {
        if (gw_status_t s = gw_wait(r, -1); s != GW_OK) return fail("gw_wait", s);
      }
      return 0;
    };
    // The receiver's 1-byte reply after its last receive: an eager gw_isend completes once the
    // transport holds its bytes, so the sender's clock alone would time how fast it posts.
    auto reply = [&]() -> int {
      gw_status_t s = rank_ == 0 ? gw_recv(comm_, &ack_, 1, GW_UINT8, peer_, 3)
                                 : gw_send(comm_, &ack_, 1, GW_UINT8, peer_, 3);
      return s == GW_OK ? 0 : fail(rank_ == 0 ? "gw_recv (reply)" : "gw_send (reply)", s);
    };
    if (int rc = round(); rc != 0) return rc;  // warm-up
    if (int rc = reply(); rc != 0) return rc;
    const auto t0 = Clock::now();
    for (int i = 0; i < rounds; ++i) {
      if (int rc = round(); rc != 0) return rc;
    }
    if (int rc = reply(); rc != 0) return rc;
    const double sec = seconds_since(t0);
    if (rank_ == 0) {
      const double bytes = static_cast<double>(b) * rounds * window;
      const double bw = c_.report_gbits ? bytes * 8 / sec / 1e9 : bytes / sec / 1e6;
      std::printf(" %-10llu %-14d %-.2f\n", static_cast<unsigned long long>(b), rounds * window,
                  bw);
      std::fflush(stdout);
      send_message(msg_fd_, "bw " + json({{"bytes", b},
                                          {"messages", rounds * window},
                                          {c_.report_gbits ? "gbits" : "mbytes_s", bw}})
                                        .dump());
    }
    return 0;
  }

  // lat_iters round trips of blocking gw_send / gw_recv (100 more first, not timed); the half
  // round trip of each.
  int latency() {
    const uint64_t b = c_.lat_bytes;
    std::vector<double> lat;
    lat.reserve(static_cast<size_t>(c_.lat_iters));
    for (int i = -100; i < c_.lat_iters; ++i) {
      const auto t0 = Clock::now();
      gw_status_t s;
      if (rank_ == 0) {
        if ((s = gw_send(comm_, buf_.data(), b, GW_UINT8, peer_, 2)) != GW_OK) {
          return fail("gw_send", s);
        }
        if ((s = gw_recv(comm_, buf_.data(), b, GW_UINT8, peer_, 2)) != GW_OK) {
          return fail("gw_recv", s);
        }
        if (i >= 0) lat.push_back(seconds_since(t0) / 2);
      } else {
        if ((s = gw_recv(comm_, buf_.data(), b, GW_UINT8, peer_, 2)) != GW_OK) {
          return fail("gw_recv", s);
        }
        if ((s = gw_send(comm_, buf_.data(), b, GW_UINT8, peer_, 2)) != GW_OK) {
          return fail("gw_send", s);
        }
      }
    }
    if (rank_ != 0 || lat.empty()) return 0;
    std::sort(lat.begin(), lat.end());
    auto pct = [&](double q) {
      size_t i = static_cast<size_t>(q * static_cast<double>(lat.size() - 1) + 0.5);
      return lat[std::min(i, lat.size() - 1)] * 1e6;
    };
    std::printf(
        "#\n#bytes #iterations  t_min[usec]  t_typical[usec]  99%%[usec]  t_max[usec]  "
        "(half round trip of gw_send + gw_recv)\n");
    std::printf(" %-6llu %-11zu  %-11.2f  %-15.2f  %-9.2f  %-.2f\n",
                static_cast<unsigned long long>(b), lat.size(), pct(0), pct(0.5), pct(0.99),
                pct(1.0));
    std::printf("# t_typical is the median\n");
    std::fflush(stdout);
    send_message(msg_fd_, "lat " + json({{"bytes", b},
                                         {"iterations", lat.size()},
                                         {"t_min_us", pct(0)},
                                         {"t_median_us", pct(0.5)},
                                         {"t_p99_us", pct(0.99)},
                                         {"t_max_us", pct(1.0)}})
                                       .dump());
    return 0;
  }

  const P2pConfig& c_;
  int msg_fd_;
  gw_comm_t comm_ = nullptr;
  int rank_ = -1;
  uint8_t ack_ = 0;  // the bandwidth loop's reply
  int peer_ = -1;
  std::vector<uint8_t> buf_;
};

}  // namespace

int run_p2p_capi(const P2pConfig& given) {
  const P2pConfig c = resolve_sizes(given);
  Status v = validate(c);
  if (!v.ok()) {
    std::fprintf(stderr, "gradwire-perf: %s\n", v.to_string().c_str());
    return 2;
  }
  if (c.np != 2 && launched_by_launcher()) return CapiRank(c, -1).run(nullptr);
  auto port = reserve_loopback_port();
  if (!port.ok()) {
    std::fprintf(stderr, "gradwire-perf: %s\n", port.status().to_string().c_str());
    return 2;
  }
  const std::string store = fmt::format("127.0.0.1:{}", *port);
  ForkOptions fo;
  fo.nranks = 2;
  const int64_t timeout =
      c.timeout_ms > 0 ? c.timeout_ms : config::get_int(core_config::kTimeoutMs);
  fo.idle_timeout_ms = timeout + 30000;
  std::string first_error;
  json doc = {{"test", "p2p_capi"},
              {"transport", c.transport},
              {"window", c.window},
              {"bandwidth", json::array()}};
  Status st = run_forked(
      fo,
      [&](int rank, int fd) {
        gw_config_t cfg = GW_CONFIG_INIT;
        cfg.rank = rank;
        cfg.world_size = 2;
        cfg.store_addr = store.c_str();
        cfg.transport = c.transport.c_str();
        cfg.timeout_ms = static_cast<int>(c.timeout_ms);
        return CapiRank(c, fd).run(&cfg);
      },
      [&](int, const std::string& line) {
        const auto sp = line.find(' ');
        if (sp == std::string::npos) return;
        const std::string kind = line.substr(0, sp);
        json j = json::parse(line.substr(sp + 1), nullptr, false);
        if (j.is_discarded()) return;
        if (kind == "bw") doc["bandwidth"].push_back(j);
        if (kind == "lat") doc["latency"] = j;
        if (kind == "error" && j.is_string() && first_error.empty()) first_error = j;
      });
  if (!st.ok()) doc["error"] = run_failure_text(st, first_error);
  if (!c.json_path.empty()) {
    std::ofstream f(c.json_path, std::ios::trunc);
    f << doc.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "gradwire-perf: cannot write --json file %s\n", c.json_path.c_str());
      if (st.ok()) return 2;
    }
  }
  if (!st.ok()) {
    std::fprintf(stderr, "gradwire-perf: run failed: %s\n",
                 run_failure_text(st, first_error).c_str());
    return 2;
  }
  return 0;
}

}  // namespace gw::perf
