// One trainer of the daemon integration tests, written against include/gradwire/gradwire.h only
// (so it runs the C ABI exactly as a user does; GW_DAEMON in its environment picks daemon mode).
//
// usage: daemon_trainer --rank R --world N [--store HOST:PORT] [--timeout-ms MS] SCENARIO [ARGS]
// Scenarios:
//   suite COUNT      allreduce and reduce_scatter (every dtype and op), broadcast (every root),
//                    allgather, barrier and iallreduces in flight
//                    at COUNT elements, with malloc'd buffers and with gw_mem_alloc buffers (in
//                    place), each result checked exactly
//   die KILLER [COUNT]  rank KILLER makes two allreduces (COUNT floats, 2^18), then SIGKILLs
//                    itself while its third one runs; the others call allreduce until it fails
//   loop             allreduce until a call fails (the test kills a daemon meanwhile)
//   extra COUNT [BIG_MIB]  alltoall (every dtype, malloc'd and gw_mem_alloc'd in place),
//                    gw_allreduce_compressed (none, fp16, topk:1 with exact sums; stats; a key
//                    reused with another count and an int32 buffer refused without harm;
//                    release), gw_comm_split (two colors ranked by a reversed key, rank 2 in
//                    none; the child used, destroyed, the parent used after), and an allreduce
//                    (average) and a broadcast of BIG_MIB (20) MiB of malloc'd memory (more than
//                    the arena holds twice: run as chunks), an iallreduce of it refused with
//                    GW_ERR_NO_MEMORY, one of 5 MiB in place (world_size x 5 MiB exceeding a
//                    16 MiB arena); allgather, reduce_scatter and alltoall run as slices:
//                    BIG_MIB in all of malloc'd memory (staged slice by slice), then 2 chunks and
//                    a bit in gw_mem_alloc buffers (the daemon uses the slices' blocks in place),
//                    each also in place, and an alltoall from the arena into malloc'd memory
//   p2p MAXBYTES     point-to-point among every rank (across hosts in a multi-host layout): a
//                    ring both ways at sizes 0, 4, 100, 16K+4 and MAXBYTES (int32 patterns
//                    naming sender and size, sends from malloc'd and gw_mem_alloc'd buffers),
//                    rank 0 receiving one message from every other rank with GW_ANY_SOURCE (the
//                    sources and counts checked), and three messages of one tag to the right
//                    neighbour received in the order sent
//   bench BYTES ITERS [mem]   allreduce float32 sum of BYTES, ITERS timed calls after 5 warm-up
//                    calls; prints the median in microseconds (mem: gw_mem_alloc buffers)
// Output: "RESULT rank=R status=S elapsed_ms=T" and "ERROR ..." lines; exit 0 when every call
// succeeded with the right result, 1 on a wrong result, 2 on usage, 10 + gw_status_t on a failure.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradwire/gradwire.h"
#include "trainer_args.h"

