// The compressed allreduce's algorithms, run by N ranks as threads over a minimal in-process
// Communicator (RendezvousComm below: real copies and reductions, reduced in rank order so
// every rank gets the same bits, as the ring does). The same algorithms over the real Communicator
// and transports are covered by compress_comm_test.cc.
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

namespace gw::coll {
namespace {

class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n), sync_(n), ptrs_(static_cast<size_t>(n)) {}
  int size() const { return n_; }
  // Every rank publishes a pointer; fn(rank) runs once all are published; then all wait again.
  void exchange(int rank, const void* ptr, const std::function<void()>& fn) {
    ptrs_[static_cast<size_t>(rank)] = ptr;
    sync_.arrive_and_wait();
    fn();
    sync_.arrive_and_wait();
  }
  const void* ptr(int r) const { return ptrs_[static_cast<size_t>(r)]; }

 private:
  int n_;
  std::barrier<> sync_;
  std::vector<const void*> ptrs_;
};

class DoneOp final : public AsyncOp {
 public:
  explicit DoneOp(Status st) : st_(std::move(st)) {}
  Status wait(int64_t) override { return st_; }
  Status test(bool* done) override {
    *done = true;
    return st_;
  }

 private:
  Status st_;
};

// An op still "in flight" until it is waited for; destroying it unwaited runs it too, as the real
// AsyncOp's destructor waits.
class DeferredOp final : public AsyncOp {
 public:
  explicit DeferredOp(std::function<Status()> fn) : fn_(std::move(fn)) {}
  ~DeferredOp() override { (void)wait(-1); }
  Status wait(int64_t) override {
    if (fn_) {
      st_ = fn_();
      fn_ = nullptr;
    }
    return st_;
  }
  Status test(bool* done) override {
    *done = fn_ == nullptr;
    return st_;
  }

 private:
  std::function<Status()> fn_;
  Status st_;
};

class RendezvousComm final : public Communicator {
 public:
  RendezvousComm(Rendezvous* g, int rank) : g_(g), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size(); }
  Status allreduce(const void* send, void* recv, size_t count, DataType dtype,
                   ReduceOp op) override {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<uint8_t> acc(bytes);
    g_->exchange(rank_, send, [&] {
      std::memcpy(acc.data(), g_->ptr(0), bytes);
      for (int r = 1; r < size(); ++r) reduce(dtype, op, acc.data(), g_->ptr(r), acc.data(), count);
    });
    std::memcpy(recv, acc.data(), bytes);
    ++allreduces;
    reduced_counts.push_back(count);
    return ok_status();
  }
  Status allgather(const void* send, void* recv, size_t count, DataType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    std::vector<uint8_t> copy(static_cast<const uint8_t*>(send),
                              static_cast<const uint8_t*>(send) + bytes);
    g_->exchange(rank_, copy.data(), [&] {
      for (int r = 0; r < size(); ++r) {
        std::memcpy(static_cast<uint8_t*>(recv) + bytes * static_cast<size_t>(r), g_->ptr(r),
                    bytes);
      }
    });
    ++allgathers;
    return ok_status();
  }
  Status alltoall(const void* send, void* recv, size_t count, DataType dtype) override {
    const size_t bytes = count * dtype_size(dtype);
    const size_t p = static_cast<size_t>(size());
    std::vector<uint8_t> copy(static_cast<const uint8_t*>(send),
                              static_cast<const uint8_t*>(send) + bytes * p);
    g_->exchange(rank_, copy.data(), [&] {
      for (size_t r = 0; r < p; ++r) {
        std::memcpy(static_cast<uint8_t*>(recv) + bytes * r,
                    static_cast<const uint8_t*>(g_->ptr(static_cast<int>(r))) +
                        bytes * static_cast<size_t>(rank_),
                    bytes);
      }
    });
    ++alltoalls;
    return ok_status();
  }
  Status broadcast(void*, size_t, DataType, int) override { return unsupported("test"); }
  Status reduce_scatter(const void*, void*, size_t, DataType, ReduceOp) override {
    return unsupported("test");
  }
  Status barrier() override { return unsupported("test"); }
  // With async set, an iallreduce runs the exchange at once and hands back a finished op (the
  // compressed allreduce's sliced path waits on it); without, it is kUnsupported, as a
  // communicator without asynchronous ops would answer.
  Result<std::unique_ptr<AsyncOp>> iallreduce(const void* send, void* recv, size_t count,
                                              DataType dtype, ReduceOp op) override {
    if (!async) return unsupported("test");
    if (iallreduces == fail_iallreduce) {  // every rank fails the same op: no exchange
      ++iallreduces;
      return std::unique_ptr<AsyncOp>(new DoneOp(peer_error("test: rank {} vanished", 1 - rank_)));
    }
    ++iallreduces;
    if (defer) {  // the exchange runs when the op is waited for or destroyed
      ++pending;
      return std::unique_ptr<AsyncOp>(new DeferredOp([=, this] {
        --pending;
        return allreduce(send, recv, count, dtype, op);
      }));
    }
    Status st = allreduce(send, recv, count, dtype, op);
    return std::unique_ptr<AsyncOp>(new DoneOp(st));
  }
  void abort() override {}
  bool aborted() const override { return false; }
  Algo choose_allreduce_algo(size_t) const override { return Algo::kRing; }

  int allreduces = 0;
  int allgathers = 0;
  int alltoalls = 0;
  int iallreduces = 0;
  bool async = false;
  int fail_iallreduce = -1;            // the index of the iallreduce whose wait fails
  bool defer = false;                  // async ops still running until waited for (or destroyed)
  int pending = 0;                     // deferred ops not run yet
  std::vector<size_t> reduced_counts;  // the count of every allreduce, blocking or not

 private:
  Rendezvous* g_;
  int rank_;
};

