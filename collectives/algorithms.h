// The algorithm tables: every algorithm the Communicator can run for allreduce, broadcast,
// allgather and reduce-scatter, with when it applies, its alpha-beta cost
// (collectives/cost_model.h) and the builder of its schedules (collectives/schedule.h). The cost
// model chooses the cheapest entry that applies; GW_ALGO (allreduce), GW_ALGO_BROADCAST,
// GW_ALGO_ALLGATHER and GW_ALGO_REDUCE_SCATTER force one by name. Pure functions of their
// arguments; thread-safe.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/cost_model.h"
#include "collectives/group.h"
#include "collectives/schedule.h"
#include "core/status.h"

namespace gw::coll {

struct AllreduceAlgorithm {
  Algo algo = Algo::kRing;
  std::string_view name;  // GW_ALGO's value
  // At most this many channels (the builder may be given fewer).
  int max_channels = 1;
  // OK when the algorithm can run on `group` for `bytes`; else kInvalidArg saying why.
  Status (*applies)(const Group& group, size_t bytes) = nullptr;
  // The model's time in seconds for `bytes` on `group`.
  double (*cost_seconds)(const Group& group, size_t bytes, const CostParams& params) = nullptr;
  // This rank's plans for an allreduce of `count` elements on `nchannels` channels (1 to
  // max_channels), the executor cutting ranges into chunks of `chunk_elems` elements; requires
  // applies() to be OK.
  std::vector<Plan> (*build)(const Group& group, size_t count, int nchannels,
                             size_t chunk_elems) = nullptr;
};

// Every entry, in order of preference when costs tie.
std::span<const AllreduceAlgorithm> allreduce_algorithms();
// nullptr when there is none (Algo::kAuto, or an unknown name).
const AllreduceAlgorithm* find_allreduce_algorithm(Algo algo);
const AllreduceAlgorithm* find_allreduce_algorithm(std::string_view name);

struct AllreduceChoice {
  const AllreduceAlgorithm* algorithm = nullptr;
  bool forced = false;
  // (name, modelled seconds) of every entry that applies, in table order.
  std::vector<std::pair<std::string_view, double>> costs;
};

// The cheapest entry that applies (ties go to the earlier entry), or `forced` when it is not
// Algo::kAuto; a forced entry that does not apply is kInvalidArg naming GW_ALGO and the reason.
// Requires group.size() > 1.
Result<AllreduceChoice> choose_allreduce(const Group& group, size_t bytes, const CostParams& params,
                                         Algo forced);

// "allreduce 64 MiB: ring, 2 channels (cost model: ring 40.1 ms, rhd 41.0 ms)"
std::string describe_choice(size_t bytes, const AllreduceChoice& choice, int nchannels);

// ---- broadcast, allgather, reduce-scatter ----------------------------------------------------

enum class Collective { kBroadcast, kAllgather, kReduceScatter };
// "broadcast", "allgather", "reduce_scatter".
std::string_view collective_name(Collective kind);
// The row that forces the collective's algorithm: "GW_ALGO_BROADCAST", ...
std::string_view collective_algo_row(Collective kind);

struct CollectiveAlgorithm {
  Algo algo = Algo::kRing;
  std::string_view name;  // the value of the collective's GW_ALGO_* row
  int max_channels = 1;
  // OK when the algorithm can run on `group`; else kInvalidArg saying why.
  Status (*applies)(const Group& group, size_t bytes) = nullptr;
  // The model's time in seconds; `bytes` is the whole buffer: broadcast's buffer, allgather's
  // output (size() blocks), reduce-scatter's input (size() blocks).
  double (*cost_seconds)(const Group& group, size_t bytes, const CostParams& params) = nullptr;
  // This rank's plans; `count` is the broadcast's elements or allgather's / reduce-scatter's
  // elements per rank, `root` the broadcast's root (ignored by the others), `nchannels` 1 to
  // max_channels. Requires applies() to be OK.
  std::vector<Plan> (*build)(const Group& group, size_t count, int root, int nchannels,
                             size_t chunk_elems) = nullptr;
};

// Every entry of the collective's table, in order of preference when costs tie (ring first).
std::span<const CollectiveAlgorithm> collective_algorithms(Collective kind);
// nullptr when there is none (Algo::kAuto, or an algorithm the collective does not have).
const CollectiveAlgorithm* find_collective_algorithm(Collective kind, Algo algo);
const CollectiveAlgorithm* find_collective_algorithm(Collective kind, std::string_view name);
// "auto" (or empty) or a name in the collective's table; anything else is kInvalidArg naming the
// row and the names it takes.
Result<Algo> parse_collective_algo(Collective kind, std::string_view name);

struct CollectiveChoice {
  const CollectiveAlgorithm* algorithm = nullptr;
  bool forced = false;
  std::vector<std::pair<std::string_view, double>> costs;  // every entry that applies
};

// As choose_allreduce, for the collective's table; a forced entry that does not apply is
// kInvalidArg naming the row and the reason. Requires group.size() > 1.
Result<CollectiveChoice> choose_collective(Collective kind, const Group& group, size_t bytes,
                                           const CostParams& params, Algo forced);

// "allgather 64 MiB: hier, 2 plans (cost model: ring 403.2 ms, hier 270.1 ms)"
std::string describe_choice(Collective kind, size_t bytes, const CollectiveChoice& choice,
                            int nplans);

}  // namespace gw::coll
