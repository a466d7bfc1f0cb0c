// The compressed allreduce's hierarchical form (compress.h, "Hierarchical form"): ranks as threads
// with real Communicators over the in-process transport, placed on fake hosts by their host id,
// so that the Compressor splits them by host and by local index as it would across machines.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/communicator_impl.h"
#include "collectives/compress/codec.h"
#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/compress.h"
#include "collectives/compress/compress_config.h"
#include "core/store.h"
#include "tests/support/gradients.h"
#include "tests/support/ranks.h"

namespace gw::coll {
namespace {

constexpr ::gw::testing::Gradients gradient{313};  // tests/support/gradients.h

// Small integers: every sum of a few of them is exact in f32 and in f16.
std::vector<float> integers(size_t n, int rank) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(static_cast<int>((i * 7 + rank) % 33) - 16);
  return v;
}

using Body = std::function<void(int rank, Communicator& comm, Compressor& c)>;

// Runs body on one thread per entry of host_of_rank (rank r on fake host host_of_rank[r]), each
// with its own communicator and Compressor (GW_COMPRESS_HIER = mode, "" for the default).
void run_ranks(const std::vector<int>& host_of_rank, const Body& body, const char* mode = "") {
  testing::RankOptions ranks;
  ranks.timeout_ms = 30000;
  ranks.host_of = host_of_rank;
  ranks.host_prefix = "fake-host-";
  testing::run_ranks(static_cast<int>(host_of_rank.size()), ranks,
                     [&](std::unique_ptr<Communicator>& comm, int r) {
                       config::Snapshot cfg = config::Snapshot::capture();
                       if (*mode) cfg = *cfg.with(compress_config::kHier, mode);
                       Compressor c(comm.get(), cfg);
                       body(r, *comm, c);
                     });
}

const std::vector<int> k2x2 = {0, 0, 1, 1};
const std::vector<int> k3p1 = {0, 1, 0, 0};  // host 0: ranks 0, 2, 3; host 1: rank 1

const char* const kSpecs[] = {"none",         "fp16", "bf16",    "topk:0.01",
                              "randomk:0.01", "sign", "qsgd:16", "powersgd:4"};

TEST(CompressHier, TheFormFollowsTheLayoutAndTheSetting) {
  struct Case {
    std::vector<int> hosts;
    const char* mode;
    Compressor::HierForm want;
  };
  const Case cases[] = {
      {k2x2, "", Compressor::HierForm::kShards},
      {k3p1, "auto", Compressor::HierForm::kLeader},
      {k2x2, "off", Compressor::HierForm::kFlat},
      {{0, 1}, "auto", Compressor::HierForm::kFlat},   // one rank per host: nothing to sum
      {{0, 1}, "on", Compressor::HierForm::kShards},   // forced: shards of one rank
      {{0, 0, 0}, "on", Compressor::HierForm::kFlat},  // one host: nothing crosses hosts
  };
  for (const Case& k : cases) {
    run_ranks(
        k.hosts,
        [&](int rank, Communicator& comm, Compressor& c) {
          EXPECT_EQ(c.hier_form(), k.want) << "rank " << rank << " mode " << k.mode;
          // And it runs: two steps of a codec with state.
          const size_t n = 1001;
          for (int step = 0; step < 2; ++step) {
            auto g = gradient(n, rank, step);
            Status st = c.allreduce(g.data(), n, DataType::kF32, "topk:0.1", "t");
            ASSERT_TRUE(st.ok()) << st.to_string();
          }
          (void)comm;
        },
        k.mode);
  }
}

// Every codec, over 2 x 2 ranks and over 3 + 1, with an odd count (padded shards) and an even
// one: every rank ends with the same bits, step after step.
TEST(CompressHier, EveryCodecEndsIdenticalOnEveryRank) {
  for (const auto& hosts : {k2x2, k3p1}) {
    for (size_t n : {size_t{20011}, size_t{8192}}) {
      const size_t p = hosts.size();
      std::vector<std::vector<std::vector<float>>> out(p);
      run_ranks(hosts, [&](int rank, Communicator&, Compressor& c) {
        for (const char* spec : kSpecs) {
          std::vector<float> last;
          for (int step = 0; step < 2; ++step) {
            auto g = gradient(n, rank, step);
            Status st = c.allreduce(g.data(), n, DataType::kF32, spec, spec);
            ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
            last = g;
          }
          out[static_cast<size_t>(rank)].push_back(last);
        }
      });
      for (size_t s = 0; s < std::size(kSpecs); ++s) {
        for (size_t r = 1; r < p; ++r) {
          ASSERT_EQ(out[r].size(), std::size(kSpecs));
          EXPECT_EQ(0, std::memcmp(out[0][s].data(), out[r][s].data(), n * 4))
              << kSpecs[s] << " rank " << r << " n " << n << " hosts " << hosts.size();
        }
      }
    }
  }
}

// none, and fp16 on integers (every partial sum exact in f16), give the exact sum, in both forms
// and for f16 buffers too.
TEST(CompressHier, ExactCodecsGiveExactSums) {
  for (const auto& hosts : {k2x2, k3p1}) {
    const size_t n = 5003;
    const int p = static_cast<int>(hosts.size());
    std::vector<float> exact(n, 0.0f);
    for (int r = 0; r < p; ++r) {
      auto v = integers(n, r);
      for (size_t i = 0; i < n; ++i) exact[i] += v[i];
    }
    run_ranks(hosts, [&](int rank, Communicator&, Compressor& c) {
      for (const char* spec : {"none", "fp16", "fp16,ef=1", "bf16"}) {
        auto v = integers(n, rank);
        Status st = c.allreduce(v.data(), n, DataType::kF32, spec, spec);
        ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(v[i], exact[i]) << spec << " rank " << rank << " element " << i;
        }
        // The same through an f16 buffer.
        auto f = integers(n, rank);
        std::vector<uint16_t> h(n);
        codec_kernels::encode_cast16(f.data(), nullptr, n, h.data(), false);
        st = c.allreduce(h.data(), n, DataType::kF16, spec, std::string(spec) + "/f16");
        ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
        codec_kernels::decode_cast16(h.data(), n, f.data(), false, false);
        for (size_t i = 0; i < n; ++i) {
          ASSERT_EQ(f[i], exact[i]) << spec << " f16 rank " << rank << " element " << i;
        }
      }
    });
  }
}

