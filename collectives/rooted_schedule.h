// Schedules (collectives/schedule.h's data model) of the rooted collectives and of all-to-all-v.
// Pure functions of (rank, nranks, root, counts), tested without a network.
//
// Every call here ends in a way that makes a rank whose arguments disagree fail every rank of the
// call (communicator.h's promise), not only the one that sees a wrong size:
// - reduce: the data flows towards the root, then an empty token flows back out from the root
//   along the same links (its *_token schedule, run after the data). A rank that fails stops and
//   closes its connections, so every rank still waiting for the token fails too.
// - gather: the blocks flow to the root, then the root sends each rank an empty token.
// - scatter: the blocks flow from the root, each rank acknowledges with an empty message, then
//   the root sends each rank an empty token (a rank that disagrees fails on the data, the root on
//   its missing acknowledgement, the others on the token).
// - alltoallv: the pairwise exchange, then an empty message each way between every pair.
// The tokens are one message latency each way (in parallel over the peers); they carry no bytes.
//
// Algorithms:
// - reduce, pipelined chain (chain_reduce): root+p-1 -> root+p-2 -> ... -> root+1 -> root, each
//   rank reducing chunk c into its own and passing it on as soon as it arrived: about
//   (p-1) a + n (b + g) + (p-2) chunk (b + g), bandwidth-optimal for large buffers.
// - reduce, binomial tree (tree_reduce): relative rank v receives from v + 2^k for each 2^k below
//   its lowest set bit and then sends to v - lowbit(v): lg p (a + n b + n g), fewer latencies for
//   small buffers. prefer_tree_reduce compares the two with the cost model's figures.
// - gather / scatter: every rank's block straight to (from) the root, all peers at once. The
//   root's link carries (p-1) n however the blocks travel, so a tree would only save per-message
//   latency at the root for tiny blocks and large p, for the price of copies through the
//   intermediate ranks.
// - alltoallv: the pairwise exchange of pairwise_alltoall with each pair's own counts; steps are
//   independent (the caller runs several at once).
#pragma once

#include <cstddef>
#include <vector>

#include "collectives/schedule.h"

namespace gw::coll {

// Reduce to `root` of `count` elements: the root's output ends with the reduction of every
// rank's input; the other ranks' output buffers are scratch of `count` elements. Data steps only;
// run reduce_token_schedule after it.
Schedule chain_reduce(int rank, int nranks, int root, size_t count);
Schedule tree_reduce(int rank, int nranks, int root, size_t count);
// The empty token back from the root along the links the reduce used (tree: true for tree_reduce).
Schedule reduce_token(int rank, int nranks, int root, bool tree);
// Whether tree_reduce is expected to be faster than chain_reduce for `bytes` on nranks ranks
// (alpha_us per message, bw_gbps per link and reduce_gbps for the reduction kernel, the chunk the
// chain pipelines).
bool prefer_tree_reduce(int nranks, size_t bytes, double alpha_us, double bw_gbps,
                        double reduce_gbps, size_t chunk_bytes);

// Gather (to_root) or scatter (!to_root) of blocks of `count` elements. The root's buffer holds
// nranks blocks (block j at j*count, its own not part of the schedule: the caller copies it); the
// other ranks' buffer holds their one block at 0 (gather: the input, scatter: the output). Steps
// have ids 1..nranks-1 by rank distance from the root and are independent on the root.
Schedule rooted_blocks(int rank, int nranks, int root, size_t count, bool to_root);
// Scatter's acknowledgement: every rank sends an empty message to the root (ids nranks+k).
Schedule rooted_ack(int rank, int nranks, int root);
// The closing token: the root sends an empty message to every rank (ids 2 nranks+k).
Schedule rooted_token(int rank, int nranks, int root);

// All-to-all-v: step k (k = 1..nranks-1) sends [sdispls[j], +sendcounts[j]) of the input to
// j = rank+k and receives [rdispls[i], +recvcounts[i]) of the output from i = rank-k (vectors of
// nranks entries, in elements). The own block is not part of it (the caller copies it).
Schedule pairwise_alltoallv(int rank, int nranks, const std::vector<size_t>& sendcounts,
                            const std::vector<size_t>& sdispls,
                            const std::vector<size_t>& recvcounts,
                            const std::vector<size_t>& rdispls);
// The closing exchange: an empty message each way with every other rank (ids nranks+k).
Schedule pairwise_token(int rank, int nranks);

// Deals independent steps round-robin into at most max_plans plans that run together (each step
// talks to another peer, so no two plans share a connection).
std::vector<Plan> spread_steps(const Schedule& steps, size_t max_plans);

}  // namespace gw::coll
