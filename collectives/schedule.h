// Collective schedules as data: pure functions of (rank, nranks, count) that list, step by step,
// which element range this rank sends to whom and receives from whom, and whether the received
// elements are reduced into or copied over the output. The Communicator executes these lists
// over a transport (chunked, pipelined, per channel); tests execute them in memory for every
// rank count without a network.
//
// Buffers: every schedule works on one output buffer of `count` elements (ranges index it) and,
// for the reducing schedules, a read-only input buffer of the same shape (may be the same memory:
// in place). A step's send and receive happen concurrently; unless the step is `forward`, its send
// range and its receive range are disjoint, so the order does not matter.
//
// The executor cuts every range into chunks and always ends it with a chunk shorter than a full
// one (an empty message closes a range that is a whole number of chunks): the sizes of a range's
// messages then spell its count, so a receiver whose count differs from its sender's sees a size
// it did not expect, whatever the sizes. Every rank's output depends on every rank's messages
// having passed that check (the broadcast passes a closing token round the ring for that), so no
// rank can finish a call whose counts disagree.
//
// Step ids are global within one schedule family: the two ends of every message compute the same
// id for it (it travels in the transport tag, so a rank that runs a different collective or a
// different step is detected). Ranks may skip ids (folded ranks in RHD).
//
// Algorithms:
// - ring reduce-scatter / allgather / allreduce: 2(p-1) steps, neighbour traffic only.
// - pair exchange (2 ranks): one step, the whole vector each way, reduced on both ranks:
//   a + n b + n g against the ring's 2a + n b + n g/2, for latency-bound sizes.
// - recursive halving-doubling (Rabenseifner): 2 lg p' steps on p' = 2^floor(lg p) ranks. The
//   r = p - p' extra ranks fold in first: even rank 2i (i < r) sends its whole vector to 2i+1,
//   which reduces it and takes part in the core; 2i+1 sends the result back in a post-step.
// - broadcast: a pipelined chain from the root (root -> root+1 -> ... -> root-1). Each rank
//   forwards chunk c as soon as it has received it, so the time is about n*beta + (p-1)*alpha
//   + (p-2)*chunk*beta: bandwidth-optimal for the gradient-sized buffers this library moves.
//   (A binomial tree would win for tiny buffers at large p, at lg p times the bytes.) Then an
//   empty token goes once round the ring from the last rank (root-1 -> root -> ... -> root-2):
//   the last rank fails if any rank's count differs (a rank that fails stops forwarding), and the
//   token tells every rank upstream of a mismatch, which would otherwise have all it expects.
//   It costs (p-1) alpha of latency and no bandwidth.
// - pairwise all-to-all: p-1 steps; step k sends block (rank+k)%p of the input to that rank and
//   receives block (rank-k)%p of the output from that rank. Every pair of ranks exchanges exactly
//   once, so the steps are independent (the executor may run several at once), and a rank sends
//   each of its p-1 foreign blocks once, straight to its owner: the minimum volume.
//
// Topology-aware algorithms take the ranks grouped by host (HostRanks: hosts[h] lists host h's
// global ranks in local-rank order):
// - hierarchical allreduce (every host the same number L of ranks): ring reduce-scatter within
//   each host (local rank l ends with block l of L summed over its host), a ring allreduce of
//   block l among the H ranks of local index l (so every rank of a host drives a share of its
//   link, as NCCL's and Horovod's hierarchical modes do), ring allgather within each host. Each
//   host's link then carries 2(H-1)/H x n per direction, where a flat ring ordered by host
//   carries 2(p-1)/p x n (2 hosts x 2 ranks: n against 1.5 n). Its pipelined form
//   (hier_pipelined_allreduce) sends the same messages cut into segments, one plan per phase,
//   so that one segment crosses the link while others are reduced or gathered within the host.
// - hierarchical allreduce, leader form (any layout, e.g. 3+1): reduce to local rank 0 (ring
//   reduce-scatter, then the blocks to the leader), ring allreduce among the H leaders, a
//   pipelined chain from the leader through its host.
// - host-ordered ring: a ring allreduce whose order lists the hosts' ranks one host after the
//   other, so it crosses each host boundary once per direction whatever the rank numbering.
// - binary blocks (for p not a power of two, "A Hitchhiker's Guide on Distributed Training of
//   Deep Neural Networks", after Rabenseifner and Traeff): the ranks form blocks of the sizes of
//   p's binary digits (13 = 8 + 4 + 1); each block reduce-scatters by recursive halving, each
//   block adds the next smaller block's segments and hands its own to the next larger, the
//   largest allgathers by recursive doubling, and the result goes back down block by block.
//   Unlike RHD's fold, no rank sits idle through the core phase with the whole vector in hand.
// - host chain broadcast: chain_broadcast along the root's host first, then every other host's
//   ranks together, so the chain enters each host once whatever the rank numbering.
// - hierarchical allgather / reduce-scatter (every host L ranks): a ring across hosts among the
//   ranks of one local index and a ring within the host per host's blocks (allgather: across
//   first; reduce-scatter: within first), pipelined over segments in two plans.
// - double binary tree: two binary trees (tree_links) whose interior ranks are disjoint, each
//   reducing and broadcasting half of the vector (the caller runs tree 0 and tree 1 on two
//   channels): 2 lg p latency steps instead of the ring's 2(p-1), for latency-bound sizes.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gw::coll {

