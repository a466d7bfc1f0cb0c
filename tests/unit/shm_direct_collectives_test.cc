// The direct allgather, reduce-scatter, broadcast and alltoall within one host over shm
// (collectives/shm_direct.h). Reduce-scatter and alltoall read the peers' inputs and allgather
// the peers' outputs with process_vm_readv, or from their mappings when every buffer is
// gw_mem_alloc memory (a shared region); broadcast takes the path only with the root's buffer in
// a shared region (the ring otherwise). Every dtype and op (reduce-scatter), odd sizes, in place
// and out of place, on 2, 3 and 4 ranks, every root (broadcast); the ring kept for a broadcast
// from the heap, below GW_SHM_DIRECT_MIN, with an algorithm forced, and for a reduce-scatter
// output that overlaps its input elsewhere than at its block; a peer that goes away mid-call.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/coll_config.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"
#include "collectives/shared_host_memory.h"
#include "collectives/shm_direct.h"
#include "core/net/shm_config.h"
#include "tests/support/dtype_values.h"
#include "tests/support/ranks.h"

namespace gw::coll {
namespace {

// Element i of rank r's input: 1..3 in the dtype, so that every sum and product of up to 4 ranks
// is exact in every type.
std::vector<uint8_t> input(DataType t, int r, size_t count) {
  std::vector<uint8_t> buf(count * dtype_size(t));
  for (size_t i = 0; i < count; ++i) {
    const int v = 1 + static_cast<int>((i * 7 + static_cast<size_t>(r) * 5) % 3);
    gw::testing::encode(t, v, buf.data() + i * dtype_size(t));
  }
  return buf;
}

testing::RankOptions shm_ranks(const char* min_bytes, const config::Row* force = nullptr) {
  testing::RankOptions o;
  o.backend = "shm";
  o.timeout_ms = 60000;
  o.tweak = [=](CommOptions& c, int) {
    c.transport = "shm";
    auto a = config::Snapshot::capture().with(coll_config::kShmDirectMin, min_bytes);
    EXPECT_TRUE(a.ok()) << a.status().to_string();
    auto b = a->with(net::shm_config::kShmCmaInjectRefuse, "0");
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    if (force != nullptr) b = b->with(*force, "ring");
    EXPECT_TRUE(b.ok()) << b.status().to_string();
    c.config = *b;
  };
  return o;
}

// 70001: more than one 256 KiB piece of the reduction for every dtype of 4 bytes or more.
const size_t kCounts[] = {1, 3, 1001, 70001};

// A rank's buffer of `bytes`: heap memory, or (shared) a region of shared host memory as
// gw_mem_alloc gives in direct mode.
class Buf {
 public:
  Buf(size_t bytes, bool shared) : heap_(shared ? 0 : bytes), bytes_(bytes) {
    if (shared) {
      auto p = shared_host_memory::allocate(std::max<size_t>(bytes, 1));
      EXPECT_TRUE(p.ok()) << p.status().to_string();
      if (p.ok()) shared_ = static_cast<uint8_t*>(*p);
    }
  }
  ~Buf() {
    if (shared_) {
      EXPECT_TRUE(shared_host_memory::release(shared_));
    }
  }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  uint8_t* data() { return shared_ ? shared_ : heap_.data(); }
  std::vector<uint8_t> bytes() { return std::vector<uint8_t>(data(), data() + bytes_); }
  void set(const std::vector<uint8_t>& v, size_t at = 0) {
    std::memcpy(data() + at, v.data(), v.size());
  }

