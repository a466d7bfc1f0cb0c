/* Peer driver for the collective benchmarks (perf/compare_peers.sh, perf/cluster_bench.sh): one
 * Open MPI collective of float32, with gradwire-perf's conventions. OP (-o; default allreduce):
 *   allreduce       MPI_Allreduce, sum, out of place         busbw = algbw * 2(n-1)/n
 *   broadcast       MPI_Bcast from rank 0, in place          busbw = algbw
 *   allgather       MPI_Allgather, out of place              busbw = algbw * (n-1)/n
 *   reduce_scatter  MPI_Reduce_scatter_block, sum, o.o.p.    busbw = algbw * (n-1)/n
 * SIZE is the whole buffer as in nccl-tests: allgather's output (each rank gives SIZE/n),
 * reduce_scatter's input (each rank keeps SIZE/n); for those two it is rounded down to a multiple
 * of 4n bytes, for the others of 4. Iterations clamp(2e9 / size / ranks, 3, 50) unless -n, 2
 * warm-up calls, and for each iteration the slowest rank's time (a MPI_MAX reduction of
 * per-iteration times); the median of those is reported. After the timed calls one more call,
 * its output first overwritten with -1, is checked on every rank against a rank- and
 * index-dependent pattern (a strided sample of at most 65536 elements that reaches every rank's
 * block); wrong is the sum over the ranks. Rank 0 prints one line per size:
 *   mpi np=N op=OP bytes=S time_us=T busbw_GBps=B wrong=W machine_cpu_s_per_gb=C
 * C: the whole machine's busy CPU time (/proc/stat) over rank 0's timed iterations per GB of the
 * buffer, as gradwire-perf --cpu (with each iteration's barrier and time reduction); the run's own
 * only on an otherwise idle machine ("?" when /proc/stat cannot be read).
 * usage: mpirun -np N mpi_allreduce [-o OP] [-n ITERS] SIZE_BYTES... */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum Op { kAllreduce, kBroadcast, kAllgather, kReduceScatter };
static const char* const kOpNames[] = {"allreduce", "broadcast", "allgather", "reduce_scatter"};

/* Every CPU's busy seconds so far (user nice system irq softirq steal of /proc/stat), -1 if
 * unreadable. */
