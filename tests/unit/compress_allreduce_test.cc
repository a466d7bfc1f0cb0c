// The compressed allreduce's algorithms, run by N ranks as threads over a minimal in-process
// Communicator (RendezvousComm below: real copies and reductions, reduced in rank order so
// every rank gets the same bits, as the ring does). The same algorithms over the real Communicator
// and transports are covered by compress_comm_test.cc.
// The sliced calls are in compress_allreduce_slices_test.cc (the same binary).
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "collectives/compress/codec_kernels.h"
#include "collectives/compress/compress.h"
#include "collectives/reduce.h"
#include "tests/support/gradients.h"
#include "tests/support/ranks.h"
#include "tests/unit/compress_allreduce_rendezvous.h"

namespace gw::coll {
namespace {

using namespace ::gw::coll::compress_test;

TEST(CompressAllreduce, EveryRankEndsWithIdenticalResults) {
  for (int p : {1, 2, 3, 4}) {
    for (const char* spec : kSpecs) {
      const size_t n = 1000 + 37 * p;  // not a multiple of chunks or partitions
      std::vector<std::vector<float>> out(static_cast<size_t>(p));
      run_ranks(p, [&](int rank, RendezvousComm&, Compressor& c) {
        for (int step = 0; step < 3; ++step) {
          auto g = gradient(n, rank, step);
          Status st = c.allreduce(g.data(), n, DataType::kF32, spec, "w");
          ASSERT_TRUE(st.ok()) << spec << ": " << st.to_string();
          if (step == 2) out[static_cast<size_t>(rank)] = g;
        }
      });
      for (int r = 1; r < p; ++r) {
        EXPECT_EQ(0, std::memcmp(out[0].data(), out[static_cast<size_t>(r)].data(), n * 4))
            << spec << " p=" << p << " rank " << r;
      }
    }
  }
}

// Relative L2 error of one compressed allreduce against the exact sum, first step.
double first_step_error(int p, const char* spec, size_t n) {
  std::vector<float> result;
  run_ranks(p, [&](int rank, RendezvousComm&, Compressor& c) {
    auto g = gradient(n, rank, 0);
    ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, spec, "k").ok());
    if (rank == 0) result = g;
  });
  double err = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    double exact = 0;
    for (int r = 0; r < p; ++r) exact += gradient(n, r, 0)[i];
    err += (result[i] - exact) * (result[i] - exact);
    norm += exact * exact;
  }
  return std::sqrt(err / norm);
}

TEST(CompressAllreduce, ResultIsCloseToTheExactSumWhereTheCodecPromisesIt) {
  EXPECT_LT(first_step_error(3, "none", 2000), 1e-6);
  EXPECT_LT(first_step_error(3, "fp16", 2000), 1e-3);
  EXPECT_LT(first_step_error(3, "bf16", 2000), 1e-2);
  EXPECT_LT(first_step_error(3, "topk:1", 2000), 1e-6);     // k = n: exact
  EXPECT_LT(first_step_error(3, "randomk:1", 2000), 1e-6);  // all indices: exact
  EXPECT_LT(first_step_error(3, "qsgd:127", 2000), 0.1);
  // sign is 1-bit: the error is large but strictly below the signal.
  EXPECT_LT(first_step_error(3, "sign,chunk=64", 2000), 1.0);
}

