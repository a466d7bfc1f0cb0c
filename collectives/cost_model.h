// Alpha-beta-gamma cost model (Thakur, Rabenseifner, Gropp 2005) that picks the allreduce
// algorithm. Pure functions; thread-safe.
//
//   ring: 2(p-1) a + 2(p-1)/p n b + (p-1)/p n g
//   rhd:  2 lg p' a + 2(p'-1)/p' n b + (p'-1)/p' n g      on p' = 2^floor(lg p) ranks, plus, when
//         p != p', the fold: 2 a + 2 n b + n g (the whole vector to the partner and back)
// a = per-message latency, b = seconds per byte on a link, g = seconds per byte of reduction.
//
// Two levels: links within a host (intra: a_i, b_i) and a host's link to the others (inter: a_e,
// b_e, shared by every rank of the host). The per-algorithm formulas over both levels are in
// collectives/algorithms.cc, next to the schedules they model.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "collectives/communicator.h"
#include "core/status.h"

namespace gw::coll {

struct CostParams {
  double alpha_us = 20.0;    // per-message latency (the flat model: the link most traffic uses)
  double bw_gbps = 1.0;      // GB/s per link
  double reduce_gbps = 8.0;  // GB/s of the reduction kernel
  // The two levels; 0 = the flat figures above.
  double intra_alpha_us = 0;
  double intra_bw_gbps = 0;
  double inter_alpha_us = 0;
  double inter_bw_gbps = 0;
  // The call's element size and the executor's chunk (0 = its default), for the pipelined forms'
  // segment counts: set per call, not agreed between ranks (every rank's are the same).
  size_t elem_bytes = 4;
  size_t chunk_bytes = 0;
  // CPU contention of inter-host messages: `cpus` each host gives its ranks (0: not considered),
  // and the most hosts of the job that share one kernel, hence its CPUs (namespace or container
  // "hosts" on one machine: same hostname and boot id). Agreed from rank 0 like the figures.
  int cpus = 0;
  int kernel_hosts = 1;
};

// Fills from a transport's typical figures (0 = unknown: keep the defaults for that transport
// name), then GW_COST_ALPHA_US / GW_COST_BW_GBPS when set (non-zero).
CostParams cost_params_for(std::string_view transport_name, double latency_us,
                           double bandwidth_gbps);

// A transport's figures as its properties give them (0 = unknown).
struct LinkFigures {
  std::string_view transport;
  double latency_us = 0;
  double bandwidth_gbps = 0;
};
// The flat figures from `main` (as cost_params_for), each level from its transport's figures,
// then GW_COST_ALPHA_US / GW_COST_BW_GBPS, then GW_COST_INTRA_* / GW_COST_INTER_* (non-zero).
CostParams cost_params_for_levels(const LinkFigures& main, const LinkFigures& intra,
                                  const LinkFigures& inter);

// One level's terms: seconds per message and per byte.
struct LinkCost {
  double a = 0;
  double b = 0;
};
LinkCost intra_link(const CostParams& params);
LinkCost inter_link(const CostParams& params);
// The inter-host link for an algorithm step in which `flows_per_host` flows leave every host at
// once: a_e times crossing_contention. A message's latency across hosts is mostly CPU work (the
// socket calls, the network stack); when more flows cross at once than the CPUs of the kernel
// they share, that work queues for the CPUs.
LinkCost inter_link(const CostParams& params, double flows_per_host);
// max(1, flows_per_host x kernel_hosts / cpus); 1 when cpus is 0.
double crossing_contention(const CostParams& params, double flows_per_host);
// Seconds per byte of reduction.
double reduce_seconds_per_byte(const CostParams& params);

double ring_allreduce_seconds(int nranks, size_t bytes, const CostParams& params);
double rhd_allreduce_seconds(int nranks, size_t bytes, const CostParams& params);

struct AlgoChoice {
  Algo algo = Algo::kRing;
  bool forced = false;
  double ring_s = 0;
  double rhd_s = 0;
};

// `forced` is Algo::kAuto to let the model decide (ties go to ring: neighbour traffic only).
AlgoChoice choose_allreduce(int nranks, size_t bytes, const CostParams& params, Algo forced);

// "auto" or an algorithm's name (algo_name) -> Algo; anything else is kInvalidArg naming GW_ALGO.
Result<Algo> parse_algo(std::string_view name);
std::string_view algo_name(Algo algo);

// "64 MiB", "1.5 KiB", "12 B".
std::string format_bytes(size_t bytes);
// "allreduce 64 MiB: ring, 2 channels (cost model: ring 40.1 ms, rhd 41.0 ms)"
std::string describe_choice(size_t bytes, const AlgoChoice& choice, int nchannels);
// Power-of-two bucket of a byte count, the unit the choice is logged once per.
int size_class(size_t bytes);

}  // namespace gw::coll
