// The direct allreduce within one host over shm (collectives/shm_direct.h): every dtype and op,
// odd sizes, in place and out of place, on 2, 3 and 4 ranks; the knob that turns it off; the
// refused probe (every rank keeps the ring); a peer that goes away; large heap buffers (streamed
// stores, huge pages); the cross-memory reads' and writes' failures. Its shared-buffer form
// (buffers in collectives/shared_host_memory.h regions, mapped by the peers): the same results,
// a rank on the heap, a region a peer cannot map, the few regions kept per peer, bad references.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <barrier>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "collectives/coll_config.h"
#include "collectives/communicator.h"
#include "collectives/reduce.h"
#include "collectives/shared_host_memory.h"
#include "collectives/shm_direct.h"
#include "core/net/shm_cma.h"
#include "core/net/shm_config.h"
#include "core/store.h"
#include "core/sys/huge_pages.h"
#include "tests/support/dtype_values.h"
#include "tests/support/exec_child.h"
#include "tests/support/ranks.h"

namespace gw::coll {
namespace {

// Element i of rank r's input: a small integer (1..3) in the dtype, so that every sum and product
// of up to 4 ranks is exact in every type and the order of the reduction does not matter.
void fill(DataType t, int r, std::vector<uint8_t>& buf, size_t count) {
  buf.assign(count * dtype_size(t), 0);
  for (size_t i = 0; i < count; ++i) {
    const int v = 1 + static_cast<int>((i * 7 + static_cast<size_t>(r) * 5) % 3);
    gw::testing::encode(t, v, buf.data() + i * dtype_size(t));
  }
}

std::vector<uint8_t> expected(DataType t, ReduceOp op, int n, size_t count) {
  std::vector<uint8_t> acc, in;
  fill(t, 0, acc, count);
  for (int r = 1; r < n; ++r) {
    fill(t, r, in, count);
    reduce_portable(t, op, acc.data(), in.data(), acc.data(), count);
  }
  if (op == ReduceOp::kAvg) finalize_avg(t, acc.data(), count, n);
  return acc;
}

config::Snapshot knobs(const char* min_bytes, bool refuse) {
  auto a = config::Snapshot::capture().with(coll_config::kShmDirectMin, min_bytes);
  EXPECT_TRUE(a.ok()) << a.status().to_string();
  auto b = a->with(net::shm_config::kShmCmaInjectRefuse, refuse ? "1" : "0");
  EXPECT_TRUE(b.ok()) << b.status().to_string();
  return *b;
}

testing::RankOptions shm_ranks(const char* min_bytes, bool refuse = false) {
  testing::RankOptions o;
  o.backend = "shm";
  o.timeout_ms = 60000;
  o.tweak = [=](CommOptions& c, int) {
    c.transport = "shm";
    c.config = knobs(min_bytes, refuse);
  };
  return o;
}

// A buffer of `bytes` in a shared host memory region (gw_mem_alloc's memory in direct mode),
// released when it goes.
class SharedBuf {
 public:
  explicit SharedBuf(size_t bytes) {
    auto p = shared_host_memory::allocate(bytes);
    EXPECT_TRUE(p.ok()) << p.status().to_string();
    if (p.ok()) p_ = static_cast<uint8_t*>(*p);
    bytes_ = bytes;
  }
  ~SharedBuf() {
    if (p_) {
      EXPECT_TRUE(shared_host_memory::release(p_));
    }
  }
  SharedBuf(const SharedBuf&) = delete;
  SharedBuf& operator=(const SharedBuf&) = delete;
  uint8_t* data() const { return p_; }
  size_t size() const { return bytes_; }

