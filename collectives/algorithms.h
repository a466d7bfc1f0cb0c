// The allreduce algorithm table: every algorithm the Communicator can run, with when it applies,
// its alpha-beta cost (collectives/cost_model.h) and the builder of its schedules
// (collectives/schedule.h). The cost model chooses the cheapest entry that applies; GW_ALGO
// forces one by name. Pure functions of their arguments; thread-safe.
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

}  // namespace gw::coll
