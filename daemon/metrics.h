// gradwired's Prometheus endpoint (--metrics HOST:PORT, GW_DAEMON_METRICS): GET /metrics serves the
// daemon's counters, byte counts and phase histograms (daemon/server.h ServerStats), read at each
// scrape (docs/daemon.md lists the metrics). Built when prometheus-cpp
// (Debian: prometheus-cpp-dev) is present (GW_HAVE_PROMETHEUS); otherwise start() says so.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "daemon/server.h"

namespace gw::daemon {

class MetricsEndpoint {
 public:
  virtual ~MetricsEndpoint() = default;
  // Serves until destroyed. `server` must outlive the endpoint. kInvalidArg for an address that
  // cannot be bound; kUnsupported when this build has no prometheus-cpp.
  static Result<std::unique_ptr<MetricsEndpoint>> start(const std::string& host_port,
                                                        const Server& server);
};

}  // namespace gw::daemon