 private:
  uint8_t* p_ = nullptr;
  size_t bytes_ = 0;
};

// Every dtype and op, in place and not, over sizes that are multiples of nothing (and smaller
// than the number of ranks), on n ranks; returns how many calls took the direct path. shared:
// the ranks whose bit is set in it take their buffers from shared host memory (the values are
// copied in and out of it), the others from the heap.
uint64_t run_all(int n, const testing::RankOptions& options, unsigned shared = 0) {
  const uint64_t before = ShmDirect::calls();
  const size_t counts[] = {1, 3, 1001, 100003};
  testing::run_ranks(n, options, [&](std::unique_ptr<Communicator>& comm, int r) {
    const bool mine_shared = (shared >> r) & 1;
    const size_t most = 100003 * 8;
    std::unique_ptr<SharedBuf> sin, sout;
    if (mine_shared) {
      sin = std::make_unique<SharedBuf>(most);
      sout = std::make_unique<SharedBuf>(most);
    }
    std::vector<uint8_t> in, out, keep;
    for (int ti = 0; ti < kNumDataTypes; ++ti) {
      for (int oi = 0; oi < kNumReduceOps; ++oi) {
        for (size_t count : counts) {
          for (bool in_place : {false, true}) {
            const auto t = static_cast<DataType>(ti);
            const auto op = static_cast<ReduceOp>(oi);
            const std::vector<uint8_t> want = expected(t, op, n, count);
            fill(t, r, in, count);
            keep = in;
            out.assign(in.size(), 0xEE);
            uint8_t* src = in.data();
            uint8_t* dst = in_place ? in.data() : out.data();
            if (mine_shared) {
              std::memcpy(sin->data(), in.data(), in.size());
              std::memset(sout->data(), 0xEE, in.size());
              src = sin->data();
              dst = in_place ? sin->data() : sout->data();
            }
            Status s = comm->allreduce(src, dst, count, t, op);
            ASSERT_TRUE(s.ok()) << s.to_string();
            if (mine_shared) {
              std::memcpy(in_place ? in.data() : out.data(), dst, in.size());
              if (!in_place) std::memcpy(in.data(), sin->data(), in.size());
              dst = in_place ? in.data() : out.data();
            }
            const auto* got = static_cast<const uint8_t*>(dst);
            ASSERT_EQ(0, std::memcmp(got, want.data(), want.size()))
                << "rank " << r << " of " << n << ": " << dtype_name(t) << " " << op_name(op)
                << " count " << count << (in_place ? " in place" : " out of place");
            if (!in_place) {
              ASSERT_EQ(in, keep) << "the input changed";
            }
          }
        }
      }
    }
  });
  return ShmDirect::calls() - before;
}

constexpr uint64_t kCallsPerRank = kNumDataTypes * kNumReduceOps * 4 * 2;

TEST(ShmDirectAllreduce, EveryDtypeOpAndOddSizeOnTwoThreeAndFourRanks) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    // GW_SHM_DIRECT_MIN=1: every call takes the path, so each rank counts every call.
    EXPECT_EQ(run_all(n, shm_ranks("1")), kCallsPerRank * static_cast<uint64_t>(n));
  }
}

TEST(ShmDirectAllreduce, ReadsThePeersBlocksAndWritesTheirOutputsOnce) {
  // 2 ranks, 1 MiB of f32: each rank reads the peer's half of the input, reduces it with its own
  // and writes the result into the peer's output (and its own): one read and one write of a half
  // per rank.
  const uint64_t read0 = ShmDirect::bytes_read(), written0 = ShmDirect::bytes_written();
  const size_t count = 262144;
  testing::run_ranks(2, shm_ranks("1M"), [&](std::unique_ptr<Communicator>& comm, int r) {
    std::vector<float> v(count, static_cast<float>(r + 1));
    ASSERT_TRUE(comm->allreduce(v.data(), v.data(), count, DataType::kF32, ReduceOp::kSum).ok());
    for (size_t i = 0; i < count; i += 4099) ASSERT_EQ(v[i], 3.0f);
  });
  EXPECT_EQ(ShmDirect::bytes_read() - read0, 2 * (count / 2) * sizeof(float));
  EXPECT_EQ(ShmDirect::bytes_written() - written0, 2 * (count / 2) * sizeof(float));
}

