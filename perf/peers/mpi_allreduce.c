/* Peer driver for the allreduce benchmarks (perf/compare_peers.sh, perf/cluster_bench.sh):
 * MPI_Allreduce of float32 sum, out of place, with gradwire-perf's conventions: iterations
 * clamp(2e9 / size / ranks, 3, 50) unless -n, 2 warm-up calls, and for each iteration the slowest
 * rank's time (a MPI_MAX reduction of per-iteration times); the median of those is reported,
 * with the nccl-tests busbw (bytes * 2(n-1)/n / time). Rank 0 prints one line per size:
 *   mpi np=N bytes=S time_us=T busbw_GBps=B
 * usage: mpirun -np N mpi_allreduce [-n ITERS] SIZE_BYTES... */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  long fixed_iters = 0;
  int first = 1;
  if (argc > 2 && strcmp(argv[1], "-n") == 0) {
    fixed_iters = atol(argv[2]);
    first = 3;
  }
  for (int a = first; a < argc; a++) {
    long bytes = atol(argv[a]);
    long count = bytes / 4;
    if (count <= 0) {
      if (rank == 0) fprintf(stderr, "mpi_allreduce: size %s: need at least 4 bytes\n", argv[a]);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    float* in = malloc(count * sizeof(float));
    float* out = malloc(count * sizeof(float));
    if (!in || !out) MPI_Abort(MPI_COMM_WORLD, 3);
    for (long i = 0; i < count; i++) in[i] = (float)((rank + i) % 13);
    long iters = fixed_iters > 0 ? fixed_iters : 2000000000L / bytes / n;
    if (fixed_iters <= 0) iters = iters < 3 ? 3 : iters > 50 ? 50 : iters;
    for (int w = 0; w < 2; w++) MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double* times = malloc(iters * sizeof(double));
    for (long i = 0; i < iters; i++) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double mine = MPI_Wtime() - t;
      MPI_Allreduce(&mine, &times[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    /* Every element of the sum is sum_r (r + i) % 13: a wrong result is not a figure. */
    long bad = 0;
    for (long i = 0; i < count && i < 4096; i++) {
      float want = 0;
      for (int r = 0; r < n; r++) want += (float)((r + i) % 13);
      if (out[i] != want) bad++;
    }
    qsort(times, iters, sizeof(double), cmp_double);
    double med = iters % 2 ? times[iters / 2] : (times[iters / 2 - 1] + times[iters / 2]) / 2;
    if (rank == 0) {
      printf("mpi np=%d bytes=%ld time_us=%.1f busbw_GBps=%.4f wrong=%ld\n", n, bytes, med * 1e6,
             bytes * 2.0 * (n - 1) / n / med / 1e9, bad);
      fflush(stdout);
    }
    free(times);
    free(in);
    free(out);
  }
  MPI_Finalize();
  return 0;
}