constexpr ::gw::testing::Gradients gradient{1000};  // tests/support/gradients.h

// Runs fn(rank, comm, compressor) on p threads; collects failures.
void run_ranks(int p, const std::function<void(int, RendezvousComm&, Compressor&)>& fn) {
  Rendezvous g(p);
  ::gw::testing::run_threads(p, [&](int r) {
    RendezvousComm comm(&g, r);
    Compressor c(&comm);
    fn(r, comm, c);
  });
}

const char* const kSpecs[] = {"fp16",    "bf16",       "topk:0.05", "randomk:0.1", "sign,chunk=64",
                              "qsgd:16", "powersgd:2", "none",      "fp16,ef=1"};

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

// allreduce_cast_encoded_sliced with hooks that encode and decode with the CPU kernels, as the GPU
// path does with its stream; records what the hooks were asked, in order.
struct SliceHookLog {
  std::vector<std::string> calls;  // "start 0 0+4096", "ready 0 0+4096", "done 0 0+4096", ...
  std::vector<bool> done;          // per slice

  // The order compress.h promises, or what breaks it first.
  std::string order_problem() const {
    std::map<std::pair<std::string, size_t>, size_t> at;  // (hook, slice) -> position
    for (size_t i = 0; i < calls.size(); ++i) {
      const size_t sp = calls[i].find(' ');
      at[{calls[i].substr(0, sp), std::stoul(calls[i].substr(sp + 1))}] = i;
    }
    auto pos = [&](const char* hook, size_t s) {
      auto it = at.find({hook, s});
      return it == at.end() ? SIZE_MAX : it->second;
    };
    for (size_t s = 0; pos("start", s) != SIZE_MAX; ++s) {
      const size_t ready = pos("ready", s);
      if (ready != SIZE_MAX && ready < pos("start", s)) return fmt::format("ready {} early", s);
      if (ready != SIZE_MAX && pos("start", s + 1) != SIZE_MAX && pos("start", s + 1) > ready) {
        return fmt::format("start {} after ready {}", s + 1, s);
      }
      if (pos("start", s + 2) != SIZE_MAX && pos("start", s + 2) < ready) {
        return fmt::format("start {} before ready {}", s + 2, s);
      }
      const size_t done = pos("done", s);
      if (done == SIZE_MAX) continue;
      if (done < ready) return fmt::format("done {} before ready {}", s, s);
      if (pos("ready", s + 1) != SIZE_MAX && done < pos("ready", s + 1)) {
        return fmt::format("done {} before ready {}", s, s + 1);
      }
      if (s > 0 && done < pos("done", s - 1)) return fmt::format("done {} before {}", s, s - 1);
    }
    return "";
  }
};