// Heap buffers above the non-temporal store threshold (16 MiB) and the huge-page size (8 MiB),
// an odd count, 2 and 3 ranks, out of place three times (sum) and in place twice (avg): the
// results, and whether the ranks asked the kernel for huge pages (from each buffer's second
// call on; GW_SHM_HUGEPAGES=0: never).
void large_heap_calls(bool hugepages) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    const size_t count = (size_t{20} << 20) / 4 + 7;
    const uint64_t calls0 = ShmDirect::calls();
    const uint64_t tried0 = sys::HugePageCollapser::attempts();
    testing::RankOptions o = shm_ranks("1M");
    o.tweak = [=](CommOptions& c, int) {
      c.transport = "shm";
      auto k = knobs("1M", false).with(coll_config::kShmHugepages, hugepages ? "1" : "0");
      ASSERT_TRUE(k.ok()) << k.status().to_string();
      c.config = *k;
    };
    testing::run_ranks(n, o, [&](std::unique_ptr<Communicator>& comm, int r) {
      std::vector<float> in(count), out(count, -1.0f);
      for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i % 1000) * (r + 1));
      const float tri = static_cast<float>(n * (n + 1) / 2);
      for (int call = 0; call < 3; ++call) {
        std::fill(out.begin(), out.end(), -1.0f);
        ASSERT_TRUE(
            comm->allreduce(in.data(), out.data(), count, DataType::kF32, ReduceOp::kSum).ok());
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[i], tri * static_cast<float>(i % 1000)) << "rank " << r << " at " << i;
          ASSERT_EQ(in[i], static_cast<float>((i % 1000) * (r + 1))) << "the input changed";
        }
      }
      for (int call = 0; call < 2; ++call) {
        for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i % 1000) * (r + 1));
        ASSERT_TRUE(
            comm->allreduce(in.data(), in.data(), count, DataType::kF32, ReduceOp::kAvg).ok());
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(in[i], tri * static_cast<float>(i % 1000) / static_cast<float>(n))
              << "rank " << r << " at " << i;
        }
      }
    });
    EXPECT_EQ(ShmDirect::calls() - calls0, 5u * static_cast<uint64_t>(n));
    // Each rank: its input on the second call (out of place), its output on the second.
    if (hugepages) {
      EXPECT_GE(sys::HugePageCollapser::attempts() - tried0, 2u * static_cast<uint64_t>(n));
    } else {
      EXPECT_EQ(sys::HugePageCollapser::attempts(), tried0);
    }
  }
}

TEST(ShmDirectAllreduce, LargeHeapCallsStreamTheirStoresAndAskForHugePages) {
  large_heap_calls(true);
}

TEST(ShmDirectAllreduce, TheHugePageKnobOffLeavesTheBuffersAlone) { large_heap_calls(false); }

TEST(ShmDirectAllreduce, KnobZeroKeepsTheRing) { EXPECT_EQ(run_all(2, shm_ranks("0")), 0u); }

TEST(ShmDirectAllreduce, BelowTheThresholdKeepsTheRing) {
  // 100003 u8 elements are the largest call of run_all: below 1M every call stays on the ring.
  EXPECT_EQ(run_all(3, shm_ranks("1M")), 0u);
}

TEST(ShmDirectAllreduce, RefusedProbeFallsBackOnEveryRank) {
  // One rank's probe fails as when ptrace access is refused: every rank keeps the ring, for every
  // later call too, with the right results.
  testing::RankOptions o = shm_ranks("1");
  o.tweak = [](CommOptions& c, int r) {
    c.transport = "shm";
    c.config = knobs("1", r == 1);
  };
  EXPECT_EQ(run_all(3, o), 0u);
  EXPECT_EQ(run_all(2, shm_ranks("1", /*refuse=*/true)), 0u);
}

TEST(ShmSharedAllreduce, EveryDtypeOpAndOddSizeWithMappedBuffers) {
  for (int n : {2, 3}) {
    SCOPED_TRACE(n);
    const uint64_t shared0 = ShmDirect::shared_calls(), read0 = ShmDirect::bytes_read();
    EXPECT_EQ(run_all(n, shm_ranks("1"), /*shared=*/0xF), kCallsPerRank * static_cast<uint64_t>(n));
    EXPECT_EQ(ShmDirect::shared_calls() - shared0, kCallsPerRank * static_cast<uint64_t>(n));
    EXPECT_EQ(ShmDirect::bytes_read(), read0) << "a shared call read with process_vm_readv";
  }
  EXPECT_EQ(shared_host_memory::count(), 0u);
}

TEST(ShmSharedAllreduce, ARankOnTheHeapKeepsTheCrossMemoryReads) {
  // Ranks 0 and 2 in shared memory, rank 1 not: every rank reads with process_vm_readv.
  const uint64_t shared0 = ShmDirect::shared_calls();
  EXPECT_EQ(run_all(3, shm_ranks("1"), /*shared=*/0x5), kCallsPerRank * 3);
  EXPECT_EQ(ShmDirect::shared_calls(), shared0);
}

