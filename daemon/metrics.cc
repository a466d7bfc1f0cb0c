#include "daemon/metrics.h"

#if defined(GW_HAVE_PROMETHEUS)
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>
#endif

#include <exception>
#include <vector>

namespace gw::daemon {

#if defined(GW_HAVE_PROMETHEUS)
namespace {

class StatsCollectable final : public prometheus::Collectable {
 public:
  explicit StatsCollectable(const Server& s) : server_(s) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    const ServerStats st = server_.stats();
    std::vector<prometheus::MetricFamily> out;
    auto add = [&](const char* name, const char* help, prometheus::MetricType type, double v,
                   prometheus::ClientMetric::Label label = {}) {
      prometheus::ClientMetric m;
      if (!label.name.empty()) m.label.push_back(label);
      if (type == prometheus::MetricType::Counter) {
        m.counter.value = v;
      } else {
        m.gauge.value = v;
      }
      if (!out.empty() && out.back().name == name) {
        out.back().metric.push_back(m);
        return;
      }
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    using T = prometheus::MetricType;
    add("gradwired_clients", "trainers connected", T::Gauge, double(st.live_clients));
    add("gradwired_arenas", "trainer arenas mapped in the daemon", T::Gauge,
        double(st.live_arenas));
    add("gradwired_jobs", "jobs with trainers on this daemon", T::Gauge, double(st.live_jobs));
    add("gradwired_clients_accepted_total", "hellos accepted", T::Counter, double(st.accepted));
    add("gradwired_clients_refused_total",
        "connections refused or cut for misbehaviour (garbage, out-of-arena offsets, ring "
        "overflow, another host, another uid)",
        T::Counter, double(st.refused));
    add("gradwired_collectives_total", "job-wide collectives completed", T::Counter,
        double(st.collectives), {"result", "ok"});
    add("gradwired_collectives_total", "job-wide collectives completed", T::Counter,
        double(st.failed), {"result", "error"});
    return out;
  }

 private:
  const Server& server_;
};

class PrometheusEndpoint final : public MetricsEndpoint {
 public:
  PrometheusEndpoint(std::unique_ptr<prometheus::Exposer> e, std::shared_ptr<StatsCollectable> c)
      : exposer_(std::move(e)), stats_(std::move(c)) {
    exposer_->RegisterCollectable(stats_);
  }

 private:
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::shared_ptr<StatsCollectable> stats_;
};

}  // namespace

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(const std::string& host_port,
                                                                const Server& server) {
  try {
    auto exposer = std::make_unique<prometheus::Exposer>(host_port);
    return std::unique_ptr<MetricsEndpoint>(
        new PrometheusEndpoint(std::move(exposer), std::make_shared<StatsCollectable>(server)));
  } catch (const std::exception& e) {
    return invalid_arg("gradwired: metrics endpoint on '{}': {}", host_port, e.what());
  }
}

#else

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(const std::string& host_port,
                                                                const Server&) {
  return unsupported(
      "gradwired: --metrics {}: this build has no Prometheus support (install prometheus-cpp-dev "
      "and rebuild)",
      host_port);
}

#endif

}  // namespace gw::daemon
