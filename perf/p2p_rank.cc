#include "perf/p2p_rank.h"

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

namespace gw::perf {

namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;
using net::Handle;
using net::Request;

constexpr int kDataTag = 1;
constexpr int kCtrlTag = 2;

// Reads or writes exactly `size` bytes on the socketpair shared with the other rank, within the
// deadline (the handle exchange happens before any transport connection exists).
Status exchange_bytes(int fd, bool write_side, void* data, size_t size, Deadline deadline) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < size) {
    int64_t left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      return timeout_error("p2p: handle exchange with the other rank timed out ({} of {} bytes)",
                           done, size);
    }
    pollfd pfd{fd, static_cast<short>(write_side ? POLLOUT : POLLIN), 0};
    int n = poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, 100)));
    if (n < 0 && errno != EINTR) return system_error("p2p: poll() on the handle socketpair", errno);
    if (n <= 0) continue;
    ssize_t got = write_side ? write(fd, p + done, size - done) : read(fd, p + done, size - done);
    if (got == 0) return peer_error("p2p: the other rank closed the handle socketpair");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return system_error("p2p: handle exchange on the socketpair", errno);
    }
    done += static_cast<size_t>(got);
  }
  return ok_status();
}

class P2pRank {
 public:
  P2pRank(const P2pConfig& c, P2pSetup setup, int64_t timeout_ms)
      : c_(c), rank_(setup.rank), setup_(std::move(setup)), timeout_ms_(timeout_ms) {}

  int run() {
    Status s = body();
    if (!s.ok()) {
      std::string msg = fmt::format("p2p rank {}: {}", rank_, s.to_string());
      std::fprintf(stderr, "gradwire-perf: %s\n", msg.c_str());
      std::fflush(stderr);
      setup_.emit("error " + json(msg).dump());
      return 2;
    }
    return 0;
  }

 private:
  // The handle exchange: over the socketpair (forked) or under this rank's key in the store.
  Status publish(const Handle& mine, Deadline d) {
    if (setup_.store == nullptr) {
      return exchange_bytes(setup_.pair_fd, true, const_cast<uint8_t*>(mine.bytes.data()),
                            mine.bytes.size(), d);
    }
    return setup_.store
        ->set(fmt::format("gw/p2p/handle/{}", rank_), Bytes(mine.bytes.begin(), mine.bytes.end()),
              d)
        .with_context("p2p: publishing this rank's handle in the store");
  }
  Status fetch(Handle* theirs, Deadline d) {
    if (setup_.store == nullptr) {
      return exchange_bytes(setup_.pair_fd, false, theirs->bytes.data(), theirs->bytes.size(), d);
    }
    auto v = setup_.store->get(fmt::format("gw/p2p/handle/{}", 1 - rank_), d);
    if (!v.ok()) {
      return v.status().with_context(
          fmt::format("p2p: waiting for rank {}'s handle in the store", 1 - rank_));
    }
    if (v->size() != theirs->bytes.size()) {
      return peer_error("p2p: rank {}'s handle has {} bytes, expected {}", 1 - rank_, v->size(),
                        theirs->bytes.size());
    }
    std::copy(v->begin(), v->end(), theirs->bytes.begin());
    return ok_status();
  }

  Deadline deadline() const { return deadline_after_ms(timeout_ms_); }

  // dpdk, forked: the two ranks share no NIC, so unless GW_DPDK_EAL_ARGS says otherwise each
  // gets one end of a net_memif pair (rank 0 the server; an abstract socket named after the
  // parent process, so concurrent runs do not meet), with its own MAC and IPv4 address. The
  // parent never starts DPDK, so each rank initialises its own EAL after the fork.
  Result<std::unique_ptr<net::Transport>> make_rank_transport(net::TransportOptions opts) {
    if (c_.transport == "dpdk" && setup_.store == nullptr &&
        config::get_string(dpdk::dpdk_config::kDpdkEalArgs).empty()) {
      const std::string eal = fmt::format(
          "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error "
          "--vdev net_memif0,role={},id=0,socket=/gradwire-perf-{}.sock,mac=02:67:77:00:00:0{}",
          rank_ == 0 ? "server" : "client", getppid(), rank_ + 1);
      GW_RETURN_IF_ERROR(config::set(dpdk::dpdk_config::kDpdkEalArgs, eal));
      if (config::get_string(dpdk::dpdk_config::kDpdkIp).empty()) {
        GW_RETURN_IF_ERROR(
            config::set(dpdk::dpdk_config::kDpdkIp, fmt::format("10.67.0.{}", rank_ + 1)));
      }
    }
    opts.config = config::Snapshot::capture();  // after the DPDK rows set above
    return net::make_transport(c_.transport, opts);
  }