 private:
  std::vector<uint8_t> heap_;
  uint8_t* shared_ = nullptr;
  size_t bytes_;
};

// Every rank gathers every rank's block; returns the calls that took the direct path. shared:
// the ranks whose bit is set take their buffers from shared host memory.
uint64_t run_allgather(int n, const testing::RankOptions& options, unsigned shared) {
  const uint64_t before = ShmDirect::calls();
  testing::run_ranks(n, options, [&](std::unique_ptr<Communicator>& comm, int r) {
    const bool mine_shared = (shared >> r) & 1;
    for (DataType t : {DataType::kU8, DataType::kF32, DataType::kF64}) {
      const size_t es = dtype_size(t);
      for (size_t count : kCounts) {
        std::vector<uint8_t> want;
        for (int q = 0; q < n; ++q) {
          const auto b = input(t, q, count);
          want.insert(want.end(), b.begin(), b.end());
        }
        // Out of place; in place at the rank's own block; in place at the start (the caller's
        // input at 0, as some frameworks pass it).
        for (int mode = 0; mode < 3; ++mode) {
          const std::vector<uint8_t> mine = input(t, r, count);
          Buf send(mine.size(), mine_shared), out(want.size(), mine_shared);
          send.set(mine);
          out.set(std::vector<uint8_t>(want.size(), 0xEE));
          const uint8_t* src = send.data();
          if (mode == 1) {
            out.set(mine, r * count * es);
            src = out.data() + r * count * es;
          } else if (mode == 2) {
            out.set(mine);
            src = out.data();
          }
          Status s = comm->allgather(src, out.data(), count, t);
          ASSERT_TRUE(s.ok()) << s.to_string();
          ASSERT_EQ(out.bytes(), want) << "rank " << r << " of " << n << ": " << dtype_name(t)
                                       << " count " << count << " mode " << mode;
          if (mode == 0) {
            ASSERT_EQ(send.bytes(), mine) << "the input changed";
          }
        }
      }
    }
  });
  return ShmDirect::calls() - before;
}

// Every dtype and op; returns the calls that took the direct path. overlap_at_start: every
// rank's output is the start of its input (block 0), which the direct path must refuse on every
// rank (ranks but 0 would overwrite a block a peer reads).
uint64_t run_reduce_scatter(int n, const testing::RankOptions& options, unsigned shared = 0,
                            bool overlap_at_start = false) {
  const uint64_t before = ShmDirect::calls();
  testing::run_ranks(n, options, [&](std::unique_ptr<Communicator>& comm, int r) {
    const bool mine_shared = (shared >> r) & 1;
    for (int ti = 0; ti < kNumDataTypes; ++ti) {
      for (int oi = 0; oi < kNumReduceOps; ++oi) {
        for (size_t count : kCounts) {
          const auto t = static_cast<DataType>(ti);
          const auto op = static_cast<ReduceOp>(oi);
          const size_t es = dtype_size(t), total = count * static_cast<size_t>(n);
          // The reduction of block r of every rank's input.
          std::vector<uint8_t> want = input(t, 0, total), other;
          for (int q = 1; q < n; ++q) {
            other = input(t, q, total);
            reduce_portable(t, op, want.data(), other.data(), want.data(), total);
          }
          want = std::vector<uint8_t>(want.begin() + r * count * es,
                                      want.begin() + (r + 1) * count * es);
          if (op == ReduceOp::kAvg) finalize_avg(t, want.data(), count, n);
          for (bool in_place : {false, true}) {
            const std::vector<uint8_t> mine = input(t, r, total);
            Buf in(mine.size(), mine_shared), out(count * es, mine_shared);
            in.set(mine);
            out.set(std::vector<uint8_t>(count * es, 0xEE));
            uint8_t* dst = out.data();
            if (overlap_at_start) {
              dst = in.data();
            } else if (in_place) {
              dst = in.data() + r * count * es;
            }
            Status s = comm->reduce_scatter(in.data(), dst, count, t, op);
            ASSERT_TRUE(s.ok()) << s.to_string();
            ASSERT_EQ(0, std::memcmp(dst, want.data(), want.size()))
                << "rank " << r << " of " << n << ": " << dtype_name(t) << " " << op_name(op)
                << " count " << count << (in_place ? " in place" : " out of place");
            if (!in_place && !overlap_at_start) {
              ASSERT_EQ(in.bytes(), mine) << "the input changed";
            }
            if (overlap_at_start) break;
          }
        }
      }
    }
  });
  return ShmDirect::calls() - before;
}

// Every root; returns the calls that took the direct path. shared as run_allgather's.
uint64_t run_broadcast(int n, const testing::RankOptions& options, unsigned shared) {
  const uint64_t before = ShmDirect::calls();
  testing::run_ranks(n, options, [&](std::unique_ptr<Communicator>& comm, int r) {
    for (int root = 0; root < n; ++root) {
      for (size_t count : kCounts) {
        const std::vector<uint8_t> want = input(DataType::kF32, root + 10, count);
        Buf buf(want.size(), (shared >> r) & 1);
        buf.set(r == root ? want : std::vector<uint8_t>(want.size(), 0xEE));
        Status s = comm->broadcast(buf.data(), count, DataType::kF32, root);
        ASSERT_TRUE(s.ok()) << s.to_string();
        ASSERT_EQ(buf.bytes(), want)
            << "rank " << r << " of " << n << ", root " << root << ", count " << count;
      }
    }
  });
  return ShmDirect::calls() - before;
}

// Every rank's block r of every input to rank r; in place too (which keeps the pairwise
// exchange: the caller's copy of the input is on the heap). Returns the direct calls.
uint64_t run_alltoall(int n, const testing::RankOptions& options, unsigned shared) {
  const uint64_t before = ShmDirect::calls();
  testing::run_ranks(n, options, [&](std::unique_ptr<Communicator>& comm, int r) {
    const bool mine_shared = (shared >> r) & 1;
    for (DataType t : {DataType::kU8, DataType::kF64}) {
      const size_t es = dtype_size(t);
      for (size_t count : kCounts) {
        const size_t blk = count * es;
        std::vector<uint8_t> want;
        for (int q = 0; q < n; ++q) {
          const auto theirs = input(t, q + 20, count * static_cast<size_t>(n));
          want.insert(want.end(), theirs.begin() + r * blk, theirs.begin() + (r + 1) * blk);
        }
        const std::vector<uint8_t> mine = input(t, r + 20, count * static_cast<size_t>(n));
        for (bool in_place : {false, true}) {
          Buf in(mine.size(), mine_shared), out(mine.size(), mine_shared);
          in.set(mine);
          out.set(std::vector<uint8_t>(mine.size(), 0xEE));
          uint8_t* dst = in_place ? in.data() : out.data();
          Status s = comm->alltoall(in.data(), dst, count, t);
          ASSERT_TRUE(s.ok()) << s.to_string();
          ASSERT_EQ(0, std::memcmp(dst, want.data(), want.size()))
              << "rank " << r << " of " << n << ": " << dtype_name(t) << " count " << count
              << (in_place ? " in place" : " out of place");
          if (!in_place) {
            ASSERT_EQ(in.bytes(), mine) << "the input changed";
          }
        }
      }
    }
  });
  return ShmDirect::calls() - before;
}

constexpr uint64_t kCounts_n = sizeof(kCounts) / sizeof(kCounts[0]);

TEST(ShmDirectCollectives, AllgatherOfEverySizeAndPlacementWithMappedOutputs) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    const uint64_t shared0 = ShmDirect::shared_calls();
    // GW_SHM_DIRECT_MIN=1: every call takes the path, so each rank counts every call.
    const uint64_t calls = 3 * kCounts_n * 3 * static_cast<uint64_t>(n);
    EXPECT_EQ(run_allgather(n, shm_ranks("1"), /*shared=*/0xF), calls);
    EXPECT_EQ(ShmDirect::shared_calls() - shared0, calls);
  }
}

