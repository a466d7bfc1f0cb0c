#include "collectives/algorithms.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include "collectives/executor.h"

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

Status two_ranks(const Group& g, size_t) {
  if (g.size() != 2)
    return invalid_arg("needs exactly 2 ranks (this communicator has {})", g.size());
  return ok_status();
}

Status several_hosts(const Group& g, size_t) {
  if (!g.multi_host()) {
    return invalid_arg("needs ranks on more than one host (all {} ranks are on one host)",
                       g.size());
  }
  return ok_status();
}

std::string layout(const Group& g) {
  std::string out;
  for (const auto& h : g.hosts()) out += fmt::format("{}{}", out.empty() ? "" : "+", h.size());
  return out;
}

Status uniform_hosts_of_several(const Group& g, size_t bytes) {
  GW_RETURN_IF_ERROR(several_hosts(g, bytes));
  if (!uniform_hosts(g.hosts())) {
    return invalid_arg("needs the same number of ranks on every host (ranks per host: {})",
                       layout(g));
  }
  if (g.local_size() < 2) {
    return invalid_arg("needs more than one rank per host (ranks per host: {})", layout(g));
  }
  return ok_status();
}

// ---- costs ------------------------------------------------------------------------------------
// p ranks on H hosts, at most L on one; n bytes. Within a host a_i, b_i; a host's link a_e, b_e,
// shared by all of its ranks; g per byte reduced (collectives.md, after Thakur, Rabenseifner and
// Gropp). A flat algorithm's step takes as long as its slowest link: on several hosts a = a_e,
// and a host's link carries every flow that crosses it.

CostParams flat(const CostParams& p, double a, double b) {
  CostParams f = p;
  f.alpha_us = a * 1e6;
  f.bw_gbps = 1.0 / (b * 1e9);
  f.intra_alpha_us = f.intra_bw_gbps = f.inter_alpha_us = f.inter_bw_gbps = 0;
  return f;
}

// The link of a flat algorithm whose heaviest step makes `flows` flows leave one host at once.
CostParams flat_link(const Group& g, const CostParams& p, int flows) {
  const LinkCost i = intra_link(p), e = inter_link(p, flows);
  if (!g.multi_host()) return flat(p, i.a, i.b);
  return flat(p, std::max(i.a, e.a), std::max(i.b, flows * e.b));
}

// Flows that leave one host at once in a ring over the ranks in `order` (the most of any host).
int ring_crossings(const Group& g, const std::vector<int>& order) {
  std::vector<int> per_host(static_cast<size_t>(g.nhosts()), 0);
  const auto& host = g.host_of_rank();
  for (size_t k = 0; k < order.size(); ++k) {
    const int a = order[k], b = order[(k + 1) % order.size()];
    if (host[a] != host[b]) ++per_host[host[a]];
  }
  return *std::max_element(per_host.begin(), per_host.end());
}

std::vector<int> rank_order(const Group& g) {
  std::vector<int> order(static_cast<size_t>(g.size()));
  for (int r = 0; r < g.size(); ++r) order[r] = r;
  return order;
}

std::vector<int> host_order(const Group& g) {
  std::vector<int> order;
  for (const auto& h : g.hosts()) order.insert(order.end(), h.begin(), h.end());
  return order;
}

// ring: 2(p-1) a + 2(p-1)/p n b + (p-1)/p n g, b over the host link's k crossing flows.
double ring_cost(const Group& g, size_t bytes, const CostParams& p) {
  return ring_allreduce_seconds(g.size(), bytes, flat_link(g, p, ring_crossings(g, rank_order(g))));
}

double host_ring_cost(const Group& g, size_t bytes, const CostParams& p) {
  return ring_allreduce_seconds(g.size(), bytes, flat_link(g, p, ring_crossings(g, host_order(g))));
}

// pair: a + n b + n g (one message each way, the whole vector reduced), b over the flows that
// leave one host at once.
double pair_cost(const Group& g, size_t bytes, const CostParams& p) {
  const CostParams f = flat_link(g, p, g.max_local_size());
  const double n = static_cast<double>(bytes);
  return f.alpha_us * 1e-6 + n / (f.bw_gbps * 1e9) + n * reduce_seconds_per_byte(p);
}

