// Time for every wait in gradwire: one monotonic clock, deadlines as points on it, and the
// conversions poll() and the transports need.
//
// Everything here is thread-safe (no state) and never blocks.
#pragma once

#include <chrono>
#include <cstdint>

namespace gw::sys {

// The monotonic clock (CLOCK_MONOTONIC on Linux): immune to wall-clock steps.
using Clock = std::chrono::steady_clock;

// A point on Clock. Every blocking call in gradwire takes one and gives up with kTimeout once it
// has passed; a deadline in the past makes such a call a single non-blocking attempt.
using Deadline = Clock::time_point;

// A deadline that has always passed (the clock's epoch): a blocking call given it makes one
// non-blocking attempt, for callers that run their own state machine.
inline constexpr Deadline kNoWait{};

// Now plus `ms` milliseconds (negative or zero: already expired).
inline Deadline deadline_after_ms(int64_t ms) {
  return Clock::now() + std::chrono::milliseconds(ms);
}

// True once the deadline has passed.
inline bool expired(Deadline deadline) { return Clock::now() >= deadline; }

// Milliseconds from now to the deadline, rounded up and clamped to [0, INT32_MAX]: the timeout
// argument for poll(), which then never returns before the deadline.
int ms_until(Deadline deadline);

// Nanoseconds from now to the deadline, clamped at 0.
int64_t ns_until(Deadline deadline);

// Clock::now() as nanoseconds since the clock's epoch, for code that keeps deadlines as integers
// (hot paths that compare them often).
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace gw::sys
