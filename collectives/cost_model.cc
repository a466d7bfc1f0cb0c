#include "collectives/cost_model.h"

#include <fmt/format.h>

#include <bit>
#include <cmath>

#include "collectives/coll_config.h"
#include "core/config.h"

namespace gw::coll {

CostParams cost_params_for(std::string_view transport_name, double latency_us,
                           double bandwidth_gbps) {
  CostParams p;
  if (transport_name == "shm") {
    p.alpha_us = 2.0;
    p.bw_gbps = 4.0;
  } else {  // tcp and unknown: kernel TCP on loopback or a 10G-class NIC
    p.alpha_us = 20.0;
    p.bw_gbps = 1.2;
  }
  if (latency_us > 0) p.alpha_us = latency_us;
  if (bandwidth_gbps > 0) p.bw_gbps = bandwidth_gbps;
  const double alpha = config::get_double(coll::coll_config::kCostAlphaUs);
  const double bw = config::get_double(coll::coll_config::kCostBwGbps);
  if (alpha > 0) p.alpha_us = alpha;
  if (bw > 0) p.bw_gbps = bw;
  return p;
}

CostParams cost_params_for_levels(const LinkFigures& main, const LinkFigures& intra,
                                  const LinkFigures& inter) {
  CostParams p = cost_params_for(main.transport, main.latency_us, main.bandwidth_gbps);
  const CostParams i = cost_params_for(intra.transport, intra.latency_us, intra.bandwidth_gbps);
  const CostParams e = cost_params_for(inter.transport, inter.latency_us, inter.bandwidth_gbps);
  auto pick = [](double level, double fallback) { return level > 0 ? level : fallback; };
  p.intra_alpha_us = pick(config::get_double(coll::coll_config::kCostIntraAlphaUs), i.alpha_us);
  p.intra_bw_gbps = pick(config::get_double(coll::coll_config::kCostIntraBwGbps), i.bw_gbps);
  p.inter_alpha_us = pick(config::get_double(coll::coll_config::kCostInterAlphaUs), e.alpha_us);
  p.inter_bw_gbps = pick(config::get_double(coll::coll_config::kCostInterBwGbps), e.bw_gbps);
  return p;
}

LinkCost intra_link(const CostParams& p) {
  const double a = p.intra_alpha_us > 0 ? p.intra_alpha_us : p.alpha_us;
  const double bw = p.intra_bw_gbps > 0 ? p.intra_bw_gbps : p.bw_gbps;
  return LinkCost{a * 1e-6, 1.0 / (bw * 1e9)};
}

LinkCost inter_link(const CostParams& p) {
  const double a = p.inter_alpha_us > 0 ? p.inter_alpha_us : p.alpha_us;
  const double bw = p.inter_bw_gbps > 0 ? p.inter_bw_gbps : p.bw_gbps;
  return LinkCost{a * 1e-6, 1.0 / (bw * 1e9)};
}

double crossing_contention(const CostParams& p, double flows_per_host) {
  if (p.cpus <= 0) return 1.0;
  const double flows = flows_per_host * std::max(1, p.kernel_hosts);
  return std::max(1.0, flows / static_cast<double>(p.cpus));
}

LinkCost inter_link(const CostParams& p, double flows_per_host) {
  LinkCost e = inter_link(p);
  e.a *= crossing_contention(p, flows_per_host);
  return e;
}

double reduce_seconds_per_byte(const CostParams& p) { return 1.0 / (p.reduce_gbps * 1e9); }

namespace {
struct Terms {
  double a, b, g;  // seconds per message, per byte on a link, per byte reduced
};
Terms terms(const CostParams& params) {
  return Terms{params.alpha_us * 1e-6, 1.0 / (params.bw_gbps * 1e9),
               1.0 / (params.reduce_gbps * 1e9)};
}
}  // namespace

double ring_allreduce_seconds(int p, size_t bytes, const CostParams& params) {
  if (p <= 1) return 0;
  const Terms t = terms(params);
  const double n = static_cast<double>(bytes);
  const double frac = static_cast<double>(p - 1) / p;
  return 2.0 * (p - 1) * t.a + 2.0 * frac * n * t.b + frac * n * t.g;
}

double rhd_allreduce_seconds(int p, size_t bytes, const CostParams& params) {
  if (p <= 1) return 0;
  const Terms t = terms(params);
  const double n = static_cast<double>(bytes);
  int pof2 = 1, lg = 0;
  while (pof2 * 2 <= p) {
    pof2 *= 2;
    ++lg;
  }
  const double frac = static_cast<double>(pof2 - 1) / pof2;
  double time = 2.0 * lg * t.a + 2.0 * frac * n * t.b + frac * n * t.g;
  if (pof2 != p) time += 2.0 * t.a + 2.0 * n * t.b + n * t.g;
  return time;
}

AlgoChoice choose_allreduce(int nranks, size_t bytes, const CostParams& params, Algo forced) {
  AlgoChoice c;
  c.ring_s = ring_allreduce_seconds(nranks, bytes, params);
  c.rhd_s = rhd_allreduce_seconds(nranks, bytes, params);
  if (forced != Algo::kAuto) {
    c.algo = forced;
    c.forced = true;
  } else {
    c.algo = c.rhd_s < c.ring_s ? Algo::kRhd : Algo::kRing;
  }
  return c;
}

namespace {
constexpr Algo kEveryAlgo[] = {Algo::kRing,       Algo::kRhd,  Algo::kHostRing, Algo::kHier,
                               Algo::kHierLeader, Algo::kTree, Algo::kBblocks,  Algo::kPair};
}  // namespace

Result<Algo> parse_algo(std::string_view name) {
  if (name == "auto" || name.empty()) return Algo::kAuto;
  std::string names = "auto";
  for (Algo a : kEveryAlgo) {
    if (name == algo_name(a)) return a;
    names += fmt::format(", {}", algo_name(a));
  }
  return invalid_arg("GW_ALGO={}: expected one of {}", name, names);
}

std::string_view algo_name(Algo algo) {
  switch (algo) {
    case Algo::kAuto:
      return "auto";
    case Algo::kRing:
      return "ring";
    case Algo::kRhd:
      return "rhd";
    case Algo::kHostRing:
      return "host_ring";
    case Algo::kHier:
      return "hier";
    case Algo::kHierLeader:
      return "hier_leader";
    case Algo::kTree:
      return "tree";
    case Algo::kBblocks:
      return "bblocks";
    case Algo::kPair:
      return "pair";
  }
  return "?";
}

std::string format_bytes(size_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  if (v == std::floor(v)) return fmt::format("{:.0f} {}", v, kUnits[u]);
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

std::string describe_choice(size_t bytes, const AlgoChoice& c, int nchannels) {
  return fmt::format("allreduce {}: {}, {} channel{} ({}: ring {:.1f} ms, rhd {:.1f} ms)",
                     format_bytes(bytes), algo_name(c.algo), nchannels, nchannels == 1 ? "" : "s",
                     c.forced ? "forced by GW_ALGO; cost model" : "cost model", c.ring_s * 1e3,
                     c.rhd_s * 1e3);
}

int size_class(size_t bytes) { return bytes == 0 ? -1 : static_cast<int>(std::bit_width(bytes)); }

}  // namespace gw::coll
