// One worker of the parameter-server tests in daemon mode (kv_daemon_test.cc), written against
// include/gradwire/gradwire.h only; GW_DAEMON in its environment picks daemon mode, so the job's
// daemons are the kv servers.
//
// usage: kv_daemon_trainer --rank R --world N [--store HOST:PORT] [--timeout-ms MS] [--codec SPEC]
//                          SCENARIO ARGS
// --codec: the store's pushes' codec (gw_kv_config_t.codec; pushpull's values stay exact under
// fp16 and bf16: small integers).
// Scenarios:
//   pushpull STEPS HOLD   a bsp/sum store, key 7 of 100 floats in 64-byte partitions (over every
//                         daemon): STEPS push_pulls, each checked to be the clock's exact sum;
//                         then "HOLDING" and, before destroying the store, a wait until the file
//                         HOLD exists ("-": none), so the test can look at the daemons meanwhile
//   loop                  a bsp/sum store: push_pull until a call fails ("READY" after the first);
//                         the test kills a daemon meanwhile
//   early HOLD            an asp/sum store: every rank pushes rank + 1 into key 7 ("PUSHED");
//                         even ranks then leave (store and communicator destroyed: "DONE"); odd
//                         ranks wait for the file HOLD, then pull and check the sum of every push,
//                         served in part by the daemon whose trainers have all gone
// Output: "RESULT rank=R status=S elapsed_ms=T" and "ERROR ..." lines; exit 0 when every call
// succeeded with the right result, 1 on a wrong result, 2 on usage, 10 + gw_status_t on a failure.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"

