// gradwirectl: asks the host's gradwired what it is doing (docs/daemon.md, "gradwirectl").
//
//   gradwirectl status | jobs | clients | config | kv [--socket PATH] [--json] [--timeout-ms MS]
//   gradwirectl trace JOB --seconds N [-o FILE] [--socket PATH] [--timeout-ms MS]
//
// It talks to the daemon's control socket (the trainers' socket + ".ctl"; --socket names the
// trainers' socket, as gradwired's option does, default GW_DAEMON_SOCKET) with the protocol of
// daemon/control.h, and prints a table, or the daemon's answer as JSON with --json. Exit status: 0
// answered, 1 the daemon refused or could not be reached (the reason on stderr), 2 usage. trace
// waits for its --seconds, then prints the Chrome trace (JSON) or writes it to -o FILE.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/config.h"
#include "daemon/control.h"
#include "daemon/control_trace.h"
#include "daemon/daemon_config.h"

namespace {

using nlohmann::json;

// Column-aligned text: a header row, then one row per entry.
std::string table(const std::vector<std::string>& header,
                  const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const auto& r : rows) {
    for (size_t i = 0; i < r.size() && i < width.size(); ++i) {
      width[i] = std::max(width[i], r[i].size());
    }
  }
  std::string out;
  auto line = [&](const std::vector<std::string>& cells) {
    std::string l;
    for (size_t i = 0; i < cells.size(); ++i) {
      l += cells[i];
      if (i + 1 < cells.size()) l += std::string(width[i] - cells[i].size() + 2, ' ');
    }
    out += l + "\n";
  };
  line(header);
  for (const auto& r : rows) line(r);
  return out;
}

// The checked fields of an answer (decode_control_response guarantees presence and type).
std::string str(const json& j, const char* key) { return j.at(key).get<std::string>(); }
std::string num(const json& j, const char* key) {
  const json& v = j.at(key);
  if (v.is_number_unsigned()) return std::to_string(v.get<uint64_t>());
  return std::to_string(v.get<int64_t>());
}
// A field a daemon before version 0.5 did not send (imports): "-" when absent or not a number.
std::string num_or_dash(const json& j, const char* key) {
  return j.contains(key) && j.at(key).is_number_integer() ? num(j, key) : "-";
}

// A string field an older daemon did not send (device_buffers_why): "-" when absent.
std::string str_or_dash(const json& j, const char* key) {
  return j.contains(key) && j.at(key).is_string() ? str(j, key) : "-";
}