  Status connect_pair() {
    net::TransportOptions opts;
    opts.job_token = setup_.token;
    opts.timeout_ms = timeout_ms_;
    opts.host_id = setup_.host_id;
    opts.rank = rank_;
    opts.route_host = setup_.route_host;
    Handle mine, theirs;
    Deadline d = deadline();
    // dpdk: rank 1 takes rank 0's handle (published once rank 0's port is running) before it
    // starts its own port. A net_memif client end (the forked pair, or two launched ranks on one
    // host) fails to start without its server; on two hosts it only serialises the EAL starts.
    const bool late = c_.transport == "dpdk" && rank_ == 1;
    if (late) GW_RETURN_IF_ERROR(fetch(&theirs, d));
    GW_ASSIGN_OR_RETURN(transport_, make_rank_transport(opts));
    GW_ASSIGN_OR_RETURN(auto listener, transport_->listen(&mine));
    GW_RETURN_IF_ERROR(publish(mine, d));
    if (!late) GW_RETURN_IF_ERROR(fetch(&theirs, d));
    GW_ASSIGN_OR_RETURN(auto connector, transport_->connect(theirs));
    while (!send_ || !recv_) {
      if (Clock::now() > d) {
        return timeout_error("p2p rank {}: connecting to rank {} over {} timed out after {} ms",
                             rank_, 1 - rank_, c_.transport, timeout_ms_);
      }
      if (!send_) {
        GW_ASSIGN_OR_RETURN(send_, connector->poll());
      }
      if (!recv_) {
        GW_ASSIGN_OR_RETURN(recv_, listener->accept());
      }
    }
    return ok_status();
  }

  Status wait(net::Comm* comm, Request* req, const char* what, size_t* size = nullptr) {
    Deadline d = deadline();
    bool done = false;
    size_t got = 0;
    uint32_t spins = 0;
    while (true) {
      Status s = comm->test(req, &done, &got);
      if (!s.ok()) return s.with_context(fmt::format("p2p {} with {}", what, comm->peer_name()));
      if (done) break;
      if ((++spins & 1023u) == 0) {
        // Busy-polling like perftest, but let a descheduled peer run on an oversubscribed host.
        sched_yield();
        if (Clock::now() <= d) continue;
        return timeout_error("p2p {} with {} timed out after {} ms", what, comm->peer_name(),
                             timeout_ms_);
      }
    }
    if (size) *size = got;
    return ok_status();
  }

  // Posts a send/recv, retrying while every request slot is taken (none should be here).
  Result<Request*> post_send(const void* data, size_t size, int tag) {
    Deadline d = deadline();
    while (true) {
      GW_ASSIGN_OR_RETURN(Request * r, send_->isend(data, size, tag, nullptr));
      if (r) return r;
      if (Clock::now() > d)
        return timeout_error("p2p isend to {}: no free request slot", send_->peer_name());
    }
  }
  Result<Request*> post_recv(void* data, size_t size, int tag) {
    Deadline d = deadline();
    while (true) {
      GW_ASSIGN_OR_RETURN(Request * r, recv_->irecv(data, size, tag, nullptr));
      if (r) return r;
      if (Clock::now() > d)
        return timeout_error("p2p irecv from {}: no free request slot", recv_->peer_name());
    }
  }

