/* One rank of a multi-process integration test, written in C11 against include/gradwire/gradwire.h
 * only, so that it also proves the public header is valid C.
 *
 * usage: gw_rank_main [--rank R --world N --store HOST:PORT] [--transport T] [--timeout-ms MS]
 *                     SCENARIO [ARGS]
 *   With --rank/--world/--store the communicator comes from gw_comm_init (explicit config);
 *   without them from gw_comm_init_from_env (GW_*, torchrun, Open MPI, Slurm variables).
 * Scenarios:
 *   suite COUNT...     allreduce of every dtype (f32 f64 i32 i64 u8) and op at every COUNT,
 *                      out-of-place and in-place, each result checked exactly
 *   mismatch           rank r calls allreduce with count 1000 + 17 r: must fail, not hang
 *   die KILLER COUNT   rank KILLER starts an allreduce of COUNT floats and SIGKILLs itself while it
 *                      runs; the others keep calling allreduce until it fails
 *   leave WHO HOW      rank WHO leaves right after gw_comm_init returns, before any collective
 *                      (HOW: "exit", exit(0) without gw_comm_destroy, or "kill", SIGKILL); the
 *                      others call one allreduce, which must fail naming it
 *   identity           prints the rank/size the library detected next to the launcher variables,
 *                      then checks one allreduce
 *   twice              creates a second communicator the same way as the first (same
 *                      environment or config), checks an allreduce on each, alternating, and
 *                      destroys the second first
 * Output: lines "RESULT rank=R status=S elapsed_ms=T" (S: the gw_status_t of the failing or last
 * call) and "ERROR ..." with gw_last_error(). Exit status: 0 all calls OK and results right,
 * 1 wrong result, 2 usage, 10 + gw_status_t when a call failed.
 */
#define _POSIX_C_SOURCE 200809L

#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gradwire/gradwire.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int g_rank = -1;

static int report_failure(const char* what, gw_status_t s, double started_ms) {
  printf("ERROR rank=%d %s: %s: %s\n", g_rank, what, gw_status_string(s), gw_last_error());
  printf("RESULT rank=%d status=%d elapsed_ms=%.0f\n", g_rank, (int)s, now_ms() - started_ms);
  fflush(stdout);
  return 10 + (int)s;
}

/* Rank r's value at index i; small enough that every reduction is exact in every dtype. */
static int64_t pattern(gw_op_t op, int world, int rank, size_t i) {
  if (op == GW_PROD) return ((i + (size_t)rank) % (size_t)world) == 0 ? 2 : 1;
  int64_t range = 255 / world;
  if (range > 31) range = 31;
  if (range < 1) range = 1;
  return (int64_t)((i * 7 + (size_t)rank * 13) % (size_t)range);
}

static int64_t expected(gw_op_t op, int world, size_t i) {
  int64_t acc = pattern(op, world, 0, i);
  for (int r = 1; r < world; ++r) {
    int64_t v = pattern(op, world, r, i);
    switch (op) {
      case GW_SUM:
      case GW_AVG:
        acc += v;
        break;
      case GW_PROD:
        acc *= v;
        break;
      case GW_MIN:
        acc = v < acc ? v : acc;
        break;
      case GW_MAX:
        acc = v > acc ? v : acc;
        break;
    }
  }
  return acc;
}

static size_t dtype_size(gw_dtype_t t) {
  switch (t) {
    case GW_FLOAT64:
    case GW_INT64:
      return 8;
    case GW_FLOAT32:
    case GW_INT32:
      return 4;
    case GW_UINT8:
      return 1;
    default:
      return 2;
  }
}

static void store(void* buf, size_t i, gw_dtype_t t, double v) {
  switch (t) {
    case GW_FLOAT32:
      ((float*)buf)[i] = (float)v;
      break;
    case GW_FLOAT64:
      ((double*)buf)[i] = v;
      break;
    case GW_INT32:
      ((int32_t*)buf)[i] = (int32_t)v;
      break;
    case GW_INT64:
      ((int64_t*)buf)[i] = (int64_t)v;
      break;
    case GW_UINT8:
      ((uint8_t*)buf)[i] = (uint8_t)((int64_t)v & 0xff);
      break;
    default:
      break;
  }
}

