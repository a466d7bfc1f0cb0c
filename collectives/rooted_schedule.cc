// The rooted collectives' and all-to-all-v's schedules (rooted_schedule.h says why each).
#include "collectives/rooted_schedule.h"

#include <algorithm>

namespace gw::coll {
namespace {

int lowest_bit_index(unsigned v) { return __builtin_ctz(v); }

}  // namespace

Schedule chain_reduce(int rank, int nranks, int root, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  const int v = wrap_rank(rank - root, nranks);
  Step st;
  st.id = 0;
  if (v < nranks - 1) {
    st.recv_from = wrap_rank(root + v + 1, nranks);
    st.recv = Range{0, count};
    st.action = RecvAction::kReduce;
    st.reduce_with_input = true;
  }
  if (v > 0) {
    st.send_to = wrap_rank(root + v - 1, nranks);
    st.send = Range{0, count};
    // The chain's far end has received nothing: it sends its input as it is.
    st.send_from_input = v == nranks - 1;
  }
  st.forward = st.send_to >= 0 && st.recv_from >= 0;
  s.push_back(st);
  return s;
}

Schedule tree_reduce(int rank, int nranks, int root, size_t count) {
  Schedule s;
  if (nranks <= 1) return s;
  const unsigned v = static_cast<unsigned>(wrap_rank(rank - root, nranks));
  bool received = false;
  for (unsigned mask = 1; mask < static_cast<unsigned>(nranks); mask <<= 1) {
    Step st;
    st.id = lowest_bit_index(mask);
    if (v & mask) {
      st.send_to = wrap_rank(root + static_cast<int>(v - mask), nranks);
      st.send = Range{0, count};
      st.send_from_input = !received;
      s.push_back(st);
      break;
    }
    if (v + mask < static_cast<unsigned>(nranks)) {
      st.recv_from = wrap_rank(root + static_cast<int>(v + mask), nranks);
      st.recv = Range{0, count};
      st.action = RecvAction::kReduce;
      st.reduce_with_input = !received;
      received = true;
      s.push_back(st);
    }
  }
  return s;
}

Schedule reduce_token(int rank, int nranks, int root, bool tree) {
  Schedule s;
  if (nranks <= 1) return s;
  const int v = wrap_rank(rank - root, nranks);
  constexpr int kBase = 32;  // above the data steps' ids
  if (!tree) {
    Step st;
    st.id = kBase;
    if (v > 0) st.recv_from = wrap_rank(root + v - 1, nranks);
    if (v < nranks - 1) st.send_to = wrap_rank(root + v + 1, nranks);
    st.forward = st.send_to >= 0 && st.recv_from >= 0;
    s.push_back(st);
    return s;
  }
  // Down the binomial tree: from the parent first, then to the children, largest subtree first.
  const unsigned uv = static_cast<unsigned>(v);
  unsigned top = 1;
  while (top < static_cast<unsigned>(nranks)) top <<= 1;
  const unsigned low = uv == 0 ? top : (uv & (~uv + 1));
  if (uv != 0) {
    Step st;
    st.id = kBase + lowest_bit_index(low);
    st.recv_from = wrap_rank(root + static_cast<int>(uv - low), nranks);
    s.push_back(st);
  }
  for (unsigned mask = low >> 1; mask > 0; mask >>= 1) {
    if (uv + mask < static_cast<unsigned>(nranks)) {
      Step st;
      st.id = kBase + lowest_bit_index(mask);
      st.send_to = wrap_rank(root + static_cast<int>(uv + mask), nranks);
      s.push_back(st);
    }
  }
  return s;
}

bool prefer_tree_reduce(int nranks, size_t bytes, double alpha_us, double bw_gbps,
                        double reduce_gbps, size_t chunk_bytes) {
  if (nranks <= 2) return true;  // one message either way; the tree has no chain to fill
  int levels = 0;
  while ((1 << levels) < nranks) ++levels;
  const double n = static_cast<double>(bytes);
  const double per_byte_us = 1e-3 / std::max(1e-9, bw_gbps) + 1e-3 / std::max(1e-9, reduce_gbps);
  const double chunk = static_cast<double>(std::min(bytes, std::max<size_t>(1, chunk_bytes)));
  const double tree = levels * (2 * alpha_us + n * per_byte_us);
  const double chain =
      2 * (nranks - 1) * alpha_us + n * per_byte_us + (nranks - 2) * chunk * per_byte_us;
  return tree <= chain;
}

Schedule rooted_blocks(int rank, int nranks, int root, size_t count, bool to_root) {
  Schedule s;
  if (nranks <= 1) return s;
  if (rank == root) {
    for (int k = 1; k < nranks; ++k) {
      const int peer = wrap_rank(root + k, nranks);
      Step st;
      st.id = k;
      const Range block{static_cast<size_t>(peer) * count, count};
      if (to_root) {
        st.recv_from = peer;
        st.recv = block;
      } else {
        st.send_to = peer;
        st.send = block;
        st.send_from_input = true;
      }
      s.push_back(st);
    }
    return s;
  }
  Step st;
  st.id = wrap_rank(rank - root, nranks);
  if (to_root) {
    st.send_to = root;
    st.send = Range{0, count};
    st.send_from_input = true;
  } else {
    st.recv_from = root;
    st.recv = Range{0, count};
  }
  s.push_back(st);
  return s;
}

namespace {

// Empty messages between the root and every other rank, ids base+k (k: distance from the root).
Schedule root_signal(int rank, int nranks, int root, int base, bool to_root) {
  Schedule s;
  if (nranks <= 1) return s;
  if (rank == root) {
    for (int k = 1; k < nranks; ++k) {
      Step st;
      st.id = base + k;
      (to_root ? st.recv_from : st.send_to) = wrap_rank(root + k, nranks);
      s.push_back(st);
    }
    return s;
  }
  Step st;
  st.id = base + wrap_rank(rank - root, nranks);
  (to_root ? st.send_to : st.recv_from) = root;
  s.push_back(st);
  return s;
}

}  // namespace

Schedule rooted_ack(int rank, int nranks, int root) {
  return root_signal(rank, nranks, root, nranks, true);
}

Schedule rooted_token(int rank, int nranks, int root) {
  return root_signal(rank, nranks, root, 2 * nranks, false);
}

Schedule pairwise_alltoallv(int rank, int nranks, const std::vector<size_t>& sendcounts,
                            const std::vector<size_t>& sdispls,
                            const std::vector<size_t>& recvcounts,
                            const std::vector<size_t>& rdispls) {
  Schedule s;
  for (int k = 1; k < nranks; ++k) {
    Step st;
    st.id = k;
    st.send_to = wrap_rank(rank + k, nranks);
    st.send = Range{sdispls[st.send_to], sendcounts[st.send_to]};
    st.send_from_input = true;
    st.recv_from = wrap_rank(rank - k, nranks);
    st.recv = Range{rdispls[st.recv_from], recvcounts[st.recv_from]};
    s.push_back(st);
  }
  return s;
}

Schedule pairwise_token(int rank, int nranks) {
  Schedule s;
  for (int k = 1; k < nranks; ++k) {
    Step st;
    st.id = nranks + k;
    st.send_to = wrap_rank(rank + k, nranks);
    st.recv_from = wrap_rank(rank - k, nranks);
    s.push_back(st);
  }
  return s;
}

std::vector<Plan> spread_steps(const Schedule& steps, size_t max_plans) {
  const size_t nplans = std::min(steps.size(), std::max<size_t>(1, max_plans));
  std::vector<Plan> plans(nplans);
  for (size_t i = 0; i < steps.size(); ++i) plans[i % nplans].sched.push_back(steps[i]);
  return plans;
}

}  // namespace gw::coll
