// The uneven splits, inputs and exact check of `gradwire-perf alltoallv`.
//
// The split rule, written down so that a peer (perf/peers/mpi_alltoallv.c) reproduces it:
// every rank sends `total` elements (the size column divided by the element size). Rank s gives
// rank d the weight w(s,d) = 1 + (splitmix64(29 * 65536 + s * 256 + d) >> 61), an integer in
// 1..8 (29 is the fixed seed; splitmix64 as Steele, Lea and Flood define it). With W(s) the sum
// of rank s's weights, rank s sends floor(total * w(s,d) / W(s)) elements to every d < n-1 and
// the remainder to rank n-1. Send blocks lie in rank order from offset 0 of the send buffer,
// receive blocks in source order from offset 0 of the receive buffer. Element i of the block s
// sends to d holds (31 s + 7 d + i) mod 97, exact in every dtype (uint8 and float16 included).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "collectives/types.h"

namespace gw::perf {

inline constexpr uint64_t kAlltoallvSeed = 29;

// One rank's arguments of gw_alltoallv for one size (world entries per array).
struct AlltoallvLayout {
  std::vector<size_t> sendcounts, sdispls, recvcounts, rdispls;
  size_t send_total = 0;  // elements this rank sends (== total)
  size_t recv_total = 0;  // elements this rank receives
};

// splitmix64's output function on x.
uint64_t splitmix64(uint64_t x);

// w(src, d) for every d (1..8).
std::vector<uint64_t> alltoallv_weights(int world, int src);

// The elements rank `src` sends to each rank when every rank sends `total` elements.
std::vector<size_t> alltoallv_split(size_t total, int world, int src);

// Rank `rank`'s counts and displacements (world >= 1, 0 <= rank < world).
AlltoallvLayout alltoallv_layout(size_t total, int world, int rank);

// The most elements any rank receives at this total: the receive buffer every rank allocates.
size_t alltoallv_max_recv(size_t total, int world);

// Writes this rank's send blocks (the pattern above) into buf, laid out as `l` says.
void alltoallv_fill(void* buf, const AlltoallvLayout& l, coll::DataType dtype, int rank);

// The elements of this rank's receive blocks that differ from what the senders wrote.
size_t alltoallv_wrong(const void* buf, const AlltoallvLayout& l, coll::DataType dtype, int rank);

}  // namespace gw::perf
