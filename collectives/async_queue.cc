#include "collectives/async_queue.h"

#include <chrono>

#include "core/timeline.h"

namespace gw::coll {

class AsyncState {
 public:
  void finish(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(s);
    done_ = true;
    cv_.notify_all();
  }
  bool wait_for(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [this] { return done_; });
  }
  bool done(Status* s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) *s = status_;
    return done_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

namespace {

class AsyncOpImpl : public AsyncOp {
 public:
  AsyncOpImpl(std::shared_ptr<AsyncState> st, const char* what, int64_t bound_ms)
      : st_(std::move(st)), what_(what), bound_ms_(bound_ms) {}
  ~AsyncOpImpl() override { (void)wait(-1); }
  Status wait(int64_t timeout_ms) override {
    // -1: until done; the op itself ends within the communicator's deadline (or at once when
    // aborted), so this is bounded too.
    const int64_t ms = timeout_ms < 0 ? bound_ms_ : timeout_ms;
    const auto deadline = Clock::now() + std::chrono::milliseconds(ms);
    while (true) {
      Status s;
      if (st_->done(&s)) return s;
      if (timeout_ms >= 0 && Clock::now() >= deadline) {
        return timeout_error("{}: still running after {} ms", what_, timeout_ms);
      }
      st_->wait_for(std::chrono::milliseconds(10));
    }
  }
  Status test(bool* done) override {
    Status s;
    *done = st_->done(&s);
    return *done ? s : ok_status();
  }

 private:
  std::shared_ptr<AsyncState> st_;
  const char* what_;
  int64_t bound_ms_;
};

}  // namespace

AsyncQueue::~AsyncQueue() {
  shutdown([] {});
}

std::unique_ptr<AsyncOp> AsyncQueue::push(const char* what, std::function<Status()> op,
                                          int64_t bound_ms) {
  auto st = std::make_shared<AsyncState>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      // After shutdown: the op never starts, and no worker is started that nobody would join.
      st->finish(aborted_error("{}: communicator destroyed", what));
      return std::make_unique<AsyncOpImpl>(st, what, bound_ms);
    }
    queue_.push_back(Item{what, std::move(op), st, timeline::on() ? timeline::now_us() : -1});
    if (!worker_.joinable()) {
      worker_ = std::thread([this] {
        std::unique_lock<std::mutex> lock(mu_);
        while (true) {
          cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
          if (queue_.empty()) return;  // stopping
          Item item = std::move(queue_.front());
          queue_.pop_front();
          running_ = true;
          lock.unlock();
          if (item.queued_us >= 0) {
            timeline::complete("queued", "phase", item.queued_us,
                               timeline::now_us() - item.queued_us);
          }
          Status s = item.op();
          item.state->finish(s.ok() ? s : s.with_context(item.what));
          lock.lock();
          running_ = false;
          cv_.notify_all();
        }
      });
    }
  }
  cv_.notify_all();
  return std::make_unique<AsyncOpImpl>(st, what, bound_ms);
}

void AsyncQueue::wait_idle() {
  std::unique_lock<std::mutex> lock(mu_);
  // Bounded: every queued op ends within its own deadline (or at once when aborted).
  cv_.wait(lock, [this] { return queue_.empty() && !running_; });
}

void AsyncQueue::shutdown(const std::function<void()>& abort_running) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    // Ops pending at shutdown end: the running one sees the abort, the queued ones never start.
    if (running_ || !queue_.empty()) abort_running();
    for (auto& item : queue_) {
      item.state->finish(aborted_error("{}: communicator destroyed", item.what));
    }
    queue_.clear();
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

}  // namespace gw::coll