TEST(CompressAllreduce, ErrorFeedbackDeliversEverythingOverTime) {
  // Sum over steps of the results + the residuals of all ranks == sum of all gradients.
  const int p = 3;
  const size_t n = 3000;
  for (const char* spec : {"topk:0.01", "randomk:0.05", "qsgd:4", "powersgd:1"}) {
    std::vector<double> delivered(n, 0.0), total(n, 0.0);
    std::vector<std::vector<float>> residuals(p);
    std::mutex mu;
    run_ranks(p, [&](int rank, RendezvousComm&, Compressor& c) {
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
      for (int r = 0; r < p; ++r) lhs += residuals[static_cast<size_t>(r)][i];
      worst = std::max(worst, std::fabs(lhs - total[i]));
    }
    EXPECT_LT(worst, 1e-3) << spec;
  }
}

TEST(CompressAllreduce, SignKeepsErrorFeedbackOnBothSides) {
  // With worker and server residuals, the running sum of results tracks the running sum of
  // gradients: the gap is the residuals, which stay bounded, so the average error shrinks.
  const int p = 4;
  const size_t n = 4096;
  std::vector<double> delivered(n, 0.0), total(n, 0.0);
  std::mutex mu;
  const int steps = 60;
  run_ranks(p, [&](int rank, RendezvousComm&, Compressor& c) {
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
  // Without error feedback the gap would grow like the sum (relative ~1); with it, it stays at
  // the size of one step's residual while the sum grows like sqrt(steps).
  EXPECT_LT(std::sqrt(gap / sum), 0.5);
}

// allreduce_two_phase_encoded (sign with the worker side encoded and decoded by the caller, as the
// GPU path does on the device): with the CPU codec behind the hooks it gives allreduce()'s bits,
// residuals and byte counts step after step, including partitions that are empty (2 chunks over 4
// ranks) and a short last one; a refused call runs no hook; a hook's error ends the call.
TEST(CompressAllreduce, ExternallyEncodedSignSumsLikeTheHostPath) {
  struct Case {
    int p;
    size_t n;
    const char* spec;
  };
  for (const Case& k : {Case{3, 5 * 256 + 77, "sign,chunk=256"}, Case{4, 2 * 2048, "sign"},
                        Case{2, 3001, "sign,ef=0,chunk=64"}}) {
    run_ranks(k.p, [&](int rank, RendezvousComm&, Compressor& c) {
      auto codec = Codec::create(*parse_codec_spec(k.spec));
      ASSERT_TRUE(codec.ok());
      const bool ef = (*codec)->spec().error_feedback;
      std::vector<float> res(k.n, 0.0f);
      size_t hook_calls = 0;
      for (int step = 0; step < 3; ++step) {
        std::vector<float> host = gradient(k.n, rank, step), ext = host;
        const CompressStats s0 = c.stats();
        ASSERT_TRUE(c.allreduce(host.data(), k.n, DataType::kF32, k.spec, "host").ok());
        const CompressStats s1 = c.stats();
        const CodecContext ctx{fnv1a64("ext"), static_cast<uint64_t>(step), rank};
        Compressor::TwoPhaseHooks hooks;
        size_t covered = 0;
        hooks.encode = [&](uint8_t* blob, size_t slot,
                           const std::vector<Compressor::Partition>& ps) {
          ++hook_calls;
          EXPECT_EQ(ps.size(), static_cast<size_t>(k.p));
          for (size_t j = 0; j < ps.size(); ++j) {
            if (ps[j].len == 0) continue;
            Status st = (*codec)->encode(ext.data() + ps[j].offset,
                                         ef ? res.data() + ps[j].offset : nullptr, ps[j].len,
                                         blob + slot * j, slot, ctx);
            if (!st.ok()) return st;
          }
          return ok_status();
        };
        hooks.decode = [&](const uint8_t* blob, size_t slot,
                           const std::vector<Compressor::Partition>& ps) {
          ++hook_calls;
          for (size_t j = 0; j < ps.size(); ++j) {
            covered += ps[j].len;
            if (ps[j].len == 0) continue;
            Status st = (*codec)->decode(blob + slot * j, (*codec)->encoded_size(ps[j].len),
                                         ps[j].len, ext.data() + ps[j].offset, ctx);
            if (!st.ok()) return st;
          }
          return ok_status();
        };
        Status st = c.allreduce_two_phase_encoded(k.n, DataType::kF32, k.spec, "ext", hooks);
        ASSERT_TRUE(st.ok()) << st.to_string();
        const CompressStats s2 = c.stats();
        EXPECT_EQ(covered, k.n);
        ASSERT_EQ(std::memcmp(host.data(), ext.data(), k.n * 4), 0) << k.spec << " step " << step;
        if (ef) {
          ASSERT_EQ(std::memcmp(c.residual("host").data(), res.data(), k.n * 4), 0) << k.spec;
        }
        EXPECT_EQ(s2.bytes_sent - s1.bytes_sent, s1.bytes_sent - s0.bytes_sent) << k.spec;
        EXPECT_EQ(s2.calls - s1.calls, 1u);
      }
      EXPECT_EQ(hook_calls, 6u);
      EXPECT_TRUE(c.residual("ext").empty());  // the worker residual is the caller's
      // Refused before any hook runs: another spec or count under the key, a host key, not sign,
      // not f32, an empty key, a missing hook.
      Compressor::TwoPhaseHooks never;
      never.encode = [&](uint8_t*, size_t, const std::vector<Compressor::Partition>&) {
        ADD_FAILURE() << "a refused call ran its encode";
        return ok_status();
      };
      never.decode = [&](const uint8_t*, size_t, const std::vector<Compressor::Partition>&) {
        ADD_FAILURE() << "a refused call ran its decode";
        return ok_status();
      };
      EXPECT_EQ(
          c.allreduce_two_phase_encoded(k.n, DataType::kF32, "sign,chunk=128", "ext", never).code(),
          Code::kInvalidArg);
      EXPECT_EQ(c.allreduce_two_phase_encoded(k.n + 1, DataType::kF32, k.spec, "ext", never).code(),
                Code::kInvalidArg);
      Status host_key = c.allreduce_two_phase_encoded(k.n, DataType::kF32, k.spec, "host", never);
      EXPECT_NE(host_key.message().find("host memory"), std::string::npos) << host_key.message();
      EXPECT_EQ(c.allreduce_two_phase_encoded(k.n, DataType::kF32, "topk:0.1", "t", never).code(),
                Code::kInvalidArg);
      EXPECT_EQ(c.allreduce_two_phase_encoded(k.n, DataType::kF16, k.spec, "h", never).code(),
                Code::kInvalidArg);
      EXPECT_EQ(c.allreduce_two_phase_encoded(k.n, DataType::kF32, k.spec, "", never).code(),
                Code::kInvalidArg);
      Compressor::TwoPhaseHooks half = never;
      half.decode = nullptr;
      EXPECT_EQ(c.allreduce_two_phase_encoded(k.n, DataType::kF32, k.spec, "z", half).code(),
                Code::kInvalidArg);
      std::vector<float> f(k.n, 1.0f);
      Status gpu_key = c.allreduce(f.data(), k.n, DataType::kF32, k.spec, "ext");
      EXPECT_NE(gpu_key.message().find("on the GPU"), std::string::npos) << gpu_key.message();
    });
  }
  // A hook that fails (on every rank, as the in-memory group cannot abandon a peer) ends the call
  // with its error, named after the tensor.
  run_ranks(2, [&](int, RendezvousComm&, Compressor& c) {
    Compressor::TwoPhaseHooks bad;
    bad.encode = [](uint8_t*, size_t, const std::vector<Compressor::Partition>&) {
      return Status(Code::kSystem, "test: device fault");
    };
    bad.decode = [](const uint8_t*, size_t, const std::vector<Compressor::Partition>&) {
      ADD_FAILURE() << "decode after a failed encode";
      return ok_status();
    };
    Status st = c.allreduce_two_phase_encoded(4096, DataType::kF32, "sign", "b", bad);
    EXPECT_EQ(st.code(), Code::kSystem);
    EXPECT_NE(st.message().find("device fault"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("\"b\""), std::string::npos) << st.message();
  });
}

TEST(CompressAllreduce, PowerSgdOfAKnownRankSumIsExact) {
  // Every rank holds a multiple of the same rank-2 matrix: the sum has rank 2, so rank 2
  // PowerSGD reproduces it.
  const int p = 3;
  const size_t rows = 24, cols = 16, n = rows * cols;
  std::vector<float> base(n, 0.0f);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t c = 0; c < cols; ++c) {
      base[i * cols + c] = std::sin(0.3f * i) * std::cos(0.2f * c) + 0.5f * (i % 3) * (c % 5);
    }
  }
  run_ranks(p, [&](int rank, RendezvousComm&, Compressor& comp) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = base[i] * static_cast<float>(rank + 1);
    ASSERT_TRUE(comp.allreduce(g.data(), n, DataType::kF32, "powersgd:2,cols=16", "m").ok());
    for (size_t i = 0; i < n; ++i) ASSERT_NEAR(g[i], 6.0f * base[i], 1e-4f * 6.0f) << i;
  });
}

TEST(CompressAllreduce, HalfPrecisionBuffersAreSupported) {
  const size_t n = 777;
  run_ranks(2, [&](int rank, RendezvousComm&, Compressor& c) {
    for (DataType dt : {DataType::kF16, DataType::kBF16}) {
      std::vector<uint16_t> buf(n);
      for (size_t i = 0; i < n; ++i) {
        const float v = 0.25f * static_cast<float>(i % 8) + rank;
        buf[i] = dt == DataType::kF16 ? float_to_half(v) : float_to_bf16(v);
      }
      ASSERT_TRUE(c.allreduce(buf.data(), n, dt, "topk:1", dt == DataType::kF16 ? "h" : "b").ok());
      for (size_t i = 0; i < n; ++i) {
        const float got = dt == DataType::kF16 ? half_to_float(buf[i]) : bf16_to_float(buf[i]);
        EXPECT_EQ(got, 0.5f * static_cast<float>(i % 8) + 1.0f) << i;
      }
    }
  });
}

TEST(CompressAllreduce, BytesSentReflectTheCompression) {
  const size_t n = 1 << 16;
  std::map<std::string, CompressStats> stats;
  std::mutex mu;
  for (const char* spec : {"none", "fp16", "topk:0.01", "sign", "powersgd:4", "randomk:0.01"}) {
    run_ranks(4, [&](int rank, RendezvousComm&, Compressor& c) {
      auto g = gradient(n, rank, 0);
      ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, spec, "w").ok());
      c.reset_stats();  // leave the first-use agreement out
      ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, spec, "w").ok());
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        stats[spec] = c.stats();
      }
    });
  }
  const uint64_t full = 2 * 3 * n * 4 / 4;  // ring allreduce of n f32 at p = 4
  for (auto& [spec, s] : stats) {
    EXPECT_EQ(s.calls, 1u) << spec;
    EXPECT_EQ(s.bytes_uncompressed, full) << spec;
  }
  EXPECT_EQ(stats["none"].bytes_sent, full);
  EXPECT_EQ(stats["fp16"].bytes_sent, full / 2);
  EXPECT_EQ(stats["topk:0.01"].bytes_sent, 3 * (8 + 655 * 8));
  EXPECT_EQ(stats["randomk:0.01"].bytes_sent, 2 * 3 * 655 * 4 / 4);
  // sign: phase 1 (all-to-all) sends each peer its partition, phase 2 (allgather) sends each
  // peer this rank's server partition.
  const uint64_t sign_part = 8 * (4 + 256);  // 8 chunks of 2048 per partition
  EXPECT_EQ(stats["sign"].bytes_sent, 3 * sign_part + 3 * sign_part);
  EXPECT_LT(stats["sign"].bytes_sent * 10, full);
  EXPECT_LT(stats["powersgd:4"].bytes_sent * 20, full);
}