static double machine_busy_s(void) {
  FILE* f = fopen("/proc/stat", "r");
  if (f == NULL) return -1;
  double v[8] = {0};
  const int got = fscanf(f, "cpu %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1], &v[2], &v[3],
                         &v[4], &v[5], &v[6], &v[7]);
  fclose(f);
  const long hz = sysconf(_SC_CLK_TCK);
  if (got < 4 || hz <= 0) return -1;
  return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / (double)hz;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Rank r's input element i: allgather gives each rank's block a value of its own (16r + i % 13,
 * exact in float32), so a block in the wrong place is caught; the reductions sum (r + i) % 13. */
static float input_value(enum Op op, int r, long i) {
  return op == kAllgather ? (float)(16L * r + i % 13) : (float)((r + i) % 13);
}

/* What rank `rank` must hold at output index i (its block of `blk` elements for reduce_scatter). */
static float expected(enum Op op, int n, int rank, long blk, long i) {
  float want = 0;
  switch (op) {
    case kAllreduce:
      for (int r = 0; r < n; r++) want += (float)((r + i) % 13);
      return want;
    case kBroadcast:
      return input_value(op, 0, i);
    case kAllgather:
      return input_value(op, (int)(i / blk), i % blk);
    case kReduceScatter:
      for (int r = 0; r < n; r++) want += (float)((r + (long)rank * blk + i) % 13);
      return want;
  }
  return 0;
}

static void run(enum Op op, MPI_Datatype ft, float* in, float* out, long count, long blk) {
  switch (op) {
    case kAllreduce:
      MPI_Allreduce(in, out, (int)count, ft, MPI_SUM, MPI_COMM_WORLD);
      break;
    case kBroadcast:
      MPI_Bcast(out, (int)count, ft, 0, MPI_COMM_WORLD);
      break;
    case kAllgather:
      MPI_Allgather(in, (int)blk, ft, out, (int)blk, ft, MPI_COMM_WORLD);
      break;
    case kReduceScatter:
      MPI_Reduce_scatter_block(in, out, (int)blk, ft, MPI_SUM, MPI_COMM_WORLD);
      break;
  }
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  long fixed_iters = 0;
  enum Op op = kAllreduce;
  int first = 1;
  while (first + 1 < argc && argv[first][0] == '-') {
    if (strcmp(argv[first], "-n") == 0) {
      fixed_iters = atol(argv[first + 1]);
    } else if (strcmp(argv[first], "-o") == 0) {
      int k = 0;
      while (k < 4 && strcmp(argv[first + 1], kOpNames[k]) != 0) k++;
      if (k == 4) {
        if (rank == 0) {
          fprintf(stderr,
                  "mpi_allreduce: -o %s: not allreduce, broadcast, allgather or reduce_scatter\n",
                  argv[first + 1]);
        }
        MPI_Abort(MPI_COMM_WORLD, 2);
      }
      op = (enum Op)k;
    } else {
      if (rank == 0) fprintf(stderr, "mpi_allreduce: unknown option %s\n", argv[first]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    first += 2;
  }
  const int blocked = op == kAllgather || op == kReduceScatter;
  for (int a = first; a < argc; a++) {
    long count = atol(argv[a]) / 4;
    if (blocked) count = count / n * n;
    const long blk = blocked ? count / n : count;
    if (count <= 0 || count > 2147483647L) {
      if (rank == 0) {
        fprintf(stderr, "mpi_allreduce: size %s: need at least %d bytes and at most 8 GiB\n",
                argv[a], blocked ? 4 * n : 4);
      }
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const long bytes = count * 4;
    const long in_count = op == kAllgather ? blk : count;
    const long out_count = op == kReduceScatter ? blk : count;
    float* in = malloc(in_count * sizeof(float));
    float* out = malloc(out_count * sizeof(float));
    if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 3);
    for (long i = 0; i < in_count; i++) in[i] = input_value(op, rank, i);
    /* broadcast is in place: the root's buffer holds the data, the others' are overwritten. */
    for (long i = 0; i < out_count; i++) out[i] = op == kBroadcast && rank == 0 ? in[i] : -1;
    long iters = fixed_iters > 0 ? fixed_iters : 2000000000L / bytes / n;
    if (fixed_iters <= 0) iters = iters < 3 ? 3 : iters > 50 ? 50 : iters;
    for (int w = 0; w < 2; w++) run(op, MPI_FLOAT, in, out, count, blk);
    double* times = malloc(iters * sizeof(double));
    const double busy0 = machine_busy_s();
    for (long i = 0; i < iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      run(op, MPI_FLOAT, in, out, count, blk);
      double mine = MPI_Wtime() - t;
      MPI_Allreduce(&mine, &times[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    const double busy1 = machine_busy_s();
    char cpu[32] = "?";
    if (busy0 >= 0 && busy1 >= 0) {
      snprintf(cpu, sizeof(cpu), "%.4f", (busy1 - busy0) / ((double)bytes * iters / 1e9));
    }
    /* A wrong result is not a figure: one more call into an overwritten output, checked. */
    for (long i = 0; i < out_count; i++) {
      if (!(op == kBroadcast && rank == 0)) out[i] = -1;
    }
    run(op, MPI_FLOAT, in, out, count, blk);
    const long step = out_count > 65536 ? out_count / 65536 : 1;
    long bad = 0, total_bad = 0;
    for (long i = 0; i < out_count; i += step) {
      if (out[i] != expected(op, n, rank, blk, i)) bad++;
    }
    if ((out_count - 1) % step != 0 &&
        out[out_count - 1] != expected(op, n, rank, blk, out_count - 1)) {
      bad++;
    }
    MPI_Reduce(&bad, &total_bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    qsort(times, iters, sizeof(double), cmp_double);
    double med = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
    const double factor = op == kAllreduce   ? 2.0 * (n - 1) / n
                          : op == kBroadcast ? 1.0
                                             : (double)(n - 1) / n;
    if (rank == 0) {
      printf(
          "mpi np=%d op=%s bytes=%ld time_us=%.1f busbw_GBps=%.4f wrong=%ld "
          "machine_cpu_s_per_gb=%s\n",
          n, kOpNames[op], bytes, med * 1e6, bytes * factor / med / 1e9, total_bad, cpu);
      fflush(stdout);
    }
    free(times);
    free(in);
    free(out);
  }
  MPI_Finalize();
  return 0;
}
