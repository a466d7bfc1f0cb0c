// Communicator::split: N ranks as threads over the in-process transport and over tcp / shm when
// the build has them (skipped with the reason otherwise), all through a memory store.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/communicator_impl.h"
#include "core/net/transport.h"
#include "core/store.h"
#include "tests/support/ranks.h"

namespace gw::coll {
namespace {

using CommPtr = std::unique_ptr<Communicator>;

class SplitTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string& b = GetParam();
    if (b == "inproc") return;
    net::TransportOptions o;
    o.job_token = "probe";
    o.host_id = "probe-host";
    auto t = net::make_transport(b, o);
    if (!t.ok()) GTEST_SKIP() << "transport " << b << " unavailable: " << t.status().to_string();
  }

  // Runs fn(comm, rank) on n ranks, each in its own thread with its own communicator.
  void run_ranks(int n, const std::function<void(CommPtr&, int)>& fn) {
    testing::RankOptions ranks;
    ranks.backend = GetParam();
    testing::run_ranks(n, ranks, fn);
  }
};

// The members of `color` ordered as split orders them: by key, then by parent rank.
std::vector<int> members(int n, const std::function<int(int)>& color,
                         const std::function<int(int)>& key, int c) {
  std::vector<int> m;
  for (int r = 0; r < n; ++r) {
    if (color(r) == c) m.push_back(r);
  }
  std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return key(a) < key(b); });
  return m;
}

// Splits, checks the new rank and size, and checks an allreduce of the parent ranks on the child.
void check_split(CommPtr& parent, int r, int n, const std::function<int(int)>& color,
                 const std::function<int(int)>& key, CommPtr* out = nullptr) {
  auto child = parent->split(color(r), key(r));
  ASSERT_TRUE(child.ok()) << "rank " << r << ": " << child.status().to_string();
  if (color(r) < 0) {
    EXPECT_EQ(*child, nullptr);
    return;
  }
  ASSERT_NE(*child, nullptr);
  const auto m = members(n, color, key, color(r));
  const int want_rank = static_cast<int>(std::find(m.begin(), m.end(), r) - m.begin());
  EXPECT_EQ((*child)->size(), static_cast<int>(m.size())) << "rank " << r;
  EXPECT_EQ((*child)->rank(), want_rank) << "rank " << r;
  // Every member contributes its parent rank at its child rank's slot: the sum names the members
  // and where each landed.
  std::vector<int64_t> v(m.size(), 0), sum(m.size());
  v[(*child)->rank()] = r;
  ASSERT_TRUE(
      (*child)->allreduce(v.data(), sum.data(), v.size(), DataType::kI64, ReduceOp::kSum).ok());
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(sum[i], m[i]) << "rank " << r << " slot " << i;
  if (out) *out = std::move(*child);
}

TEST_P(SplitTest, TwoColorsAtFourRanks) {
  run_ranks(4, [](CommPtr& c, int r) {
    check_split(
        c, r, 4, [](int q) { return q % 2; }, [](int q) { return q; });
  });
}

TEST_P(SplitTest, KeysReorderRanksAndTiesKeepParentOrder) {
  run_ranks(4, [](CommPtr& c, int r) {
    check_split(
        c, r, 4, [](int) { return 7; }, [](int q) { return -q; });  // reversed
    check_split(
        c, r, 4, [](int) { return 0; }, [](int q) { return q / 2; });  // ties
  });
}

TEST_P(SplitTest, NegativeColorJoinsNone) {
  run_ranks(4, [](CommPtr& c, int r) {
    check_split(
        c, r, 4, [](int q) { return q == 2 ? -1 : 1; }, [](int) { return 0; });
    // The parent still works afterwards, for every rank.
    int32_t v = 1, sum = 0;
    ASSERT_TRUE(c->allreduce(&v, &sum, 1, DataType::kI32, ReduceOp::kSum).ok());
    EXPECT_EQ(sum, 4);
  });
}