TEST(ShmSharedAllreduce, LargeCallsStreamTheirStoresInPlaceAndNot) {
  // Above the non-temporal store threshold (4 MiB), an odd count, 2 and 3 ranks.
  for (int n : {2, 3}) {
    const size_t count = (size_t{6} << 20) / 4 + 7;
    const uint64_t shared0 = ShmDirect::shared_calls();
    testing::run_ranks(n, shm_ranks("1M"), [&](std::unique_ptr<Communicator>& comm, int r) {
      SharedBuf in(count * 4), out(count * 4);
      auto* f = reinterpret_cast<float*>(in.data());
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>((i % 1000) * (r + 1));
      auto* o = reinterpret_cast<float*>(out.data());
      ASSERT_TRUE(comm->allreduce(f, o, count, DataType::kF32, ReduceOp::kSum).ok());
      ASSERT_TRUE(comm->allreduce(f, f, count, DataType::kF32, ReduceOp::kAvg).ok());
      const float tri = static_cast<float>(n * (n + 1) / 2);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(o[i], tri * static_cast<float>(i % 1000)) << "rank " << r << " at " << i;
        ASSERT_EQ(f[i], tri * static_cast<float>(i % 1000) / static_cast<float>(n))
            << "rank " << r << " at " << i;
      }
    });
    EXPECT_EQ(ShmDirect::shared_calls() - shared0, 2u * static_cast<uint64_t>(n));
  }
}

TEST(ShmSharedAllreduce, ARegionAPeerCannotMapTurnsTheMappingOffOnEveryRank) {
  // Rank 1's input region's descriptor is made to name /dev/null: rank 0 cannot map it, every
  // rank falls back to the cross-memory reads for this call and the later ones, results right.
  const uint64_t shared0 = ShmDirect::shared_calls(), calls0 = ShmDirect::calls();
  testing::run_ranks(2, shm_ranks("1"), [&](std::unique_ptr<Communicator>& comm, int r) {
    const size_t count = 300001;
    SharedBuf in(count * 4), out(count * 4);
    if (r == 1) {
      auto ref = shared_host_memory::find(in.data(), 0);
      ASSERT_TRUE(ref.has_value());
      const int null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
      ASSERT_GE(null, 0);
      ASSERT_EQ(::dup3(null, static_cast<int>(ref->fd), O_CLOEXEC), ref->fd);
      ::close(null);
    }
    auto* f = reinterpret_cast<float*>(in.data());
    auto* o = reinterpret_cast<float*>(out.data());
    for (int round = 0; round < 2; ++round) {
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<float>(i % 13 + r);
      ASSERT_TRUE(comm->allreduce(f, o, count, DataType::kF32, ReduceOp::kSum).ok());
      for (size_t i = 0; i < count; i += 7) {
        ASSERT_EQ(o[i], static_cast<float>(2 * (i % 13) + 1)) << "rank " << r << " at " << i;
      }
    }
  });
  EXPECT_EQ(ShmDirect::shared_calls(), shared0);
  EXPECT_EQ(ShmDirect::calls() - calls0, 4u);
}

// Two ranks of ShmDirect itself as threads, their exchanges through memory (a barrier before and
// after each copy), so a test can look at one rank's mapped regions.
struct TwoDirectRanks {
  std::barrier<> sync{2};
  std::vector<uint8_t> board;
  Exchange exchange_for(int r) {
    return [this, r](uint8_t* buf, size_t blk) -> Status {
      if (r == 0) board.assign(2 * blk, 0);
      sync.arrive_and_wait();
      std::memcpy(board.data() + r * blk, buf + r * blk, blk);
      sync.arrive_and_wait();
      std::memcpy(buf, board.data(), 2 * blk);
      sync.arrive_and_wait();
      return ok_status();
    };
  }
};

