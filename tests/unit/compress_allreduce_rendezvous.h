// What the compress_allreduce_test binary's files share: N ranks as threads over a minimal
// in-process Communicator (RendezvousComm: real copies and reductions, reduced in rank order so
// every rank gets the same bits, as the ring does) and the codec specs every test runs. Defined
// inline in a named namespace, one type in every file.
#pragma once

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

namespace gw::coll::compress_test {

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

inline constexpr ::gw::testing::Gradients gradient{1000};  // tests/support/gradients.h

// Runs fn(rank, comm, compressor) on p threads; collects failures.
inline void run_ranks(int p, const std::function<void(int, RendezvousComm&, Compressor&)>& fn) {
  Rendezvous g(p);
  ::gw::testing::run_threads(p, [&](int r) {
    RendezvousComm comm(&g, r);
    Compressor c(&comm);
    fn(r, comm, c);
  });
}

inline const char* const kSpecs[] = {"fp16",        "bf16",          "topk:0.05",
                                     "randomk:0.1", "sign,chunk=64", "qsgd:16",
                                     "powersgd:2",  "none",          "fp16,ef=1"};

}  // namespace gw::coll::compress_test