  // Control messages: 8 bytes, a count (-D) or 0.
  Status ctrl_send(uint64_t value = 0) {
    std::memcpy(ctrl_out_, &value, sizeof(value));
    GW_ASSIGN_OR_RETURN(Request * r, post_send(ctrl_out_, sizeof(ctrl_out_), kCtrlTag));
    return wait(send_.get(), r, "control send");
  }
  Result<uint64_t> ctrl_recv() {
    GW_ASSIGN_OR_RETURN(Request * r, post_recv(ctrl_in_, sizeof(ctrl_in_), kCtrlTag));
    size_t got = 0;
    GW_RETURN_IF_ERROR(wait(recv_.get(), r, "control receive", &got));
    if (got != sizeof(ctrl_in_)) {
      return peer_error("p2p: a control message of {} bytes from {} (expected {})", got,
                        recv_->peer_name(), sizeof(ctrl_in_));
    }
    uint64_t v = 0;
    std::memcpy(&v, ctrl_in_, sizeof(v));
    return v;
  }

  // -b: both ranks stream `count` messages of `size` bytes at once, `window` in flight each way.
  // Per direction the messages are a "ready" control message, the data, then "done", and each
  // side posts its receives in that order. Returns rank 0's seconds from both being ready to both
  // being done (rank 1: 0).
  Result<double> stream_bidir(size_t size, int count) {
    const int window = std::min(c_.window, count);
    std::deque<Request*> sends, recvs;
    GW_ASSIGN_OR_RETURN(Request * ready, post_recv(ctrl_in_, sizeof(ctrl_in_), kCtrlTag));
    int rposted = 0, rdone = 0, sposted = 0, sdone = 0;
    for (; rposted < window; ++rposted) {
      GW_ASSIGN_OR_RETURN(Request * r, post_recv(rbuf_.data(), size, kDataTag));
      recvs.push_back(r);
    }
    GW_RETURN_IF_ERROR(ctrl_send());
    GW_RETURN_IF_ERROR(wait(recv_.get(), ready, "control receive"));
    const auto t0 = SteadyClock::now();
    for (; sposted < window; ++sposted) {
      GW_ASSIGN_OR_RETURN(Request * r, post_send(buf_.data(), size, kDataTag));
      sends.push_back(r);
    }
    const Deadline d = deadline();
    uint32_t spins = 0;
    while (sdone < count || rdone < count) {
      bool progressed = false;
      if (!sends.empty()) {
        bool done = false;
        size_t got = 0;
        Status st = send_->test(sends.front(), &done, &got);
        if (!st.ok()) return st.with_context(fmt::format("p2p send to {}", send_->peer_name()));
        if (done) {
          progressed = true;
          sends.pop_front();
          ++sdone;
          if (sposted < count) {
            GW_ASSIGN_OR_RETURN(Request * r, post_send(buf_.data(), size, kDataTag));
            sends.push_back(r);
            ++sposted;
          }
        }
      }
      if (!recvs.empty()) {
        bool done = false;
        size_t got = 0;
        Status st = recv_->test(recvs.front(), &done, &got);
        if (!st.ok())
          return st.with_context(fmt::format("p2p receive from {}", recv_->peer_name()));
        if (done) {
          if (got != size) {
            return peer_error("p2p: received {} bytes from {} where {} were sent", got,
                              recv_->peer_name(), size);
          }
          progressed = true;
          recvs.pop_front();
          ++rdone;
          if (rposted < count) {
            GW_ASSIGN_OR_RETURN(Request * r, post_recv(rbuf_.data(), size, kDataTag));
            recvs.push_back(r);
            ++rposted;
          }
        }
      }
      if (!progressed && (++spins & 1023u) == 0) {
        sched_yield();
        if (Clock::now() > d) {
          return timeout_error(
              "p2p bidirectional stream with rank {} timed out after {} ms ({} "
              "of {} sent, {} received)",
              1 - rank_, timeout_ms_, sdone, count, rdone);
        }
      }
    }
    GW_ASSIGN_OR_RETURN(Request * fin, post_recv(ctrl_in_, sizeof(ctrl_in_), kCtrlTag));
    GW_RETURN_IF_ERROR(ctrl_send());
    GW_RETURN_IF_ERROR(wait(recv_.get(), fin, "control receive"));
    if (rank_ != 0) return 0.0;
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
  }

