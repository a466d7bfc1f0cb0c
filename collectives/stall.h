// The stall inspector: names the ranks a collective is waiting for.
//
// When a collective has run for GW_STALL_WARN_S without finishing and is making no progress, the
// waiting rank logs a WARN with the operation, its buffer size, how long it has waited, and which
// ranks have not entered it, and repeats that every GW_STALL_WARN_S until the call ends (it still
// fails at GW_TIMEOUT_MS). Nothing is exchanged while collectives progress: a stalled rank posts
// the tag of the collective it waits in (its sequence number with its signature folded in, the
// tag its messages carry) to a counter of the communicator's store, at half the warning period,
// and at the warning reads every rank's counter with add(key, 0), which never blocks. A rank
// whose counter holds another tag has not been seen waiting in this collective: it has not
// called it yet, or it called another one (a different op, dtype, root or order of calls).
// Off (warn_s <= 0) it costs one comparison per idle turn of the executor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/schedule.h"
#include "collectives/types.h"
#include "core/store.h"

namespace gw::coll {

struct StallOptions {
  Store* store = nullptr;  // the communicator's (keys under its prefix); null: off
  int rank = 0;
  int size = 1;
  double warn_s = 0;  // GW_STALL_WARN_S; <= 0: off
};

// One collective call's watch, made by Executor::run (one at a time per communicator).
class StallWatch {
 public:
  // plans and dtype give the reported size (the extent of the buffer the plans touch); they must
  // outlive the watch.
  StallWatch(const StallOptions& options, const char* name, uint32_t tag,
             const std::vector<Plan>& plans, DataType dtype);
  // Called on every idle turn of the collective's progress loop.
  void idle() {
    if (on_ && Clock::now() >= next_) tick();
  }

 private:
  void tick();
  void post();
  void report();

  const StallOptions& o_;
  const char* name_;
  uint32_t tag_;
  const std::vector<Plan>& plans_;
  DataType dtype_;
  bool on_;
  bool posted_ = false;
  Clock::time_point start_;
  Clock::time_point next_;
};

// The extent of the buffer `plans` touch, in bytes (what the stall and the timeline report).
size_t extent_bytes(const std::vector<Plan>& plans, DataType dtype);

// The rank's store key ("stall/<rank>"), shared by the inspector and its test.
std::string stall_key(int rank);

}  // namespace gw::coll