TEST(ShmSharedAllreduce, KeepsOnlyAFewRegionsOfAPeerMapped) {
  // Eight calls, each on freshly allocated buffers (freed after the call): each rank keeps at most
  // four of its peer's regions mapped, and the values are right every time.
  TwoDirectRanks two;
  ShmDirectOptions o;
  o.min_bytes = 1;
  testing::run_threads(2, [&](int r) {
    ShmDirect direct(r, 2, o);
    direct.set_eligible(true);
    const Exchange ex = two.exchange_for(r);
    const size_t count = 65537;
    for (int call = 0; call < 8; ++call) {
      SharedBuf in(count * 4), out(count * 4);
      auto* f = reinterpret_cast<int32_t*>(in.data());
      for (size_t i = 0; i < count; ++i) f[i] = static_cast<int32_t>(i) * (r + 1) + call;
      bool ran = false;
      Status s = direct.allreduce(in.data(), out.data(), count, DataType::kI32, ReduceOp::kSum,
                                  sys::deadline_after_ms(30000), nullptr, ex, &ran);
      ASSERT_TRUE(s.ok()) << s.to_string();
      ASSERT_TRUE(ran);
      auto* g = reinterpret_cast<const int32_t*>(out.data());
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(g[i], static_cast<int32_t>(i) * 3 + 2 * call) << "call " << call << " at " << i;
      }
      EXPECT_LE(direct.peer_regions(), 4u) << "call " << call;
    }
  });
}

TEST(ShmSharedAllreduce, AReferenceOutsideItsRegionIsRefused) {
  ShmDirect::SharedRef r{/*gen=*/1, /*ino=*/5, /*region_bytes=*/4096, /*offset=*/0, /*fd=*/3};
  EXPECT_EQ(ShmDirect::check_ref(r, 4096), "");
  EXPECT_NE(ShmDirect::check_ref(r, 4097), "");
  r.offset = 4096;
  EXPECT_EQ(ShmDirect::check_ref(r, 0), "");
  EXPECT_NE(ShmDirect::check_ref(r, 1), "");
  r.offset = UINT64_MAX;
  EXPECT_NE(ShmDirect::check_ref(r, 2), "") << "offset + bytes wraps";
  r.offset = 0;
  r.fd = -1;
  EXPECT_NE(ShmDirect::check_ref(r, 1), "");
  r.fd = int64_t{1} << 40;
  EXPECT_NE(ShmDirect::check_ref(r, 1), "");
  r.fd = 3;
  r.gen = 0;
  EXPECT_NE(ShmDirect::check_ref(r, 1), "");
  r.gen = 1;
  r.region_bytes = 0;
  EXPECT_NE(ShmDirect::check_ref(r, 0), "");
}

TEST(ShmDirectAllreduce, PeerThatGoesAwayFailsTheCall) {
  // Both ranks run one direct call; then rank 1 destroys its communicator while rank 0 is in the
  // next one. Rank 0 fails with kPeer long before its 60 s deadline.
  testing::run_ranks(2, shm_ranks("1"), [&](std::unique_ptr<Communicator>& comm, int r) {
    std::vector<float> v(1 << 20, 1.0f);
    ASSERT_TRUE(comm->allreduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum).ok());
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      comm.reset();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    Status s = comm->allreduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
    EXPECT_LT(took, std::chrono::seconds(30)) << "waited out its deadline";
  });
}

// Rank 1 of PeerKilledMidCallFailsTheSurvivor, in a process of its own: one direct allreduce,
// then it sleeps until rank 0 kills it (SIGKILL) while rank 0 waits in the next one.
const bool kRank1Child = testing::register_child_case("ShmDirectChild", "Rank1", [] {
  TcpStoreOptions o;
  o.port = std::atoi(testing::env_or_empty("GW_SD_STORE_PORT").c_str());
  auto store = TcpStore::create(o);
  if (!store.ok()) return 2;
  auto comm = testing::create_rank(shm_ranks("1"), 1, 2, *store);
  if (!comm.ok()) return 3;
  std::vector<float> v(1 << 20, 1.0f);
  if (!(*comm)->allreduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum).ok()) {
    return 4;
  }
  std::this_thread::sleep_for(std::chrono::seconds(120));
  return 0;
});

