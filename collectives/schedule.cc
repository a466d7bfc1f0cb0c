#include "collectives/schedule.h"

#include <fmt/format.h>

#include <algorithm>

namespace gw::coll {

Range block_range(size_t count, int nblocks, int b) {
  const size_t n = static_cast<size_t>(nblocks);
  const size_t base = count / n, extra = count % n, i = static_cast<size_t>(b);
  return Range{i * base + (i < extra ? i : extra), base + (i < extra ? 1 : 0)};
}

namespace {

// Ring reduce-scatter over the given blocks, among the ranks of `ring` (global ranks in ring
// order; this rank is ring[pos]). `shift` 0 leaves ring[i] owning block i+1 (the ring allreduce's
// natural layout), shift p-1 leaves it owning block i. `from_input`: the blocks are still in the
// input (the first phase of a schedule), else the output holds this rank's contribution.
void add_ring_reduce_scatter(Schedule& s, const std::vector<int>& ring, int pos,
                             const std::vector<Range>& blocks, int shift, int first_id,
                             bool from_input = true) {
  const int p = static_cast<int>(ring.size());
  for (int k = 0; k < p - 1; ++k) {
    Step st;
    st.id = first_id + k;
    st.send_to = ring[wrap_rank(pos + 1, p)];
    st.send = blocks[wrap_rank(pos - k + shift, p)];
    st.send_from_input = from_input && k == 0;  // later sends forward what a step reduced
    st.recv_from = ring[wrap_rank(pos - 1, p)];
    st.recv = blocks[wrap_rank(pos - k - 1 + shift, p)];
    st.action = RecvAction::kReduce;
    // Each block is received once, so its local part is untouched until then.
    st.reduce_with_input = from_input;
    s.push_back(st);
  }
}

// Ring allgather among the ranks of `ring` where ring[i] starts owning block i + shift.
void add_ring_allgather(Schedule& s, const std::vector<int>& ring, int pos,
                        const std::vector<Range>& blocks, int shift, int first_id) {
  const int p = static_cast<int>(ring.size());
  const int own = wrap_rank(pos + shift, p);
  for (int k = 0; k < p - 1; ++k) {
    Step st;
    st.id = first_id + k;
    st.send_to = ring[wrap_rank(pos + 1, p)];
    st.send = blocks[wrap_rank(own - k, p)];
    st.recv_from = ring[wrap_rank(pos - 1, p)];
    st.recv = blocks[wrap_rank(own - k - 1, p)];
    st.action = RecvAction::kCopy;
    s.push_back(st);
  }
}

std::vector<int> identity_ring(int p) {
  std::vector<int> ring(static_cast<size_t>(p));
  for (int i = 0; i < p; ++i) ring[i] = i;
  return ring;
}

std::vector<Range> split_blocks(size_t count, int n) {
  std::vector<Range> blocks(static_cast<size_t>(n));
  for (int b = 0; b < n; ++b) blocks[b] = block_range(count, n, b);
  return blocks;
}

}  // namespace

Schedule ring_allreduce(int rank, int nranks, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  const auto ring = identity_ring(nranks);
  auto blocks = split_blocks(count, nranks);
  add_ring_reduce_scatter(s, ring, rank, blocks, 0, 0);
  add_ring_allgather(s, ring, rank, blocks, 1, nranks - 1);
  return s;
}

Schedule ring_reduce_scatter(int rank, int nranks, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  add_ring_reduce_scatter(s, identity_ring(nranks), rank, split_blocks(count, nranks), nranks - 1,
                          0);
  return s;
}

Schedule ring_allgather(int rank, int nranks, size_t count_per_rank) {
  Schedule s;
  if (nranks <= 1) return s;
  std::vector<Range> blocks(static_cast<size_t>(nranks));
  for (int b = 0; b < nranks; ++b) blocks[b] = Range{b * count_per_rank, count_per_rank};
  add_ring_allgather(s, identity_ring(nranks), rank, blocks, 0, 0);
  return s;
}

Schedule pair_allreduce(int rank, int nranks, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  Step st;
  st.id = 0;
  st.send_to = st.recv_from = 1 - rank;
  st.send = st.recv = Range{0, count};
  st.send_from_input = true;
  st.action = RecvAction::kReduce;
  st.reduce_with_input = true;
  s.push_back(st);
  return s;
}

Schedule rhd_allreduce(int rank, int nranks, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  int pof2 = 1, levels = 0;
  while (pof2 * 2 <= nranks) {
    pof2 *= 2;
    ++levels;
  }
  const int rem = nranks - pof2;
  const int post_id = 2 * levels + 1;
  const Range all{0, count};
  bool touched = false;  // has this rank reduced anything into its output yet?
  int vrank;
  if (rank < 2 * rem) {
    if (rank % 2 == 0) {
      Step pre;
      pre.id = 0;
      pre.send_to = rank + 1;
      pre.send = all;
      pre.send_from_input = true;
      s.push_back(pre);
      Step post;
      post.id = post_id;
      post.recv_from = rank + 1;
      post.recv = all;
      post.action = RecvAction::kCopy;
      s.push_back(post);
      return s;
    }
    Step pre;
    pre.id = 0;
    pre.recv_from = rank - 1;
    pre.recv = all;
    pre.action = RecvAction::kReduce;
    pre.reduce_with_input = true;
    s.push_back(pre);
    touched = true;
    vrank = rank / 2;
  } else {
    vrank = rank - rem;
  }
  auto real = [rem](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  auto blocks = split_blocks(count, pof2);
  auto span = [&blocks](int lo, int hi) {
    if (lo >= hi) return Range{blocks[lo].offset, 0};
    return Range{blocks[lo].offset,
                 blocks[hi - 1].offset + blocks[hi - 1].count - blocks[lo].offset};
  };
  // Reduce-scatter by recursive halving: the partner across the highest bit first.
  int lo = 0, hi = pof2, id = 1;
  for (int mask = pof2 / 2; mask >= 1; mask /= 2, ++id) {
    const int mid = (lo + hi) / 2;
    const bool lower = (vrank & mask) == 0;
    Step st;
    st.id = id;
    st.send_to = st.recv_from = real(vrank ^ mask);
    st.send = lower ? span(mid, hi) : span(lo, mid);
    st.recv = lower ? span(lo, mid) : span(mid, hi);
    st.send_from_input = !touched;
    st.action = RecvAction::kReduce;
    st.reduce_with_input = !touched;
    touched = true;
    s.push_back(st);
    if (lower) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  // Allgather by recursive doubling: exchange owned ranges, the nearest partner first.
  for (int mask = 1; mask < pof2; mask *= 2, ++id) {
    const bool upper = (vrank & mask) != 0;
    Step st;
    st.id = id;
    st.send_to = st.recv_from = real(vrank ^ mask);
    st.send = span(lo, hi);
    st.recv = upper ? span(lo - mask, lo) : span(hi, hi + mask);
    st.action = RecvAction::kCopy;
    s.push_back(st);
    if (upper) {
      lo -= mask;
    } else {
      hi += mask;
    }
  }
  if (rank < 2 * rem) {
    Step post;
    post.id = post_id;
    post.send_to = rank - 1;
    post.send = all;
    s.push_back(post);
  }
  return s;
}

namespace {

// chain_broadcast over the ranks of `chain` (chain[0] the root; this rank is chain[pos]).
Schedule chain_broadcast_over(const std::vector<int>& chain, int pos, size_t count) {
  Schedule s;
  const int p = static_cast<int>(chain.size());
  if (p <= 1) return s;
  Step st;
  st.id = 0;
  if (pos > 0) {
    st.recv_from = chain[pos - 1];
    st.recv = Range{0, count};
    st.action = RecvAction::kCopy;
  }
  if (pos < p - 1) {
    st.send_to = chain[pos + 1];
    st.send = Range{0, count};
  }
  st.forward = (pos > 0 && pos < p - 1);
  s.push_back(st);
  // The closing token: an empty message that the last rank sends on once it has checked all it
  // received, and that goes on round the ring to the rank before it (chain[p-1] -> chain[0] ->
  // chain[1] -> ... -> chain[p-2]), each rank passing it on once it arrives.
  Step done;
  done.id = 1;
  if (pos < p - 1) {
    done.recv_from = chain[wrap_rank(pos - 1, p)];
    done.action = RecvAction::kCopy;
  }
  if (pos != p - 2) done.send_to = chain[wrap_rank(pos + 1, p)];
  done.forward = done.send_to >= 0 && done.recv_from >= 0;
  s.push_back(done);
  return s;
}

}  // namespace

Schedule chain_broadcast(int rank, int nranks, int root, size_t count) {
  std::vector<int> chain(static_cast<size_t>(nranks));
  for (int i = 0; i < nranks; ++i) chain[i] = wrap_rank(root + i, nranks);
  return chain_broadcast_over(chain, wrap_rank(rank - root, nranks), count);
}

Schedule pairwise_alltoall(int rank, int nranks, size_t count_per_rank) {
  Schedule s;
  for (int k = 1; k < nranks; ++k) {
    Step st;
    st.id = k;
    st.send_to = wrap_rank(rank + k, nranks);
    st.send = Range{static_cast<size_t>(st.send_to) * count_per_rank, count_per_rank};
    st.send_from_input = true;
    st.recv_from = wrap_rank(rank - k, nranks);
    st.recv = Range{static_cast<size_t>(st.recv_from) * count_per_rank, count_per_rank};
    st.action = RecvAction::kCopy;
    s.push_back(st);
  }
  return s;
}

// ---- topology-aware schedules --------------------------------------------------------------

namespace {

// Phases of a composed schedule take step ids from disjoint bands, so the two ends of every
// message agree on its id whatever the other phases hold (tags carry 12 bits of step id).
constexpr int kPhaseBand = 1024;

struct Place {
  int host = -1;
  int local = -1;
};

Place place_of(const HostRanks& hosts, int rank) {
  for (size_t h = 0; h < hosts.size(); ++h) {
    for (size_t l = 0; l < hosts[h].size(); ++l) {
      if (hosts[h][l] == rank) return Place{static_cast<int>(h), static_cast<int>(l)};
    }
  }
  return Place{};
}

// Blocks of `whole` split into n near-equal parts, offset into the buffer.
std::vector<Range> split_range(const Range& whole, int n) {
  auto blocks = split_blocks(whole.count, n);
  for (auto& b : blocks) b.offset += whole.offset;
  return blocks;
}

// A pipelined chain over `chain` (chain[0] holds the data in its output) along which the range
// travels with forwarding, as chain_broadcast's first step.
void add_chain(Schedule& s, const std::vector<int>& chain, int pos, const Range& range, int id) {
  const int p = static_cast<int>(chain.size());
  if (p <= 1) return;
  Step st;
  st.id = id;
  if (pos > 0) {
    st.recv_from = chain[pos - 1];
    st.recv = range;
    st.action = RecvAction::kCopy;
  }
  if (pos < p - 1) {
    st.send_to = chain[pos + 1];
    st.send = range;
  }
  st.forward = pos > 0 && pos < p - 1;
  s.push_back(st);
}

}  // namespace

bool uniform_hosts(const HostRanks& hosts) {
  if (hosts.empty()) return false;
  for (const auto& h : hosts) {
    if (h.size() != hosts[0].size() || h.empty()) return false;
  }
  return true;
}

HostRanks hosts_from_map(const std::vector<int>& host_of_rank) {
  HostRanks hosts;
  for (size_t r = 0; r < host_of_rank.size(); ++r) {
    const int h = host_of_rank[r];
    if (h < 0) continue;
    if (hosts.size() <= static_cast<size_t>(h)) hosts.resize(static_cast<size_t>(h) + 1);
    hosts[h].push_back(static_cast<int>(r));
  }
  return hosts;
}

Schedule host_ring_allreduce(const HostRanks& hosts, int rank, size_t count) {
  Schedule s;
  std::vector<int> ring;
  for (const auto& h : hosts) ring.insert(ring.end(), h.begin(), h.end());
  const int p = static_cast<int>(ring.size());
  if (p <= 1) return s;
  const int pos = static_cast<int>(std::find(ring.begin(), ring.end(), rank) - ring.begin());
  auto blocks = split_blocks(count, p);
  add_ring_reduce_scatter(s, ring, pos, blocks, 0, 0);
  add_ring_allgather(s, ring, pos, blocks, 1, p - 1);
  return s;
}

Schedule hier_allreduce(const HostRanks& hosts, int rank, size_t count) {
  Schedule s;
  const Place me = place_of(hosts, rank);
  const int nhosts = static_cast<int>(hosts.size());
  const int nlocal = static_cast<int>(hosts[me.host].size());
  // 1. Within the host: ring reduce-scatter, local rank l ends with block l summed over the host.
  const Range all{0, count};
  const auto blocks = split_range(all, nlocal);
  if (nlocal > 1) add_ring_reduce_scatter(s, hosts[me.host], me.local, blocks, nlocal - 1, 0);
  // 2. Across hosts: the ranks with the same local index allreduce their block with a ring, so
  //    every rank of a host drives its share of the host's link at once.
  if (nhosts > 1) {
    std::vector<int> column(static_cast<size_t>(nhosts));
    for (int h = 0; h < nhosts; ++h) column[h] = hosts[h][me.local];
    const auto sub = split_range(blocks[me.local], nhosts);
    add_ring_reduce_scatter(s, column, me.host, sub, 0, kPhaseBand, nlocal == 1);
    add_ring_allgather(s, column, me.host, sub, 1, kPhaseBand + nhosts - 1);
  }
  // 3. Within the host: ring allgather of the summed blocks.
  if (nlocal > 1) add_ring_allgather(s, hosts[me.host], me.local, blocks, 0, 2 * kPhaseBand);
  return s;
}

Schedule hier_leader_allreduce(const HostRanks& hosts, int rank, size_t count) {
  Schedule s;
  const Place me = place_of(hosts, rank);
  const int nhosts = static_cast<int>(hosts.size());
  const auto& local = hosts[me.host];
  const int nlocal = static_cast<int>(local.size());
  const Range all{0, count};
  const auto blocks = split_range(all, nlocal);
  if (nlocal > 1) {
    // 1. Reduce to the host's leader (local rank 0): a ring reduce-scatter, then every other
    //    local rank hands its summed block to the leader.
    add_ring_reduce_scatter(s, local, me.local, blocks, nlocal - 1, 0);
    if (me.local == 0) {
      for (int l = 1; l < nlocal; ++l) {
        Step st;
        st.id = kPhaseBand / 2 + l;
        st.recv_from = local[l];
        st.recv = blocks[l];
        st.action = RecvAction::kCopy;
        s.push_back(st);
      }
    } else {
      Step st;
      st.id = kPhaseBand / 2 + me.local;
      st.send_to = local[0];
      st.send = blocks[me.local];
      s.push_back(st);
    }
  }
  // 2. The leaders allreduce the whole vector with a ring.
  if (me.local == 0 && nhosts > 1) {
    std::vector<int> leaders(static_cast<size_t>(nhosts));
    for (int h = 0; h < nhosts; ++h) leaders[h] = hosts[h][0];
    const auto lblocks = split_range(all, nhosts);
    add_ring_reduce_scatter(s, leaders, me.host, lblocks, 0, kPhaseBand, nlocal == 1);
    add_ring_allgather(s, leaders, me.host, lblocks, 1, kPhaseBand + nhosts - 1);
  }
  // 3. The leader passes the result down a pipelined chain through its host.
  add_chain(s, local, me.local, all, 2 * kPhaseBand);
  return s;
}

// ---- pipelined hierarchical allreduce ----------------------------------------------------------

std::vector<Plan> hier_pipelined_allreduce(const HostRanks& hosts, int rank, size_t count,
                                           int nsegments) {
  enum Lane { kIntraReduce = 0, kInter = 1, kIntraGather = 2 };
  std::vector<Plan> lanes(3);
  for (int i = 0; i < 3; ++i) lanes[i].chan = i;
  const Place me = place_of(hosts, rank);
  const int nhosts = static_cast<int>(hosts.size());
  const int nlocal = static_cast<int>(hosts[me.host].size());
  const auto& local = hosts[me.host];
  std::vector<int> column(static_cast<size_t>(nhosts));
  for (int h = 0; h < nhosts; ++h) column[h] = hosts[h][me.local];
  // Steps per segment in each lane; ids go on from segment to segment within the lane's band
  // (each lane has a channel of its own, so only the two ends of one lane's messages compare).
  const int intra_steps = nlocal > 1 ? nlocal - 1 : 0;
  const int inter_steps = nhosts > 1 ? 2 * (nhosts - 1) : 0;
  // The first step of a segment waits until the lane before it has finished that segment: the
  // allgather waits for the inter-host lane, or for the reduce-scatter when there is one host.
  auto wait_for = [&](Schedule& s, size_t first, int lane, int per_segment, int k) {
    if (first >= s.size() || per_segment == 0) return;
    s[first].after_plan = lane;
    s[first].after_steps = static_cast<size_t>(per_segment) * static_cast<size_t>(k + 1);
  };
  for (int k = 0; k < nsegments; ++k) {
    const Range seg = block_range(count, nsegments, k);
    const auto blocks = split_range(seg, nlocal);
    // 1. Within the host: local rank l ends with block l of the segment summed over the host.
    if (intra_steps > 0) {
      add_ring_reduce_scatter(lanes[kIntraReduce].sched, local, me.local, blocks, nlocal - 1,
                              k * intra_steps);
    }
    // 2. Across hosts: the ring allreduce of block l among the ranks of local index l.
    if (inter_steps > 0) {
      Schedule& s = lanes[kInter].sched;
      const size_t first = s.size();
      const auto sub = split_range(blocks[me.local], nhosts);
      const int id = kPhaseBand + k * inter_steps;
      add_ring_reduce_scatter(s, column, me.host, sub, 0, id, nlocal == 1);
      add_ring_allgather(s, column, me.host, sub, 1, id + nhosts - 1);
      wait_for(s, first, kIntraReduce, intra_steps, k);
    }
    // 3. Within the host: ring allgather of the segment's summed blocks.
    if (intra_steps > 0) {
      Schedule& s = lanes[kIntraGather].sched;
      const size_t first = s.size();
      add_ring_allgather(s, local, me.local, blocks, 0, 2 * kPhaseBand + k * intra_steps);
      if (inter_steps > 0) {
        wait_for(s, first, kInter, inter_steps, k);
      } else {
        wait_for(s, first, kIntraReduce, intra_steps, k);
      }
    }
  }
  return lanes;
}

// ---- host-aware broadcast, allgather, reduce-scatter -------------------------------------------

std::vector<int> host_chain(const HostRanks& hosts, int root) {
  const Place r = place_of(hosts, root);
  const int nhosts = static_cast<int>(hosts.size());
  std::vector<int> chain;
  for (int i = 0; i < nhosts; ++i) {
    const auto& h = hosts[(r.host + i) % nhosts];
    const size_t n = h.size(), first = i == 0 ? static_cast<size_t>(r.local) : 0;
    for (size_t l = 0; l < n; ++l) chain.push_back(h[(first + l) % n]);
  }
  return chain;
}

Schedule host_chain_broadcast(const HostRanks& hosts, int rank, int root, size_t count) {
  const std::vector<int> chain = host_chain(hosts, root);
  const int pos = static_cast<int>(std::find(chain.begin(), chain.end(), rank) - chain.begin());
  return chain_broadcast_over(chain, pos, count);
}

namespace {

// Segment k (of nsegments) of rank r's block of `per` elements.
Range block_segment(int r, size_t per, int nsegments, int k) {
  const Range seg = block_range(per, nsegments, k);
  return Range{static_cast<size_t>(r) * per + seg.offset, seg.count};
}

// Makes the first step added to `s` since `first` wait until plan `plan` has finished `steps`.
void wait_after(Schedule& s, size_t first, int plan, size_t steps) {
  if (first >= s.size() || steps == 0) return;
  s[first].after_plan = plan;
  s[first].after_steps = steps;
}

// What hier_allgather and hier_reduce_scatter share: two plans on channels 0 and 1, this rank's
// place, its column (the ranks of its local index on every host) and each lane's steps per segment.
struct HierLanes {
  std::vector<Plan> lanes;
  Place me;
  int nhosts = 0, nlocal = 0;
  std::vector<int> column;
  int inter_steps = 0, intra_steps = 0;
};

HierLanes hier_lanes(const HostRanks& hosts, int rank) {
  HierLanes v;
  v.lanes.resize(2);
  for (int i = 0; i < 2; ++i) v.lanes[i].chan = i;
  v.me = place_of(hosts, rank);
  v.nhosts = static_cast<int>(hosts.size());
  v.nlocal = static_cast<int>(hosts[v.me.host].size());
  v.column.resize(static_cast<size_t>(v.nhosts));
  for (int h = 0; h < v.nhosts; ++h) v.column[h] = hosts[h][v.me.local];
  v.inter_steps = v.nhosts - 1;
  v.intra_steps = v.nhosts * (v.nlocal - 1);
  return v;
}

// Segment k of each rank's block, for the ranks in `ranks` (block i belongs to ranks[i]).
std::vector<Range> segment_blocks(const std::vector<int>& ranks, size_t count_per_rank,
                                  int nsegments, int k) {
  std::vector<Range> blocks(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    blocks[i] = block_segment(ranks[i], count_per_rank, nsegments, k);
  }
  return blocks;
}

}  // namespace

std::vector<Plan> hier_allgather(const HostRanks& hosts, int rank, size_t count_per_rank,
                                 int nsegments) {
  enum Lane { kInter = 0, kIntra = 1 };
  HierLanes v = hier_lanes(hosts, rank);
  const auto& local = hosts[v.me.host];
  for (int k = 0; k < nsegments; ++k) {
    // 1. Across hosts: the ranks of one local index gather their segments with a ring, so every
    //    rank of a host drives its share of the host's link at once.
    if (v.inter_steps > 0) {
      add_ring_allgather(v.lanes[kInter].sched, v.column, v.me.host,
                         segment_blocks(v.column, count_per_rank, nsegments, k), 0,
                         k * v.inter_steps);
    }
    // 2. Within the host: local rank l now holds column l's segments (one from every host);
    //    a ring allgather per host hands them round.
    if (v.nlocal > 1) {
      Schedule& s = v.lanes[kIntra].sched;
      const size_t first = s.size();
      for (int h = 0; h < v.nhosts; ++h) {
        add_ring_allgather(s, local, v.me.local,
                           segment_blocks(hosts[h], count_per_rank, nsegments, k), 0,
                           k * v.intra_steps + h * (v.nlocal - 1));
      }
      wait_after(s, first, kInter, static_cast<size_t>(v.inter_steps) * (k + 1));
    }
  }
  return std::move(v.lanes);
}

std::vector<Plan> hier_reduce_scatter(const HostRanks& hosts, int rank, size_t count_per_rank,
                                      int nsegments) {
  enum Lane { kIntra = 0, kInter = 1 };
  HierLanes v = hier_lanes(hosts, rank);
  const auto& local = hosts[v.me.host];
  for (int k = 0; k < nsegments; ++k) {
    // 1. Within the host: for every host h, a ring reduce-scatter of host h's blocks leaves local
    //    rank l with the block of hosts[h][l] summed over this host (column l's blocks).
    if (v.nlocal > 1) {
      for (int h = 0; h < v.nhosts; ++h) {
        add_ring_reduce_scatter(v.lanes[kIntra].sched, local, v.me.local,
                                segment_blocks(hosts[h], count_per_rank, nsegments, k),
                                v.nlocal - 1, k * v.intra_steps + h * (v.nlocal - 1));
      }
    }
    // 2. Across hosts: the ranks of one local index reduce-scatter their column's host sums with
    //    a ring, each ending with its own block summed over every host.
    if (v.inter_steps > 0) {
      Schedule& s = v.lanes[kInter].sched;
      const size_t first = s.size();
      add_ring_reduce_scatter(s, v.column, v.me.host,
                              segment_blocks(v.column, count_per_rank, nsegments, k), v.nhosts - 1,
                              k * v.inter_steps, v.nlocal == 1);
      wait_after(s, first, kIntra, static_cast<size_t>(v.intra_steps) * (k + 1));
    }
  }
  return std::move(v.lanes);
}

Schedule binary_blocks_allreduce(int rank, int nranks, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  // Blocks: the binary digits of p, largest first (13 = 8 + 4 + 1: ranks 0-7, 8-11, 12).
  std::vector<int> base, lg;
  for (int bit = 30, next = 0; bit >= 0; --bit) {
    if (nranks & (1 << bit)) {
      base.push_back(next);
      lg.push_back(bit);
      next += 1 << bit;
    }
  }
  const int nblocks = static_cast<int>(base.size());
  int j = nblocks - 1;
  while (base[j] > rank) --j;
  const int a = lg[j], i = rank - base[j], K = lg[0];
  // Fine pieces: the largest block's 2^K. Rank i of a block of 2^x ranks owns the pieces
  // [i 2^(K-x), (i+1) 2^(K-x)): the same boundaries in every block, so a segment of a smaller
  // block is exactly the union of segments of a larger one.
  const auto fine = split_blocks(count, 1 << K);
  auto seg = [&](int x, int lo, int hi) {  // segments [lo, hi) of a block of 2^x ranks
    const int w = 1 << (K - x);
    const Range first = fine[lo * w];
    const Range last = fine[hi * w - 1];
    return Range{first.offset, last.offset + last.count - first.offset};
  };
  bool touched = false;
  // 1. Reduce-scatter by recursive halving inside the block: rank i ends with segment i.
  {
    int lo = 0, hi = 1 << a, id = 0;
    for (int mask = (1 << a) / 2; mask >= 1; mask /= 2, ++id) {
      const int mid = (lo + hi) / 2;
      const bool lower = (i & mask) == 0;
      Step st;
      st.id = id;
      st.send_to = st.recv_from = base[j] + (i ^ mask);
      st.send = lower ? seg(a, mid, hi) : seg(a, lo, mid);
      st.recv = lower ? seg(a, lo, mid) : seg(a, mid, hi);
      st.send_from_input = st.reduce_with_input = !touched;
      st.action = RecvAction::kReduce;
      touched = true;
      s.push_back(st);
      (lower ? hi : lo) = mid;
    }
  }
  // 2. Up: each block adds the next smaller block's sums, then hands its own to the next larger.
  if (j + 1 < nblocks) {
    const int c = lg[j + 1];
    Step st;
    st.id = kPhaseBand + j + 1;
    st.recv_from = base[j + 1] + (i >> (a - c));
    st.recv = seg(a, i, i + 1);
    st.action = RecvAction::kReduce;
    st.reduce_with_input = !touched;
    touched = true;
    s.push_back(st);
  }
  if (j > 0) {
    const int b = lg[j - 1];
    for (int m = i << (b - a); m < (i + 1) << (b - a); ++m) {
      Step st;
      st.id = kPhaseBand + j;
      st.send_to = base[j - 1] + m;
      st.send = seg(b, m, m + 1);
      st.send_from_input = !touched;
      s.push_back(st);
    }
    // 3. Down: the segment's final sum from the larger block.
    Step down;
    down.id = 3 * kPhaseBand + j;
    down.recv_from = base[j - 1] + (i << (b - a));
    down.recv = seg(a, i, i + 1);
    down.action = RecvAction::kCopy;
    s.push_back(down);
  }
  // 4. Allgather by recursive doubling inside the block.
  {
    int lo = i, hi = i + 1, id = 2 * kPhaseBand + 64 * j;
    for (int mask = 1; mask < (1 << a); mask *= 2, ++id) {
      const bool upper = (i & mask) != 0;
      Step st;
      st.id = id;
      st.send_to = st.recv_from = base[j] + (i ^ mask);
      st.send = seg(a, lo, hi);
      st.recv = upper ? seg(a, lo - mask, lo) : seg(a, hi, hi + mask);
      st.action = RecvAction::kCopy;
      s.push_back(st);
      (upper ? lo : hi) += upper ? -mask : mask;
    }
  }
  // 5. Down: the final sums to the next smaller block, each of its ranks' segment.
  if (j + 1 < nblocks) {
    const int c = lg[j + 1];
    if (i % (1 << (a - c)) == 0) {
      Step st;
      st.id = 3 * kPhaseBand + j + 1;
      st.send_to = base[j + 1] + (i >> (a - c));
      st.send = seg(c, i >> (a - c), (i >> (a - c)) + 1);
      s.push_back(st);
    }
  }
  return s;
}

TreeLinks tree_links(int rank, int nranks, int tree) {
  // Heap layout over a permutation of the ranks: position i has children 2i+1 and 2i+2. Tree 0
  // places rank r at position r, tree 1 at position p-1-r, so the interior positions (the lower
  // half) of one tree are the leaves of the other: every rank forwards in at most one of the
  // two trees (NCCL's double binary tree property, with a simpler layout).
  auto at = [&](int pos) { return tree == 0 ? pos : nranks - 1 - pos; };
  const int pos = tree == 0 ? rank : nranks - 1 - rank;
  TreeLinks t;
  t.parent = pos == 0 ? -1 : at((pos - 1) / 2);
  t.slot = pos == 0 ? -1 : (pos - 1) % 2;
  for (int c = 0; c < 2; ++c) {
    const int child = 2 * pos + 1 + c;
    if (child < nranks) t.children.push_back(at(child));
  }
  return t;
}

Schedule tree_allreduce(int rank, int nranks, int tree, const Range& range) {
  Schedule s;
  if (nranks <= 1) return s;
  const TreeLinks t = tree_links(rank, nranks, tree);
  // Up: reduce the children's partial sums (step id 1 + the child's slot), then send to the
  // parent; down: the result, step id 5 + the child's slot.
  bool touched = false;
  for (size_t c = 0; c < t.children.size(); ++c) {
    Step st;
    st.id = 1 + static_cast<int>(c);
    st.recv_from = t.children[c];
    st.recv = range;
    st.action = RecvAction::kReduce;
    st.reduce_with_input = !touched;
    touched = true;
    s.push_back(st);
  }
  // The send to the parent and the receive of the result from it are one step: the parent
  // answers only after it has everything, so the two never overlap in time.
  if (t.parent >= 0) {
    Step st;
    st.id = 1 + t.slot;
    st.send_to = t.parent;
    st.send = range;
    st.send_from_input = !touched;
    s.push_back(st);
    Step down;
    down.id = 5 + t.slot;
    down.recv_from = t.parent;
    down.recv = range;
    down.action = RecvAction::kCopy;
    s.push_back(down);
  }
  // Down: the result to each child.
  for (size_t c = 0; c < t.children.size(); ++c) {
    Step st;
    st.id = 5 + static_cast<int>(c);
    st.send_to = t.children[c];
    st.send = range;
    s.push_back(st);
  }
  return s;
}

std::string describe(const Step& st) {
  std::string out = fmt::format("step {}:", st.id);
  if (st.send_to >= 0) {
    out += fmt::format(" send [{}, +{}) to {}{}", st.send.offset, st.send.count, st.send_to,
                       st.send_from_input ? " (input)" : "");
  }
  if (st.recv_from >= 0) {
    out += fmt::format(" recv [{}, +{}) from {} {}{}", st.recv.offset, st.recv.count, st.recv_from,
                       st.action == RecvAction::kReduce ? "reduce" : "copy",
                       st.reduce_with_input ? " with input" : "");
  }
  if (st.forward) out += " forward";
  if (st.after_plan >= 0)
    out += fmt::format(" after plan {} step {}", st.after_plan, st.after_steps);
  return out;
}

}  // namespace gw::coll