// rhd: 2 lg p' a + 2(p'-1)/p' n b (+ fold); its long-distance steps take every rank of a host
// across at once, so b is over L flows.
double rhd_cost(const Group& g, size_t bytes, const CostParams& p) {
  return rhd_allreduce_seconds(g.size(), bytes, flat_link(g, p, g.max_local_size()));
}

// Binary blocks, blocks 2^k0 > 2^k1 > ... (B of them): the largest block's halving-doubling,
// then each smaller block's exchange with the next larger, one after the other:
// (2 k0 + 2 (B-1)) a + (2(P0-1)/P0 + 2 sum_j 2^-kj) n b + ((P0-1)/P0 + sum_j 2^-kj) n g.
double bblocks_cost(const Group& g, size_t bytes, const CostParams& p) {
  const int nranks = g.size();
  if (nranks <= 1) return 0;
  const CostParams f = flat_link(g, p, g.max_local_size());
  const double a = f.alpha_us * 1e-6, b = 1.0 / (f.bw_gbps * 1e9), gm = reduce_seconds_per_byte(p);
  const double n = static_cast<double>(bytes);
  std::vector<int> lg;
  for (int bit = 30; bit >= 0; --bit) {
    if (nranks & (1 << bit)) lg.push_back(bit);
  }
  const double p0 = static_cast<double>(1 << lg[0]);
  double small = 0;
  for (size_t j = 1; j < lg.size(); ++j) small += 1.0 / static_cast<double>(1 << lg[j]);
  const double steps = 2.0 * lg[0] + 2.0 * static_cast<double>(lg.size() - 1);
  return steps * a + (2.0 * (p0 - 1) / p0 + 2.0 * small) * n * b + ((p0 - 1) / p0 + small) * n * gm;
}

// Double binary tree, depth D = floor(lg p), each tree over half the vector: per level up, a
// rank receives both children's halves (a + n b) and reduces them (n g); down, the same without
// the reduction: 2 D (a + n b) + D n g.
double tree_cost(const Group& g, size_t bytes, const CostParams& p) {
  if (g.size() <= 1) return 0;
  const CostParams f = flat_link(g, p, std::min(2, g.max_local_size()));
  const double a = f.alpha_us * 1e-6, b = 1.0 / (f.bw_gbps * 1e9), gm = reduce_seconds_per_byte(p);
  const double n = static_cast<double>(bytes);
  const double depth = std::floor(std::log2(static_cast<double>(g.size())));
  return 2.0 * depth * (a + n * b) + depth * n * gm;
}

// Segments of the pipelined hierarchical allreduce of `count` elements: the more, the shorter
// the time the pipeline takes to fill (the first segment's intra-host reduce-scatter) and drain
// (the last one's allgather), but every inter-host ring step keeps a whole chunk at least (a
// step ends when all its chunks have, so shorter steps leave the link idle between them). At
// most kHierMaxSegments.
constexpr size_t kHierMaxSegments = 64;
int hier_segments(size_t count, int nlocal, int nhosts, size_t chunk_elems) {
  const size_t per_segment =
      chunk_elems * static_cast<size_t>(nlocal) * static_cast<size_t>(nhosts);
  return static_cast<int>(std::clamp<size_t>(count / per_segment, 1, kHierMaxSegments));
}

size_t chunk_of(const CostParams& p) {
  return p.chunk_bytes != 0 ? p.chunk_bytes : ExecutorOptions{}.chunk_bytes;
}

// The segments the hierarchical builders cut `bytes` into, as they count them: in elements of
// the call's size, with the executor's chunk.
double segments_for(const Group& g, size_t bytes, const CostParams& p) {
  const size_t es = std::max<size_t>(1, p.elem_bytes);
  return hier_segments(bytes / es, g.max_local_size(), g.nhosts(),
                       std::max<size_t>(1, chunk_of(p) / es));
}

