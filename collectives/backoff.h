// How a thread that polls connections waits when nothing moved (the executor and the connection
// pool's set-up loop share it).
#pragma once

#include <poll.h>
#include <sched.h>

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/store.h"

namespace gw::coll {

// Waiting policy: spin for a couple of microseconds (a peer on another core usually answers
// within that); then, until spin_us, keep polling but give the core away between polls with
// sched_yield(), which returns at once when nothing else wants this core and otherwise runs the
// other task (often the very peer being waited for, when the ranks outnumber the cores); then,
// when every connection being waited on can be waited on with poll() (tcp), block in poll() for
// at most 1 ms; otherwise (shm) yield for a while, then sleep briefly.
class Backoff {
 public:
  // pure_spin: how long to spin before the first sched_yield (a caller waiting on one message
  // may spin longer: a yield on a loaded core can give it away for a whole time slice).
  explicit Backoff(int64_t spin_us,
                   std::chrono::microseconds pure_spin = std::chrono::microseconds(2))
      : pure_spin_(pure_spin), spin_(std::chrono::microseconds(spin_us)) {}
  void reset() { idle_ = 0; }
  // gather(&fds) appends the descriptors to wait on and returns false if some connection
  // cannot be waited on that way. Returns the time it read on entry (one read per call: a
  // spinning caller makes many, and may use it as its own "now").
  template <typename Gather>
  Clock::time_point idle(Gather&& gather) {
    const auto now = Clock::now();
    if (idle_++ == 0) since_ = now;
    const auto waited = now - since_;
    if (waited < pure_spin_) return now;
    if (waited < spin_) {
      sched_yield();
      return now;
    }
    fds_.clear();
    if (gather(&fds_) && !fds_.empty()) {
      (void)::poll(fds_.data(), fds_.size(), 1);
      return now;
    }
    if (waited < spin_ + std::chrono::milliseconds(2)) {
      sched_yield();
      return now;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    return now;
  }
  Clock::time_point idle() {
    return idle([](std::vector<pollfd>*) { return false; });
  }

 private:
  std::chrono::microseconds pure_spin_;
  std::vector<pollfd> fds_;
  std::chrono::microseconds spin_;
  int64_t idle_ = 0;
  Clock::time_point since_;
};

}  // namespace gw::coll