namespace {

int g_rank = -1;

double now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int report(const char* what, gw_status_t s, double t0) {
  std::printf("ERROR rank=%d %s: %s: %s\n", g_rank, what, gw_status_string(s), gw_last_error());
  std::printf("RESULT rank=%d status=%d elapsed_ms=%.0f\n", g_rank, static_cast<int>(s),
              now_ms() - t0);
  std::fflush(stdout);
  return 10 + static_cast<int>(s);
}

constexpr uint64_t kKey = 7;
constexpr size_t kCount = 100;

int run_pushpull(gw_kv_t kv, int rank, int world, int steps, const std::string& hold) {
  const double t0 = now_ms();
  std::vector<float> zero(kCount, 0.f);
  gw_status_t s = gw_kv_init(kv, kKey, zero.data(), kCount, GW_FLOAT32);
  if (s != GW_OK) return report("gw_kv_init", s, t0);
  for (int step = 0; step < steps; ++step) {
    std::vector<float> v(kCount), out(kCount, -1.f);
    for (size_t i = 0; i < kCount; ++i) v[i] = static_cast<float>((rank + 1) * (step + 1) + i);
    s = gw_kv_pushpull(kv, kKey, v.data(), out.data(), kCount, GW_FLOAT32, 0);
    if (s != GW_OK) return report("gw_kv_pushpull", s, t0);
    for (size_t i = 0; i < kCount; ++i) {
      const float want = static_cast<float>(world * (world + 1) / 2 * (step + 1) + world * i);
      if (out[i] != want) {
        std::printf("ERROR rank=%d step %d element %zu: %g, want %g\n", rank, step, i, out[i],
                    want);
        std::printf("RESULT rank=%d status=-1 elapsed_ms=%.0f\n", rank, now_ms() - t0);
        return 1;
      }
    }
    s = gw_kv_clock(kv);
    if (s != GW_OK) return report("gw_kv_clock", s, t0);
  }
  std::printf("HOLDING rank=%d\n", rank);
  std::fflush(stdout);
  struct stat st {};
  for (int i = 0; hold != "-" && i < 600 && ::stat(hold.c_str(), &st) != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("RESULT rank=%d status=0 elapsed_ms=%.0f\n", rank, now_ms() - t0);
  return 0;
}

int run_loop(gw_kv_t kv, int rank) {
  const double t0 = now_ms();
  std::vector<float> v(1000, 1.f), out(1000);
  gw_status_t s = gw_kv_init(kv, kKey, v.data(), v.size(), GW_FLOAT32);
  if (s != GW_OK) return report("gw_kv_init", s, t0);
  for (int step = 0;; ++step) {
    const double t = now_ms();
    s = gw_kv_pushpull(kv, kKey, v.data(), out.data(), v.size(), GW_FLOAT32, 0);
    if (s == GW_OK) s = gw_kv_clock(kv);
    if (s != GW_OK) return report("gw_kv_pushpull while a daemon dies", s, t);
    if (step == 0) {
      std::printf("READY rank=%d\n", rank);
      std::fflush(stdout);
    }
  }
}

int run_early(gw_kv_t kv, int rank, int world, const std::string& hold) {
  const double t0 = now_ms();
  std::vector<float> v(kCount, 0.f), out(kCount, -1.f);
  gw_status_t s = gw_kv_init(kv, kKey, v.data(), kCount, GW_FLOAT32);
  if (s != GW_OK) return report("gw_kv_init", s, t0);
  std::fill(v.begin(), v.end(), static_cast<float>(rank + 1));
  s = gw_kv_push(kv, kKey, v.data(), kCount, GW_FLOAT32, 0);
  if (s != GW_OK) return report("gw_kv_push", s, t0);
  std::printf("PUSHED rank=%d\n", rank);
  std::fflush(stdout);
  if (rank % 2 == 1) {
    struct stat st {};
    for (int i = 0; i < 600 && ::stat(hold.c_str(), &st) != 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    s = gw_kv_pull(kv, kKey, out.data(), kCount, GW_FLOAT32, 0);
    if (s != GW_OK) return report("gw_kv_pull after the even ranks left", s, t0);
    const float want = static_cast<float>(world * (world + 1) / 2);
    for (size_t i = 0; i < kCount; ++i) {
      if (out[i] != want) {
        std::printf("ERROR rank=%d element %zu: %g, want %g\n", rank, i, out[i], want);
        std::printf("RESULT rank=%d status=-1 elapsed_ms=%.0f\n", rank, now_ms() - t0);
        return 1;
      }
    }
  }
  std::printf("RESULT rank=%d status=0 elapsed_ms=%.0f\n", rank, now_ms() - t0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gw_config_t cfg = GW_CONFIG_INIT;
  const char* codec = nullptr;
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
    } else if (std::strcmp(argv[i], "--codec") == 0) {
      codec = argv[i + 1];
    } else {
      std::fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "usage: %s [options] pushpull STEPS HOLD | loop | early HOLD\n", argv[0]);
    return 2;
  }
  const std::string scenario = argv[i++];
  g_rank = cfg.rank;
  const double t0 = now_ms();
  gw_comm_t comm = nullptr;
  gw_status_t s = gw_comm_init(&comm, &cfg);
  if (s != GW_OK) return report("gw_comm_init", s, t0);
  int rank = 0, world = 1;
  gw_comm_rank(comm, &rank);
  gw_comm_size(comm, &world);
  gw_kv_config_t kc = GW_KV_CONFIG_INIT;
  kc.partition_bytes = 64;  // 16 floats a partition: key 7 spreads over every daemon
  if (scenario == "early") kc.mode = GW_KV_ASP;
  kc.codec = codec;
  gw_kv_t kv = nullptr;
  s = gw_kv_create(comm, &kc, &kv);
  if (s != GW_OK) {
    const int rc = report("gw_kv_create", s, t0);
    gw_comm_destroy(comm);
    return rc;
  }
  int rc = 2;
  if (scenario == "pushpull" && argc - i == 2) {
    rc = run_pushpull(kv, rank, world, std::atoi(argv[i]), argv[i + 1]);
  } else if (scenario == "loop" && argc == i) {
    rc = run_loop(kv, rank);
  } else if (scenario == "early" && argc - i == 1) {
    rc = run_early(kv, rank, world, argv[i]);
  } else {
    std::fprintf(stderr, "unknown scenario or arguments\n");
  }
  std::fflush(stdout);
  s = gw_kv_destroy(kv);
  if (s != GW_OK && rc == 0) rc = report("gw_kv_destroy", s, t0);
  std::fflush(stdout);
  gw_comm_destroy(comm);
  std::printf("DONE rank=%d\n", rank);
  std::fflush(stdout);
  return rc;
}