TEST(ShmDirectCollectives, AllgatherOnTheHeapOrWithOneRankOnItReadsThePeersOutputs) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    const uint64_t shared0 = ShmDirect::shared_calls(), read0 = ShmDirect::bytes_read();
    const uint64_t calls = 3 * kCounts_n * 3 * static_cast<uint64_t>(n);
    EXPECT_EQ(run_allgather(n, shm_ranks("1"), 0), calls);
    EXPECT_EQ(ShmDirect::shared_calls(), shared0);
    EXPECT_GT(ShmDirect::bytes_read(), read0) << "the heap's calls read with process_vm_readv";
  }
  const uint64_t shared1 = ShmDirect::shared_calls();
  EXPECT_EQ(run_allgather(3, shm_ranks("1"), /*shared=*/0x5), 3 * kCounts_n * 3 * 3)
      << "rank 1 on the heap";
  EXPECT_EQ(ShmDirect::shared_calls(), shared1);
}

TEST(ShmDirectCollectives, AHeapAllgatherReadsEachPeersBlockOnce) {
  // 3 ranks, 4 MiB blocks of f32: each rank reads the two other blocks, once.
  const uint64_t read0 = ShmDirect::bytes_read();
  const size_t count = size_t{1} << 20;
  testing::run_ranks(3, shm_ranks("1M"), [&](std::unique_ptr<Communicator>& comm, int r) {
    std::vector<float> mine(count, static_cast<float>(r + 1)), all(3 * count, 0.0f);
    ASSERT_TRUE(comm->allgather(mine.data(), all.data(), count, DataType::kF32).ok());
    for (size_t i = 0; i < all.size(); i += 4099) {
      ASSERT_EQ(all[i], static_cast<float>(i / count + 1)) << "rank " << r << " at " << i;
    }
  });
  EXPECT_EQ(ShmDirect::bytes_read() - read0, 3 * 2 * count * sizeof(float));
}

