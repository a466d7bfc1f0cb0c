// The asynchronous operations of one communicator: one progress thread, started on the first
// push(), runs queued operations in issue order. Blocking calls wait_idle() first, so the
// communicator keeps the issue order across blocking and asynchronous calls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "collectives/communicator.h"
#include "core/status.h"

namespace gw::coll {

class AsyncState;

class AsyncQueue {
 public:
  AsyncQueue() = default;
  // Requires shutdown() to have been called (the queued functions may use their owner).
  ~AsyncQueue();
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;

  // Queues `op` (`what` names it in errors) and returns its handle; wait() with -1 waits up to
  // `bound_ms` (the op itself ends within the owner's deadline, or at once when aborted).
  std::unique_ptr<AsyncOp> push(const char* what, std::function<Status()> op, int64_t bound_ms);
  // Blocks until no op is queued or running (bounded: each ends within its own deadline).
  void wait_idle();
  // Stops the thread: queued ops end with kAborted without running; when one is queued or
  // running, `abort_running` is called first so that the running one ends at once.
  void shutdown(const std::function<void()>& abort_running);

 private:
  struct Item {
    const char* what;
    std::function<Status()> op;
    std::shared_ptr<AsyncState> state;
    int64_t queued_us = -1;  // when pushed, while the timeline (core/timeline.h) is on
  };

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool running_ = false;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace gw::coll