TEST(CompressAllreduce, SignPhaseOneIsAnAllToAllOfPartitions) {
  // Phase 1 used to allgather every worker's whole 1-bit vector: p times the bytes of phase 2.
  // As an all-to-all, each rank sends each peer one partition, as much as phase 2 sends, and a
  // sign call sends 2(p-1)/p of the encoding: 16x less than f32 (1 bit + 32 bits per 2048).
  const size_t n = 3 * 4096 + 100;  // partitions of unequal length (the last one short)
  for (int p : {2, 3, 5}) {
    std::vector<CompressStats> stats(static_cast<size_t>(p));
    std::vector<std::vector<float>> out(static_cast<size_t>(p));
    run_ranks(p, [&](int rank, RendezvousComm& comm, Compressor& c) {
      auto g = gradient(n, rank, 1);
      ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, "sign,chunk=64", "a2a").ok());
      c.reset_stats();
      const int a2a_before = comm.alltoalls, ag_before = comm.allgathers;
      g = gradient(n, rank, 2);
      ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, "sign,chunk=64", "a2a").ok());
      EXPECT_EQ(comm.alltoalls - a2a_before, 1) << "p " << p;
      EXPECT_EQ(comm.allgathers - ag_before, 1) << "p " << p;
      stats[static_cast<size_t>(rank)] = c.stats();
      out[static_cast<size_t>(rank)] = g;
    });
    const size_t chunks = (n + 63) / 64;
    const size_t part_chunks = (chunks + static_cast<size_t>(p) - 1) / static_cast<size_t>(p);
    const uint64_t ep = part_chunks * (4 + 64 / 8);  // f32 scale + 64 bits per chunk
    for (int r = 0; r < p; ++r) {
      const auto& s = stats[static_cast<size_t>(r)];
      EXPECT_EQ(s.bytes_sent, 2 * static_cast<uint64_t>(p - 1) * ep) << "p " << p;
      // The allgather emulation sent (p-1)*p*ep in phase 1, (p-1)*(p+1)*ep in all.
      EXPECT_LT(s.bytes_sent, static_cast<uint64_t>(p - 1) * static_cast<uint64_t>(p + 1) * ep);
      EXPECT_EQ(s.bytes_uncompressed, allreduce_send_bytes(n * 4, p));
      EXPECT_EQ(out[static_cast<size_t>(r)], out[0]) << "rank " << r << " of " << p;
    }
  }
}