Compressor::CastSliceHooks cpu_slice_hooks(SliceHookLog& log, const float* in, float* res,
                                           uint16_t* wire, float* out, bool bf16,
                                           int fail_ready_at = -1) {
  auto note = [&log](const char* what, size_t s, size_t off, size_t len) {
    log.calls.push_back(fmt::format("{} {} {}+{}", what, s, off, len));
    if (log.done.size() <= s) log.done.resize(s + 1, false);
  };
  Compressor::CastSliceHooks h;
  h.start = [=](size_t s, size_t off, size_t len) {
    note("start", s, off, len);
    codec_kernels::encode_cast16(in + off, res ? res + off : nullptr, len, wire + off, bf16);
    return ok_status();
  };
  h.ready = [=](size_t s, size_t off, size_t len) {
    note("ready", s, off, len);
    if (static_cast<int>(s) == fail_ready_at) return Status(Code::kSystem, "test: stream failed");
    return ok_status();
  };
  h.done = [=, &log](size_t s, size_t off, size_t len) {
    note("done", s, off, len);
    log.done[s] = true;
    codec_kernels::decode_cast16(wire + off, len, out + off, bf16, false);
    return ok_status();
  };
  return h;
}

// allreduce_cast_encoded_sliced (the GPU path's exchange): the same slices as
// allreduce() for the spec (the counts of the slices' allreduces are the same list), so the same
// bits, residual and byte counts; the hooks are called in the promised order; with blocking
// slices (no iallreduce) too.
TEST(CompressAllreduce, ExternallyEncodedSlicesSumLikeTheHostPath) {
  const size_t n = 3 * 4096 + 7;  // 4096-slices: three full ones and a short one
  const int p = 3;
  struct Want {
    const char* spec;
    size_t slices;
    size_t slice_len;
  };
  for (const Want& w : {Want{"fp16,ef=1,slice=4096", 4, 4096}, Want{"bf16,slice=0", 1, n},
                        Want{"bf16,ef=1,slice=8192", 1, n}, Want{"fp16,slice=6200", 1, n},
                        Want{"fp16,slice=4100", 3, 4100}}) {
    const bool bf16 = w.spec[0] == 'b';
    const bool ef = std::string_view(w.spec).find("ef=1") != std::string_view::npos;
    for (bool async : {true, false}) {
      run_ranks(p, [&](int rank, RendezvousComm& comm, Compressor& c) {
        comm.async = async;
        std::vector<float> res(n, 0.0f);
        for (int step = 0; step < 2; ++step) {
          std::vector<float> host = gradient(n, rank, step), in = host, out(n, -1.0f);
          const CompressStats s0 = c.stats();
          comm.reduced_counts.clear();
          ASSERT_TRUE(c.allreduce(host.data(), n, DataType::kF32, w.spec, "host").ok());
          std::vector<size_t> host_counts = comm.reduced_counts;
          // With error feedback the host path first agrees on non-finite input (one element);
          // the externally encoded path leaves that to its caller.
          if (ef) {
            ASSERT_FALSE(host_counts.empty());
            EXPECT_EQ(host_counts.front(), 1u) << w.spec;
            host_counts.erase(host_counts.begin());
          }
          const CompressStats s1 = c.stats();
          comm.reduced_counts.clear();
          std::vector<uint16_t> wire(n);
          SliceHookLog log;
          Status st = c.allreduce_cast_encoded_sliced(
              wire.data(), n, DataType::kF32, w.spec, "ext",
              cpu_slice_hooks(log, in.data(), ef ? res.data() : nullptr, wire.data(), out.data(),
                              bf16));
          ASSERT_TRUE(st.ok()) << w.spec << ": " << st.to_string();
          const CompressStats s2 = c.stats();
          EXPECT_EQ(log.order_problem(), "") << w.spec;
          EXPECT_EQ(log.done, std::vector<bool>(w.slices, true)) << w.spec;
          EXPECT_EQ(log.calls.size(), 3 * w.slices);
          const size_t last = w.slice_len * (w.slices - 1);
          EXPECT_EQ(log.calls.back(), fmt::format("done {} {}+{}", w.slices - 1, last, n - last))
              << w.spec;
          // The first use adds one agreement allgather to each side; the rest are the slices.
          EXPECT_EQ(comm.reduced_counts, host_counts) << w.spec;
          EXPECT_EQ(comm.reduced_counts.size(), w.slices);
          ASSERT_EQ(std::memcmp(host.data(), out.data(), n * 4), 0) << w.spec << " step " << step;
          if (ef) {
            ASSERT_EQ(std::memcmp(c.residual("host").data(), res.data(), n * 4), 0) << w.spec;
          }
          EXPECT_EQ(s2.bytes_sent - s1.bytes_sent, s1.bytes_sent - s0.bytes_sent) << w.spec;
          EXPECT_EQ(s2.bytes_uncompressed - s1.bytes_uncompressed,
                    s1.bytes_uncompressed - s0.bytes_uncompressed);
          EXPECT_EQ(s2.calls - s1.calls, 1u);
        }
        // allreduce() runs one slice as a blocking allreduce, the sliced call as an iallreduce.
        const size_t host_async = w.slices > 1 ? w.slices : 0;
        EXPECT_EQ(comm.iallreduces, async ? static_cast<int>(2 * (host_async + w.slices)) : 0)
            << w.spec;
      });
    }
  }
}