TEST(ShmDirectAllreduce, PeerKilledMidCallFailsTheSurvivor) {
  TcpStoreOptions so;
  so.host_server = true;
  auto store = TcpStore::create(so);
  ASSERT_TRUE(store.ok()) << store.status().to_string();
  testing::ExecChild child("ShmDirectChild.Rank1",
                           {"GW_SD_STORE_PORT=" + std::to_string((*store)->port())});
  ASSERT_TRUE(child.started());
  auto comm = testing::create_rank(shm_ranks("1"), 0, 2, *store);
  ASSERT_TRUE(comm.ok()) << comm.status().to_string();
  std::vector<float> v(1 << 20, 1.0f);
  ASSERT_TRUE(
      (*comm)->allreduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum).ok());
  EXPECT_EQ(v[12345], 2.0f);
  EXPECT_GT(ShmDirect::calls(), 0u);
  // Rank 0 is inside the next call, waiting for rank 1, when rank 1's process is killed.
  std::thread killer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    child.kill_now();
  });
  const auto start = std::chrono::steady_clock::now();
  Status s = (*comm)->allreduce(v.data(), v.data(), v.size(), DataType::kF32, ReduceOp::kSum);
  const auto took = std::chrono::steady_clock::now() - start;
  killer.join();
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
  EXPECT_LT(took, std::chrono::seconds(30)) << "waited out its deadline";
}

// The read of a peer's buffer (shm_direct_read_peer) against a child process whose buffer goes
// away under it: unmapped while it lives, or the whole process killed. Both are kPeer, never
// kInternal: a rank killed mid-call made the survivors report "a bug in gradwire" before (its
// memory is released before it is a zombie, so the read fails with EFAULT, not ESRCH; that
// moment cannot be caught on purpose here: peer_exiting, which tells it apart, is checked on a
// live, a zombie and a reaped child; ProcFailureTest kills ranks mid-call).
class PeerBuffer {
 public:
  PeerBuffer() {
    if (pipe(to_child_) != 0 || pipe(to_parent_) != 0) return;
    pid_ = fork();
    if (pid_ == 0) child();
    read_all(to_parent_[0], &addr_, sizeof(addr_));
  }
  ~PeerBuffer() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      reap();
    }
    for (int fd : {to_child_[0], to_child_[1], to_parent_[0], to_parent_[1]}) {
      if (fd >= 0) close(fd);
    }
  }
  pid_t pid() const { return pid_; }
  uint64_t addr() const { return addr_; }
  // The child unmaps its buffer and says so.
  void unmap() {
    char c = 'u';
    ASSERT_EQ(write(to_child_[1], &c, 1), 1);
    ASSERT_EQ(read(to_parent_[0], &c, 1), 1);
  }
  // SIGKILL (which the child cannot ignore), then waits until it is a zombie, not reaping it.
  bool kill_and_wait_for_zombie() {
    if (pid_ <= 0 || ::kill(pid_, SIGKILL) != 0) return false;
    siginfo_t info{};
    return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOWAIT) == 0;
  }
  void reap() {
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  static void read_all(int fd, void* p, size_t n) {
    auto* b = static_cast<char*>(p);
    while (n > 0) {
      ssize_t k = read(fd, b, n);
      if (k <= 0) return;
      b += k;
      n -= static_cast<size_t>(k);
    }
  }
  [[noreturn]] void child() {
    void* m = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) _exit(2);
    std::memset(m, 0x5a, kBytes);
    uint64_t a = reinterpret_cast<uint64_t>(m);
    if (write(to_parent_[1], &a, sizeof(a)) != sizeof(a)) _exit(3);
    char c;
    if (read(to_child_[0], &c, 1) != 1) _exit(4);
    munmap(m, kBytes);
    if (write(to_parent_[1], &c, 1) != 1) _exit(5);
    while (read(to_child_[0], &c, 1) > 0) {
    }
    _exit(0);
  }

 public:
  static constexpr size_t kBytes = size_t{1} << 20;

 private:
  int to_child_[2] = {-1, -1};
  int to_parent_[2] = {-1, -1};
  pid_t pid_ = -1;
  uint64_t addr_ = 0;
};

