// gradwire-perf --check (perf/check_pattern.h) for the rooted collectives: the output each rank
// must hold is counted right, one corrupted element is one wrong element, and reduce and gather
// ask nothing of the ranks other than the root.
#include "perf/check_pattern.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace gw::perf {
namespace {

using coll::DataType;
using coll::ReduceOp;

constexpr int kWorld = 4;
constexpr int kRoot = 2;
constexpr size_t kCount = 37;  // per-rank block: not a multiple of anything

std::vector<int32_t> pattern(int rank, size_t first, size_t count) {
  std::vector<int32_t> v(count);
  fill_pattern(v.data(), count, DataType::kI32, ReduceOp::kSum, kWorld, rank, first);
  return v;
}

TEST(CheckPatternTest, ReduceIsCheckedAtTheRootOnly) {
  std::vector<int32_t> sum(kCount, 0);
  for (int r = 0; r < kWorld; ++r) {
    auto p = pattern(r, 0, kCount);
    for (size_t i = 0; i < kCount; ++i) sum[i] += p[i];
  }
  EXPECT_EQ(count_wrong(Collective::kReduce, sum.data(), kCount, DataType::kI32, ReduceOp::kSum,
                        kWorld, kRoot, kRoot),
            0u);
  sum[5] += 1;
  EXPECT_EQ(count_wrong(Collective::kReduce, sum.data(), kCount, DataType::kI32, ReduceOp::kSum,
                        kWorld, kRoot, kRoot),
            1u);
  std::vector<int32_t> junk(kCount, -1);  // a non-root's recvbuf is not the reduce's output
  EXPECT_EQ(count_wrong(Collective::kReduce, junk.data(), kCount, DataType::kI32, ReduceOp::kSum,
                        kWorld, 0, kRoot),
            0u);
  EXPECT_EQ(count_wrong(Collective::kReduce, junk.data(), kCount, DataType::kI32, ReduceOp::kSum,
                        kWorld, kRoot, kRoot),
            kCount);
}

TEST(CheckPatternTest, GatherIsEveryRanksBlockInRankOrderAtTheRoot) {
  std::vector<int32_t> out;
  for (int r = 0; r < kWorld; ++r) {
    auto p = pattern(r, 0, kCount);
    out.insert(out.end(), p.begin(), p.end());
  }
  EXPECT_EQ(count_wrong(Collective::kGather, out.data(), kCount, DataType::kI32, ReduceOp::kSum,
                        kWorld, kRoot, kRoot),
            0u);
  // Two blocks swapped: every element of both is wrong (the patterns differ by rank).
  std::vector<int32_t> swapped = out;
  std::copy(out.begin(), out.begin() + kCount, swapped.begin() + kCount);
  std::copy(out.begin() + kCount, out.begin() + 2 * kCount, swapped.begin());
  EXPECT_GT(count_wrong(Collective::kGather, swapped.data(), kCount, DataType::kI32, ReduceOp::kSum,
                        kWorld, kRoot, kRoot),
            kCount);
  std::vector<int32_t> junk(kWorld * kCount, -1);
  EXPECT_EQ(count_wrong(Collective::kGather, junk.data(), kCount, DataType::kI32, ReduceOp::kSum,
                        kWorld, 1, kRoot),
            0u);
}

TEST(CheckPatternTest, ScatterGivesEachRankItsBlockOfTheRootsInput) {
  for (int rank = 0; rank < kWorld; ++rank) {
    auto mine = pattern(kRoot, static_cast<size_t>(rank) * kCount, kCount);
    EXPECT_EQ(count_wrong(Collective::kScatter, mine.data(), kCount, DataType::kI32, ReduceOp::kSum,
                          kWorld, rank, kRoot),
              0u)
        << "rank " << rank;
    // The block of another rank, or this rank's block of its own input, is wrong.
    auto other = pattern(kRoot, static_cast<size_t>((rank + 1) % kWorld) * kCount, kCount);
    EXPECT_GT(count_wrong(Collective::kScatter, other.data(), kCount, DataType::kI32,
                          ReduceOp::kSum, kWorld, rank, kRoot),
              0u)
        << "rank " << rank;
    if (rank != kRoot) {
      auto own = pattern(rank, static_cast<size_t>(rank) * kCount, kCount);
      EXPECT_GT(count_wrong(Collective::kScatter, own.data(), kCount, DataType::kI32,
                            ReduceOp::kSum, kWorld, rank, kRoot),
                0u)
          << "rank " << rank;
    }
  }
}

}  // namespace
}  // namespace gw::perf
