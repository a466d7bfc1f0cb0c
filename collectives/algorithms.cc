#include "collectives/algorithms.h"

#include <fmt/format.h>

#include <array>

namespace gw::coll {
namespace {

// Slices [0, count) into nchannels blocks and runs `make` on each slice on its own channel.
template <typename Make>
std::vector<Plan> per_channel(size_t count, int nchannels, Make&& make) {
  std::vector<Plan> plans(static_cast<size_t>(nchannels));
  for (int c = 0; c < nchannels; ++c) {
    const Range slice = block_range(count, nchannels, c);
    plans[c].chan = c;
    plans[c].base = slice.offset;
    plans[c].sched = make(slice.count);
  }
  return plans;
}

Status always(const Group&, size_t) { return ok_status(); }

// ---- ring ----
double ring_cost(const Group& g, size_t bytes, const CostParams& p) {
  return ring_allreduce_seconds(g.size(), bytes, p);
}
std::vector<Plan> ring_build(const Group& g, size_t count, int nch) {
  return per_channel(count, nch, [&](size_t n) { return ring_allreduce(g.rank(), g.size(), n); });
}

// ---- recursive halving-doubling ----
double rhd_cost(const Group& g, size_t bytes, const CostParams& p) {
  return rhd_allreduce_seconds(g.size(), bytes, p);
}
std::vector<Plan> rhd_build(const Group& g, size_t count, int nch) {
  return per_channel(count, nch, [&](size_t n) { return rhd_allreduce(g.rank(), g.size(), n); });
}

constexpr int kAnyChannels = 1 << 10;

const std::array<AllreduceAlgorithm, 2> kTable = {{
    {Algo::kRing, "ring", kAnyChannels, &always, &ring_cost, &ring_build},
    // Two channels at most: its steps are whole halves of the vector, so more channels only
    // add messages.
    {Algo::kRhd, "rhd", 2, &always, &rhd_cost, &rhd_build},
}};

}  // namespace

std::span<const AllreduceAlgorithm> allreduce_algorithms() { return kTable; }

const AllreduceAlgorithm* find_allreduce_algorithm(Algo algo) {
  for (const auto& a : kTable) {
    if (a.algo == algo) return &a;
  }
  return nullptr;
}

const AllreduceAlgorithm* find_allreduce_algorithm(std::string_view name) {
  for (const auto& a : kTable) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

Result<AllreduceChoice> choose_allreduce(const Group& group, size_t bytes, const CostParams& params,
                                         Algo forced) {
  AllreduceChoice c;
  c.forced = forced != Algo::kAuto;
  double best = 0;
  for (const auto& a : kTable) {
    if (!a.applies(group, bytes).ok()) continue;
    const double s = a.cost_seconds(group, bytes, params);
    c.costs.emplace_back(a.name, s);
    if (!c.forced && (c.algorithm == nullptr || s < best)) {
      c.algorithm = &a;
      best = s;
    }
  }
  if (c.forced) {
    const AllreduceAlgorithm* a = find_allreduce_algorithm(forced);
    if (a == nullptr)
      return invalid_arg("GW_ALGO: no algorithm numbered {}", static_cast<int>(forced));
    Status why = a->applies(group, bytes);
    if (!why.ok()) {
      return invalid_arg("GW_ALGO={} does not apply to this communicator: {}", a->name,
                         why.message());
    }
    c.algorithm = a;
  }
  if (c.algorithm == nullptr) return internal_error("allreduce: no algorithm applies");
  return c;
}

std::string describe_choice(size_t bytes, const AllreduceChoice& c, int nchannels) {
  std::string costs;
  for (const auto& [name, s] : c.costs) {
    costs += fmt::format("{}{} {:.1f} ms", costs.empty() ? "" : ", ", name, s * 1e3);
  }
  return fmt::format("allreduce {}: {}, {} channel{} ({}: {})", format_bytes(bytes),
                     c.algorithm->name, nchannels, nchannels == 1 ? "" : "s",
                     c.forced ? "forced by GW_ALGO; cost model" : "cost model", costs);
}

}  // namespace gw::coll