struct Range {
  size_t offset = 0;  // elements
  size_t count = 0;
  bool operator==(const Range&) const = default;
};

enum class RecvAction { kCopy, kReduce };

struct Step {
  int id = 0;
  int send_to = -1;  // -1: this step sends nothing
  Range send;
  bool send_from_input = false;  // the send reads the input buffer (not yet touched), else output
  int recv_from = -1;            // -1: this step receives nothing
  Range recv;
  RecvAction action = RecvAction::kCopy;
  bool reduce_with_input = false;  // kReduce: output = input op received, else output op received
  bool forward = false;  // chain: send == recv range, chunk c is sent once chunk c has arrived
  // The step starts only once plan number `after_plan` (an index into the plans run together)
  // has finished its first `after_steps` steps: orders the plans of one rank that hand buffer
  // ranges to each other (hier_pipelined_allreduce's phases). -1: starts when the previous one
  // of its own plan has finished.
  int after_plan = -1;
  size_t after_steps = 0;
};

using Schedule = std::vector<Step>;

// A schedule placed on one channel (its own connections per peer) over the slice of the buffer
// that starts at element `base` (the schedule's ranges are relative to it). Several plans run
// together, each its steps in order, the steps of different plans concurrently unless a step
// waits for another plan (Step::after_plan); two plans on one channel must not talk to the same
// peer.
struct Plan {
  int chan = 0;
  size_t base = 0;
  Schedule sched;
};

// Block b of `count` split into `nblocks` near-equal blocks (the first count % nblocks blocks get
// one element more). Blocks may be empty when count < nblocks.
Range block_range(size_t count, int nblocks, int b);

// a mod n in [0, n) for negative a too (n > 0): rank arithmetic around a ring or a root.
inline int wrap_rank(int a, int n) { return ((a % n) + n) % n; }

// Every function requires 0 <= rank < nranks and nranks >= 1; nranks == 1 yields no steps.
Schedule ring_allreduce(int rank, int nranks, size_t count);
// Ends with block `rank` (block_range(count, nranks, rank)) fully reduced in the output.
Schedule ring_reduce_scatter(int rank, int nranks, size_t count);
// Block `rank` (of blocks of `count_per_rank`) must already be in the output.
Schedule ring_allgather(int rank, int nranks, size_t count_per_rank);
Schedule rhd_allreduce(int rank, int nranks, size_t count);
// Pair exchange, for 2 ranks (nranks == 1: no steps; more: not defined): one step in which each
// rank sends its whole input to the other and reduces what it receives with its input (output =
// input op received). One message latency where the ring takes two, for the whole vector reduced
// on both ranks; both compute the same bits (every reduction op is commutative). Its send reads
// the input while its receive writes the output over the same range, so an in-place caller must
// give it a copy of the input (the Communicator does).
Schedule pair_allreduce(int rank, int nranks, size_t count);
Schedule chain_broadcast(int rank, int nranks, int root, size_t count);
// Input and output both hold nranks blocks of `count_per_rank`; block j of the input goes to rank
// j, block j of the output comes from rank j. The own block is not part of the schedule (the
// caller copies it). Steps are independent and have ids 1..nranks-1 (k = the rank distance).
Schedule pairwise_alltoall(int rank, int nranks, size_t count_per_rank);