  // Streams `count` messages of `size` bytes from rank 0 to rank 1 with `window` in flight.
  // Returns the seconds rank 0 measured, from the receiver's "ready" to its final "done".
  Result<double> stream(size_t size, int count) {
    int window = std::min(c_.window, count);
    std::deque<Request*> inflight;
    if (rank_ == 1) {
      int posted = 0, completed = 0;
      for (; posted < window; ++posted) {
        GW_ASSIGN_OR_RETURN(Request * r, post_recv(buf_.data(), size, kDataTag));
        inflight.push_back(r);
      }
      GW_RETURN_IF_ERROR(ctrl_send());
      while (completed < count) {
        size_t got = 0;
        GW_RETURN_IF_ERROR(wait(recv_.get(), inflight.front(), "bandwidth receive", &got));
        inflight.pop_front();
        if (got != size) {
          return peer_error("p2p: received {} bytes from {} where {} were sent", got,
                            recv_->peer_name(), size);
        }
        ++completed;
        if (posted < count) {
          GW_ASSIGN_OR_RETURN(Request * r, post_recv(buf_.data(), size, kDataTag));
          inflight.push_back(r);
          ++posted;
        }
      }
      GW_RETURN_IF_ERROR(ctrl_send());
      return 0.0;
    }
    GW_RETURN_IF_ERROR(ctrl_recv().status());
    auto t0 = SteadyClock::now();
    int posted = 0, completed = 0;
    for (; posted < window; ++posted) {
      GW_ASSIGN_OR_RETURN(Request * r, post_send(buf_.data(), size, kDataTag));
      inflight.push_back(r);
    }
    while (completed < count) {
      GW_RETURN_IF_ERROR(wait(send_.get(), inflight.front(), "bandwidth send"));
      inflight.pop_front();
      ++completed;
      if (posted < count) {
        GW_ASSIGN_OR_RETURN(Request * r, post_send(buf_.data(), size, kDataTag));
        inflight.push_back(r);
        ++posted;
      }
    }
    GW_RETURN_IF_ERROR(ctrl_recv().status());
    return std::chrono::duration<double>(SteadyClock::now() - t0).count();
  }

  Status latency(std::vector<double>* half_rtts) {
    size_t size = static_cast<size_t>(c_.lat_bytes);
    const int warmup = std::min(100, c_.lat_iters);
    for (int i = 0; i < warmup + c_.lat_iters; ++i) {
      if (rank_ == 0) {
        auto t0 = SteadyClock::now();
        GW_ASSIGN_OR_RETURN(Request * rr, post_recv(lat_in_.data(), size, kDataTag));
        GW_ASSIGN_OR_RETURN(Request * sr, post_send(lat_out_.data(), size, kDataTag));
        GW_RETURN_IF_ERROR(wait(send_.get(), sr, "latency ping"));
        GW_RETURN_IF_ERROR(wait(recv_.get(), rr, "latency pong"));
        double dt = std::chrono::duration<double>(SteadyClock::now() - t0).count();
        if (i >= warmup) half_rtts->push_back(dt / 2);
      } else {
        GW_ASSIGN_OR_RETURN(Request * rr, post_recv(lat_in_.data(), size, kDataTag));
        GW_RETURN_IF_ERROR(wait(recv_.get(), rr, "latency ping"));
        GW_ASSIGN_OR_RETURN(Request * sr, post_send(lat_out_.data(), size, kDataTag));
        GW_RETURN_IF_ERROR(wait(send_.get(), sr, "latency pong"));
      }
    }
    return ok_status();
  }

