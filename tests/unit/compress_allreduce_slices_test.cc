// The compressed allreduce in slices (allreduce_cast_encoded_sliced) with hooks that encode and
// decode with the CPU kernels, as the GPU path does: the hooks' order, refused and failed calls,
// half precision, the slice option. Part of the compress_allreduce_test binary.
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

}  // namespace
}  // namespace gw::coll