TEST(ShmDirectRead, ReadsALivePeersBuffer) {
  PeerBuffer peer;
  ASSERT_GT(peer.pid(), 0);
  std::vector<uint8_t> got(PeerBuffer::kBytes, 0);
  Status s = shm_direct_read_peer(peer.pid(), 1, got.data(), peer.addr(), got.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(got.front(), 0x5a);
  EXPECT_EQ(got.back(), 0x5a);
}

TEST(ShmDirectRead, AnUnmappedBufferIsThePeersFault) {
  PeerBuffer peer;
  ASSERT_GT(peer.pid(), 0);
  peer.unmap();
  std::vector<uint8_t> got(PeerBuffer::kBytes, 0);
  Status s = shm_direct_read_peer(peer.pid(), 1, got.data(), peer.addr(), got.size());
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
  EXPECT_NE(s.to_string().find("no longer mapped"), std::string::npos) << s.to_string();
}

TEST(ShmDirectRead, AKilledPeerIsGoneBeforeAndAfterItIsReaped) {
  PeerBuffer peer;
  ASSERT_GT(peer.pid(), 0);
  const pid_t pid = peer.pid();
  EXPECT_FALSE(net::shm::peer_exiting(pid));
  ASSERT_TRUE(peer.kill_and_wait_for_zombie());
  std::vector<uint8_t> got(PeerBuffer::kBytes, 0);
  EXPECT_TRUE(net::shm::peer_exiting(pid));
  Status s = shm_direct_read_peer(pid, 1, got.data(), peer.addr(), got.size());
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
  EXPECT_NE(s.to_string().find("is gone"), std::string::npos) << s.to_string();
  peer.reap();
  EXPECT_TRUE(net::shm::peer_exiting(pid));
  s = shm_direct_read_peer(pid, 1, got.data(), peer.addr(), got.size());
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
}

TEST(ShmDirectWrite, WritesALivePeersBuffer) {
  PeerBuffer peer;
  ASSERT_GT(peer.pid(), 0);
  std::vector<uint8_t> mine(PeerBuffer::kBytes), got(PeerBuffer::kBytes, 0);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = static_cast<uint8_t>(i * 13);
  Status s = shm_direct_write_peer(peer.pid(), 1, mine.data(), peer.addr(), mine.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  s = shm_direct_read_peer(peer.pid(), 1, got.data(), peer.addr(), got.size());
  ASSERT_TRUE(s.ok()) << s.to_string();
  EXPECT_EQ(got, mine);
}

TEST(ShmDirectWrite, AnUnmappedOrKilledPeersOutputIsThePeersFault) {
  std::vector<uint8_t> mine(PeerBuffer::kBytes, 0x11);
  {
    PeerBuffer peer;
    ASSERT_GT(peer.pid(), 0);
    peer.unmap();
    Status s = shm_direct_write_peer(peer.pid(), 1, mine.data(), peer.addr(), mine.size());
    EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
    EXPECT_NE(s.to_string().find("output"), std::string::npos) << s.to_string();
    EXPECT_NE(s.to_string().find("no longer mapped"), std::string::npos) << s.to_string();
  }
  PeerBuffer peer;
  ASSERT_GT(peer.pid(), 0);
  ASSERT_TRUE(peer.kill_and_wait_for_zombie());
  Status s = shm_direct_write_peer(peer.pid(), 1, mine.data(), peer.addr(), mine.size());
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
  EXPECT_NE(s.to_string().find("is gone"), std::string::npos) << s.to_string();
  peer.reap();
}

// The shm transport's single-copy receive (core/net/shm_cma.h) reads the same way and classifies
// the same failures.
TEST(ShmCmaRead, AnUnmappedOrKilledSenderIsAPeerFailure) {
  std::vector<uint8_t> got(PeerBuffer::kBytes, 0);
  {
    PeerBuffer peer;
    ASSERT_GT(peer.pid(), 0);
    Status s = net::shm::cma_read(peer.pid(), got.data(), peer.addr(), got.size(), "rank 1");
    ASSERT_TRUE(s.ok()) << s.to_string();
    EXPECT_EQ(got[77], 0x5a);
    peer.unmap();
    s = net::shm::cma_read(peer.pid(), got.data(), peer.addr(), got.size(), "rank 1");
    EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
    EXPECT_NE(s.to_string().find("no longer mapped"), std::string::npos) << s.to_string();
  }
  PeerBuffer peer;
  ASSERT_GT(peer.pid(), 0);
  ASSERT_TRUE(peer.kill_and_wait_for_zombie());
  Status s = net::shm::cma_read(peer.pid(), got.data(), peer.addr(), got.size(), "rank 1");
  EXPECT_EQ(s.code(), Code::kPeer) << s.to_string();
  EXPECT_NE(s.to_string().find("closed by peer"), std::string::npos) << s.to_string();
  EXPECT_FALSE(net::shm::peer_exiting(getpid()));
}

}  // namespace
}  // namespace gw::coll
