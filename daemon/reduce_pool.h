// The daemon's helper threads for the local sums and copies of large collectives: run(parts, fn)
// calls fn(0) .. fn(parts - 1), part 0 on the calling thread and the others on the pool's workers,
// and returns when all are done. One run at a time: a job thread that finds the pool busy (another
// job's run) does every part itself, so jobs never wait for each other here.
//
// Thread-safe. fn must not throw and must not call run().
#pragma once

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gw::daemon {

class ReducePool {
 public:
  // threads: the parts run at once, the caller's included (0: min(4, the CPUs); 1: no workers).
  explicit ReducePool(int threads);
  ~ReducePool();
  ReducePool(const ReducePool&) = delete;
  ReducePool& operator=(const ReducePool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  void run(size_t parts, const std::function<void(size_t part)>& fn);

 private:
  void work(size_t index);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;  // one run at a time (try_lock: a busy pool runs the parts inline)
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t parts_ = 0;
  size_t next_ = 0;     // the next part to hand out
  size_t pending_ = 0;  // parts handed to workers and not yet finished
  uint64_t generation_ = 0;
  bool stop_ = false;
};

// Splits `count` elements of `elem` bytes into at most `parts` ranges of whole cache lines (the
// last takes the rest); calls fn(first_element, elements) for each non-empty one through the pool.
void parallel_ranges(ReducePool* pool, size_t count, size_t elem, size_t min_bytes_per_part,
                     const std::function<void(size_t first, size_t n)>& fn);

}  // namespace gw::daemon