// A refused call (another spec, count or side under the key; not a cast; a hook missing) calls no
// hook, so the caller's residual is untouched.
TEST(CompressAllreduce, ARefusedSlicedCallRunsNoHook) {
  const size_t n = 9000;
  run_ranks(2, [&](int rank, RendezvousComm& comm, Compressor& c) {
    comm.async = true;
    std::vector<float> in = gradient(n, rank, 0), res(n, 0.0f), out(n);
    std::vector<uint16_t> wire(n);
    SliceHookLog log;
    auto hooks = cpu_slice_hooks(log, in.data(), res.data(), wire.data(), out.data(), false);
    ASSERT_TRUE(
        c.allreduce_cast_encoded_sliced(wire.data(), n, DataType::kF32, "fp16,ef=1", "k", hooks)
            .ok());
    ASSERT_TRUE(c.allreduce(in.data(), n, DataType::kF32, "fp16,ef=1", "host").ok());
    const std::vector<float> res_before = res;
    log.calls.clear();
    auto refused = [&](std::string_view spec, size_t count, std::string_view key,
                       const Compressor::CastSliceHooks& h) {
      return c.allreduce_cast_encoded_sliced(wire.data(), count, DataType::kF32, spec, key, h);
    };
    EXPECT_EQ(refused("bf16,ef=1", n, "k", hooks).code(), Code::kInvalidArg);
    EXPECT_EQ(refused("fp16,ef=1", n - 1, "k", hooks).code(), Code::kInvalidArg);
    EXPECT_EQ(refused("fp16,ef=1,slice=4096", n, "k", hooks).code(), Code::kInvalidArg);
    Status host_key = refused("fp16,ef=1", n, "host", hooks);
    EXPECT_EQ(host_key.code(), Code::kInvalidArg);
    EXPECT_NE(host_key.message().find("host memory"), std::string::npos) << host_key.message();
    Status not_cast = refused("topk:0.1", n, "t", hooks);
    EXPECT_EQ(not_cast.code(), Code::kInvalidArg);
    EXPECT_NE(not_cast.message().find("not a cast codec"), std::string::npos) << not_cast.message();
    EXPECT_EQ(refused("fp16", n, "", hooks).code(), Code::kInvalidArg);
    Compressor::CastSliceHooks no_done = hooks;
    no_done.done = nullptr;
    EXPECT_EQ(refused("fp16,ef=1", n, "k", no_done).code(), Code::kInvalidArg);
    EXPECT_TRUE(log.calls.empty()) << log.calls.front();
    EXPECT_EQ(std::memcmp(res.data(), res_before.data(), n * 4), 0);
    // The key holds state encoded elsewhere: allreduce() on host memory with it is refused.
    std::vector<float> host(n, 1.0f);
    Status gpu_key = c.allreduce(host.data(), n, DataType::kF32, "fp16,ef=1", "k");
    EXPECT_EQ(gpu_key.code(), Code::kInvalidArg);
    EXPECT_NE(gpu_key.message().find("on the GPU"), std::string::npos) << gpu_key.message();
  });
}