TEST(ShmDirectCollectives, ReduceScatterOfEveryDtypeAndOpReadFromTheHeap) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    const uint64_t calls = kNumDataTypes * kNumReduceOps * kCounts_n * 2 * static_cast<uint64_t>(n);
    const uint64_t shared0 = ShmDirect::shared_calls(), read0 = ShmDirect::bytes_read();
    EXPECT_EQ(run_reduce_scatter(n, shm_ranks("1")), calls);
    EXPECT_GT(ShmDirect::bytes_read(), read0) << "the heap's calls read with process_vm_readv";
    EXPECT_EQ(ShmDirect::shared_calls(), shared0);
  }
}

TEST(ShmDirectCollectives, ReduceScatterOfEveryDtypeAndOpFromMappedInputs) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    const uint64_t calls = kNumDataTypes * kNumReduceOps * kCounts_n * 2 * static_cast<uint64_t>(n);
    const uint64_t shared0 = ShmDirect::shared_calls(), read0 = ShmDirect::bytes_read();
    EXPECT_EQ(run_reduce_scatter(n, shm_ranks("1"), /*shared=*/0xF), calls);
    EXPECT_EQ(ShmDirect::shared_calls() - shared0, calls);
    EXPECT_EQ(ShmDirect::bytes_read(), read0) << "mapped inputs need no cross-memory read";
  }
  // One rank's input on the heap: every rank reads with process_vm_readv, results alike.
  const uint64_t shared1 = ShmDirect::shared_calls();
  EXPECT_EQ(run_reduce_scatter(3, shm_ranks("1"), /*shared=*/0x3),
            kNumDataTypes * kNumReduceOps * kCounts_n * 2 * 3);
  EXPECT_EQ(ShmDirect::shared_calls(), shared1);
}

TEST(ShmDirectCollectives, BroadcastFromEveryRootWithItsBufferMapped) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    EXPECT_EQ(run_broadcast(n, shm_ranks("1"), /*shared=*/0xF),
              kCounts_n * static_cast<uint64_t>(n) * static_cast<uint64_t>(n));
  }
  // Only the root's buffer matters: with rank 0's in shared memory, the calls rooted there take
  // the path (3 ranks each), the others keep the ring.
  EXPECT_EQ(run_broadcast(3, shm_ranks("1"), /*shared=*/0x1), kCounts_n * 3);
  EXPECT_EQ(run_broadcast(2, shm_ranks("1"), 0), 0u) << "on the heap: the ring";
}

TEST(ShmDirectCollectives, AlltoallFromMappedInputsOrFromTheHeap) {
  // 2 dtypes x 4 counts, out of place and in place (which copies the input to the heap first).
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    const uint64_t shared0 = ShmDirect::shared_calls(), read0 = ShmDirect::bytes_read();
    const uint64_t per_mode = 2 * kCounts_n * static_cast<uint64_t>(n);
    EXPECT_EQ(run_alltoall(n, shm_ranks("1"), /*shared=*/0xF), 2 * per_mode);
    EXPECT_EQ(ShmDirect::shared_calls() - shared0, per_mode) << "out of place: the mappings";
    EXPECT_GT(ShmDirect::bytes_read(), read0) << "in place: process_vm_readv of the copies";
  }
  const uint64_t shared1 = ShmDirect::shared_calls(), read1 = ShmDirect::bytes_read();
  EXPECT_EQ(run_alltoall(2, shm_ranks("1"), 0), 2 * 2 * kCounts_n * 2) << "on the heap";
  EXPECT_EQ(run_alltoall(3, shm_ranks("1"), 0x6), 2 * 2 * kCounts_n * 3) << "rank 0 on the heap";
  EXPECT_EQ(ShmDirect::shared_calls(), shared1);
  EXPECT_GT(ShmDirect::bytes_read(), read1);
  EXPECT_EQ(run_alltoall(2, shm_ranks("4M"), 0x3), 0u) << "below the threshold";
}