// Hierarchical (L ranks on each of H hosts): ring reduce-scatter and allgather within the host,
// a ring allreduce of each 1/L shard among the H ranks of one local index, all L at once over
// the host's link, pipelined over S segments. The intra-host phases cost
//   I = 2 S (L-1) a_i + 2(L-1)/L n b_i + (L-1)/L n g,
// the inter-host one E = 2 S (H-1) a_e + 2(H-1)/H n b_e + (H-1)/(H L) n g. The two overlap
// except while the first segment is reduce-scattered and the last allgathered (or, when the
// host is the slower part, while the last segment crosses the link): max(I, E) + min(I, E) / S.
// S as the builder picks it for the call's element size and chunk.
double hier_cost(const Group& g, size_t bytes, const CostParams& p) {
  const LinkCost i = intra_link(p), e = inter_link(p, g.max_local_size());  // all L rings cross
  const double gm = reduce_seconds_per_byte(p), n = static_cast<double>(bytes);
  const double L = g.max_local_size(), H = g.nhosts();
  const double S = segments_for(g, bytes, p);
  const double intra = 2 * S * (L - 1) * i.a + 2 * (L - 1) / L * n * i.b + (L - 1) / L * n * gm;
  const double inter =
      2 * S * (H - 1) * e.a + 2 * (H - 1) / H * n * e.b + (H - 1) / (H * L) * n * gm;
  return std::max(intra, inter) + std::min(intra, inter) / S;
}

// Leader form (any layout, L the largest host): reduce-scatter within the host and gather to the
// leader ((L-1) a_i + (L-1)/L n b_i, then a_i + (L-1)/L n b_i), a ring allreduce of the whole
// vector among the H leaders (2(H-1) a_e + 2(H-1)/H n b_e), a pipelined chain back through the
// host ((L-1) a_i + n b_i); reductions ((L-1)/L + (H-1)/H) n g.
double hier_leader_cost(const Group& g, size_t bytes, const CostParams& p) {
  const LinkCost i = intra_link(p), e = inter_link(p, 1);  // only the leader crosses
  const double gm = reduce_seconds_per_byte(p), n = static_cast<double>(bytes);
  const double L = g.max_local_size(), H = g.nhosts();
  double t = 2 * (H - 1) * e.a + 2 * (H - 1) / H * n * e.b + ((L - 1) / L + (H - 1) / H) * n * gm;
  if (L > 1) t += (2 * L - 1) * i.a + 2 * (L - 1) / L * n * i.b + n * i.b;
  return t;
}

// ---- builders ---------------------------------------------------------------------------------

std::vector<Plan> ring_build(const Group& g, size_t count, int nch, size_t) {
  return per_channel(count, nch, [&](size_t n) { return ring_allreduce(g.rank(), g.size(), n); });
}
std::vector<Plan> rhd_build(const Group& g, size_t count, int nch, size_t) {
  return per_channel(count, nch, [&](size_t n) { return rhd_allreduce(g.rank(), g.size(), n); });
}
std::vector<Plan> host_ring_build(const Group& g, size_t count, int nch, size_t) {
  return per_channel(count, nch,
                     [&](size_t n) { return host_ring_allreduce(g.hosts(), g.rank(), n); });
}
// One pipeline (hier_pipelined_allreduce): its segments are what runs side by side, so more
// channels would only cut the segments smaller.
std::vector<Plan> hier_build(const Group& g, size_t count, int, size_t chunk_elems) {
  return hier_pipelined_allreduce(g.hosts(), g.rank(), count,
                                  hier_segments(count, g.local_size(), g.nhosts(), chunk_elems));
}
std::vector<Plan> hier_leader_build(const Group& g, size_t count, int nch, size_t) {
  return per_channel(count, nch,
                     [&](size_t n) { return hier_leader_allreduce(g.hosts(), g.rank(), n); });
}
std::vector<Plan> pair_build(const Group& g, size_t count, int nch, size_t) {
  return per_channel(count, nch, [&](size_t n) { return pair_allreduce(g.rank(), g.size(), n); });
}
std::vector<Plan> bblocks_build(const Group& g, size_t count, int nch, size_t) {
  return per_channel(count, nch,
                     [&](size_t n) { return binary_blocks_allreduce(g.rank(), g.size(), n); });
}
// Always two channels: tree 0 reduces the first half of the vector, tree 1 the second.
std::vector<Plan> tree_build(const Group& g, size_t count, int, size_t) {
  std::vector<Plan> plans(2);
  for (int t = 0; t < 2; ++t) {
    plans[t].chan = t;
    plans[t].sched = tree_allreduce(g.rank(), g.size(), t, block_range(count, 2, t));
  }
  return plans;
}

