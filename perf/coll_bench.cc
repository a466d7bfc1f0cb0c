#include "perf/coll_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "collectives/coll_config.h"
#include "collectives/cost_model.h"
#include "core/config.h"
#include "core/config_snapshot.h"
#include "core/core_config.h"
#include "core/net/backend_registry.h"
#include "gradwire/gradwire.h"
#include "perf/coll_rank_run.h"
#include "perf/coll_report.h"
#include "perf/rank_launcher.h"

namespace gw::perf {

namespace {

using json = nlohmann::json;

int run_forked_sweep(const CollConfig& c) {
  auto port = reserve_loopback_port();
  if (!port.ok()) {
    std::fprintf(stderr, "gradwire-perf: %s\n", port.status().to_string().c_str());
    return 2;
  }
  std::string store = fmt::format("127.0.0.1:{}", *port);
  json doc = json::object();
  doc["config"] = config_json(c);
  doc["rows"] = json::array();
  std::string first_error;
  bool have_summary = false;
  ForkOptions fo;
  fo.nranks = c.np;
  int64_t timeout = c.timeout_ms > 0 ? c.timeout_ms : config::get_int(core_config::kTimeoutMs);
  fo.idle_timeout_ms = timeout + 30000;
  Status st = run_forked(
      fo,
      [&](int rank, int fd) {
        gw_config_t cfg = GW_CONFIG_INIT;
        cfg.rank = rank;
        cfg.world_size = c.np;
        cfg.store_addr = store.c_str();
        cfg.transport = c.transport.c_str();
        cfg.timeout_ms = static_cast<int>(c.timeout_ms);
        return run_coll_rank(c, fd, &cfg);
      },
      [&](int rank, const std::string& line) {
        auto sp = line.find(' ');
        std::string kind = line.substr(0, sp);
        std::string body = sp == std::string::npos ? "" : line.substr(sp + 1);
        json j = json::parse(body, nullptr, false);
        if (kind == "config" && !j.is_discarded()) {
          doc["config"] = j;
        } else if (kind == "row" && !j.is_discarded()) {
          doc["rows"].push_back(j);
        } else if (kind == "summary" && !j.is_discarded()) {
          doc["avg_busbw_gbps"] = j["avg_busbw_gbps"];
          have_summary = true;
        } else if (kind == "error" && j.is_string() && first_error.empty()) {
          first_error = j.get<std::string>();
        }
      });
  int rc = 0;
  if (!st.ok()) {
    std::string msg =
        first_error.empty() ? st.to_string() : fmt::format("{} ({})", first_error, st.to_string());
    std::fprintf(stderr, "gradwire-perf: run failed: %s\n",
                 run_failure_text(st, first_error).c_str());
    doc["error"] = msg;
    rc = 2;
    // Exit status 1 of a rank means wrong results, not an error.
    if (first_error.empty() && st.message().find("exited with status 1") != std::string::npos) {
      doc.erase("error");
      doc["check_passed"] = false;
      rc = 1;
    }
  } else if (!have_summary) {
    doc["error"] = "rank 0 finished without a summary";
    rc = 2;
  } else if (c.check_iters > 0) {
    doc["check_passed"] = true;
  }
  if (!c.json_path.empty() && !write_json_file(c.json_path, doc) && rc == 0) rc = 2;
  return rc;
}

}  // namespace

std::string comm_describe(gw_comm_t comm, const char* key) {
  size_t needed = 0;
  if (gw_comm_describe(comm, key, nullptr, 0, &needed) != GW_OK) return "?";
  std::string v(needed, '\0');
  if (gw_comm_describe(comm, key, v.data(), v.size(), nullptr) != GW_OK) return "?";
  v.resize(needed - 1);
  return v;
}

bool write_json_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) {
    std::fprintf(stderr, "gradwire-perf: cannot write --json file %s\n", path.c_str());
    return false;
  }
  f << text << "\n";
  return static_cast<bool>(f);
}

Status set_api_value(const config::Row& row, const std::string& value) {
  GW_RETURN_IF_ERROR(config::set(row, value));
  if (gw_config_set(row.name, value.c_str()) != GW_OK) {
    return invalid_arg("gw_config_set({}): {}", row.name, gw_last_error());
  }
  return ok_status();
}

double busbw_factor(Collective coll, int nranks) {
  if (nranks <= 0) return 0;
  double n = nranks;
  switch (coll) {
    case Collective::kAllreduce:
      return 2.0 * (n - 1) / n;
    case Collective::kAllgather:
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
    case Collective::kAlltoallv:
    case Collective::kGather:
    case Collective::kScatter:
      return (n - 1) / n;
    case Collective::kBroadcast:
    case Collective::kReduce:
      return 1.0;
  }
  return 0;
}

int adaptive_iters(uint64_t bytes, int nranks) {
  double it = 2e9 / static_cast<double>(std::max<uint64_t>(bytes, 1)) / std::max(nranks, 1);
  return static_cast<int>(std::clamp(it, 3.0, 50.0));
}

