// The HTTP listener behind gradwired's /metrics (daemon/metrics.h): one thread, one poll loop,
// non-blocking sockets, so that no client can hold it. Each connection has one deadline for its
// whole life (request read, answer written); a connection past it is closed whatever it is doing,
// checked on every round (not only for sockets without events). At most `max_connections` are open:
// a newcomer evicts the oldest one older than the grace period, and waits in the kernel's queue
// while every one is younger, so a scraper whose request comes a little after its connection is
// not pushed out by the newcomers behind it. So slowloris senders and idle connections cost the
// scraper nothing but a place in a short queue that moves every grace period, however many an
// attacker opens (docs/daemon.md "Metrics"; DESIGN.md says why not CivetWeb's worker pool).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"

namespace gw::daemon {

struct MetricsServerOptions {
  // "PORT" (binds 127.0.0.1), "HOST:PORT", "[V6]:PORT"; 0.0.0.0 or [::] for every address.
  std::string address;
  // A connection's whole life: request read and answer written.
  int64_t deadline_ms = 2000;
  // Open connections at most; a newcomer evicts the oldest past its grace period.
  int max_connections = 256;
  // A connection's time to send its request before a newcomer may evict it (capped at
  // deadline_ms). While all max_connections are younger, newcomers wait in the accept queue: a
  // flood is taken max_connections per grace period.
  int64_t grace_ms = sys::kEvictGraceMs;
};

// What the server has done, for tests and the daemon's log.
struct MetricsServerCounts {
  uint64_t served = 0;     // answers written whole (any status)
  uint64_t expired = 0;    // closed at their deadline
  uint64_t evicted = 0;    // closed for a newcomer
  uint64_t malformed = 0;  // answered 400/431
};

class MetricsServer {
 public:
  // The body of GET /metrics, called on the server's thread at each scrape.
  using BodyFn = std::function<std::string()>;

  // Binds and listens, then serves on a thread of its own until destroyed. kInvalidArg with the
  // reason when the address cannot be bound (in use, not an address of this host, malformed).
  static Result<std::unique_ptr<MetricsServer>> start(const MetricsServerOptions& options,
                                                      BodyFn body);
  ~MetricsServer();  // stops and joins the thread; closes every connection
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The address bound, "127.0.0.1:9464" or "[::1]:9464" (the port the kernel chose for port 0).
  const std::string& bound_address() const { return bound_; }
  MetricsServerCounts counts() const;

  struct Conn;  // one client's request and answer (metrics_server.cc)

 private:
  MetricsServer(const MetricsServerOptions& o, BodyFn body, sys::Fd listener, sys::Fd wake,
                std::string bound);
  void run();
  bool step(Conn& c, short events);
  bool evict_one(std::deque<Conn>& conns, sys::Deadline now);
  bool full_of_young(const std::deque<Conn>& conns, sys::Deadline now) const;

  MetricsServerOptions options_;
  BodyFn body_;
  sys::Fd listener_;
  sys::Fd wake_;  // an eventfd: the destructor's stop
  std::string bound_;
  std::atomic<uint64_t> served_{0}, expired_{0}, evicted_{0}, malformed_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Splits a --metrics address into host and port ("9464" -> 127.0.0.1, 9464). kInvalidArg when
// the port is not a number in 0..65535 or the brackets of an IPv6 host do not match.
Result<std::pair<std::string, uint16_t>> split_metrics_address(const std::string& address);

}  // namespace gw::daemon
