// The frame the trainers of the daemon tests share (daemon_trainer.cc, device_trainer.cc): their
// options, the usage line, the comm's set-up and tear-down, and the ERROR/RESULT lines their
// tests read. Header-only and against include/gradwire/gradwire.h alone, so that a trainer stays
// one source file that perf/gpu/CMakeLists.txt can build outside this tree.
//
// usage: TRAINER --rank R --world N [--store HOST:PORT] [--timeout-ms MS] SCENARIO [ARGS]
#pragma once

#include <signal.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "gradwire/gradwire.h"

namespace gw_trainer {

// The rank the ERROR/RESULT lines name before the comm says its own (the --rank option).
inline int& report_rank() {
  static int rank = -1;
  return rank;
}

inline double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Prints the failed call's ERROR and RESULT lines; returns the exit code of a failure.
inline int report(const char* what, gw_status_t s, double t0) {
  const int rank = report_rank();
  std::printf("ERROR rank=%d %s: %s: %s\n", rank, what, gw_status_string(s), gw_last_error());
  std::printf("RESULT rank=%d status=%d elapsed_ms=%.0f\n", rank, static_cast<int>(s),
              now_ms() - t0);
  std::fflush(stdout);
  return 10 + static_cast<int>(s);
}

// The "die" scenario on float32 buffers of `count` elements (host or device memory): rank
// `killer` makes two allreduces, then SIGKILLs itself while its third one runs; the others call
// allreduce until it fails (exit code of report()) or 100000 calls went through (0).
inline int die_while_others_allreduce(gw_comm_t comm, int rank, int killer, void* send, void* recv,
                                      size_t count) {
  if (rank == killer) {
    for (int i = 0; i < 2; ++i) {
      gw_status_t s = gw_allreduce(comm, send, recv, count, GW_FLOAT32, GW_SUM);
      if (s != GW_OK) return report("allreduce before dying", s, now_ms());
    }
    std::thread t([&] { gw_allreduce(comm, send, recv, count, GW_FLOAT32, GW_SUM); });
    t.detach();
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, nullptr);
    std::printf("DYING rank=%d\n", rank);
    std::fflush(stdout);
    raise(SIGKILL);
  }
  for (int i = 0; i < 100000; ++i) {
    const double t0 = now_ms();
    gw_status_t s = gw_allreduce(comm, send, recv, count, GW_FLOAT32, GW_SUM);
    if (s != GW_OK) return report("allreduce while a trainer dies", s, t0);
  }
  std::printf("RESULT rank=%d status=0 elapsed_ms=0 (the killed trainer never broke it)\n", rank);
  return 0;
}

// What a scenario is handed: the comm, its rank and size, the arguments after the scenario's
// name, and when the set-up began.
struct Scenario {
  gw_comm_t comm = nullptr;
  int rank = 0;
  int world = 1;
  std::string name;
  int argc = 0;  // arguments after the name
  char** argv = nullptr;
  double t0 = 0;
};

// Parses the options, runs `prepare()` (0 to go on, else the exit code), makes the comm, runs
// `dispatch(scenario)` and destroys the comm. dispatch returns the exit code, or -1 for an
// unknown scenario or wrong arguments (exit 2). Exit 2 on a usage error; `usage` names the
// scenarios.
template <typename Prepare, typename Dispatch>
int trainer_main(int argc, char** argv, const char* usage, Prepare prepare, Dispatch dispatch) {
  gw_config_t cfg = GW_CONFIG_INIT;
  int i = 1;
  for (; i + 1 < argc && std::strncmp(argv[i], "--", 2) == 0; i += 2) {
    if (std::strcmp(argv[i], "--rank") == 0) {
      cfg.rank = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--world") == 0) {
      cfg.world_size = std::atoi(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--store") == 0) {
      cfg.store_addr = argv[i + 1];
    } else if (std::strcmp(argv[i], "--timeout-ms") == 0) {
      cfg.timeout_ms = std::atoi(argv[i + 1]);
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "usage: %s [options] %s\n", argv[0], usage);
    return 2;
  }
  Scenario sc;
  sc.name = argv[i++];
  sc.argc = argc - i;
  sc.argv = argv + i;
  report_rank() = cfg.rank;
  if (const int rc = prepare(); rc != 0) return rc;
  sc.t0 = now_ms();
  gw_status_t s = gw_comm_init(&sc.comm, &cfg);
  if (s != GW_OK) return report("gw_comm_init", s, sc.t0);
  gw_comm_rank(sc.comm, &sc.rank);
  gw_comm_size(sc.comm, &sc.world);
  int rc = dispatch(sc);
  if (rc < 0) {
    std::fprintf(stderr, "unknown scenario or arguments\n");
    rc = 2;
  }
  std::fflush(stdout);
  gw_comm_destroy(sc.comm);
  return rc;
}

}  // namespace gw_trainer