TEST(CompressAllreduce, BadArgumentsAreRejectedWithAMessage) {
  run_ranks(1, [&](int, RendezvousComm&, Compressor& c) {
    std::vector<float> g(100, 1.0f);
    Status st = c.allreduce(g.data(), 100, DataType::kF32, "topk:2", "w");
    EXPECT_EQ(st.code(), Code::kInvalidArg);
    EXPECT_NE(st.message().find("ratio"), std::string::npos) << st.message();
    st = c.allreduce(g.data(), 100, DataType::kF32, "topk:0.1", "");
    EXPECT_EQ(st.code(), Code::kInvalidArg);
    EXPECT_NE(st.message().find("key"), std::string::npos) << st.message();
    std::vector<int32_t> ints(100);
    st = c.allreduce(ints.data(), 100, DataType::kI32, "fp16", "i");
    EXPECT_EQ(st.code(), Code::kInvalidArg);
    EXPECT_NE(st.message().find("int32"), std::string::npos) << st.message();
    st = c.allreduce(nullptr, 100, DataType::kF32, "fp16", "n");
    EXPECT_EQ(st.code(), Code::kInvalidArg);
    ASSERT_TRUE(c.allreduce(g.data(), 100, DataType::kF32, "topk:0.1", "w").ok());
    st = c.allreduce(g.data(), 50, DataType::kF32, "topk:0.1", "w");
    EXPECT_EQ(st.code(), Code::kInvalidArg);
    EXPECT_NE(st.message().find("tensor key \"w\""), std::string::npos) << st.message();
    st = c.allreduce(g.data(), 100, DataType::kF32, "sign", "w");
    EXPECT_EQ(st.code(), Code::kInvalidArg);
    EXPECT_EQ(c.num_keys(), 1u);
    EXPECT_TRUE(c.allreduce(g.data(), 0, DataType::kF32, "sign", "empty").ok());
  });
}

