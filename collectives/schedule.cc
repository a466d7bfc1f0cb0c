#include "collectives/schedule.h"

#include <fmt/format.h>

namespace gw::coll {

Range block_range(size_t count, int nblocks, int b) {
  const size_t n = static_cast<size_t>(nblocks);
  const size_t base = count / n, extra = count % n, i = static_cast<size_t>(b);
  return Range{i * base + (i < extra ? i : extra), base + (i < extra ? 1 : 0)};
}

namespace {

int mod(int a, int p) { return ((a % p) + p) % p; }

// Ring reduce-scatter over the given blocks. `shift` 0 leaves rank r owning block r+1 (the ring
// allreduce's natural layout), shift p-1 leaves it owning block r.
void add_ring_reduce_scatter(Schedule& s, int rank, int p, const std::vector<Range>& blocks,
                             int shift, int first_id) {
  for (int k = 0; k < p - 1; ++k) {
    Step st;
    st.id = first_id + k;
    st.send_to = mod(rank + 1, p);
    st.send = blocks[mod(rank - k + shift, p)];
    st.send_from_input = (k == 0);  // later sends forward what the previous step reduced
    st.recv_from = mod(rank - 1, p);
    st.recv = blocks[mod(rank - k - 1 + shift, p)];
    st.action = RecvAction::kReduce;
    st.reduce_with_input = true;  // each block is received once, so its local part is untouched
    s.push_back(st);
  }
}

// Ring allgather where rank r starts owning block `owned(r)` = r + shift.
void add_ring_allgather(Schedule& s, int rank, int p, const std::vector<Range>& blocks, int shift,
                        int first_id) {
  const int own = mod(rank + shift, p);
  for (int k = 0; k < p - 1; ++k) {
    Step st;
    st.id = first_id + k;
    st.send_to = mod(rank + 1, p);
    st.send = blocks[mod(own - k, p)];
    st.recv_from = mod(rank - 1, p);
    st.recv = blocks[mod(own - k - 1, p)];
    st.action = RecvAction::kCopy;
    s.push_back(st);
  }
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
  auto blocks = split_blocks(count, nranks);
  add_ring_reduce_scatter(s, rank, nranks, blocks, 0, 0);
  add_ring_allgather(s, rank, nranks, blocks, 1, nranks - 1);
  return s;
}

Schedule ring_reduce_scatter(int rank, int nranks, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  add_ring_reduce_scatter(s, rank, nranks, split_blocks(count, nranks), nranks - 1, 0);
  return s;
}

Schedule ring_allgather(int rank, int nranks, size_t count_per_rank) {
  Schedule s;
  if (nranks <= 1) return s;
  std::vector<Range> blocks(static_cast<size_t>(nranks));
  for (int b = 0; b < nranks; ++b) blocks[b] = Range{b * count_per_rank, count_per_rank};
  add_ring_allgather(s, rank, nranks, blocks, 0, 0);
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

Schedule chain_broadcast(int rank, int nranks, int root, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  const int vr = mod(rank - root, nranks);
  Step st;
  st.id = 0;
  if (vr > 0) {
    st.recv_from = mod(rank - 1, nranks);
    st.recv = Range{0, count};
    st.action = RecvAction::kCopy;
  }
  if (vr < nranks - 1) {
    st.send_to = mod(rank + 1, nranks);
    st.send = Range{0, count};
  }
  st.forward = (vr > 0 && vr < nranks - 1);
  s.push_back(st);
  // The closing token: an empty message that the last rank sends on once it has checked all it
  // received, and that goes on round the ring to the rank before it (root-1 -> root -> root+1
  // -> ... -> root-2), each rank passing it on once it arrives.
  Step done;
  done.id = 1;
  if (vr < nranks - 1) {
    done.recv_from = mod(rank - 1, nranks);
    done.action = RecvAction::kCopy;
  }
  if (vr != nranks - 2) done.send_to = mod(rank + 1, nranks);
  done.forward = done.send_to >= 0 && done.recv_from >= 0;
  s.push_back(done);
  return s;
}

Schedule pairwise_alltoall(int rank, int nranks, size_t count_per_rank) {
  Schedule s;
  for (int k = 1; k < nranks; ++k) {
    Step st;
    st.id = k;
    st.send_to = mod(rank + k, nranks);
    st.send = Range{static_cast<size_t>(st.send_to) * count_per_rank, count_per_rank};
    st.send_from_input = true;
    st.recv_from = mod(rank - k, nranks);
    st.recv = Range{static_cast<size_t>(st.recv_from) * count_per_rank, count_per_rank};
    st.action = RecvAction::kCopy;
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
  return out;
}

}  // namespace gw::coll
