#include "plugin/plugin_timeline.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "core/config.h"
#include "core/core_config.h"
#include "core/timeline.h"
#include "plugin/net_plugin.h"

namespace gw::plugin::trace {

namespace {

constexpr const char* kCategory = "nccl-net";

// A JSON string's contents (peer names come from the network layer; escape anyway).
std::string json_text(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out;
}

std::string origin_members(const PluginComm& c);

// The members every event of a comm carries: made once per comm (name_comm) while the timeline
// is on; made here for a comm named while it was off.
std::string comm_args(const PluginComm& c) {
  const std::string& made = c.origin().trace_args;
  return made.empty() ? origin_members(c) : made;
}

std::string origin_members(const PluginComm& c) {
  const CommOrigin& o = c.origin();
  return fmt::format(R"("peer":"{}","comm":"0x{:016x}","conn":{},"transport":"{}")",
                     json_text(c.peer_name()), o.comm_id, o.conn, json_text(o.backend));
}

// A non-negative decimal from `name`, or -1 when unset or not one.
int env_rank(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*end != '\0' || errno != 0 || n < 0 || n > 1 << 30) return -1;
  return static_cast<int>(n);
}

}  // namespace

std::string plugin_pattern(std::string_view pattern) {
  std::string p(pattern);
  constexpr std::string_view kJson = ".json";
  const bool json =
      p.size() > kJson.size() && p.compare(p.size() - kJson.size(), kJson.size(), kJson) == 0;
  if (json) p.resize(p.size() - kJson.size());
  // Without "%r", timeline::path_for would put ".<rank>" where ".nccl" goes: put it there first.
  if (p.find("%r") == std::string::npos) p += ".%r";
  return p + ".nccl" + (json ? std::string(kJson) : std::string());
}

RankChoice launcher_rank() {
  const int64_t gw = config::get_int(core_config::kRank);
  if (gw >= 0 && gw <= 1 << 30) return {static_cast<int>(gw), "GW_RANK"};
  for (const char* name : {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) {
    if (const int r = env_rank(name); r >= 0) return {r, name};
  }
  return {static_cast<int>(::getpid()), "process id: no launcher rank variable is set"};
}

Result<std::string> open_from_env() {
  static std::once_flag once;
  Result<std::string> said = std::string();
  std::call_once(once, [&] {
    const std::string pattern = config::get_string(core_config::kTimeline);
    if (pattern.empty()) return;
    const RankChoice rank = launcher_rank();
    const std::string mine = plugin_pattern(pattern);
    const Status st = timeline::open(mine, rank.rank);
    if (!st.ok()) {
      said = st;
      return;
    }
    said = fmt::format("timeline to {} (pid {}: {})", timeline::path_for(mine, rank.rank),
                       rank.rank, rank.source);
  });
  return said;
}

std::string origin_args(const PluginComm& c) { return origin_members(c); }

int next_conn() {
  static std::atomic<int> n{0};
  return n.fetch_add(1, std::memory_order_relaxed) + 1;
}

void transfer(const PluginComm& c, const char* name, int64_t ts_us, size_t bytes, size_t posted,
              int tag, bool failed) {
  std::string args = fmt::format(R"("bytes":{},"tag":{},{})", bytes, tag, comm_args(c));
  if (posted != bytes) args += fmt::format(R"(,"posted":{})", posted);
  if (failed) args += R"(,"failed":true)";
  timeline::complete(name, kCategory, ts_us, timeline::now_us() - ts_us, args);
}

void registration(const PluginComm& c, const char* name, int64_t ts_us, size_t bytes,
                  const char* type, bool failed) {
  std::string args = fmt::format(R"("bytes":{},"type":"{}",{})", bytes, type, comm_args(c));
  if (failed) args += R"(,"failed":true)";
  timeline::complete(name, kCategory, ts_us, timeline::now_us() - ts_us, args);
}

void setup(const PluginComm& c, const char* name, int64_t ts_us) {
  timeline::complete(name, kCategory, ts_us, timeline::now_us() - ts_us, comm_args(c));
}

void setup_failed(const char* name, uint64_t comm_id, int64_t ts_us, std::string_view why) {
  timeline::complete(
      name, kCategory, ts_us, timeline::now_us() - ts_us,
      fmt::format(R"("comm":"0x{:016x}","failed":true,"why":"{}")", comm_id, json_text(why)));
}

}  // namespace gw::plugin::trace
