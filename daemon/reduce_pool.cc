#include "daemon/reduce_pool.h"

#include <algorithm>

namespace gw::daemon {

ReducePool::ReducePool(int threads) {
  if (threads <= 0) {
    threads = static_cast<int>(std::min(4u, std::max(1u, std::thread::hardware_concurrency())));
  }
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

ReducePool::~ReducePool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ReducePool::run(size_t parts, const std::function<void(size_t)>& fn) {
  std::unique_lock<std::mutex> mine(run_mu_, std::try_to_lock);
  if (parts <= 1 || workers_.empty() || !mine.owns_lock()) {
    for (size_t p = 0; p < parts; ++p) fn(p);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    parts_ = parts;
    next_ = 1;  // part 0 is the caller's
    pending_ = 0;
    ++generation_;
  }
  wake_.notify_all();
  fn(0);
  // The caller takes parts too, until none is left to hand out; then waits for the workers'.
  std::unique_lock<std::mutex> lock(mu_);
  while (next_ < parts_) {
    const size_t p = next_++;
    lock.unlock();
    fn(p);
    lock.lock();
  }
  done_.wait(lock, [&] { return pending_ == 0; });
  fn_ = nullptr;
}

void ReducePool::work(size_t) {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return stop_ || (generation_ != seen && fn_ != nullptr); });
    if (stop_) return;
    seen = generation_;
    while (fn_ != nullptr && next_ < parts_) {
      const size_t p = next_++;
      ++pending_;
      const auto* fn = fn_;
      lock.unlock();
      (*fn)(p);
      lock.lock();
      if (--pending_ == 0) done_.notify_all();
    }
  }
}

void parallel_ranges(ReducePool* pool, size_t count, size_t elem, size_t min_bytes_per_part,
                     const std::function<void(size_t first, size_t n)>& fn) {
  if (count == 0) return;
  const size_t threads = pool ? static_cast<size_t>(pool->threads()) : 1;
  const size_t by_size =
      std::max<size_t>(1, count * elem / std::max<size_t>(1, min_bytes_per_part));
  const size_t parts = std::min(threads, by_size);
  if (parts <= 1) {
    fn(0, count);
    return;
  }
  // Whole cache lines per part where the element size divides one.
  const size_t line = 64 % elem == 0 ? 64 / elem : 1;
  size_t per = (count + parts - 1) / parts;
  per = (per + line - 1) / line * line;
  pool->run(parts, [&](size_t p) {
    const size_t first = p * per;
    if (first >= count) return;
    fn(first, std::min(per, count - first));
  });
}

}  // namespace gw::daemon
