// gradwire-fusion-bench: what tensor fusion in the C library (GW_FUSION_THRESHOLD, capi/
// fusion_queue.h) saves a program that starts many small allreduces with gw_iallreduce.
//
// Forks --np ranks on this host (rank 0 hosts the store on 127.0.0.1). One step: --tensors calls
// of --bytes each (float32 sum), all started with gw_iallreduce, then all waited for. Three modes,
// each on its own communicator: fusion off (GW_FUSION_THRESHOLD=0), fusion on (the default
// threshold, or --threshold), and the bound: one gw_allreduce of the concatenated bytes. A step's
// time is the slowest rank's (an allreduce MAX after the step); a run's figure is the median of
// --steps steps after --warmup, and the program prints the median of --runs runs per mode. Every
// result is checked (the sum of the ranks' values). --gap-us G spins G us before each call (the
// backward pass computing the next gradient), so that batches close on GW_CYCLE_TIME_MS
// (--cycle-ms) while the "compute" goes on, as in training; the bound then is the compute plus one
// allreduce of everything after it.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradwire/gradwire.h"

namespace {

struct Args {
  int np = 4;
  int tensors = 200;
  size_t bytes = 4096;
  int steps = 30;
  int warmup = 5;
  int runs = 5;
  int port = 29731;
  std::string transport = "auto";
  std::string threshold = "64M";
  double gap_us = 0;
  std::string cycle_ms;  // "" : GW_CYCLE_TIME_MS as set
};

void spin_us(double us) {
  if (us <= 0) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double, std::micro>(us);
  while (std::chrono::steady_clock::now() < end) {
  }
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

[[noreturn]] void die(const char* what, int rank) {
  std::fprintf(stderr, "rank %d: %s: %s\n", rank, what, gw_last_error());
  std::exit(1);
}

// One run of one mode (0: fusion off, 1: on, 2: one concatenated allreduce) on a new
// communicator; returns the median step time (us) of the slowest rank.
double run_mode(const Args& a, int rank, int mode, int run, std::vector<float>& data) {
  setenv("GW_FUSION_THRESHOLD", mode == 1 ? a.threshold.c_str() : "0", 1);
  if (!a.cycle_ms.empty()) setenv("GW_CYCLE_TIME_MS", a.cycle_ms.c_str(), 1);
  const std::string addr = "127.0.0.1:" + std::to_string(a.port + 1 + run * 3 + mode);
  gw_config_t cfg = GW_CONFIG_INIT;
  cfg.rank = rank;
  cfg.world_size = a.np;
  cfg.store_addr = addr.c_str();
  cfg.timeout_ms = 60000;
  cfg.transport = a.transport.c_str();
  cfg.job_token = "fusion-bench";
  gw_comm_t comm = nullptr;
  if (gw_comm_init(&comm, &cfg) != GW_OK) die("gw_comm_init", rank);
  const size_t per = a.bytes / sizeof(float);
  std::vector<gw_request_t> reqs(static_cast<size_t>(a.tensors));
  std::vector<double> times;
  for (int s = 0; s < a.warmup + a.steps; ++s) {
    std::fill(data.begin(), data.end(), static_cast<float>(rank + 1));
    if (gw_barrier(comm) != GW_OK) die("gw_barrier", rank);
    const double t0 = now_us();
    if (mode == 2) {
      for (int i = 0; i < a.tensors; ++i) spin_us(a.gap_us);
      if (gw_allreduce(comm, data.data(), data.data(), data.size(), GW_FLOAT32, GW_SUM) != GW_OK) {
        die("gw_allreduce", rank);
      }
    } else {
      for (int i = 0; i < a.tensors; ++i) {
        spin_us(a.gap_us);
        float* p = data.data() + static_cast<size_t>(i) * per;
        if (gw_iallreduce(comm, p, p, per, GW_FLOAT32, GW_SUM, &reqs[static_cast<size_t>(i)]) !=
            GW_OK) {
          die("gw_iallreduce", rank);
        }
      }
      for (auto* r : reqs) {
        if (gw_wait(r, -1) != GW_OK) die("gw_wait", rank);
      }
    }
    double dt = now_us() - t0;
    const float want = static_cast<float>(a.np * (a.np + 1) / 2);
    for (float v : data) {
      if (v != want) {
        std::fprintf(stderr, "rank %d: wrong result %g (want %g)\n", rank, v, want);
        std::exit(1);
      }
    }
    if (gw_allreduce(comm, &dt, &dt, 1, GW_FLOAT64, GW_MAX) != GW_OK) die("gw_allreduce", rank);
    if (s >= a.warmup) times.push_back(dt);
  }
  gw_comm_destroy(comm);
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const char* v = argv[i + 1];
    if (k == "--np")
      a.np = std::atoi(v);
    else if (k == "--tensors")
      a.tensors = std::atoi(v);
    else if (k == "--bytes")
      a.bytes = std::strtoull(v, nullptr, 10);
    else if (k == "--steps")
      a.steps = std::atoi(v);
    else if (k == "--warmup")
      a.warmup = std::atoi(v);
    else if (k == "--runs")
      a.runs = std::atoi(v);
    else if (k == "--port")
      a.port = std::atoi(v);
    else if (k == "--transport")
      a.transport = v;
    else if (k == "--threshold")
      a.threshold = v;
    else if (k == "--gap-us")
      a.gap_us = std::atof(v);
    else if (k == "--cycle-ms")
      a.cycle_ms = v;
    else {
      std::fprintf(
          stderr,
          "usage: %s [--np N] [--tensors N] [--bytes B] [--steps N] [--warmup N] "
          "[--runs N] [--port P] [--transport auto|tcp|shm] [--threshold SIZE] [--gap-us US] "
          "[--cycle-ms MS]\n",
          argv[0]);
      return 2;
    }
  }
  if (a.np < 1 || a.tensors < 1 || a.bytes < sizeof(float) || a.steps < 1 || a.runs < 1) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  std::vector<pid_t> kids;
  for (int r = 0; r < a.np; ++r) {
    const pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) {
      kids.push_back(pid);
      continue;
    }
    std::vector<float> data(static_cast<size_t>(a.tensors) * (a.bytes / sizeof(float)));
    std::vector<double> med[3];
    for (int run = 0; run < a.runs; ++run) {
      for (int mode = 0; mode < 3; ++mode) med[mode].push_back(run_mode(a, r, mode, run, data));
    }
    if (r == 0) {
      std::printf(
          "# %d ranks, transport %s, %d x %zu B gw_iallreduce per step, then all waited;\n"
          "# %.1f us of compute before each call; threshold %s, GW_CYCLE_TIME_MS %s\n"
          "# median of %d steps (slowest rank) per run, median of %d runs [min..max]\n",
          a.np, a.transport.c_str(), a.tensors, a.bytes, a.gap_us, a.threshold.c_str(),
          a.cycle_ms.empty() ? "(as set)" : a.cycle_ms.c_str(), a.steps, a.runs);
      const char* names[3] = {"fusion off (GW_FUSION_THRESHOLD=0)", "fusion on",
                              "bound: one allreduce"};
      for (int m = 0; m < 3; ++m) {
        auto& v = med[m];
        std::printf("%-36s %10.1f us/step  [%.1f .. %.1f]\n", names[m], median(v),
                    *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end()));
      }
    }
    std::exit(0);
  }
  int bad = 0;
  for (pid_t k : kids) {
    int st = 0;
    waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      bad = 1;
      if (WIFSIGNALED(st)) std::fprintf(stderr, "a rank died of signal %d\n", WTERMSIG(st));
    }
  }
  return bad;
}