TEST(ShmDirectCollectives, AHeapAlltoallReadsEachPeersBlockOnce) {
  // 3 ranks, 1 MiB blocks of f32, out of place: each rank reads its block of the two others.
  const uint64_t read0 = ShmDirect::bytes_read();
  const size_t count = size_t{1} << 18;
  testing::run_ranks(3, shm_ranks("1M"), [&](std::unique_ptr<Communicator>& comm, int r) {
    std::vector<float> in(3 * count), out(3 * count, -1.0f);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(r * 10 + i / count);
    ASSERT_TRUE(comm->alltoall(in.data(), out.data(), count, DataType::kF32).ok());
    for (size_t i = 0; i < out.size(); i += 997) {
      ASSERT_EQ(out[i], static_cast<float>((i / count) * 10 + r)) << "rank " << r << " at " << i;
    }
  });
  EXPECT_EQ(ShmDirect::bytes_read() - read0, 3 * 2 * count * sizeof(float));
}

TEST(ShmDirectCollectives, AnOutputOverlappingTheInputElsewhereKeepsTheRingOnEveryRank) {
  // Ranks 1.. write their block at the start of their input, which rank 0 reads: every rank sees
  // every descriptor and every rank takes the ring, with the right results.
  EXPECT_EQ(run_reduce_scatter(3, shm_ranks("1"), 0, /*overlap_at_start=*/true), 0u);
  EXPECT_EQ(run_reduce_scatter(3, shm_ranks("1"), 0x7, /*overlap_at_start=*/true), 0u);
}

TEST(ShmDirectCollectives, BelowTheThresholdOrWithAnAlgorithmForcedTheRingRuns) {
  // 70001 x 8 x 4 ranks is the largest whole buffer above: below 4M every call keeps the ring.
  EXPECT_EQ(run_allgather(2, shm_ranks("4M"), 0x3), 0u);
  EXPECT_EQ(run_broadcast(2, shm_ranks("4M"), 0x3), 0u);
  EXPECT_EQ(run_reduce_scatter(2, shm_ranks("4M")), 0u);
  EXPECT_EQ(run_allgather(2, shm_ranks("1", &coll_config::kAlgoAllgather), 0x3), 0u);
  EXPECT_EQ(run_reduce_scatter(2, shm_ranks("1", &coll_config::kAlgoReduceScatter)), 0u);
  EXPECT_EQ(run_broadcast(2, shm_ranks("1", &coll_config::kAlgoBroadcast), 0x3), 0u);
  EXPECT_EQ(run_reduce_scatter(2, shm_ranks("0")), 0u) << "0 turns the path off";
}

TEST(ShmDirectCollectives, APeerThatGoesAwayFailsTheCall) {
  // Both ranks run one direct reduce-scatter; then rank 1 destroys its communicator while rank 0
  // is in the next one. Rank 0 fails with kPeer long before its 60 s deadline.
  testing::run_ranks(2, shm_ranks("1"), [&](std::unique_ptr<Communicator>& comm, int r) {
    const size_t count = 1 << 20;
    std::vector<float> in(2 * count, 1.0f), out(count);
    ASSERT_TRUE(
        comm->reduce_scatter(in.data(), out.data(), count, DataType::kF32, ReduceOp::kSum).ok());
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm.reset();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    Status s = comm->reduce_scatter(in.data(), out.data(), count, DataType::kF32, ReduceOp::kSum);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
    EXPECT_LT(took, std::chrono::seconds(30)) << "waited out its deadline";
  });
}

}  // namespace
}  // namespace gw::coll