std::string render(gw::daemon::ControlCommand command, const json& r) {
  using gw::daemon::ControlCommand;
  switch (command) {
    case ControlCommand::kStatus: {
      char uptime[32];
      std::snprintf(uptime, sizeof(uptime), "%.1f s", r.at("uptime_s").get<double>());
      return table({"field", "value"}, {{"version", str(r, "version")},
                                        {"pid", num(r, "pid")},
                                        {"uptime", uptime},
                                        {"socket", str(r, "socket")},
                                        {"control socket", str(r, "control_socket")},
                                        {"transport", str(r, "transport")},
                                        {"device buffers", str_or_dash(r, "device_buffers_why")},
                                        {"dpdk port", str_or_dash(r, "dpdk_port")},
                                        {"host id", str(r, "host_id")},
                                        {"clients", num(r, "clients")},
                                        {"jobs", num(r, "jobs")},
                                        {"arenas", num(r, "arenas")},
                                        {"device imports", num_or_dash(r, "imports")},
                                        {"clients accepted", num(r, "accepted")},
                                        {"clients refused", num(r, "refused")},
                                        {"collectives ok", num(r, "collectives")},
                                        {"collectives failed", num(r, "failed")}});
    }
    case ControlCommand::kJobs: {
      std::vector<std::vector<std::string>> rows;
      for (const json& j : r) {
        rows.push_back({str(j, "job"), num(j, "world"), num(j, "hosts"), num(j, "host_index"),
                        num(j, "local_trainers") + "/" + num(j, "local_size"), str(j, "state"),
                        str(j, "transport"), num(j, "collectives"), num(j, "errors"),
                        num_or_dash(j, "imports")});
      }
      std::string out = table({"JOB", "WORLD", "HOSTS", "HOST", "LOCAL", "STATE", "TRANSPORT",
                               "COLLECTIVES", "ERRORS", "IMPORTS"},
                              rows);
      // The NCCL plugin's daemon mode: each connection is a job of its own; per NCCL job, how
      // many connections and the bytes they carried.
      std::map<std::string, std::pair<uint64_t, uint64_t>> nccl;
      for (const json& j : r) {
        if (!j.contains("nccl_job") || !j["nccl_job"].is_string()) continue;
        auto& [conns, bytes] = nccl[j["nccl_job"].get<std::string>()];
        ++conns;
        if (j.contains("nccl_bytes") && j["nccl_bytes"].is_number_unsigned()) {
          bytes += j["nccl_bytes"].get<uint64_t>();
        }
      }
      if (nccl.empty()) return out;
      std::vector<std::vector<std::string>> nrows;
      for (const auto& [id, cb] : nccl) {
        nrows.push_back({id, std::to_string(cb.first), std::to_string(cb.second)});
      }
      return out + "\n" + table({"NCCL JOB", "CONNECTIONS", "BYTES"}, nrows);
    }
    case ControlCommand::kClients: {
      std::vector<std::vector<std::string>> rows;
      for (const json& c : r) {
        rows.push_back({num(c, "id"), num(c, "pid"), num(c, "uid"), str(c, "job"), num(c, "rank"),
                        num(c, "local_rank"), num(c, "arena_bytes"), num(c, "requests")});
      }
      return table({"ID", "PID", "UID", "JOB", "RANK", "LOCAL", "ARENA_BYTES", "REQUESTS"}, rows);
    }
    case ControlCommand::kKv: {
      std::vector<std::vector<std::string>> rows;
      for (const json& k : r) {
        rows.push_back({str(k, "job"), num(k, "host_index"), num(k, "store"), str(k, "mode"),
                        str(k, "update"), str(k, "codec"), num(k, "live") + "/" + num(k, "workers"),
                        num(k, "keys"), num(k, "partitions"), num(k, "bytes"),
                        num(k, "min_clock") + ".." + num(k, "max_clock"), num(k, "lag"),
                        num(k, "dropped"), num(k, "lost"), str(k, "state")});
      }
      return table({"JOB", "HOST", "STORE", "MODE", "UPDATE", "CODEC", "WORKERS", "KEYS",
                    "PARTITIONS", "BYTES", "CLOCK", "LAG", "DROPPED", "LOST", "STATE"},
                   rows);
    }
    case ControlCommand::kConfig: {
      std::vector<std::vector<std::string>> rows;
      for (const json& c : r) {
        rows.push_back({str(c, "name"), str(c, "value"), str(c, "source"), str(c, "default")});
      }
      return table({"NAME", "VALUE", "SOURCE", "DEFAULT"}, rows);
    }
    case ControlCommand::kTrace:  // the Chrome trace itself, as JSON
      return r.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"gradwirectl: ask the host's gradwired what it is doing (docs/daemon.md)"};
  app.require_subcommand(1, 1);
  std::string socket_path;
  bool as_json = false;
  int64_t timeout_ms = 5000;
  app.add_option("--socket", socket_path,
                 "the daemon's trainers' socket (GW_DAEMON_SOCKET); its control socket is this "
                 "path + '.ctl'");
  app.add_flag("--json", as_json, "print the daemon's answer as JSON");
  app.add_option("--timeout-ms", timeout_ms, "how long to wait for the daemon")
      ->check(CLI::Range(int64_t{1}, int64_t{600000}));
  std::string chosen;
  for (const char* name : {"status", "jobs", "clients", "config", "kv"}) {
    const std::string_view n(name);
    const char* help = n == "status"    ? "the daemon: version, pid, counts"
                       : n == "jobs"    ? "the jobs it serves"
                       : n == "clients" ? "the trainers connected"
                       : n == "kv"      ? "the parameter-server stores: codec, keys, clocks, lag"
                                        : "its resolved settings";
    app.add_subcommand(name, help)->fallthrough()->callback([&chosen, name] { chosen = name; });
  }
  gw::daemon::TraceRequest trace;
  std::string trace_out;
  CLI::App* tr = app.add_subcommand(
      "trace",
      "record a job's collectives in the daemon for --seconds; print them (or write -o) "
      "as a Chrome trace");
  tr->fallthrough()->callback([&chosen] { chosen = "trace"; });
  tr->add_option("job", trace.job, "the job, as `gradwirectl jobs` names it")->required();
  tr->add_option("--seconds", trace.seconds, "how long to record (at most 600)")->required();
  tr->add_option("-o,--output", trace_out, "write the trace to this file instead of stdout");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (socket_path.empty()) socket_path = gw::config::get_string(gw::daemon_config::kSocket);
  auto command = gw::daemon::parse_control_command(chosen);
  if (!command.ok()) {
    std::fprintf(stderr, "gradwirectl: %s\n", command.status().message().c_str());
    return 2;
  }
  const std::string ctl = gw::daemon::control_socket_path(socket_path);
  // A trace is answered when it ends: the wait is its length, then --timeout-ms (a length out of
  // range is the daemon's to refuse, at once).
  const double wait_s = std::isfinite(trace.seconds) && trace.seconds > 0
                            ? std::min(trace.seconds, gw::daemon::kMaxTraceSeconds)
                            : 0;
  auto answer =
      *command == gw::daemon::ControlCommand::kTrace
          ? gw::daemon::control_call_body(ctl, gw::daemon::encode_trace_request(trace), *command,
                                          timeout_ms + static_cast<int64_t>(wait_s * 1000))
          : gw::daemon::control_call(ctl, *command, timeout_ms);
  if (!answer.ok()) {
    std::fprintf(stderr, "gradwirectl: %s\n", answer.status().message().c_str());
    return 1;
  }
  const std::string out = as_json
                              ? answer->dump(2, ' ', false, json::error_handler_t::replace) + "\n"
                              : render(*command, *answer);
  if (!trace_out.empty()) {
    std::FILE* f = std::fopen(trace_out.c_str(), "w");
    if (f == nullptr || std::fputs(out.c_str(), f) < 0 || std::fclose(f) != 0) {
      std::fprintf(stderr, "gradwirectl: cannot write %s: %s\n", trace_out.c_str(),
                   std::strerror(errno));
      return 1;
    }
    const json& other = answer->at("otherData");
    std::printf("gradwirectl: wrote %s: %s events of job %s (host %s), %s dropped at the cap\n",
                trace_out.c_str(), num(other, "events").c_str(), str(other, "job").c_str(),
                num(other, "host_index").c_str(), num(other, "dropped").c_str());
    return 0;
  }
  std::fputs(out.c_str(), stdout);
  return 0;
}