TEST(CompressAllreduce, RanksThatDisagreeOnSpecOrKeyGetAnErrorNotGarbage) {
  run_ranks(3, [&](int rank, RendezvousComm&, Compressor& c) {
    std::vector<float> g(256, 1.0f);
    const char* spec = rank == 2 ? "topk:0.5" : "topk:0.25";
    Status st = c.allreduce(g.data(), 256, DataType::kF32, spec, "w");
    EXPECT_EQ(st.code(), Code::kInvalidArg);
    EXPECT_NE(st.message().find("rank"), std::string::npos) << st.message();
  });
}

// A step whose input holds a NaN (one rank) or an Inf is summed uncompressed on every rank (its
// result carries the non-finite value) and leaves every residual and codec state as it was: the
// steps after it give the same bits as a run without that step. With nonfinite=keep the residual
// is poisoned and every later result holds NaNs.
TEST(CompressAllreduce, ANonFiniteStepLeavesTheErrorFeedbackStateAsItWas) {
  const int p = 3;
  const size_t n = 2048;
  for (const char* spec : {"sign,chunk=64", "qsgd:4", "powersgd:2", "topk:0.05", "randomk:0.1"}) {
    for (float poison : {std::nanf(""), INFINITY}) {
      // results[with_bad_step][rank][step]
      std::vector<std::vector<std::vector<float>>> results(
          2, std::vector<std::vector<float>>(p, std::vector<float>()));
      std::vector<uint64_t> skipped(p, 0);
      for (int with_bad = 0; with_bad < 2; ++with_bad) {
        run_ranks(p, [&](int rank, RendezvousComm&, Compressor& c) {
          auto& out = results[static_cast<size_t>(with_bad)][static_cast<size_t>(rank)];
          for (int step = 0; step < 4; ++step) {
            if (with_bad && step == 2) {
              auto g = gradient(n, rank, 99);
              if (rank == 1) g[5] = poison;
              ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, spec, "t").ok()) << spec;
              EXPECT_FALSE(std::isfinite(g[5])) << spec << ": the bad step's result is finite";
            }
            auto g = gradient(n, rank, step);
            ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, spec, "t").ok()) << spec;
            out.insert(out.end(), g.begin(), g.end());
          }
          skipped[static_cast<size_t>(rank)] = c.stats().nonfinite_steps;
        });
      }
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(skipped[static_cast<size_t>(r)], 1u) << spec;
        const auto& a = results[0][static_cast<size_t>(r)];
        const auto& b = results[1][static_cast<size_t>(r)];
        ASSERT_EQ(a.size(), b.size());
        EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
            << spec << " poison " << poison << ", rank " << r
            << ": the steps after a skipped one differ from a run without it";
      }
    }
  }
  // keep: the old behaviour, the residual is poisoned for good.
  run_ranks(p, [&](int rank, RendezvousComm&, Compressor& c) {
    auto g = gradient(n, rank, 0);
    if (rank == 1) g[5] = std::nanf("");
    ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, "sign,chunk=64,nonfinite=keep", "k").ok());
    g = gradient(n, rank, 1);
    ASSERT_TRUE(c.allreduce(g.data(), n, DataType::kF32, "sign,chunk=64,nonfinite=keep", "k").ok());
    size_t bad = 0;
    for (float v : g) bad += std::isfinite(v) ? 0 : 1;
    EXPECT_GT(bad, 0u) << "nonfinite=keep: the step after a NaN was clean";
    EXPECT_EQ(c.stats().nonfinite_steps, 0u);
  });
}

}  // namespace
}  // namespace gw::coll