  Status body() {
    GW_RETURN_IF_ERROR(connect_pair());
    buf_.assign(std::max<uint64_t>(c_.max_bytes, 1), 0x5a);
    if (c_.bidirectional) rbuf_.assign(std::max<uint64_t>(c_.max_bytes, 1), 0);
    lat_in_.assign(std::max<uint64_t>(c_.lat_bytes, 1), 0);
    lat_out_.assign(std::max<uint64_t>(c_.lat_bytes, 1), 0x33);
    if (rank_ != 0 && setup_.server) {
      const auto& p = transport_->properties();
      std::printf("# p2p server: interfaces: %s\n",
                  p.interfaces.empty() ? "-" : p.interfaces.c_str());
      std::fflush(stdout);
    }
    if (rank_ == 0) {
      const auto& p = transport_->properties();
      std::printf("# gradwire-perf p2p: transport %s, %s, %s\n", p.name.c_str(),
                  setup_.origin.c_str(),
                  c_.bidirectional ? "bidirectional (both ranks send at once; BW = both ways)"
                                   : "unidirectional rank 0 -> rank 1");
      std::printf("# interfaces: %s  sockets per connection: %d  window: %d outstanding sends\n",
                  p.interfaces.empty() ? "-" : p.interfaces.c_str(), p.sockets_per_conn, c_.window);
      const std::string iters =
          c_.duration_s > 0 ? fmt::format("as many as fit in {} s per size (-D)", c_.duration_s)
          : c_.iters > 0    ? std::to_string(c_.iters)
                            : std::string("adaptive clamp(2e9/size, 20, 1000)");
      std::printf(
          "# iters: %s  BW average = bytes * iters%s / time, %s; latency = round trip / 2\n",
          iters.c_str(), c_.bidirectional ? " * 2" : "",
          c_.report_gbits ? "Gb = 1e9 bits" : "MB = 1e6 B");
      std::string env;
      for (const auto& [row, v] : config::Snapshot::capture().entries()) {
        if (v.source != config::Source::kDefault) {
          env += fmt::format(" {}={}", row->name, config::shown(*row, v));
        }
      }
      std::printf("# GW_* set:%s\n", env.empty() ? " none" : env.c_str());
      std::printf("#bytes     #iterations    %-18s MsgRate[Mpps]\n",
                  c_.report_gbits ? "BW average[Gb/sec]" : "BW average[MB/s]");
      std::fflush(stdout);
      setup_.emit("config " + json({{"transport", p.name},
                                    {"ranks", setup_.origin},
                                    {"interfaces", p.interfaces},
                                    {"sockets_per_conn", p.sockets_per_conn},
                                    {"window", c_.window},
                                    {"bidirectional", c_.bidirectional},
                                    {"duration_s", c_.duration_s}})
                                  .dump());
    }
    for (uint64_t b = c_.min_bytes; b <= c_.max_bytes;) {
      int iters = c_.iters > 0 ? c_.iters : p2p_adaptive_iters(b);
      auto run_stream = [&](int count) {
        return c_.bidirectional ? stream_bidir(static_cast<size_t>(b), count)
                                : stream(static_cast<size_t>(b), count);
      };
      const int warm = std::min(iters, c_.window);
      GW_ASSIGN_OR_RETURN(double warm_secs, run_stream(warm));
      if (c_.duration_s > 0) {
        // -D: rank 0 sizes the run from the pace of a calibration and tells rank 1 the count. A
        // window of small messages takes about a millisecond, where one descheduling would make
        // the pace (and the run) many times off: calibration rounds of 4x the messages follow
        // until one lasts a twentieth of -D (at least 20 ms). Each round's count goes to rank 1
        // with kCalibrate set; the final count without it.
        constexpr uint64_t kCalibrate = uint64_t{1} << 62;
        constexpr double kMaxMessages = 1e8;
        if (rank_ == 0) {
          const double enough = std::max(0.02, c_.duration_s / 20);
          int calib = warm;
          double calib_secs = warm_secs;
          while (calib_secs < enough && calib < kMaxMessages / 4) {
            calib *= 4;
            GW_RETURN_IF_ERROR(ctrl_send(kCalibrate | static_cast<uint64_t>(calib)));
            GW_ASSIGN_OR_RETURN(calib_secs, run_stream(calib));
          }
          const double per = calib_secs > 0 ? calib_secs / calib : 1e-6;
          iters = static_cast<int>(std::clamp(c_.duration_s / per, 1.0, kMaxMessages));
          GW_RETURN_IF_ERROR(ctrl_send(static_cast<uint64_t>(iters)));
        } else {
          for (;;) {
            GW_ASSIGN_OR_RETURN(uint64_t v, ctrl_recv());
            const uint64_t n = v & ~kCalibrate;
            if (n < 1 || n > kMaxMessages) {
              return peer_error("p2p: rank 0 asked for {} messages", n);
            }
            if ((v & kCalibrate) == 0) {
              iters = static_cast<int>(n);
              break;
            }
            GW_RETURN_IF_ERROR(run_stream(static_cast<int>(n)).status());
          }
        }
      }
      GW_ASSIGN_OR_RETURN(double secs, run_stream(iters));
      if (rank_ == 0) {
        const double ways = c_.bidirectional ? 2.0 : 1.0;
        double mbps = secs > 0 ? static_cast<double>(b) * iters * ways / secs / 1e6 : 0;
        double mpps = secs > 0 ? iters * ways / secs / 1e6 : 0;
        const double gbps = mbps * 8 / 1000;
        std::printf(" %-10llu %-14d %-18.2f %-.6f\n", static_cast<unsigned long long>(b), iters,
                    c_.report_gbits ? gbps : mbps, mpps);
        std::fflush(stdout);
        setup_.emit("bw " + json({{"bytes", b},
                                  {"iterations", iters},
                                  {"seconds", secs},
                                  {"bw_average_MBps", mbps},
                                  {"bw_average_Gbps", gbps},
                                  {"msg_rate_Mpps", mpps}})
                                .dump());
      } else {
        setup_.emit("alive");
      }
      if (b > c_.max_bytes / static_cast<uint64_t>(c_.factor)) break;
      b = b == 0 ? 1 : b * static_cast<uint64_t>(c_.factor);
    }
    std::vector<double> lat;
    GW_RETURN_IF_ERROR(latency(&lat));
    if (rank_ == 0) {
      std::sort(lat.begin(), lat.end());
      auto pct = [&](double q) {
        size_t i = static_cast<size_t>(q * static_cast<double>(lat.size() - 1) + 0.5);
        return lat[std::min(i, lat.size() - 1)] * 1e6;
      };
      std::printf(
          "#\n#bytes #iterations  t_min[usec]  t_typical[usec]  99%%[usec]  "
          "99.9%%[usec]  t_max[usec]\n");
      std::printf(" %-6llu %-11zu  %-11.2f  %-15.2f  %-9.2f  %-11.2f  %-.2f\n",
                  static_cast<unsigned long long>(c_.lat_bytes), lat.size(), pct(0), pct(0.5),
                  pct(0.99), pct(0.999), pct(1.0));
      std::printf("# t_typical is the median\n");
      std::fflush(stdout);
      setup_.emit("lat " + json({{"bytes", c_.lat_bytes},
                                 {"iterations", lat.size()},
                                 {"t_min_us", pct(0)},
                                 {"t_median_us", pct(0.5)},
                                 {"t_p99_us", pct(0.99)},
                                 {"t_p999_us", pct(0.999)},
                                 {"t_max_us", pct(1.0)}})
                               .dump());
    }
    // Both sides finish together, so neither tears down a connection the other still drains.
    if (rank_ == 0) {
      GW_RETURN_IF_ERROR(ctrl_send());
    } else {
      GW_RETURN_IF_ERROR(ctrl_recv().status());
    }
    return ok_status();
  }

  const P2pConfig& c_;
  int rank_;
  P2pSetup setup_;
  int64_t timeout_ms_;
  std::unique_ptr<net::Transport> transport_;
  std::unique_ptr<net::SendComm> send_;
  std::unique_ptr<net::RecvComm> recv_;
  std::vector<uint8_t> buf_, rbuf_, lat_in_, lat_out_;
  uint8_t ctrl_in_[8] = {};
  uint8_t ctrl_out_[8] = {};
};

}  // namespace

int run_p2p_rank(const P2pConfig& c, P2pSetup setup, int64_t timeout_ms) {
  return P2pRank(c, std::move(setup), timeout_ms).run();
}

}  // namespace gw::perf
