// A trainer of daemon_trace_test (the stall inspector in daemon mode), against
// include/gradwire/gradwire.h only.
//
// usage: stall_trainer --rank R --world N [--store HOST:PORT] [--timeout-ms MS] late SLEEPER MS
//   every rank makes one allreduce; then rank SLEEPER sleeps MS milliseconds ("SLEEPING", then
//   "ENTERING" when it calls) while the others call at once ("ENTERED"); the second allreduce's
//   sum is checked. Output and exit codes as daemon_trainer's (trainer_args.h).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "trainer_args.h"

namespace {

using gw_trainer::now_ms;
using gw_trainer::report;

int run_late(gw_comm_t comm, int rank, int world, int sleeper, int ms) {
  const size_t count = 1000;  // 4000 bytes
  std::vector<float> buf(count, 1.0f);
  double t0 = now_ms();
  gw_status_t s = gw_allreduce(comm, buf.data(), buf.data(), count, GW_FLOAT32, GW_SUM);
  if (s != GW_OK) return report("first allreduce", s, t0);
  std::fill(buf.begin(), buf.end(), 1.0f);
  if (rank == sleeper) {
    std::printf("SLEEPING rank=%d\n", rank);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    std::printf("ENTERING rank=%d\n", rank);
  } else {
    std::printf("ENTERED rank=%d\n", rank);
  }
  std::fflush(stdout);
  t0 = now_ms();
  s = gw_allreduce(comm, buf.data(), buf.data(), count, GW_FLOAT32, GW_SUM);
  if (s != GW_OK) return report("late allreduce", s, t0);
  for (float v : buf) {
    if (v != static_cast<float>(world)) {
      std::printf("ERROR rank=%d late allreduce: %g, not %d\n", rank, v, world);
      return 1;
    }
  }
  std::printf("RESULT rank=%d status=0 elapsed_ms=%.0f\n", rank, now_ms() - t0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gw_trainer::trainer_main(
      argc, argv, "late SLEEPER MS", [] { return 0; },
      [](const gw_trainer::Scenario& sc) {
        if (sc.name == "late" && sc.argc == 2) {
          return run_late(sc.comm, sc.rank, sc.world, std::atoi(sc.argv[0]), std::atoi(sc.argv[1]));
        }
        return -1;
      });
}