constexpr int kAnyChannels = 1 << 10;

// Ties go to the earlier entry: the flat ring first (neighbour traffic only), then the others
// from the simplest.
const std::array<AllreduceAlgorithm, 8> kTable = {{
    {Algo::kRing, "ring", kAnyChannels, &always, &ring_cost, &ring_build},
    // Two channels at most for the logarithmic ones: their steps are whole halves of the vector,
    // so more channels only add messages.
    {Algo::kRhd, "rhd", 2, &always, &rhd_cost, &rhd_build},
    {Algo::kHostRing, "host_ring", kAnyChannels, &several_hosts, &host_ring_cost, &host_ring_build},
    // One pipeline of three channels (hier_build).
    {Algo::kHier, "hier", 1, &uniform_hosts_of_several, &hier_cost, &hier_build},
    {Algo::kHierLeader, "hier_leader", 2, &several_hosts, &hier_leader_cost, &hier_leader_build},
    {Algo::kTree, "tree", 2, &always, &tree_cost, &tree_build},
    {Algo::kBblocks, "bblocks", 2, &always, &bblocks_cost, &bblocks_build},
    {Algo::kPair, "pair", 2, &two_ranks, &pair_cost, &pair_build},
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
    // Latency-bound sizes differ by microseconds.
    costs += s >= 1e-3 ? fmt::format("{}{} {:.1f} ms", costs.empty() ? "" : ", ", name, s * 1e3)
                       : fmt::format("{}{} {:.1f} us", costs.empty() ? "" : ", ", name, s * 1e6);
  }
  return fmt::format("allreduce {}: {}, {} channel{} ({}: {})", format_bytes(bytes),
                     c.algorithm->name, nchannels, nchannels == 1 ? "" : "s",
                     c.forced ? "forced by GW_ALGO; cost model" : "cost model", costs);
}

// ---- broadcast, allgather, reduce-scatter ----------------------------------------------------