namespace {

using gw_trainer::now_ms;
using gw_trainer::report;

size_t dsize(gw_dtype_t t) {
  switch (t) {
    case GW_FLOAT64:
    case GW_INT64:
      return 8;
    case GW_FLOAT32:
    case GW_INT32:
      return 4;
    case GW_FLOAT16:
    case GW_BFLOAT16:
      return 2;
    default:
      return 1;
  }
}

// Half precision for the small integers these tests use (exact, no rounding needed).
uint16_t to_half(double v) {
  if (v == 0) return 0;
  const bool neg = v < 0;
  double a = std::fabs(v);
  int e = 0;
  double m = std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  const int exp = e - 1 + 15;
  const auto frac = static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024));
  return static_cast<uint16_t>((neg ? 0x8000 : 0) | (exp << 10) | frac);
}
double from_half(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int frac = h & 0x3ff;
  double v = exp == 0 ? std::ldexp(frac, -24) : std::ldexp(1024 + frac, exp - 25);
  return (h & 0x8000) ? -v : v;
}
uint16_t to_bf16(double v) {
  float f = static_cast<float>(v);
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}
double from_bf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void put(void* b, size_t i, gw_dtype_t t, double v) {
  switch (t) {
    case GW_FLOAT32:
      static_cast<float*>(b)[i] = static_cast<float>(v);
      break;
    case GW_FLOAT64:
      static_cast<double*>(b)[i] = v;
      break;
    case GW_FLOAT16:
      static_cast<uint16_t*>(b)[i] = to_half(v);
      break;
    case GW_BFLOAT16:
      static_cast<uint16_t*>(b)[i] = to_bf16(v);
      break;
    case GW_INT32:
      static_cast<int32_t*>(b)[i] = static_cast<int32_t>(v);
      break;
    case GW_INT64:
      static_cast<int64_t*>(b)[i] = static_cast<int64_t>(v);
      break;
    case GW_UINT8:
      static_cast<uint8_t*>(b)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

double get(const void* b, size_t i, gw_dtype_t t) {
  switch (t) {
    case GW_FLOAT32:
      return static_cast<const float*>(b)[i];
    case GW_FLOAT64:
      return static_cast<const double*>(b)[i];
    case GW_FLOAT16:
      return from_half(static_cast<const uint16_t*>(b)[i]);
    case GW_BFLOAT16:
      return from_bf16(static_cast<const uint16_t*>(b)[i]);
    case GW_INT32:
      return static_cast<const int32_t*>(b)[i];
    case GW_INT64:
      return static_cast<double>(static_cast<const int64_t*>(b)[i]);
    case GW_UINT8:
      return static_cast<const uint8_t*>(b)[i];
  }
  return 0;
}

bool is_int(gw_dtype_t t) { return t == GW_INT32 || t == GW_INT64 || t == GW_UINT8; }

// Rank r's value at i: small, so every sum and product is exact in every dtype.
double pattern(gw_op_t op, int rank, size_t i) {
  if (op == GW_PROD) return ((i + rank) % 3) == 0 ? 2 : 1;
  return static_cast<double>((i * 7 + rank * 5) % 8);
}

double expected(gw_op_t op, gw_dtype_t t, int world, size_t i) {
  double acc = pattern(op, 0, i);
  for (int r = 1; r < world; ++r) {
    const double v = pattern(op, r, i);
    switch (op) {
      case GW_SUM:
      case GW_AVG:
        acc += v;
        break;
      case GW_PROD:
        acc *= v;
        break;
      case GW_MIN:
        acc = std::min(acc, v);
        break;
      case GW_MAX:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == GW_AVG) acc = is_int(t) ? std::trunc(acc / world) : acc / world;
  return acc;
}

bool close(gw_dtype_t t, double got, double want) {
  if (is_int(t)) return got == want;
  const double tol = (t == GW_FLOAT16 || t == GW_BFLOAT16) ? 0.02 * std::fabs(want) + 1e-3
                                                           : 1e-6 * std::fabs(want) + 1e-9;
  return std::fabs(got - want) <= tol;
}

const gw_dtype_t kTypes[] = {GW_FLOAT32, GW_FLOAT64, GW_FLOAT16, GW_BFLOAT16,
                             GW_INT32,   GW_INT64,   GW_UINT8};
const char* kTypeNames[] = {"f32", "f64", "f16", "bf16", "i32", "i64", "u8"};
const gw_op_t kOps[] = {GW_SUM, GW_PROD, GW_MIN, GW_MAX, GW_AVG};
const char* kOpNames[] = {"sum", "prod", "min", "max", "avg"};

struct Buffers {
  gw_comm_t comm;
  bool arena;
  void* a = nullptr;
  void* b = nullptr;
  size_t bytes;
  Buffers(gw_comm_t c, bool use_arena, size_t n) : comm(c), arena(use_arena), bytes(n) {
    if (arena) {
      if (gw_mem_alloc(comm, bytes, &a) != GW_OK || gw_mem_alloc(comm, bytes, &b) != GW_OK) {
        std::printf("ERROR rank=%d gw_mem_alloc: %s\n", gw_trainer::report_rank(), gw_last_error());
        std::exit(10 + GW_ERR_NO_MEMORY);
      }
    } else {
      a = std::malloc(bytes);
      b = std::malloc(bytes);
    }
  }
  ~Buffers() {
    if (arena) {
      gw_mem_free(comm, a);
      gw_mem_free(comm, b);
    } else {
      std::free(a);
      std::free(b);
    }
  }
};

int run_suite(gw_comm_t comm, int rank, int world, size_t count) {
  const double t0 = now_ms();
  int calls = 0;
  char what[160];
  for (int arena = 0; arena < 2; ++arena) {
    for (int d = 0; d < 7; ++d) {
      const gw_dtype_t t = kTypes[d];
      Buffers buf(comm, arena != 0, count * dsize(t) * world + 64);
      // allreduce: out of place with malloc'd buffers, in place with arena ones.
      for (int o = 0; o < 5; ++o) {
        for (size_t i = 0; i < count; ++i) {
          put(buf.a, i, t, pattern(kOps[o], rank, i));
          put(buf.b, i, t, -1);
        }
        void* out = arena ? buf.a : buf.b;
        std::snprintf(what, sizeof(what), "allreduce %s %s count %zu%s", kTypeNames[d], kOpNames[o],
                      count, arena ? " in place (gw_mem_alloc)" : "");
        gw_status_t s = gw_allreduce(comm, buf.a, out, count, t, kOps[o]);
        ++calls;
        if (s != GW_OK) return report(what, s, t0);
        for (size_t i = 0; i < count; ++i) {
          const double want = expected(kOps[o], t, world, i);
          if (!close(t, get(out, i, t), want)) {
            std::printf("WRONG rank=%d %s at %zu: got %g want %g\n", rank, what, i, get(out, i, t),
                        want);
            return 1;
          }
        }
      }
      // broadcast from every root.
      for (int root = 0; root < world; ++root) {
        for (size_t i = 0; i < count; ++i) put(buf.a, i, t, rank == root ? (i + root) % 100 : 0);
        std::snprintf(what, sizeof(what), "broadcast %s root %d count %zu", kTypeNames[d], root,
                      count);
        gw_status_t s = gw_broadcast(comm, buf.a, count, t, root);
        ++calls;
        if (s != GW_OK) return report(what, s, t0);
        for (size_t i = 0; i < count; ++i) {
          if (get(buf.a, i, t) != static_cast<double>((i + root) % 100)) {
            std::printf("WRONG rank=%d %s at %zu: got %g\n", rank, what, i, get(buf.a, i, t));
            return 1;
          }
        }
      }
      // reduce_scatter: out of place (malloc) / in place (arena: this rank's block of the input).
      for (int o = 0; o < 5; ++o) {
        for (size_t i = 0; i < count * world; ++i) put(buf.a, i, t, pattern(kOps[o], rank, i));
        void* out = arena ? static_cast<uint8_t*>(buf.a) + rank * count * dsize(t) : buf.b;
        std::snprintf(what, sizeof(what), "reduce_scatter %s %s count %zu%s", kTypeNames[d],
                      kOpNames[o], count, arena ? " in place (gw_mem_alloc)" : "");
        gw_status_t s = gw_reduce_scatter(comm, buf.a, out, count, t, kOps[o]);
        ++calls;
        if (s != GW_OK) return report(what, s, t0);
        for (size_t i = 0; i < count; ++i) {
          const double want = expected(kOps[o], t, world, rank * count + i);
          if (!close(t, get(out, i, t), want)) {
            std::printf("WRONG rank=%d %s at %zu: got %g want %g\n", rank, what, i, get(out, i, t),
                        want);
            return 1;
          }
        }
      }
      // allgather: out of place (malloc) / in place (arena: this rank's block of the output).
      const size_t block = count * dsize(t);
      void* send = arena ? static_cast<uint8_t*>(buf.b) + rank * block : buf.a;
      for (size_t i = 0; i < count; ++i) put(send, i, t, (rank * 3 + i) % 50);
      std::snprintf(what, sizeof(what), "allgather %s count %zu", kTypeNames[d], count);
      gw_status_t s = gw_allgather(comm, send, buf.b, count, t);
      ++calls;
      if (s != GW_OK) return report(what, s, t0);
      for (int r = 0; r < world; ++r) {
        for (size_t i = 0; i < count; ++i) {
          if (get(buf.b, r * count + i, t) != static_cast<double>((r * 3 + i) % 50)) {
            std::printf("WRONG rank=%d %s block %d at %zu\n", rank, what, r, i);
            return 1;
          }
        }
      }
    }
  }
  gw_status_t s = gw_barrier(comm);
  ++calls;
  if (s != GW_OK) return report("barrier", s, t0);
  // Several iallreduces in flight (more than the daemon's ring holds), completed by gw_test and
  // gw_wait, in place and not, beside a blocking call.
  {
    const int n = count > 10000 ? 6 : 70;  // within a 16 MiB arena's staging
    std::vector<std::vector<int32_t>> in(n, std::vector<int32_t>(count)), out = in;
    std::vector<gw_request_t> req(n);
    for (int k = 0; k < n; ++k) {
      for (size_t i = 0; i < count; ++i) in[k][i] = static_cast<int32_t>(k + rank + i % 5);
      int32_t* dst = k % 2 ? in[k].data() : out[k].data();
      s = gw_iallreduce(comm, in[k].data(), dst, count, GW_INT32, GW_SUM, &req[k]);
      ++calls;
      if (s != GW_OK) return report("iallreduce", s, t0);
    }
    if ((s = gw_barrier(comm)) != GW_OK) return report("barrier among iallreduces", s, t0);
    for (int k = 0; k < n; ++k) {
      int done = 0;
      if (k % 3 == 0 && (s = gw_test(req[k], &done)) != GW_OK) return report("gw_test", s, t0);
      if (!done && (s = gw_wait(req[k], -1)) != GW_OK) return report("gw_wait", s, t0);
      const int32_t* dst = k % 2 ? in[k].data() : out[k].data();
      for (size_t i = 0; i < count; ++i) {
        const int32_t want = world * (k + static_cast<int32_t>(i % 5)) + world * (world - 1) / 2;
        if (dst[i] != want) {
          std::printf("WRONG rank=%d iallreduce %d at %zu: got %d want %d\n", rank, k, i, dst[i],
                      want);
          return 1;
        }
      }
    }
  }
  std::printf("RESULT rank=%d status=0 elapsed_ms=%.0f calls=%d\n", rank, now_ms() - t0, calls);
  return 0;
}

int wrong(int rank, const char* what, size_t at, double got, double want) {
  std::printf("WRONG rank=%d %s at %zu: got %g want %g\n", rank, what, at, got, want);
  return 1;
}

// allgather, reduce_scatter and alltoall (int32, exact) of `total` bytes in all: more than a
// chunk, so the client runs them as slices of every rank's block. arena: gw_mem_alloc buffers;
// mixed: an alltoall from arena memory into malloc'd memory.
int check_sliced(gw_comm_t comm, int rank, int world, size_t total, bool arena, bool in_place,
                 bool mixed, double t0) {
  const size_t n = (total / 4 / world) | 1;  // elements per block, odd: slices end unevenly
  Buffers buf(comm, arena, n * 4 * world);
  auto* a = static_cast<int32_t*>(buf.a);
  auto* b = static_cast<int32_t*>(buf.b);
  int32_t* out_malloc = nullptr;
  std::vector<int32_t> plain;
  if (mixed) {
    plain.resize(n * world);
    out_malloc = plain.data();
  }
  char what[200];
  const char* where = mixed ? "arena to malloc'd" : arena ? "gw_mem_alloc" : "malloc'd";
  gw_status_t s;
  // allgather: rank r's block holds r * 10^7 + i.
  if (!mixed) {
    std::snprintf(what, sizeof(what), "allgather of %zu bytes, %s%s (slices)", n * 4 * world, where,
                  in_place ? ", in place" : "");
    int32_t* send = in_place ? a + rank * n : b;
    for (size_t i = 0; i < n * world; ++i) a[i] = -1;
    for (size_t i = 0; i < n; ++i) send[i] = rank * 10000000 + static_cast<int32_t>(i);
    if ((s = gw_allgather(comm, send, a, n, GW_INT32)) != GW_OK) return report(what, s, t0);
    for (int r = 0; r < world; ++r) {
      for (size_t i = 0; i < n; ++i) {
        const double want = r * 10000000.0 + i;
        if (a[r * n + i] != want) return wrong(rank, what, r * n + i, a[r * n + i], want);
      }
    }
    // reduce_scatter (sum): rank q's block b holds (q + 1) * ((b * 7 + i) % 1000).
    std::snprintf(what, sizeof(what), "reduce_scatter of %zu bytes, %s%s (slices)", n * 4 * world,
                  where, in_place ? ", in place" : "");
    for (int blk = 0; blk < world; ++blk) {
      for (size_t i = 0; i < n; ++i) a[blk * n + i] = (rank + 1) * ((blk * 7 + i) % 1000);
    }
    int32_t* rs_out = in_place ? a + rank * n : b;
    if ((s = gw_reduce_scatter(comm, a, rs_out, n, GW_INT32, GW_SUM)) != GW_OK) {
      return report(what, s, t0);
    }
    for (size_t i = 0; i < n; ++i) {
      const double want = ((rank * 7 + i) % 1000) * (world * (world + 1) / 2.0);
      if (rs_out[i] != want) return wrong(rank, what, i, rs_out[i], want);
    }
  }
  // alltoall: rank q's block for rank d holds q * 100 + d + (i % 1000) * 10^4.
  std::snprintf(what, sizeof(what), "alltoall of %zu bytes, %s%s (slices)", n * 4 * world, where,
                in_place ? ", in place" : "");
  for (int d = 0; d < world; ++d) {
    for (size_t i = 0; i < n; ++i) a[d * n + i] = rank * 100 + d + (i % 1000) * 10000;
  }
  int32_t* out = mixed ? out_malloc : in_place ? a : b;
  if ((s = gw_alltoall(comm, a, out, n, GW_INT32)) != GW_OK) return report(what, s, t0);
  for (int q = 0; q < world; ++q) {
    for (size_t i = 0; i < n; ++i) {
      const double want = q * 100 + rank + (i % 1000) * 10000.0;
      if (out[q * n + i] != want) return wrong(rank, what, q * n + i, out[q * n + i], want);
    }
  }
  return 0;
}

int run_extra(gw_comm_t comm, int rank, int world, size_t count, size_t big_mib) {
  const double t0 = now_ms();
  char what[160];
  gw_status_t s;
  // What the communicator resolved, in daemon mode.
  char desc[512];
  for (const char* key : {"transport", "daemon_transport", "chunk", "allreduce", "interface"}) {
    if ((s = gw_comm_describe(comm, key, desc, sizeof(desc), nullptr)) != GW_OK) {
      return report("gw_comm_describe", s, t0);
    }
    std::printf("DESCRIBE rank=%d %s=%s\n", rank, key, desc);
  }
  // alltoall: rank r's block for rank d holds (r * 11 + d * 3 + i) % 50.
  for (int arena = 0; arena < 2; ++arena) {
    for (int d = 0; d < 7; ++d) {
      const gw_dtype_t t = kTypes[d];
      Buffers buf(comm, arena != 0, count * dsize(t) * world + 64);
      for (int to = 0; to < world; ++to) {
        for (size_t i = 0; i < count; ++i) {
          put(buf.a, to * count + i, t, (rank * 11 + to * 3 + i) % 50);
        }
      }
      void* out = arena ? buf.a : buf.b;
      std::snprintf(what, sizeof(what), "alltoall %s count %zu%s", kTypeNames[d], count,
                    arena ? " in place (gw_mem_alloc)" : "");
      if ((s = gw_alltoall(comm, buf.a, out, count, t)) != GW_OK) return report(what, s, t0);
      for (int from = 0; from < world; ++from) {
        for (size_t i = 0; i < count; ++i) {
          const double want = static_cast<double>((from * 11 + rank * 3 + i) % 50);
          const double got = get(out, from * count + i, t);
          if (got != want) return wrong(rank, what, from * count + i, got, want);
        }
      }
    }
  }
  // Compressed allreduce: codecs whose sums of these small integers are exact.
  std::vector<float> g(count);
  uint64_t calls = 0;
  for (const char* spec : {"none", "fp16", "topk:1"}) {
    for (int step = 0; step < 2; ++step) {
      for (size_t i = 0; i < count; ++i) g[i] = static_cast<float>(pattern(GW_SUM, rank, i));
      std::snprintf(what, sizeof(what), "allreduce_compressed %s step %d count %zu", spec, step,
                    count);
      s = gw_allreduce_compressed(comm, g.data(), count, GW_FLOAT32, spec, spec);
      ++calls;
      if (s != GW_OK) return report(what, s, t0);
      for (size_t i = 0; i < count; ++i) {
        const double want = expected(GW_SUM, GW_FLOAT32, world, i);
        if (g[i] != want) return wrong(rank, what, i, g[i], want);
      }
    }
  }
  gw_comm_stats_t st{};
  if ((s = gw_comm_stats(comm, &st)) != GW_OK) return report("gw_comm_stats", s, t0);
  if (st.calls != calls || (world > 1 && st.bytes_uncompressed == 0)) {
    std::printf("WRONG rank=%d stats: calls %llu (want %llu) uncompressed %llu\n", rank,
                static_cast<unsigned long long>(st.calls), static_cast<unsigned long long>(calls),
                static_cast<unsigned long long>(st.bytes_uncompressed));
    return 1;
  }
  std::printf("STATS rank=%d calls=%llu sent=%llu uncompressed=%llu\n", rank,
              static_cast<unsigned long long>(st.calls),
              static_cast<unsigned long long>(st.bytes_sent),
              static_cast<unsigned long long>(st.bytes_uncompressed));
  // A key reused with another count, and an integer buffer: refused here, the comm goes on.
  s = gw_allreduce_compressed(comm, g.data(), count - 1, GW_FLOAT32, "fp16", "fp16");
  if (s != GW_ERR_INVALID_ARG) return report("compressed key reused with another count", s, t0);
  std::vector<int32_t> ints(count, 1);
  s = gw_allreduce_compressed(comm, ints.data(), count, GW_INT32, "fp16", "ints");
  if (s != GW_ERR_INVALID_ARG) return report("compressed int32", s, t0);
  // After a release the key starts afresh: another count is fine.
  if ((s = gw_comm_release_compression(comm)) != GW_OK) return report("release", s, t0);
  for (size_t i = 0; i + 1 < count; ++i) g[i] = 1.0f;
  s = gw_allreduce_compressed(comm, g.data(), count - 1, GW_FLOAT32, "fp16", "fp16");
  if (s != GW_OK) return report("compressed after release", s, t0);
  for (size_t i = 0; i + 1 < count; ++i) {
    if (g[i] != world) return wrong(rank, "compressed after release", i, g[i], world);
  }
  // Split: even and odd ranks, ranked by a reversed key; rank 2 joins none.
  auto color_of = [&](int r) { return r == 2 && world > 3 ? -1 : r % 2; };
  const int color = color_of(rank);
  gw_comm_t child = nullptr;
  if ((s = gw_comm_split(comm, color, world - rank, &child)) != GW_OK) {
    return report("gw_comm_split", s, t0);
  }
  if (color < 0) {
    if (child != nullptr) return wrong(rank, "split color -1 gave a comm", 0, 1, 0);
  } else {
    std::vector<int> members;
    for (int r = world - 1; r >= 0; --r) {
      if (color_of(r) == color) members.push_back(r);
    }
    int crank = -1, csize = -1;
    gw_comm_rank(child, &crank);
    gw_comm_size(child, &csize);
    const int want_rank =
        static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    if (csize != static_cast<int>(members.size()) || crank != want_rank) {
      std::printf("WRONG rank=%d split: rank %d of %d, want %d of %zu\n", rank, crank, csize,
                  want_rank, members.size());
      return 1;
    }
    std::vector<int64_t> v(count, rank), all(count * csize);
    if ((s = gw_allreduce(child, v.data(), v.data(), count, GW_INT64, GW_SUM)) != GW_OK) {
      return report("allreduce on the split comm", s, t0);
    }
    double want = 0;
    for (int r : members) want += r;
    for (size_t i = 0; i < count; ++i) {
      if (v[i] != want) return wrong(rank, "allreduce on the split comm", i, v[i], want);
    }
    const int64_t mine = rank;
    if ((s = gw_allgather(child, &mine, all.data(), 1, GW_INT64)) != GW_OK) {
      return report("allgather on the split comm", s, t0);
    }
    for (int c = 0; c < csize; ++c) {
      if (all[c] != members[c])
        return wrong(rank, "allgather on the split comm", c, all[c], members[c]);
    }
    // 3 MiB, chunked (chunks of 1 MiB at most in a 16 MiB arena): the child's ranks cut alike.
    std::vector<float> chunked(size_t{3} << 18, 1.0f);
    if ((s = gw_allreduce(child, chunked.data(), chunked.data(), chunked.size(), GW_FLOAT32,
                          GW_SUM)) != GW_OK) {
      return report("chunked allreduce on the split comm", s, t0);
    }
    for (size_t i = 0; i < chunked.size(); ++i) {
      if (chunked[i] != csize)
        return wrong(rank, "chunked allreduce on the split comm", i, chunked[i], csize);
    }
    if ((s = gw_comm_destroy(child)) != GW_OK) return report("destroying the split comm", s, t0);
  }
  // Larger than the arena: chunks (and, with chunks of 8 MiB or more across hosts, the daemons'
  // pipelined pieces). An average: the pieces' finalisation is checked too.
  const size_t big = big_mib << 18;  // floats
  std::vector<float> x(big), y(big);
  for (size_t i = 0; i < big; ++i) x[i] = static_cast<float>((i + rank) % 7);
  if ((s = gw_allreduce(comm, x.data(), y.data(), big, GW_FLOAT32, GW_AVG)) != GW_OK) {
    return report("allreduce avg of BIG MiB (chunks)", s, t0);
  }
  for (size_t i = 0; i < big; ++i) {
    double want = 0;
    for (int r = 0; r < world; ++r) want += (i + r) % 7;
    want /= world;
    if (y[i] != static_cast<float>(want))
      return wrong(rank, "allreduce avg of BIG MiB", i, y[i], want);
  }
  for (size_t i = 0; i < big; ++i) x[i] = rank == world - 1 ? static_cast<float>(i % 1000) : -1;
  if ((s = gw_broadcast(comm, x.data(), big, GW_FLOAT32, world - 1)) != GW_OK) {
    return report("broadcast of BIG MiB (chunks)", s, t0);
  }
  for (size_t i = 0; i < big; ++i) {
    if (x[i] != i % 1000) return wrong(rank, "broadcast of BIG MiB (chunks)", i, x[i], i % 1000);
  }
  gw_request_t req = nullptr;
  s = gw_iallreduce(comm, x.data(), y.data(), big, GW_FLOAT32, GW_SUM, &req);
  if (s != GW_ERR_NO_MEMORY) return report("iallreduce of BIG MiB (more than the arena)", s, t0);
  x = std::vector<float>();
  y = std::vector<float>();
  // An iallreduce is one block however many ranks there are: 5 MiB in place stages 5 MiB of a
  // 16 MiB arena, where world_size x 5 MiB would not fit.
  {
    const size_t n = size_t{5} << 18;  // floats
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>((i + rank) % 5);
    if ((s = gw_iallreduce(comm, v.data(), v.data(), n, GW_FLOAT32, GW_SUM, &req)) != GW_OK) {
      return report("iallreduce of 5 MiB in place", s, t0);
    }
    if ((s = gw_wait(req, -1)) != GW_OK) return report("gw_wait on 5 MiB in place", s, t0);
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < world; ++r) want += (i + r) % 5;
      if (v[i] != static_cast<float>(want))
        return wrong(rank, "iallreduce of 5 MiB", i, v[i], want);
    }
  }
  // The chunk the communicator cuts at ("1 MiB", "8 MiB"...): slices are of 2 chunks at most;
  // arena buffers of a slice and a bit.
  if ((s = gw_comm_describe(comm, "chunk", desc, sizeof(desc), nullptr)) != GW_OK) {
    return report("gw_comm_describe chunk", s, t0);
  }
  double chunk = 0;
  char unit[8] = {0};
  if (std::sscanf(desc, "%lf %7s", &chunk, unit) != 2) return wrong(rank, desc, 0, 0, 1);
  chunk *= std::strcmp(unit, "MiB") == 0 ? 1 << 20 : std::strcmp(unit, "KiB") == 0 ? 1 << 10 : 1;
  const size_t in_arena = static_cast<size_t>(chunk) * 2 + 4096;
  for (int in_place = 0; in_place < 2; ++in_place) {
    int rc = check_sliced(comm, rank, world, big_mib << 20, false, in_place != 0, false, t0);
    if (rc == 0) rc = check_sliced(comm, rank, world, in_arena, true, in_place != 0, false, t0);
    if (rc != 0) return rc;
  }
  if (int rc = check_sliced(comm, rank, world, in_arena, true, false, true, t0); rc != 0) return rc;
  if ((s = gw_barrier(comm)) != GW_OK) return report("barrier at the end", s, t0);
  std::printf("RESULT rank=%d status=0 elapsed_ms=%.0f\n", rank, now_ms() - t0);
  return 0;
}

int run_die(gw_comm_t comm, int rank, int killer, size_t count) {
  std::vector<float> send(count, 1.0f), recv(count);
  return gw_trainer::die_while_others_allreduce(comm, rank, killer, send.data(), recv.data(),
                                                count);
}

int run_loop(gw_comm_t comm, int rank) {
  const size_t count = 1 << 16;
  std::vector<float> buf(count, 1.0f);
  std::printf("LOOPING rank=%d\n", rank);
  std::fflush(stdout);
  for (int i = 0; i < 1000000; ++i) {
    const double t0 = now_ms();
    gw_status_t s = gw_allreduce(comm, buf.data(), buf.data(), count, GW_FLOAT32, GW_MAX);
    if (s != GW_OK) return report("allreduce while a daemon dies", s, t0);
  }
  return 0;
}

int32_t p2p_value(int src, size_t bytes, size_t i) {
  return static_cast<int32_t>(src * 1000003 + bytes * 7 + i);
}

int run_p2p(gw_comm_t comm, int rank, int world, size_t max_bytes) {
  const double t0 = now_ms();
  const int right = (rank + 1) % world, left = (rank + world - 1) % world;
  int bad = 0;
  auto check = [&](const std::vector<int32_t>& got, int src, size_t bytes, const char* what) {
    for (size_t i = 0; i < bytes / 4; ++i) {
      if (got[i] != p2p_value(src, bytes, i)) {
        std::printf("ERROR rank=%d p2p %s of %zu bytes from rank %d: element %zu is %d\n", rank,
                    what, bytes, src, i, got[i]);
        bad = 1;
        return;
      }
    }
  };
  max_bytes = std::max<size_t>(max_bytes / 4 * 4, 4);
  // The ring, both ways: each size to the right (tag 1) and to the left (tag 2), all posted first.
  for (size_t bytes : {size_t{0}, size_t{4}, size_t{100}, size_t{16388}, max_bytes}) {
    for (int mem = 0; mem < 2; ++mem) {
      const size_t n = bytes / 4;
      std::vector<int32_t> from_left(n + 1, -1), from_right(n + 1, -1), out(n + 1);
      for (size_t i = 0; i < n; ++i) out[i] = p2p_value(rank, bytes, i);
      void* arena = nullptr;
      if (mem && bytes > 0) {
        gw_status_t s = gw_mem_alloc(comm, bytes, &arena);
        if (s != GW_OK) return report("p2p gw_mem_alloc", s, t0);
        std::memcpy(arena, out.data(), bytes);
      }
      const void* src = arena != nullptr ? arena : out.data();
      gw_request_t r[4] = {};
      gw_status_t s = gw_irecv(comm, from_left.data(), n, GW_INT32, left, 1, &r[0]);
      if (s == GW_OK) s = gw_irecv(comm, from_right.data(), n, GW_INT32, right, 2, &r[1]);
      if (s == GW_OK) s = gw_isend(comm, src, n, GW_INT32, right, 1, &r[2]);
      if (s == GW_OK) s = gw_isend(comm, src, n, GW_INT32, left, 2, &r[3]);
      for (int i = 0; i < 4 && s == GW_OK; ++i) s = gw_wait(r[i], -1);
      if (arena != nullptr) (void)gw_mem_free(comm, arena);
      if (s != GW_OK) return report("p2p ring", s, t0);
      check(from_left, left, bytes, "from the left");
      check(from_right, right, bytes, "from the right");
    }
  }
  // Any source: rank 0 takes one message of 64 bytes from every other rank.
  const size_t any_bytes = 64;
  std::vector<int32_t> buf(any_bytes / 4);
  if (rank == 0) {
    std::vector<int> seen(static_cast<size_t>(world), 0);
    for (int k = 1; k < world; ++k) {
      gw_request_t r = nullptr;
      size_t count = 0;
      int source = -1;
      gw_status_t s = gw_irecv(comm, buf.data(), buf.size(), GW_INT32, GW_ANY_SOURCE, 3, &r);
      if (s == GW_OK) s = gw_wait_recv(r, -1, &count, &source);
      if (s != GW_OK) return report("p2p any-source receive", s, t0);
      if (source < 1 || source >= world || count != buf.size() || seen[source]++ != 0) {
        std::printf("ERROR rank=0 any-source: source %d count %zu (seen before: %d)\n", source,
                    count, source >= 0 && source < world ? seen[source] - 1 : -1);
        bad = 1;
        continue;
      }
      check(buf, source, any_bytes, "any-source");
    }
  } else {
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = p2p_value(rank, any_bytes, i);
    gw_status_t s = gw_send(comm, buf.data(), buf.size(), GW_INT32, 0, 3);
    if (s != GW_OK) return report("p2p send to rank 0", s, t0);
  }
  // Order: three messages of one tag to the right, received in the order sent.
  std::vector<int32_t> got(3, -1);
  gw_request_t r[6] = {};
  gw_status_t s = GW_OK;
  for (int i = 0; i < 3 && s == GW_OK; ++i) {
    s = gw_irecv(comm, &got[i], 1, GW_INT32, left, 4, &r[i]);
  }
  const int32_t vals[3] = {rank * 10, rank * 10 + 1, rank * 10 + 2};
  for (int i = 0; i < 3 && s == GW_OK; ++i) {
    s = gw_isend(comm, &vals[i], 1, GW_INT32, right, 4, &r[3 + i]);
  }
  for (int i = 0; i < 6 && s == GW_OK; ++i) s = gw_wait(r[i], -1);
  if (s != GW_OK) return report("p2p order", s, t0);
  for (int i = 0; i < 3; ++i) {
    if (got[i] != left * 10 + i) {
      std::printf("ERROR rank=%d p2p order: message %d from rank %d is %d\n", rank, i, left,
                  got[i]);
      bad = 1;
    }
  }
  s = gw_barrier(comm);
  if (s != GW_OK) return report("p2p barrier", s, t0);
  std::printf("RESULT rank=%d status=%d elapsed_ms=%.0f\n", rank, bad, now_ms() - t0);
  return bad;
}

int run_bench(gw_comm_t comm, int rank, size_t bytes, int iters, bool mem) {
  const size_t count = bytes / 4;
  Buffers buf(comm, mem, count * 4 + 64);
  std::memset(buf.a, 0, count * 4);
  std::vector<double> us;
  for (int i = 0; i < iters + 5; ++i) {
    gw_barrier(comm);
    const double t0 = now_ms();
    gw_status_t s = gw_allreduce(comm, buf.a, buf.b, count, GW_FLOAT32, GW_SUM);
    const double dt = (now_ms() - t0) * 1000;
    if (s != GW_OK) return report("bench allreduce", s, t0);
    if (i >= 5) us.push_back(dt);
  }
  std::sort(us.begin(), us.end());
  std::printf("BENCH rank=%d bytes=%zu mem=%d median_us=%.1f min_us=%.1f\n", rank, bytes,
              mem ? 1 : 0, us[us.size() / 2], us[0]);
  std::printf("RESULT rank=%d status=0 elapsed_ms=0\n", rank);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return gw_trainer::trainer_main(
      argc, argv, "suite|extra|die|loop|init|p2p|bench [args]", [] { return 0; },
      [](const gw_trainer::Scenario& sc) {
        const int n = sc.argc;
        char** a = sc.argv;
        if (sc.name == "suite" && n == 1) {
          return run_suite(sc.comm, sc.rank, sc.world, std::strtoull(a[0], nullptr, 10));
        }
        if (sc.name == "extra" && (n == 1 || n == 2)) {
          return run_extra(sc.comm, sc.rank, sc.world, std::strtoull(a[0], nullptr, 10),
                           n == 2 ? std::strtoull(a[1], nullptr, 10) : 20);
        }
        if (sc.name == "die" && (n == 1 || n == 2)) {
          return run_die(sc.comm, sc.rank, std::atoi(a[0]),
                         n == 2 ? std::strtoull(a[1], nullptr, 10) : size_t{1} << 18);
        }
        if (sc.name == "loop") return run_loop(sc.comm, sc.rank);
        if (sc.name == "p2p" && n == 1) {
          return run_p2p(sc.comm, sc.rank, sc.world, std::strtoull(a[0], nullptr, 10));
        }
        if (sc.name == "init" && n == 0) {
          // Nothing but the set-up: rank 0 destroys its communicator (and the store it hosts)
          // at once.
          std::printf("RESULT rank=%d status=0 elapsed_ms=%.0f\n", sc.rank, now_ms() - sc.t0);
          return 0;
        }
        if (sc.name == "bench" && n >= 2) {
          return run_bench(sc.comm, sc.rank, std::strtoull(a[0], nullptr, 10), std::atoi(a[1]),
                           n >= 3 && std::strcmp(a[2], "mem") == 0);
        }
        return -1;
      });
}