// Ranks grouped by host: hosts[h] holds the global ranks of host h in local-rank order. Every
// rank 0..p-1 appears exactly once and no host is empty.
using HostRanks = std::vector<std::vector<int>>;
// Groups ranks by host_of_rank[r] (hosts numbered 0..H-1 in order of first appearance).
HostRanks hosts_from_map(const std::vector<int>& host_of_rank);
// True when every host has the same number of ranks (hier_allreduce applies).
bool uniform_hosts(const HostRanks& hosts);

// The schedules below require `rank` to be listed in `hosts`.
Schedule host_ring_allreduce(const HostRanks& hosts, int rank, size_t count);
// Requires uniform_hosts(hosts).
Schedule hier_allreduce(const HostRanks& hosts, int rank, size_t count);
Schedule hier_leader_allreduce(const HostRanks& hosts, int rank, size_t count);

// Pipelined hierarchical allreduce (requires uniform_hosts(hosts) and 1 <= nsegments): the
// buffer is cut into `nsegments` segments (block_range) that go through hier_allreduce's three
// phases in order, each phase a plan of its own: plan 0 on channel 0 the intra-host ring
// reduce-scatters, plan 1 on channel 1 the inter-host ring allreduces per local index, plan 2 on
// channel 2 the intra-host ring allgathers, segment after segment. A plan's first step of
// segment k waits (Step::after_plan) until the plan before it has finished segment k, so while
// segment k crosses the hosts' links, segment k+1 is reduce-scattered and segment k-1
// allgathered within the host. Each element is reduced by one rank and copied to the others, in
// the same order as hier_allreduce, so every rank ends with the same bits. The three plans must
// run together, at indices 0, 1, 2 of the plans vector (a caller that places them elsewhere adds
// its offset to after_plan and chan). A plan may be empty (one host, or one rank per host).
std::vector<Plan> hier_pipelined_allreduce(const HostRanks& hosts, int rank, size_t count,
                                           int nsegments);

// Host-aware broadcast (any layout): chain_broadcast along host_chain(hosts, root), which lists
// the root's host first (from the root on, in local order, wrapping), then the other hosts in
// order, each one's ranks together: the chain enters every other host once, so each host's link
// carries the buffer once per direction whatever the rank numbering. Closing token as
// chain_broadcast's.
std::vector<int> host_chain(const HostRanks& hosts, int root);
Schedule host_chain_broadcast(const HostRanks& hosts, int rank, int root, size_t count);

// Hierarchical allgather (requires uniform_hosts(hosts) and 1 <= nsegments): the output holds p
// blocks of `count_per_rank`, block r rank r's (this rank's own must be in place). Every block
// is cut into `nsegments` segments (block_range); per segment, plan 0 (channel 0) runs a ring
// allgather across hosts among the ranks of this rank's local index (H-1 steps), then plan 1
// (channel 1), once plan 0 has finished that segment, runs within the host a ring allgather of
// every host's blocks (H (L-1) steps, one block per step). Each host's link carries
// (H-1)/H x the output per direction, where a flat ring carries (p-1)/p x it.
std::vector<Plan> hier_allgather(const HostRanks& hosts, int rank, size_t count_per_rank,
                                 int nsegments);
// Hierarchical reduce-scatter (requires uniform_hosts(hosts) and 1 <= nsegments): the input holds
// p blocks of `count_per_rank`; rank r ends with block r (at r x count_per_rank of the output,
// the rest of which is scratch) reduced over every rank. Per segment, plan 0 (channel 0) ring
// reduce-scatters every host's blocks within the host (local rank l keeps the blocks of the
// ranks of local index l, summed over its host), then plan 1 (channel 1) ring reduce-scatters
// those across hosts among the ranks of one local index. Link traffic as hier_allgather's.
std::vector<Plan> hier_reduce_scatter(const HostRanks& hosts, int rank, size_t count_per_rank,
                                      int nsegments);

// Any nranks; a power of two gives recursive halving + doubling.
Schedule binary_blocks_allreduce(int rank, int nranks, size_t count);

struct TreeLinks {
  int parent = -1;            // -1 at the root
  int slot = -1;              // which child of the parent (0 or 1); -1 at the root
  std::vector<int> children;  // 0, 1 or 2 ranks
};
// Tree 0 or 1 of the double binary tree over nranks ranks.
TreeLinks tree_links(int rank, int nranks, int tree);
// Allreduce of `range` (elements of the buffer) over tree 0 or 1: reduce up, broadcast down.
Schedule tree_allreduce(int rank, int nranks, int tree, const Range& range);

std::string describe(const Step& step);  // for test failure messages and debug logs

}  // namespace gw::coll