// What crosses hosts is the codec applied to the host's exact sum: top-k of each shard of the
// host sums, decoded and summed in host order, bit for bit; and the byte counters hold the exact
// intra-host legs plus the compressed inter-host one.
TEST(CompressHier, OnlyTheInterHostLegIsCompressed) {
  const size_t n = 40000;  // 2 shards of 20000
  const size_t len = n / 2;
  const char* spec = "topk:0.01";
  auto codec = Codec::create(*parse_codec_spec(spec));
  ASSERT_TRUE(codec.ok());
  // The expected result: host h's exact sum (2 ranks: a + b is exact in either order), each
  // shard encoded as the shard's owner on host h encodes it (rank h in the cross communicator).
  std::vector<float> want(n);
  for (size_t shard = 0; shard < 2; ++shard) {
    std::vector<std::vector<uint8_t>> encs(2);
    const std::string key = "g#" + std::to_string(shard);
    std::vector<CodecContext> ctxs(2);
    for (int h = 0; h < 2; ++h) {
      auto a = gradient(n, 2 * h, 0), b = gradient(n, 2 * h + 1, 0);
      std::vector<float> sum(len), residual(len, 0.0f);
      for (size_t i = 0; i < len; ++i) sum[i] = a[shard * len + i] + b[shard * len + i];
      ctxs[static_cast<size_t>(h)] = CodecContext{fnv1a64(key), 0, h};
      auto& e = encs[static_cast<size_t>(h)];
      e.resize((*codec)->encoded_size(len));
      ASSERT_TRUE((*codec)
                      ->encode(sum.data(), residual.data(), len, e.data(), e.size(),
                               ctxs[static_cast<size_t>(h)])
                      .ok());
    }
    const uint8_t* ptrs[2] = {encs[0].data(), encs[1].data()};
    ASSERT_TRUE(
        (*codec)
            ->decode_sum(ptrs, encs[0].size(), 2, len, want.data() + shard * len, ctxs.data())
            .ok());
  }
  const uint64_t e = (*codec)->encoded_size(len);
  const uint64_t want_sent = allgather_send_bytes(8, 4)               // the key's agreement
                             + reduce_scatter_send_bytes(len * 4, 2)  // host sum
                             + allgather_send_bytes(e, 2)             // top-k across hosts
                             + allgather_send_bytes(len * 4, 2);      // shards to the host
  run_ranks(k2x2, [&](int rank, Communicator&, Compressor& c) {
    auto g = gradient(n, rank, 0);
    ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, spec, "g").ok());
    EXPECT_EQ(0, std::memcmp(g.data(), want.data(), n * 4)) << "rank " << rank;
    const CompressStats s = c.stats();
    EXPECT_EQ(s.bytes_sent, want_sent) << "rank " << rank;
    EXPECT_EQ(s.bytes_uncompressed, allreduce_send_bytes(n * 4, 4));
    EXPECT_EQ(s.calls, 1u);
    // The bytes that cross hosts are e per rank against 2 * len * 4 for an f32 ring across the
    // two hosts: the inter-host leg is about 1/25 of it at 1 %.
    EXPECT_LT(allgather_send_bytes(e, 2) * 20, allreduce_send_bytes(len * 4 * 2, 2));
  });
}

