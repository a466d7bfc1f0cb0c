// pairwise_alltoall as data, without a network: for every rank count, executed in memory step by
// step (each step's messages matched between the two ends by step id), every rank must end with
// block j of its output equal to block `rank` of rank j's input.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "collectives/schedule.h"

namespace gw::coll {
namespace {

TEST(AlltoallSchedule, EveryPairExchangesOnceAndTheBlocksLandInPlace) {
  for (int p = 1; p <= 17; ++p) {
    for (size_t count : {size_t{0}, size_t{1}, size_t{3}}) {
      const size_t total = count * static_cast<size_t>(p);
      // in[r][i] identifies (sender r, element i); out starts with a value no input has.
      std::vector<std::vector<int>> in(p), out(p, std::vector<int>(total, -1));
      std::vector<Schedule> s(p);
      for (int r = 0; r < p; ++r) {
        for (size_t i = 0; i < total; ++i) in[r].push_back(r * 1000 + static_cast<int>(i));
        s[r] = pairwise_alltoall(r, p, count);
        ASSERT_EQ(s[r].size(), static_cast<size_t>(p - 1)) << "p " << p;
        // The caller's own-block copy.
        for (size_t i = 0; i < count; ++i) out[r][r * count + i] = in[r][r * count + i];
      }
      std::map<std::pair<int, int>, int> pairs;  // (src, dst) -> messages
      for (int r = 0; r < p; ++r) {
        for (const Step& st : s[r]) {
          SCOPED_TRACE(describe(st));
          ASSERT_GE(st.send_to, 0);
          ASSERT_GE(st.recv_from, 0);
          EXPECT_NE(st.send_to, r);
          EXPECT_TRUE(st.send_from_input);
          EXPECT_EQ(st.action, RecvAction::kCopy);
          ++pairs[{r, st.send_to}];
          // The receiver has a step with the same id that receives from r, of the same size.
          const Step* peer = nullptr;
          for (const Step& q : s[st.send_to]) {
            if (q.id == st.id) peer = &q;
          }
          ASSERT_NE(peer, nullptr);
          ASSERT_EQ(peer->recv_from, r);
          ASSERT_EQ(peer->recv.count, st.send.count);
          for (size_t i = 0; i < st.send.count; ++i) {
            out[st.send_to][peer->recv.offset + i] = in[r][st.send.offset + i];
          }
        }
      }
      EXPECT_EQ(pairs.size(), static_cast<size_t>(p * (p - 1))) << "p " << p;
      for (const auto& [pair, n] : pairs) EXPECT_EQ(n, 1);
      for (int r = 0; r < p; ++r) {
        for (int j = 0; j < p; ++j) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(out[r][j * count + i], in[j][r * count + i])
                << "p " << p << " rank " << r << " block " << j << " element " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace gw::coll