size_t count_for_size(Collective coll, uint64_t bytes, coll::DataType dtype, int nranks) {
  size_t count = bytes / coll::dtype_size(dtype);
  if (coll == Collective::kAllgather || coll == Collective::kReduceScatter ||
      coll == Collective::kAlltoall || coll == Collective::kGather ||
      coll == Collective::kScatter) {
    size_t n = static_cast<size_t>(std::max(nranks, 1));
    count = count / n * n;
  }
  return count;
}

Status validate(const CollConfig& c) {
  if (c.min_bytes > c.max_bytes) {
    return invalid_arg("-b {} is larger than -e {}", c.min_bytes, c.max_bytes);
  }
  if (c.step_bytes == 0 && c.factor < 2) {
    return invalid_arg("-f {}: the step factor must be at least 2", c.factor);
  }
  if (c.check_iters < 0) return invalid_arg("-c {}: must be >= 0 (0 = no check)", c.check_iters);
  if (!c.blocking && c.coll != Collective::kAllreduce) {
    return invalid_arg(
        "-z 0: only allreduce has a non-blocking form (gw_iallreduce); {} runs blocking calls",
        c.name);
  }
  if (c.max_bytes > (uint64_t{1} << 40)) {
    return invalid_arg("-e {}: sizes above 1 TiB are not supported", c.max_bytes);
  }
  if (c.iters < 0) return invalid_arg("--iters {}: must be >= 0 (0 = adaptive)", c.iters);
  if (c.warmup < 0) return invalid_arg("--warmup {}: must be >= 0", c.warmup);
  if (c.np < 0) return invalid_arg("--np {}: must be >= 1", c.np);
  if (c.np > 256) return invalid_arg("--np {}: at most 256 forked ranks", c.np);
  if (c.root < 0 || (c.np > 0 && c.root >= c.np)) {
    return invalid_arg("--root {} is not a rank of a {}-rank job", c.root, c.np);
  }
  GW_RETURN_IF_ERROR(net::check_backend_name(c.transport, "--transport"));
  if (c.transport == "dpdk" && c.np > 0) {
    // DPDK owns a port per process (EAL and port are process-wide): forked ranks on one host
    // would all open the port GW_DPDK_EAL_ARGS names.
    return invalid_arg(
        "--transport dpdk with --np: DPDK needs one rank per host, each with its own port; run "
        "one rank per host under a launcher (GW_RANK, GW_WORLD_SIZE, GW_STORE, or torchrun / "
        "mpirun / srun) with that host's GW_DPDK_EAL_ARGS and GW_DPDK_IP, or run "
        "perf/dpdk_vs_tcp.sh, which does so on network-namespace hosts");
  }
  if (!c.algo.empty()) {
    // The library's own parser: every name in its algorithm table.
    auto algo = coll::parse_algo(c.algo);
    if (!algo.ok()) return algo.status().with_context(fmt::format("--algo {}", c.algo));
  }
  if (c.timeout_ms < 0 || c.timeout_ms > INT32_MAX) {
    return invalid_arg("--timeout-ms {}: out of range", c.timeout_ms);
  }
  if (c.coll == Collective::kAllreduce || c.coll == Collective::kReduceScatter) {
    (void)0;  // every op is valid for every dtype
  }
  return config::validate();
}

int run_collective(const CollConfig& config) {
  Status s = validate(config);
  if (!s.ok()) {
    std::fprintf(stderr, "gradwire-perf: %s\n", s.to_string().c_str());
    if (!config.json_path.empty()) {
      write_json_file(
          config.json_path,
          json{{"config", config_json(config)}, {"rows", json::array()}, {"error", s.to_string()}});
    }
    return 2;
  }
  // The options are settings of the API layer, here and in libgradwire (its own copy of the
  // configuration); forked ranks inherit them.
  if (!config.algo.empty()) s = set_api_value(coll::coll_config::kAlgo, config.algo);
  if (s.ok() && config.np == 0 && config.timeout_ms > 0) {
    s = set_api_value(core_config::kTimeoutMs, std::to_string(config.timeout_ms));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "gradwire-perf: %s\n", s.to_string().c_str());
    return 2;
  }
  if (config.np > 0) return run_forked_sweep(config);
  if (!launched_by_launcher()) {
    const std::string msg = no_launcher_advice();
    std::fprintf(stderr, "gradwire-perf: %s\n", msg.c_str());
    if (!config.json_path.empty()) {
      write_json_file(
          config.json_path,
          json{{"config", config_json(config)}, {"rows", json::array()}, {"error", msg}});
    }
    return 2;
  }
  // Rank, size and store from the launcher (world_size 0); the transport is passed explicitly
  // because gw_comm_init_from_env does not read GW_TRANSPORT (it would silently run "auto").
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.transport = config.transport.c_str();
  cfg.timeout_ms = static_cast<int>(config.timeout_ms);
  return run_coll_rank(config, -1, &cfg);
}

}  // namespace gw::perf
