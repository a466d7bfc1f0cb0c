// gradwired's Prometheus endpoint (--metrics [HOST:]PORT, GW_DAEMON_METRICS; no host: 127.0.0.1):
// GET /metrics serves the daemon's counters, byte counts and phase histograms (daemon/server.h
// ServerStats), read at each scrape (docs/daemon.md lists the metrics). prometheus-cpp
// (Debian: prometheus-cpp-dev, GW_HAVE_PROMETHEUS) writes the text format; the HTTP side is
// daemon/metrics_server.h, which a flood of idle or trickling connections cannot blind.
// Without prometheus-cpp start() says so.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "daemon/server.h"

namespace gw::daemon {

class MetricsEndpoint {
 public:
  virtual ~MetricsEndpoint() = default;
  // The address bound ("127.0.0.1:9464"; the kernel's port for port 0).
  virtual const std::string& bound_address() const = 0;
  // Serves until destroyed. `server` must outlive the endpoint. kInvalidArg for an address that
  // cannot be bound; kUnsupported when this build has no prometheus-cpp.
  static Result<std::unique_ptr<MetricsEndpoint>> start(const std::string& host_port,
                                                        const Server& server);
};

}  // namespace gw::daemon
