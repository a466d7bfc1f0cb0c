// Tensor fusion of small gw_iallreduce calls (GW_FUSION_THRESHOLD, GW_CYCLE_TIME_MS): the queue of
// one communicator, its background thread, and the request a fused call hands out.
//
// A call of at most kFusionMaxTensorBytes (and at most the threshold) is queued instead of run.
// The thread cuts the queue into batches and runs each as one in-place allreduce of a fusion
// buffer on the communicator; each call's request completes once its slice is copied back.
//
// Every rank must cut the same batches, but when a rank flushes depends on its clock and on which
// request it waits for. So a flush is a round that starts with an agreement: a one-element
// allreduce MIN of "how many calls this rank has queued", on the communicator itself (ordered like
// every collective). Every rank then takes the same prefix of its queue: at most the agreed number
// of calls, all of the head's dtype and op, at most the threshold in bytes together. By induction
// every rank's queue starts at the same call before every round, so the prefixes are equal. A rank
// starts a round when its oldest call has waited GW_CYCLE_TIME_MS, when its queue holds the
// threshold, when a caller waits for or tests a queued call, or before any other collective
// (drain(): the other collective then follows the fused ones on every rank, keeping the order).
// A rank never offers zero calls, so each round fuses at least one.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "capi/session.h"
#include "collectives/types.h"
#include "core/status.h"

namespace gw::capi {

// Larger calls are not fused: copying them twice costs more than the latency fusion saves.
inline constexpr size_t kFusionMaxTensorBytes = size_t{1} << 20;

struct FusionOptions {
  size_t threshold = 0;    // the most bytes of one batch; 0: fusion off
  double cycle_ms = 1;     // the longest a call waits for company before a round starts
  int64_t timeout_ms = 0;  // the communicator's deadline (waits with -1, the agreement)
  int world_size = 1;
};

struct FusionEntry;
struct FusionBatch;

class FusionQueue : public std::enable_shared_from_this<FusionQueue> {
 public:
  // `inner` runs the agreement and the fused allreduces; it must outlive stop().
  FusionQueue(Session* inner, FusionOptions options);
  ~FusionQueue();
  FusionQueue(const FusionQueue&) = delete;
  FusionQueue& operator=(const FusionQueue&) = delete;

  // Whether an allreduce of `bytes` is queued rather than run alone.
  bool fusible(size_t bytes) const {
    return bytes > 0 && bytes <= options_.threshold && bytes <= kFusionMaxTensorBytes;
  }
  // Queues the call (the C layer has checked it); its request completes when its part is back.
  Result<std::unique_ptr<SessionRequest>> submit(const void* sendbuf, void* recvbuf, size_t count,
                                                 coll::DataType dtype, coll::ReduceOp op);
  // Returns once every queued call has been issued to the communicator (or failed), so that the
  // caller's next collective follows them. Bounded by the communicator's deadline.
  Status drain();
  // Thread-safe, never blocks: every queued call fails with kAborted.
  void abort();
  // abort(), then ends the thread; no fused call touches a caller's buffer after it returns.
  void stop();

  // For a request's wait (poll = false) and test (poll = true, *done set).
  Status await(FusionEntry& e, int64_t timeout_ms, bool poll, bool* done);

 private:
  void run();
  // One round: agree, take the prefix, issue it. Not under mu_.
  Status round(int64_t offered);
  void fail_queued(const Status& s);  // callers hold mu_

  Session* const inner_;
  const FusionOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;  // the queue changed, a round ended, a flush is wanted, stop
  std::deque<std::shared_ptr<FusionEntry>> queue_;
  size_t queued_bytes_ = 0;
  bool flush_ = false;  // a caller waits for a queued call: rounds until the queue empties
  int drainers_ = 0;    // callers in drain()
  bool round_running_ = false;
  bool stopping_ = false;
  bool aborted_ = false;
  uint64_t next_batch_ = 0;
  std::vector<std::weak_ptr<FusionBatch>> batches_;  // issued batches, for stop()
  std::thread thread_;                               // started by the first submit
};

}  // namespace gw::capi
