#include "daemon/metrics.h"

#include "daemon/metrics_server.h"
#include "daemon/protocol.h"

#if defined(GW_HAVE_PROMETHEUS)
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#endif

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace gw::daemon {

#if defined(GW_HAVE_PROMETHEUS)
namespace {

// The daemon's figures as Prometheus families, read at each scrape.
std::vector<prometheus::MetricFamily> collect(const Server& server) {
  const ServerStats st = server.stats();
  std::vector<prometheus::MetricFamily> out;
  using Labels = std::vector<prometheus::ClientMetric::Label>;
  // Appends a sample to the family `name` (a new family when the last one is another).
  auto family = [&](const char* name, const char* help,
                    prometheus::MetricType type) -> prometheus::MetricFamily& {
    if (out.empty() || out.back().name != name) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = type;
      out.push_back(std::move(f));
    }
    return out.back();
  };
  auto add = [&](const char* name, const char* help, prometheus::MetricType type, double v,
                 Labels labels = {}) {
    prometheus::ClientMetric m;
    m.label = std::move(labels);
    if (type == prometheus::MetricType::Counter) {
      m.counter.value = v;
    } else {
      m.gauge.value = v;
    }
    family(name, help, type).metric.push_back(std::move(m));
  };
  using T = prometheus::MetricType;
  add("gradwired_clients", "trainers connected", T::Gauge, double(st.live_clients));
  add("gradwired_arenas", "trainer arenas mapped in the daemon", T::Gauge, double(st.live_arenas));
  add("gradwired_imported_allocations", "trainers' device allocations open in the daemon", T::Gauge,
      double(st.live_imports));
  add("gradwired_jobs", "jobs with trainers on this daemon", T::Gauge, double(st.live_jobs));
  add("gradwired_clients_accepted_total", "hellos accepted", T::Counter, double(st.accepted));
  add("gradwired_clients_refused_total",
      "connections refused or cut for misbehaviour (garbage, out-of-arena offsets, ring "
      "overflow, another host, another uid)",
      T::Counter, double(st.refused));
  const char* kCollHelp = "job-wide collectives completed, by kind and result";
  for (int k = 0; k < kNumOpcodes; ++k) {
    const char* kind = opcode_name(static_cast<Opcode>(k + 1));
    add("gradwired_collectives_total", kCollHelp, T::Counter, double(st.by_opcode[k][0]),
        {{"kind", kind}, {"result", "ok"}});
    add("gradwired_collectives_total", kCollHelp, T::Counter, double(st.by_opcode[k][1]),
        {{"kind", kind}, {"result", "error"}});
  }
  const char* kErrHelp =
      "errors by kind: refused hellos (hello), peers of another uid (credentials), caps "
      "(capacity), misbehaviour after the hello (protocol), failed collectives (collective)";
  for (int k = 0; k < kNumErrorKinds; ++k) {
    add("gradwired_errors_total", kErrHelp, T::Counter, double(st.errors[k]),
        {{"kind", error_kind_name(static_cast<ErrorKind>(k))}});
  }
  for (int c = 1; c < 9; ++c) {
    add("gradwired_collective_errors_total", "failed collectives by status code", T::Counter,
        double(st.collective_errors[c]), {{"code", code_name(static_cast<Code>(c))}});
  }
  const char* kBytesHelp =
      "bytes by transport and direction: arena = read from trainers' buffers (in) and written "
      "back (out); the inter-host transport = payload handed to its collectives (out) and got "
      "back (in), not wire bytes";
  add("gradwired_bytes_total", kBytesHelp, T::Counter, double(st.arena_bytes_in),
      {{"transport", "arena"}, {"direction", "in"}});
  add("gradwired_bytes_total", kBytesHelp, T::Counter, double(st.arena_bytes_out),
      {{"transport", "arena"}, {"direction", "out"}});
  for (const auto& t : st.inter) {
    add("gradwired_bytes_total", kBytesHelp, T::Counter, double(t.in),
        {{"transport", t.transport}, {"direction", "in"}});
    add("gradwired_bytes_total", kBytesHelp, T::Counter, double(t.out),
        {{"transport", t.transport}, {"direction", "out"}});
  }
  // The NCCL plugin's daemon mode, by NCCL job (docs/nccl-plugin.md "Daemon mode").
  for (const NcclJobStats& n : st.nccl_jobs) {
    add("gradwired_nccl_connections",
        "connections of the NCCL plugin's daemon mode now, by NCCL job", T::Gauge,
        double(n.connections), {{"nccl_job", n.job}});
  }
  for (const NcclJobStats& n : st.nccl_jobs) {
    add("gradwired_nccl_bytes_total",
        "bytes the NCCL plugin's daemon-mode connections received, by NCCL job", T::Counter,
        double(n.bytes), {{"nccl_job", n.job}});
  }
  // The parameter-server stores this daemon holds (each job's share of its keys).
  add("gradwired_kv_stores", "parameter-server stores held by this daemon's jobs", T::Gauge,
      double(st.kv_stores.size()));
  auto kv_add = [&](const char* name, const char* help, T type, double v, const KvStoreStats& k) {
    add(name, help, type, v,
        {{"job", k.job}, {"store", std::to_string(k.store)}, {"mode", k.mode}, {"codec", k.codec}});
  };
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_keys", "keys of the store with a partition on this daemon", T::Gauge,
           double(k.keys), k);
  }
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_partitions", "partitions of the store held by this daemon", T::Gauge,
           double(k.partitions), k);
  }
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_bytes", "bytes of the store's values held by this daemon", T::Gauge,
           double(k.bytes), k);
  }
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_min_clock", "the slowest live worker's clock, as this daemon saw it",
           T::Gauge, double(k.min_clock), k);
  }
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_max_clock", "the fastest worker's clock, as this daemon saw it", T::Gauge,
           double(k.max_clock), k);
  }
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_lag_clocks", "the fastest worker's clock minus the slowest live one's",
           T::Gauge, double(k.max_clock - std::min(k.min_clock, k.max_clock)), k);
  }
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_dropped_pushes_total",
           "pushes of a closed clock dropped by this daemon's share of the store (sync:K)",
           T::Counter, double(k.dropped), k);
  }
  for (const KvStoreStats& k : st.kv_stores) {
    kv_add("gradwired_kv_lost_workers", "workers of the store that died without saying goodbye",
           T::Gauge, double(k.lost), k);
  }
  for (int p = 0; p < kNumPhases; ++p) {
    const DurationHistogram& h = st.phases[p];
    prometheus::ClientMetric m;
    m.label = {{"phase", phase_name(static_cast<Phase>(p))}};
    m.histogram.sample_count = h.count;
    m.histogram.sample_sum = h.sum_s;
    uint64_t cumulative = 0;
    for (int b = 0; b < DurationHistogram::kBuckets; ++b) {
      cumulative += h.buckets[b];
      prometheus::ClientMetric::Bucket bucket;
      bucket.cumulative_count = cumulative;
      bucket.upper_bound = b + 1 < DurationHistogram::kBuckets
                               ? DurationHistogram::kBounds[b]
                               : std::numeric_limits<double>::infinity();
      m.histogram.bucket.push_back(bucket);
    }
    family("gradwired_phase_seconds",
           "time per phase of a collective in the daemon: local_reduce (reading and summing the "
           "local trainers' buffers), inter_host (the collective among the job's daemons), "
           "copy_back (writing the result into every trainer's buffer)",
           T::Histogram)
        .metric.push_back(std::move(m));
  }
  return out;
}

class PrometheusEndpoint final : public MetricsEndpoint {
 public:
  explicit PrometheusEndpoint(std::unique_ptr<MetricsServer> http) : http_(std::move(http)) {}
  const std::string& bound_address() const override { return http_->bound_address(); }

 private:
  std::unique_ptr<MetricsServer> http_;
};

}  // namespace

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(const std::string& host_port,
                                                                const Server& server) {
  MetricsServerOptions o;
  o.address = host_port;
  auto http = MetricsServer::start(o, [&server] {
    std::ostringstream text;
    prometheus::TextSerializer().Serialize(text, collect(server));
    return text.str();
  });
  if (!http.ok()) return http.status();
  return std::unique_ptr<MetricsEndpoint>(new PrometheusEndpoint(std::move(*http)));
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