static double load(const void* buf, size_t i, gw_dtype_t t) {
  switch (t) {
    case GW_FLOAT32:
      return ((const float*)buf)[i];
    case GW_FLOAT64:
      return ((const double*)buf)[i];
    case GW_INT32:
      return ((const int32_t*)buf)[i];
    case GW_INT64:
      return (double)((const int64_t*)buf)[i];
    case GW_UINT8:
      return ((const uint8_t*)buf)[i];
    default:
      return 0;
  }
}

static int is_float(gw_dtype_t t) { return t == GW_FLOAT32 || t == GW_FLOAT64; }

static double want_at(gw_op_t op, gw_dtype_t t, int world, size_t i) {
  int64_t e = expected(op, world, i);
  if (op != GW_AVG) return (double)e;
  return is_float(t) ? (double)e / world : (double)(e / world);
}

static int close_enough(gw_dtype_t t, double got, double want) {
  if (!is_float(t)) return got == want;
  double tol = (t == GW_FLOAT32 ? 1e-6 : 1e-14) * (want < 0 ? -want : want) + 1e-12;
  double d = got - want;
  return d <= tol && -d <= tol;
}

static int run_suite(gw_comm_t comm, int rank, int world, int ncounts, char** counts) {
  const gw_dtype_t dtypes[] = {GW_FLOAT32, GW_FLOAT64, GW_INT32, GW_INT64, GW_UINT8};
  const char* dnames[] = {"float32", "float64", "int32", "int64", "uint8"};
  const gw_op_t ops[] = {GW_SUM, GW_PROD, GW_MIN, GW_MAX, GW_AVG};
  const char* onames[] = {"sum", "prod", "min", "max", "avg"};
  double t0 = now_ms();
  int calls = 0;
  for (int c = 0; c < ncounts; ++c) {
    size_t count = (size_t)strtoull(counts[c], NULL, 10);
    for (int d = 0; d < 5; ++d) {
      size_t bytes = count * dtype_size(dtypes[d]);
      unsigned char* send = malloc(bytes + 1);
      unsigned char* recv = malloc(bytes + 1);
      if (!send || !recv) {
        fprintf(stderr, "out of memory\n");
        return 2;
      }
      for (int o = 0; o < 5; ++o) {
        for (int in_place = 0; in_place < 2; ++in_place) {
          for (size_t i = 0; i < count; ++i) {
            store(send, i, dtypes[d], (double)pattern(ops[o], world, rank, i));
            store(recv, i, dtypes[d], -1.0);
          }
          void* out = in_place ? (void*)send : (void*)recv;
          gw_status_t s = gw_allreduce(comm, send, out, count, dtypes[d], ops[o]);
          ++calls;
          if (s != GW_OK) {
            char what[128];
            snprintf(what, sizeof(what), "allreduce %s %s count %zu%s", dnames[d], onames[o], count,
                     in_place ? " in place" : "");
            free(send);
            free(recv);
            return report_failure(what, s, t0);
          }
          size_t wrong = 0, first_wrong = 0;
          for (size_t i = 0; i < count; ++i) {
            if (!close_enough(dtypes[d], load(out, i, dtypes[d]),
                              want_at(ops[o], dtypes[d], world, i))) {
              if (wrong++ == 0) first_wrong = i;
            }
          }
          if (wrong) {
            printf(
                "WRONG rank=%d allreduce %s %s count %zu%s: %zu wrong, first at %zu: got %g "
                "want %g\n",
                rank, dnames[d], onames[o], count, in_place ? " in place" : "", wrong, first_wrong,
                load(out, first_wrong, dtypes[d]), want_at(ops[o], dtypes[d], world, first_wrong));
            fflush(stdout);
            free(send);
            free(recv);
            return 1;
          }
        }
      }
      free(send);
      free(recv);
    }
  }
  printf("RESULT rank=%d status=0 elapsed_ms=%.0f calls=%d\n", rank, now_ms() - t0, calls);
  return 0;
}