namespace {

// Bytes of one pipeline chunk, for the chain's fill time.
double chunk_bytes_of(size_t bytes, const CostParams& p) {
  return static_cast<double>(std::min(bytes, chunk_of(p)));
}

// Chain broadcast over p ranks along `order` from any root: the data down the chain (n b), the
// first chunk's fill through p-2 forwarding ranks ((p-2) c b), p-1 message latencies, and the
// closing token once round (p-1 more): 2(p-1) a + n b + (p-2) c b, b over the flows that leave
// one host at once (the chain is the ring over `order` less one edge, so the ring's count bounds
// it whatever the root).
double chain_cost(const Group& g, size_t bytes, const CostParams& p,
                  const std::vector<int>& order) {
  const CostParams f = flat_link(g, p, ring_crossings(g, order));
  const double a = f.alpha_us * 1e-6, b = 1.0 / (f.bw_gbps * 1e9);
  const double n = static_cast<double>(bytes), np = g.size();
  return 2 * (np - 1) * a + n * b + std::max(0.0, np - 2) * chunk_bytes_of(bytes, p) * b;
}

double bcast_ring_cost(const Group& g, size_t bytes, const CostParams& p) {
  return chain_cost(g, bytes, p, rank_order(g));
}
double bcast_hier_cost(const Group& g, size_t bytes, const CostParams& p) {
  return chain_cost(g, bytes, p, host_order(g));
}

// Flat ring allgather / reduce-scatter of n bytes in all: (p-1) a + (p-1)/p n b (+ (p-1)/p n g
// for the reduction), b over the host link's crossing flows.
double flat_ring_half(const Group& g, size_t bytes, const CostParams& p, bool reduces) {
  const CostParams f = flat_link(g, p, ring_crossings(g, rank_order(g)));
  const double a = f.alpha_us * 1e-6, b = 1.0 / (f.bw_gbps * 1e9);
  const double n = static_cast<double>(bytes), np = g.size();
  double t = (np - 1) * a + (np - 1) / np * n * b;
  if (reduces) t += (np - 1) / np * n * reduce_seconds_per_byte(p);
  return t;
}
double allgather_ring_cost(const Group& g, size_t bytes, const CostParams& p) {
  return flat_ring_half(g, bytes, p, false);
}
double reduce_scatter_ring_cost(const Group& g, size_t bytes, const CostParams& p) {
  return flat_ring_half(g, bytes, p, true);
}

// Hierarchical allgather / reduce-scatter (L ranks on each of H hosts, n bytes in all, S
// segments): within the host I = S H (L-1) a_i + (L-1)/L n b_i (+ (L-1)/L n g), across hosts
// E = S (H-1) a_e + (H-1)/H n b_e (+ (H-1)/p n g), the link shared by the L rings of a host;
// the two overlap except for one segment: max(I, E) + min(I, E) / S.
double hier_half(const Group& g, size_t bytes, const CostParams& p, bool reduces) {
  const LinkCost i = intra_link(p), e = inter_link(p, g.max_local_size());
  const double gm = reduces ? reduce_seconds_per_byte(p) : 0, n = static_cast<double>(bytes);
  const double L = g.max_local_size(), H = g.nhosts();
  const double S = segments_for(g, bytes, p);
  const double intra = S * H * (L - 1) * i.a + (L - 1) / L * n * (i.b + gm);
  const double inter = S * (H - 1) * e.a + (H - 1) / H * n * e.b + (H - 1) / (H * L) * n * gm;
  return std::max(intra, inter) + std::min(intra, inter) / S;
}
double allgather_hier_cost(const Group& g, size_t bytes, const CostParams& p) {
  return hier_half(g, bytes, p, false);
}
double reduce_scatter_hier_cost(const Group& g, size_t bytes, const CostParams& p) {
  return hier_half(g, bytes, p, true);
}

std::vector<Plan> bcast_ring_build(const Group& g, size_t count, int root, int nch, size_t) {
  return per_channel(count, nch,
                     [&](size_t n) { return chain_broadcast(g.rank(), g.size(), root, n); });
}
std::vector<Plan> bcast_hier_build(const Group& g, size_t count, int root, int nch, size_t) {
  return per_channel(count, nch,
                     [&](size_t n) { return host_chain_broadcast(g.hosts(), g.rank(), root, n); });
}
std::vector<Plan> allgather_ring_build(const Group& g, size_t count, int, int, size_t) {
  std::vector<Plan> plans(1);
  plans[0].sched = ring_allgather(g.rank(), g.size(), count);
  return plans;
}
// Segments as hier allreduce's: every inter-host ring step keeps a whole chunk at least.
std::vector<Plan> allgather_hier_build(const Group& g, size_t count, int, int, size_t chunk) {
  const size_t total = count * static_cast<size_t>(g.size());
  return hier_allgather(g.hosts(), g.rank(), count,
                        hier_segments(total, g.local_size(), g.nhosts(), chunk));
}
std::vector<Plan> reduce_scatter_ring_build(const Group& g, size_t count, int, int, size_t) {
  std::vector<Plan> plans(1);
  plans[0].sched = ring_reduce_scatter(g.rank(), g.size(), count * static_cast<size_t>(g.size()));
  return plans;
}
std::vector<Plan> reduce_scatter_hier_build(const Group& g, size_t count, int, int, size_t chunk) {
  const size_t total = count * static_cast<size_t>(g.size());
  return hier_reduce_scatter(g.hosts(), g.rank(), count,
                             hier_segments(total, g.local_size(), g.nhosts(), chunk));
}

// The flat ring first (ties go to it), then the host-aware form. hier's two plans are lanes of
// one pipeline (channels 0 and 1), so it takes no more channels.
const std::array<CollectiveAlgorithm, 2> kBroadcastTable = {{
    {Algo::kRing, "ring", kAnyChannels, &always, &bcast_ring_cost, &bcast_ring_build},
    {Algo::kHier, "hier", kAnyChannels, &uniform_hosts_of_several, &bcast_hier_cost,
     &bcast_hier_build},
}};
const std::array<CollectiveAlgorithm, 2> kAllgatherTable = {{
    {Algo::kRing, "ring", 1, &always, &allgather_ring_cost, &allgather_ring_build},
    {Algo::kHier, "hier", 1, &uniform_hosts_of_several, &allgather_hier_cost,
     &allgather_hier_build},
}};
const std::array<CollectiveAlgorithm, 2> kReduceScatterTable = {{
    {Algo::kRing, "ring", 1, &always, &reduce_scatter_ring_cost, &reduce_scatter_ring_build},
    {Algo::kHier, "hier", 1, &uniform_hosts_of_several, &reduce_scatter_hier_cost,
     &reduce_scatter_hier_build},
}};

}  // namespace