TEST_P(SplitTest, ChildCollectivesSideBySideWithTheParent) {
  run_ranks(4, [](CommPtr& c, int r) {
    CommPtr child;
    check_split(
        c, r, 4, [](int q) { return q / 2; }, [](int q) { return q; }, &child);
    ASSERT_NE(child, nullptr);
    for (int it = 0; it < 3; ++it) {
      std::vector<float> in(1001, static_cast<float>(r + it)), out(1001);
      ASSERT_TRUE(
          c->allreduce(in.data(), out.data(), in.size(), DataType::kF32, ReduceOp::kSum).ok());
      EXPECT_EQ(out[1000], static_cast<float>(6 + 4 * it));
      ASSERT_TRUE(
          child->allreduce(in.data(), out.data(), in.size(), DataType::kF32, ReduceOp::kSum).ok());
      const int base = (r / 2) * 2;
      EXPECT_EQ(out[0], static_cast<float>(2 * base + 1 + 2 * it));
      int32_t b = child->rank() == 1 ? 40 + r : -1;
      ASSERT_TRUE(child->broadcast(&b, 1, DataType::kI32, 1).ok());
      EXPECT_EQ(b, 40 + base + 1);
      std::vector<int32_t> all(2);
      int32_t mine = r;
      ASSERT_TRUE(child->allgather(&mine, all.data(), 1, DataType::kI32).ok());
      EXPECT_EQ(all, (std::vector<int32_t>{base, base + 1}));
      ASSERT_TRUE(child->barrier().ok());
      auto op = child->iallreduce(in.data(), out.data(), in.size(), DataType::kF32, ReduceOp::kSum);
      ASSERT_TRUE(op.ok());
      ASSERT_TRUE((*op)->wait(-1).ok());
    }
  });
}

TEST_P(SplitTest, ChildOutlivesItsParent) {
  run_ranks(4, [](CommPtr& c, int r) {
    CommPtr child;
    check_split(
        c, r, 4, [](int q) { return q % 2; }, [](int q) { return q; }, &child);
    ASSERT_NE(child, nullptr);
    c.reset();  // the parent (and the caller's reference to the store) goes first
    int64_t v = r, sum = 0;
    ASSERT_TRUE(child->allreduce(&v, &sum, 1, DataType::kI64, ReduceOp::kSum).ok());
    EXPECT_EQ(sum, r % 2 == 0 ? 2 : 4);
  });
}

TEST_P(SplitTest, NestedSplitAndParentDestroyedAfterChildren) {
  run_ranks(8, [](CommPtr& c, int r) {
    CommPtr half, quarter;
    check_split(
        c, r, 8, [](int q) { return q / 4; }, [](int q) { return q; }, &half);
    ASSERT_NE(half, nullptr);
    const int hr = half->rank();
    auto q = half->split(hr % 2, -hr);
    ASSERT_TRUE(q.ok()) << q.status().to_string();
    ASSERT_NE(*q, nullptr);
    quarter = std::move(*q);
    ASSERT_EQ(quarter->size(), 2);
    EXPECT_EQ(quarter->rank(), hr < 2 ? 1 : 0);  // keys -hr: the higher half rank comes first
    int64_t v = r, sum = 0;
    ASSERT_TRUE(quarter->allreduce(&v, &sum, 1, DataType::kI64, ReduceOp::kSum).ok());
    // Members: parent ranks (r/4)*4 + {hr%2, hr%2 + 2}.
    EXPECT_EQ(sum, 2 * ((r / 4) * 4) + 2 * (hr % 2) + 2);
    quarter.reset();
    half.reset();
    ASSERT_TRUE(c->barrier().ok());
  });
}

TEST_P(SplitTest, EveryWorldFromOneToEightWithSeveralColors) {
  const int top = GetParam() == "inproc" ? 8 : 5;
  for (int n = 1; n <= top; ++n) {
    auto color = [](int q) { return q % 3 == 2 ? -1 : q % 3; };
    auto key = [n](int q) { return (q * 5) % n - q % 2; };
    run_ranks(n, [&](CommPtr& c, int r) {
      check_split(c, r, n, color, key);
      check_split(
          c, r, n, [](int) { return 0; }, [](int) { return 0; });  // a copy
    });
    if (HasFailure()) return;
  }
}

TEST_P(SplitTest, SplitOfAnAbortedCommunicatorFails) {
  run_ranks(2, [](CommPtr& c, int) {
    c->abort();
    auto child = c->split(0, 0);
    ASSERT_FALSE(child.ok());
    EXPECT_EQ(child.status().code(), Code::kAborted);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, SplitTest, ::testing::Values("inproc", "tcp", "shm"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gw::coll