static int run_mismatch(gw_comm_t comm, int rank) {
  size_t count = 1000 + 17 * (size_t)rank;
  float* buf = calloc(count, sizeof(float));
  if (!buf) return 2;
  double t0 = now_ms();
  gw_status_t s = gw_allreduce(comm, buf, buf, count, GW_FLOAT32, GW_SUM);
  free(buf);
  if (s == GW_OK) {
    printf("RESULT rank=%d status=0 elapsed_ms=%.0f\n", rank, now_ms() - t0);
    return 0;
  }
  return report_failure("allreduce with a count that differs between ranks", s, t0);
}

static int run_die(gw_comm_t comm, int rank, int killer, size_t count) {
  float* send = calloc(count, sizeof(float));
  float* recv = calloc(count, sizeof(float));
  if (!send || !recv) return 2;
  if (rank == killer) {
    /* A few complete calls first, so the connections are up and busy. */
    for (int i = 0; i < 2; ++i) {
      gw_status_t s = gw_allreduce(comm, send, recv, count, GW_FLOAT32, GW_SUM);
      if (s != GW_OK) return report_failure("allreduce before dying", s, now_ms());
    }
    gw_request_t req = NULL;
    gw_status_t s = gw_iallreduce(comm, send, recv, count, GW_FLOAT32, GW_SUM, &req);
    if (s != GW_OK) return report_failure("iallreduce before dying", s, now_ms());
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
    printf("DYING rank=%d\n", rank);
    fflush(stdout);
    raise(SIGKILL);
    return 3; /* not reached */
  }
  for (int i = 0; i < 100000; ++i) {
    double t0 = now_ms();
    gw_status_t s = gw_allreduce(comm, send, recv, count, GW_FLOAT32, GW_SUM);
    if (s != GW_OK) {
      free(send);
      free(recv);
      return report_failure("allreduce while a rank dies", s, t0);
    }
  }
  free(send);
  free(recv);
  printf("RESULT rank=%d status=0 elapsed_ms=0 (the killed rank never broke the collective)\n",
         rank);
  return 0;
}

static int run_leave(gw_comm_t comm, int rank, int who, const char* how) {
  if (rank == who) {
    printf("LEAVING rank=%d\n", rank);
    fflush(stdout);
    if (strcmp(how, "kill") == 0) raise(SIGKILL);
    exit(0);
  }
  float buf[1024];
  memset(buf, 0, sizeof(buf));
  double t0 = now_ms();
  gw_status_t s = gw_allreduce(comm, buf, buf, 1024, GW_FLOAT32, GW_SUM);
  if (s == GW_OK) {
    printf("RESULT rank=%d status=0 elapsed_ms=%.0f (a rank left, yet the allreduce ran)\n", rank,
           now_ms() - t0);
    return 1;
  }
  return report_failure("the first allreduce after a rank left", s, t0);
}

static int run_identity(gw_comm_t comm, int rank, int world) {
  const char* vars[] = {"GW_RANK",      "RANK",       "OMPI_COMM_WORLD_RANK",
                        "SLURM_PROCID", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE",
                        "SLURM_NTASKS", "GW_STORE",   "MASTER_ADDR",
                        "MASTER_PORT"};
  printf("IDENTITY rank=%d size=%d", rank, world);
  for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); ++i) {
    const char* v = getenv(vars[i]);
    if (v) printf(" %s=%s", vars[i], v);
  }
  printf("\n");
  fflush(stdout);
  char* one[] = {"1000"};
  return run_suite(comm, rank, world, 1, one);
}