// Error feedback per rank, in both forms: the sum over steps of the results plus every rank's
// residual (its part in place, zeros elsewhere) is the sum of all gradients.
TEST(CompressHier, ErrorFeedbackDeliversEverythingOverTime) {
  const size_t n = 3001;
  for (const auto& hosts : {k2x2, k3p1}) {
    const size_t p = hosts.size();
    // (fp16's residual holds the local cast only, not the rounding of the f16 sums: not here.)
    for (const char* spec : {"topk:0.01", "randomk:0.05", "qsgd:4", "powersgd:1"}) {
      std::vector<double> delivered(n, 0.0), total(n, 0.0);
      std::vector<std::vector<float>> residuals(p);
      std::mutex mu;
      run_ranks(hosts, [&](int rank, Communicator&, Compressor& c) {
        for (int step = 0; step < 10; ++step) {
          auto g = gradient(n, rank, step);
          {
            std::lock_guard<std::mutex> lock(mu);
            for (size_t i = 0; i < n; ++i) total[i] += g[i];
          }
          ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, spec, "x").ok());
          if (rank == 0) {
            for (size_t i = 0; i < n; ++i) delivered[i] += g[i];
          }
        }
        residuals[static_cast<size_t>(rank)] = c.residual("x");
      });
      double worst = 0;
      for (size_t i = 0; i < n; ++i) {
        double lhs = delivered[i];
        for (size_t r = 0; r < p; ++r) {
          ASSERT_EQ(residuals[r].size(), n) << spec << " rank " << r;
          lhs += residuals[r][i];
        }
        worst = std::max(worst, std::fabs(lhs - total[i]));
      }
      EXPECT_LT(worst, 1e-3) << spec << " hosts " << hosts.size();
    }
  }
}

// Sign (worker and server residuals on the shard owners): the running sum of results tracks the
// running sum of gradients at 2 x 2 as it does flat.
TEST(CompressHier, SignErrorFeedbackConverges) {
  const size_t n = 8192;
  const int steps = 60;
  std::vector<double> delivered(n, 0.0), total(n, 0.0);
  std::mutex mu;
  run_ranks(k2x2, [&](int rank, Communicator&, Compressor& c) {
    for (int step = 0; step < steps; ++step) {
      auto g = gradient(n, rank, step);
      {
        std::lock_guard<std::mutex> lock(mu);
        for (size_t i = 0; i < n; ++i) total[i] += g[i];
      }
      ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, "sign,chunk=256", "s").ok());
      if (rank == 0) {
        for (size_t i = 0; i < n; ++i) delivered[i] += g[i];
      }
    }
  });
  double gap = 0, sum = 0;
  for (size_t i = 0; i < n; ++i) {
    gap += (delivered[i] - total[i]) * (delivered[i] - total[i]);
    sum += total[i] * total[i];
  }
  EXPECT_LT(std::sqrt(gap / sum), 0.5);
}

// Ranks that disagree on the form (one configured off) are refused on every rank at the key's
// first use, before any split could hang.
TEST(CompressHier, RanksThatDisagreeOnTheFormAreRefused) {
  testing::RankOptions ranks;
  ranks.timeout_ms = 30000;
  ranks.host_of = k2x2;
  ranks.host_prefix = "fake-host-";
  testing::run_ranks(4, ranks, [&](std::unique_ptr<Communicator>& comm, int r) {
    auto cfg = config::Snapshot::capture().with(compress_config::kHier, r == 3 ? "off" : "auto");
    ASSERT_TRUE(cfg.ok());
    Compressor c(comm.get(), *cfg);
    auto g = gradient(100, r, 0);
    Status st = c.allreduce(g.data(), g.size(), DataType::kF32, "topk:0.1", "k");
    EXPECT_EQ(st.code(), Code::kInvalidArg) << "rank " << r << ": " << st.to_string();
  });
}

}  // namespace
}  // namespace gw::coll