// An error on a slice (a hook's, or a slice's exchange's) ends the call with it, naming the
// slice; no hook runs after it, and every exchange already started has finished on return.
TEST(CompressAllreduce, AFailedSlicedCallNamesTheSliceAndLeavesNoExchangeRunning) {
  const size_t n = 4 * 4096;
  const char* spec = "fp16,ef=1,slice=4096";
  // A hook fails (every rank at the same slice, as a GPU fault would not be, but a one-sided
  // failure would leave the in-memory group waiting): slice 1's exchange is in flight then.
  run_ranks(2, [&](int rank, RendezvousComm& comm, Compressor& c) {
    comm.async = true;
    comm.defer = true;
    std::vector<float> in = gradient(n, rank, 0), res(n, 0.0f), out(n, -1.0f);
    std::vector<uint16_t> wire(n);
    SliceHookLog log;
    Status st = c.allreduce_cast_encoded_sliced(
        wire.data(), n, DataType::kF32, spec, "h",
        cpu_slice_hooks(log, in.data(), res.data(), wire.data(), out.data(), false,
                        /*fail_ready_at=*/2));
    EXPECT_EQ(st.code(), Code::kSystem) << st.to_string();
    EXPECT_NE(st.message().find("slice 2 of 4"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("stream failed"), std::string::npos) << st.message();
    EXPECT_EQ(comm.pending, 0);  // slice 1's exchange ran before the call returned
    EXPECT_EQ(comm.iallreduces, 2);
    EXPECT_EQ(log.calls.back(), "ready 2 8192+4096");
    EXPECT_EQ(log.done, (std::vector<bool>{true, false, false, false}));
    EXPECT_EQ(c.stats().bytes_sent, allgather_send_bytes(8, 2));  // the agreement only
  });
  // An exchange fails: the error names its slice, and the slices after it are never done.
  run_ranks(2, [&](int rank, RendezvousComm& comm, Compressor& c) {
    comm.async = true;
    comm.fail_iallreduce = 1;
    std::vector<float> in = gradient(n, rank, 0), out(n, -1.0f);
    std::vector<uint16_t> wire(n);
    SliceHookLog log;
    Status st = c.allreduce_cast_encoded_sliced(
        wire.data(), n, DataType::kF32, spec, "x",
        cpu_slice_hooks(log, in.data(), nullptr, wire.data(), out.data(), false));
    EXPECT_EQ(st.code(), Code::kPeer) << st.to_string();
    EXPECT_NE(st.message().find("vanished"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("slice 1 of 4"), std::string::npos) << st.message();
    EXPECT_EQ(log.done, (std::vector<bool>{true, false, false, false}));
    EXPECT_EQ(comm.pending, 0);
  });
}

// Large fp16/bf16 tensors go slice by slice (the casts overlap the exchange): the result is the
// same elementwise sum of the casts as one allreduce would give (here, in rank order: bit for
// bit), the residual is the local cast error, and both the async and the blocking fallback work.
TEST(CompressAllreduce, SlicedHalfPrecisionGivesTheSameSumAsOneAllreduce) {
  const size_t n = 2 * Compressor::kCastSlice + 1001;  // two full slices and a short one
  const int p = 2;
  std::vector<std::vector<float>> grads;
  for (int r = 0; r < p; ++r) grads.push_back(gradient(n, r, 0));
  for (const char* spec : {"fp16,ef=1", "bf16"}) {
    const bool bf16 = spec[0] == 'b';
    const DataType wire = bf16 ? DataType::kBF16 : DataType::kF16;
    // Reference: cast each rank's gradient, sum the casts in rank order in the wire type, widen.
    std::vector<uint16_t> acc(n), cast(n);
    for (int r = 0; r < p; ++r) {
      codec_kernels::encode_cast16(grads[static_cast<size_t>(r)].data(), nullptr, n,
                                   r == 0 ? acc.data() : cast.data(), bf16);
      if (r > 0) reduce(wire, ReduceOp::kSum, acc.data(), cast.data(), acc.data(), n);
    }
    std::vector<float> want(n);
    codec_kernels::decode_cast16(acc.data(), n, want.data(), bf16, false);
    for (bool async : {true, false}) {
      std::vector<std::vector<float>> got(p), res(p);
      std::vector<int> iallreduces(p);
      run_ranks(p, [&](int rank, RendezvousComm& comm, Compressor& c) {
        comm.async = async;
        auto x = grads[static_cast<size_t>(rank)];
        ASSERT_TRUE(c.allreduce(x.data(), n, DataType::kF32, spec, "big").ok());
        got[static_cast<size_t>(rank)] = std::move(x);
        res[static_cast<size_t>(rank)] = c.residual("big");
        iallreduces[static_cast<size_t>(rank)] = comm.iallreduces;
      });
      for (int r = 0; r < p; ++r) {
        const auto& g = got[static_cast<size_t>(r)];
        ASSERT_EQ(g.size(), n);
        EXPECT_EQ(0, std::memcmp(g.data(), want.data(), n * 4)) << spec << " rank " << r;
        EXPECT_EQ(iallreduces[static_cast<size_t>(r)], async ? 3 : 0) << spec;
        const auto& rs = res[static_cast<size_t>(r)];
        if (spec[0] == 'f') {  // ef=1: residual = v - widen(cast(v)), v = the gradient
          ASSERT_EQ(rs.size(), n);
          const auto& gr = grads[static_cast<size_t>(r)];
          for (size_t i = 0; i < n; i += 4099) {
            EXPECT_EQ(rs[i], gr[i] - half_to_float(float_to_half(gr[i]))) << i;
          }
        } else {
          EXPECT_TRUE(rs.empty());
        }
      }
    }
  }
}

TEST(CompressAllreduce, SliceOptionSetsTheSlicesAndZeroTurnsSlicingOff) {
  const size_t n = 3 * 4096 + 7;  // 4 slices of 4096 (the last short)
  const int p = 3;
  for (const char* spec : {"fp16,slice=4096", "bf16,slice=0", "fp16,slice=8192"}) {
    std::vector<std::vector<float>> got(p);
    std::vector<int> iallreduces(p);
    run_ranks(p, [&](int rank, RendezvousComm& comm, Compressor& c) {
      comm.async = true;
      auto x = gradient(n, rank, 1);
      ASSERT_TRUE(c.allreduce(x.data(), n, DataType::kF32, spec, "s").ok());
      got[static_cast<size_t>(rank)] = std::move(x);
      iallreduces[static_cast<size_t>(rank)] = comm.iallreduces;
    });
    const int want_slices = std::string(spec).ends_with("=4096") ? 4 : 0;  // 8192: < 2 slices
    for (int r = 0; r < p; ++r) {
      EXPECT_EQ(iallreduces[static_cast<size_t>(r)], want_slices) << spec;
      EXPECT_EQ(0, std::memcmp(got[static_cast<size_t>(r)].data(), got[0].data(), n * 4)) << spec;
    }
    // Close to the exact sum (half precision casts of three gradients).
    std::vector<double> exact(n, 0.0);
    for (int r = 0; r < p; ++r) {
      const auto g = gradient(n, r, 1);
      for (size_t i = 0; i < n; ++i) exact[i] += g[i];
    }
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) {
      err += (got[0][i] - exact[i]) * (got[0][i] - exact[i]);
      norm += exact[i] * exact[i];
    }
    EXPECT_LT(std::sqrt(err / norm), 1e-2) << spec;
  }
}

TEST(CompressAllreduce, AFailedSliceEndsTheCallWithTheErrorNotAHang) {
  const size_t n = 2 * Compressor::kCastSlice + 5;
  run_ranks(2, [&](int rank, RendezvousComm& comm, Compressor& c) {
    comm.async = true;
    comm.fail_iallreduce = 1;
    auto x = gradient(n, rank, 0);
    Status st = c.allreduce(x.data(), n, DataType::kF32, "fp16", "big");
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("vanished"), std::string::npos) << st.to_string();
    EXPECT_NE(st.message().find("slice 1"), std::string::npos) << st.to_string();
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

}  // namespace
}  // namespace gw::coll

namespace gw::coll {
namespace {

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
