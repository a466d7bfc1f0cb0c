#include "perf/coll_alltoallv.h"

#include <algorithm>

#include "collectives/reduce.h"

namespace gw::perf {
namespace {

using coll::DataType;

int64_t value(int src, int dst, size_t i) {
  return static_cast<int64_t>(
      (31 * static_cast<uint64_t>(src) + 7 * static_cast<uint64_t>(dst) + i) % 97);
}

void store(void* buf, size_t i, DataType t, int64_t v) {
  switch (t) {
    case DataType::kF32:
      static_cast<float*>(buf)[i] = static_cast<float>(v);
      break;
    case DataType::kF64:
      static_cast<double*>(buf)[i] = static_cast<double>(v);
      break;
    case DataType::kF16:
      static_cast<uint16_t*>(buf)[i] = coll::float_to_half(static_cast<float>(v));
      break;
    case DataType::kBF16:
      static_cast<uint16_t*>(buf)[i] = coll::float_to_bf16(static_cast<float>(v));
      break;
    case DataType::kI32:
      static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v);
      break;
    case DataType::kI64:
      static_cast<int64_t*>(buf)[i] = v;
      break;
    case DataType::kU8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(v);
      break;
  }
}

// Compared as raw elements: every pattern value is exact, so a bit-for-bit match is the check.
bool equals(const void* buf, size_t i, DataType t, int64_t v) {
  switch (t) {
    case DataType::kF32:
      return static_cast<const float*>(buf)[i] == static_cast<float>(v);
    case DataType::kF64:
      return static_cast<const double*>(buf)[i] == static_cast<double>(v);
    case DataType::kF16:
      return static_cast<const uint16_t*>(buf)[i] == coll::float_to_half(static_cast<float>(v));
    case DataType::kBF16:
      return static_cast<const uint16_t*>(buf)[i] == coll::float_to_bf16(static_cast<float>(v));
    case DataType::kI32:
      return static_cast<const int32_t*>(buf)[i] == static_cast<int32_t>(v);
    case DataType::kI64:
      return static_cast<const int64_t*>(buf)[i] == v;
    case DataType::kU8:
      return static_cast<const uint8_t*>(buf)[i] == static_cast<uint8_t>(v);
  }
  return false;
}

}  // namespace

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::vector<uint64_t> alltoallv_weights(int world, int src) {
  std::vector<uint64_t> w(static_cast<size_t>(world));
  for (size_t d = 0; d < w.size(); ++d) {
    w[d] = 1 + (splitmix64(kAlltoallvSeed * 65536 + static_cast<uint64_t>(src) * 256 + d) >> 61);
  }
  return w;
}

std::vector<size_t> alltoallv_split(size_t total, int world, int src) {
  const size_t n = static_cast<size_t>(world);
  const std::vector<uint64_t> w = alltoallv_weights(world, src);
  uint64_t sum = 0;
  for (uint64_t x : w) sum += x;
  std::vector<size_t> counts(n);
  size_t given = 0;
  for (size_t d = 0; d + 1 < n; ++d) {
    // total <= 2^40 elements and w <= 8: the product stays far below 2^64.
    counts[d] = static_cast<size_t>(static_cast<uint64_t>(total) * w[d] / sum);
    given += counts[d];
  }
  counts[n - 1] = total - given;
  return counts;
}

AlltoallvLayout alltoallv_layout(size_t total, int world, int rank) {
  const size_t n = static_cast<size_t>(world);
  AlltoallvLayout l;
  l.sendcounts = alltoallv_split(total, world, rank);
  l.sdispls.assign(n, 0);
  l.recvcounts.assign(n, 0);
  l.rdispls.assign(n, 0);
  for (size_t j = 0; j < n; ++j) {
    l.sdispls[j] = l.send_total;
    l.send_total += l.sendcounts[j];
    l.recvcounts[j] = alltoallv_split(total, world, static_cast<int>(j))[static_cast<size_t>(rank)];
    l.rdispls[j] = l.recv_total;
    l.recv_total += l.recvcounts[j];
  }
  return l;
}

size_t alltoallv_max_recv(size_t total, int world) {
  std::vector<size_t> recv(static_cast<size_t>(world), 0);
  for (int s = 0; s < world; ++s) {
    std::vector<size_t> c = alltoallv_split(total, world, s);
    for (size_t d = 0; d < c.size(); ++d) recv[d] += c[d];
  }
  size_t most = 0;
  for (size_t r : recv) most = std::max(most, r);
  return most;
}

void alltoallv_fill(void* buf, const AlltoallvLayout& l, DataType dtype, int rank) {
  for (size_t d = 0; d < l.sendcounts.size(); ++d) {
    for (size_t i = 0; i < l.sendcounts[d]; ++i) {
      store(buf, l.sdispls[d] + i, dtype, value(rank, static_cast<int>(d), i));
    }
  }
}

size_t alltoallv_wrong(const void* buf, const AlltoallvLayout& l, DataType dtype, int rank) {
  size_t wrong = 0;
  for (size_t s = 0; s < l.recvcounts.size(); ++s) {
    for (size_t i = 0; i < l.recvcounts[s]; ++i) {
      if (!equals(buf, l.rdispls[s] + i, dtype, value(static_cast<int>(s), rank, i))) ++wrong;
    }
  }
  return wrong;
}

}  // namespace gw::perf