static int run_twice(gw_comm_t comm, int rank, int world, const gw_config_t* cfg) {
  gw_comm_t second = NULL;
  double t0 = now_ms();
  gw_status_t s = cfg ? gw_comm_init(&second, cfg) : gw_comm_init_from_env(&second);
  if (s != GW_OK) return report_failure("second gw_comm_init", s, t0);
  char* one[] = {"1000"};
  int rc = run_suite(second, rank, world, 1, one);
  if (rc == 0) rc = run_suite(comm, rank, world, 1, one);
  if (rc == 0) rc = run_suite(second, rank, world, 1, one);
  if (rc != 0) gw_comm_abort(second);
  s = gw_comm_destroy(second);
  if (rc == 0 && s != GW_OK) return report_failure("gw_comm_destroy of the second", s, t0);
  if (rc == 0) printf("TWICE rank=%d ok\n", rank);
  return rc;
}

int main(int argc, char** argv) {
  gw_config_t cfg = GW_CONFIG_INIT;
  int explicit_cfg = 0;
  int i = 1;
  for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
    if (i + 1 >= argc) {
      fprintf(stderr, "%s needs a value\n", argv[i]);
      return 2;
    }
    if (strcmp(argv[i], "--rank") == 0) {
      cfg.rank = atoi(argv[i + 1]);
      explicit_cfg = 1;
    } else if (strcmp(argv[i], "--world") == 0) {
      cfg.world_size = atoi(argv[i + 1]);
    } else if (strcmp(argv[i], "--store") == 0) {
      cfg.store_addr = argv[i + 1];
    } else if (strcmp(argv[i], "--transport") == 0) {
      cfg.transport = argv[i + 1];
    } else if (strcmp(argv[i], "--timeout-ms") == 0) {
      cfg.timeout_ms = atoi(argv[i + 1]);
    } else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (i >= argc) {
    fprintf(stderr, "usage: %s [options] suite|mismatch|die|leave|identity|twice [args]\n",
            argv[0]);
    return 2;
  }
  const char* scenario = argv[i++];
  gw_comm_t comm = NULL;
  double t0 = now_ms();
  gw_status_t s = explicit_cfg ? gw_comm_init(&comm, &cfg) : gw_comm_init_from_env(&comm);
  if (s != GW_OK) return report_failure("gw_comm_init", s, t0);
  int rank = -1, world = -1;
  if ((s = gw_comm_rank(comm, &rank)) != GW_OK) return report_failure("gw_comm_rank", s, t0);
  if ((s = gw_comm_size(comm, &world)) != GW_OK) return report_failure("gw_comm_size", s, t0);
  g_rank = rank;

  int rc;
  if (strcmp(scenario, "suite") == 0) {
    rc = run_suite(comm, rank, world, argc - i, argv + i);
  } else if (strcmp(scenario, "mismatch") == 0) {
    rc = run_mismatch(comm, rank);
  } else if (strcmp(scenario, "die") == 0 && argc - i == 2) {
    rc = run_die(comm, rank, atoi(argv[i]), (size_t)strtoull(argv[i + 1], NULL, 10));
  } else if (strcmp(scenario, "leave") == 0 && argc - i == 2) {
    rc = run_leave(comm, rank, atoi(argv[i]), argv[i + 1]);
  } else if (strcmp(scenario, "identity") == 0) {
    rc = run_identity(comm, rank, world);
  } else if (strcmp(scenario, "twice") == 0) {
    rc = run_twice(comm, rank, world, explicit_cfg ? &cfg : NULL);
  } else {
    fprintf(stderr, "unknown scenario or wrong arguments: %s\n", scenario);
    rc = 2;
  }
  fflush(stdout);
  if (rc == 0) {
    s = gw_comm_destroy(comm);
    if (s != GW_OK) return report_failure("gw_comm_destroy", s, t0);
  } else {
    gw_comm_abort(comm);
    gw_comm_destroy(comm);
  }
  return rc;
}