std::string_view collective_name(Collective kind) {
  switch (kind) {
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kAllgather:
      return "allgather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
  }
  return "?";
}

std::string_view collective_algo_row(Collective kind) {
  switch (kind) {
    case Collective::kBroadcast:
      return "GW_ALGO_BROADCAST";
    case Collective::kAllgather:
      return "GW_ALGO_ALLGATHER";
    case Collective::kReduceScatter:
      return "GW_ALGO_REDUCE_SCATTER";
  }
  return "?";
}

std::span<const CollectiveAlgorithm> collective_algorithms(Collective kind) {
  switch (kind) {
    case Collective::kBroadcast:
      return kBroadcastTable;
    case Collective::kAllgather:
      return kAllgatherTable;
    case Collective::kReduceScatter:
      return kReduceScatterTable;
  }
  return {};
}

const CollectiveAlgorithm* find_collective_algorithm(Collective kind, Algo algo) {
  for (const auto& a : collective_algorithms(kind)) {
    if (a.algo == algo) return &a;
  }
  return nullptr;
}

const CollectiveAlgorithm* find_collective_algorithm(Collective kind, std::string_view name) {
  for (const auto& a : collective_algorithms(kind)) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

Result<Algo> parse_collective_algo(Collective kind, std::string_view name) {
  if (name == "auto" || name.empty()) return Algo::kAuto;
  if (const CollectiveAlgorithm* a = find_collective_algorithm(kind, name)) return a->algo;
  std::string names = "auto";
  for (const auto& a : collective_algorithms(kind)) names += fmt::format(", {}", a.name);
  return invalid_arg("{}={}: expected one of {}", collective_algo_row(kind), name, names);
}

Result<CollectiveChoice> choose_collective(Collective kind, const Group& group, size_t bytes,
                                           const CostParams& params, Algo forced) {
  CollectiveChoice c;
  c.forced = forced != Algo::kAuto;
  double best = 0;
  for (const auto& a : collective_algorithms(kind)) {
    if (!a.applies(group, bytes).ok()) continue;
    const double s = a.cost_seconds(group, bytes, params);
    c.costs.emplace_back(a.name, s);
    if (!c.forced && (c.algorithm == nullptr || s < best)) {
      c.algorithm = &a;
      best = s;
    }
  }
  if (c.forced) {
    const CollectiveAlgorithm* a = find_collective_algorithm(kind, forced);
    if (a == nullptr) {
      return invalid_arg("{}: {} has no algorithm {}", collective_algo_row(kind),
                         collective_name(kind), algo_name(forced));
    }
    Status why = a->applies(group, bytes);
    if (!why.ok()) {
      return invalid_arg("{}={} does not apply to this communicator: {}", collective_algo_row(kind),
                         a->name, why.message());
    }
    c.algorithm = a;
  }
  if (c.algorithm == nullptr) {
    return internal_error("{}: no algorithm applies", collective_name(kind));
  }
  return c;
}

std::string describe_choice(Collective kind, size_t bytes, const CollectiveChoice& c, int nplans) {
  std::string costs;
  for (const auto& [name, s] : c.costs) {
    costs += s >= 1e-3 ? fmt::format("{}{} {:.1f} ms", costs.empty() ? "" : ", ", name, s * 1e3)
                       : fmt::format("{}{} {:.1f} us", costs.empty() ? "" : ", ", name, s * 1e6);
  }
  return fmt::format("{} {}: {}, {} plan{} ({}: {})", collective_name(kind), format_bytes(bytes),
                     c.algorithm->name, nplans, nplans == 1 ? "" : "s",
                     c.forced ? fmt::format("forced by {}; cost model", collective_algo_row(kind))
                              : std::string("cost model"),
                     costs);
}

}  // namespace gw::coll
