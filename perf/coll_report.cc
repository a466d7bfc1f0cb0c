#include "perf/coll_report.h"

#include <cstdio>
#include <fstream>

#include "collectives/coll_config.h"
#include "core/config.h"
#include "core/config_snapshot.h"
#include "gradwire/gradwire.h"

namespace gw::perf {

using json = nlohmann::json;

namespace {

const char* nccl_type_name(coll::DataType t) {
  switch (t) {
    case coll::DataType::kF32:
      return "float";
    case coll::DataType::kF64:
      return "double";
    case coll::DataType::kF16:
      return "half";
    default:
      return nullptr;  // bfloat16, int32, int64, uint8: the same name in both
  }
}

const char* average_name(CollConfig::Average a) {
  switch (a) {
    case CollConfig::Average::kRank0:
      return "rank0";
    case CollConfig::Average::kMean:
      return "mean";
    case CollConfig::Average::kMin:
      return "min";
    case CollConfig::Average::kMax:
      return "max";
  }
  return "?";
}

}  // namespace

bool has_op(Collective c) {
  return c == Collective::kAllreduce || c == Collective::kReduceScatter || c == Collective::kReduce;
}

std::string table_type(coll::DataType t) {
  const char* n = nccl_type_name(t);
  return n != nullptr ? std::string(n) : std::string(coll::dtype_name(t));
}

std::string busbw_formula(Collective c) {
  switch (c) {
    case Collective::kAllreduce:
      return "algbw * 2(n-1)/n";
    case Collective::kAllgather:
    case Collective::kReduceScatter:
    case Collective::kAlltoall:
    case Collective::kGather:
    case Collective::kScatter:
      return "algbw * (n-1)/n";
    case Collective::kAlltoallv:
      return "algbw * (n-1)/n (size = the send buffer of one rank, uneven splits)";
    case Collective::kBroadcast:
    case Collective::kReduce:
      return "algbw";
  }
  return "?";
}

// Writes `doc` to path as exactly one JSON document (NaN/inf become null).
bool write_json_file(const std::string& path, const json& doc) {
  std::ofstream f(path, std::ios::trunc);
  if (!f) {
    std::fprintf(stderr, "gradwire-perf: cannot write --json file %s\n", path.c_str());
    return false;
  }
  f << doc.dump(2) << "\n";
  return static_cast<bool>(f);
}

// How the time column is made, for the header and the JSON.
std::string time_rule(const CollConfig& c) {
  const char* across = c.average == CollConfig::Average::kRank0  ? "rank 0's"
                       : c.average == CollConfig::Average::kMean ? "the mean over ranks of the"
                       : c.average == CollConfig::Average::kMin  ? "the fastest rank's"
                                                                 : "the slowest rank's";
  if (!c.blocking) {
    return fmt::format(
        "{} time of all iterations issued at once (gw_iallreduce) divided by the iterations",
        across);
  }
  return fmt::format("median over iterations of {} per-iteration time (blocking calls)", across);
}

// The sizes of the sweep: -b, then times -f (or plus -i), up to -e.
std::vector<uint64_t> sweep_sizes(const CollConfig& c) {
  std::vector<uint64_t> sizes;
  for (uint64_t b = c.min_bytes; b <= c.max_bytes;) {
    sizes.push_back(b);
    uint64_t next = 0;
    if (c.step_bytes > 0) {
      if (b > c.max_bytes - c.step_bytes) break;
      next = b + c.step_bytes;
    } else {
      if (b > c.max_bytes / static_cast<uint64_t>(c.factor)) break;
      next = b * static_cast<uint64_t>(c.factor);
      if (next == b) next = b + 1;  // -b 0
    }
    b = next;
  }
  return sizes;
}

json config_json(const CollConfig& c) {
  json j;
  j["collective"] = c.name;
  j["ranks_requested"] = c.np;
  // As asked; rank 0 adds what the communicator resolved ("transport", "interface", ...).
  j["transport_requested"] = c.transport;
  j["algorithm_requested"] = c.algo.empty() ? config::get_string(coll::coll_config::kAlgo) : c.algo;
  j["dtype"] = std::string(coll::dtype_name(c.dtype));
  j["op"] = has_op(c.coll) ? std::string(coll::op_name(c.op)) : "none";
  j["root"] = is_rooted(c.coll) ? c.root : -1;
  j["min_bytes"] = c.min_bytes;
  j["max_bytes"] = c.max_bytes;
  j["step_factor"] = c.factor;
  j["iters"] = c.iters > 0 ? json(c.iters) : json("adaptive");
  j["warmup"] = c.warmup;
  j["warmup_ms"] = c.warmup_ms;
  j["step_bytes"] = c.step_bytes;
  j["check"] = c.check_iters > 0;
  j["check_iters"] = c.check_iters;
  j["average"] = average_name(c.average);
  j["blocking"] = c.blocking;
  j["time"] = time_rule(c);
  j["mem_alloc"] = c.mem_alloc;
  j["gradwire_version"] = gw_version();
  // Every setting a layer above the default sets (file, environment, or the options above).
  json env = json::object();
  for (const auto& [row, v] : config::Snapshot::capture().entries()) {
    if (v.source != config::Source::kDefault) env[row->name] = config::shown(*row, v);
  }
  j["gw_env"] = env;
  return j;
}

}  // namespace gw::perf
