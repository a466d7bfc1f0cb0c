// The byte-level schedule simulator (MSCCL's idea: algorithms as data, checked without a
// network) and its helpers: host layouts and their numberings, dtype encoding, and the check
// that plans running together never race.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/cost_model.h"
#include "collectives/schedule.h"
#include "collectives/types.h"
#include "tests/support/dtype_values.h"  // encode, decode

namespace gw::testing {

inline constexpr coll::DataType kAllTypes[] = {
    coll::DataType::kF32, coll::DataType::kF64, coll::DataType::kF16, coll::DataType::kBF16,
    coll::DataType::kI32, coll::DataType::kI64, coll::DataType::kU8};

// One rank of a simulation: its plans (several run together) and its buffers as bytes.
struct SimRank {
  std::vector<coll::Plan> plans;
  std::vector<uint8_t> input, output;
  // Set by simulate(): each plan's next step, and whether that step's send is posted.
  std::vector<size_t> next;
  std::vector<bool> sent;
};

// Runs every rank's plans to the end, in memory: each plan's steps in order (a step that waits
// for another plan starts once that plan is far enough), messages through FIFO queues per
// (sender, receiver, channel) carrying the step id, receivers checking the id and the byte count
// as the executor does, the plans of a rank visited in an order shuffled by seed every round.
// Fails the test on a mismatch, two plans of a rank on one channel to one peer, a deadlock or a
// message left unreceived.
void simulate(std::vector<SimRank>& ranks, coll::DataType dtype, coll::ReduceOp op, uint32_t seed);

// A schedule as the only plan of a rank.
std::vector<coll::Plan> one_plan(coll::Schedule s);

// ---- host layouts -----------------------------------------------------------------------------

// Host sizes joined by '+' ("2+2").
std::string layout_name(const coll::HostRanks& hosts);
// Host-major (ranks 0..L-1 on host 0, ...) and interleaved (rank r on the next host that has
// room) numberings of a layout given by its host sizes.
std::vector<coll::HostRanks> numberings(const std::vector<int>& sizes);
// Every uniform layout of up to kSimMaxRanks ranks (tests/support/test_env.h).
std::vector<std::vector<int>> uniform_layouts();
// `fixed`, then `random` layouts drawn with seed: min_hosts..6 hosts of 1..8 ranks, at most 33.
std::vector<std::vector<int>> uneven_layouts(std::vector<std::vector<int>> fixed, uint32_t seed,
                                             int random, int min_hosts);
int nranks_of(const coll::HostRanks& hosts);
// host_of for nhosts hosts of per_host ranks each, host-major.
std::vector<int> hosts_of(int nhosts, int per_host);
// Shared memory within a host, a 1 Gbit/s link between hosts.
coll::CostParams two_level();

// ---- plans that run together ------------------------------------------------------------------

// Finished-step counts of every plan of one rank that the dependencies (each plan's own order,
// Step::after_plan) guarantee before each step starts: start[l][i][m] steps of plan m.
std::vector<std::vector<std::vector<size_t>>> guaranteed_before(
    const std::vector<coll::Plan>& plans);
// Two steps of different plans of one rank that may run at the same time (neither is ordered
// before the other) must not touch a range the other writes. Input and output are taken as one
// buffer (in place), the stricter case.
void expect_no_races(const std::vector<coll::Plan>& plans, const std::string& what);

}  // namespace gw::testing
