/* Peer baseline for `gradwire-perf alltoallv`: MPI_Alltoallv of float32 with the same uneven
 * splits (the rule of perf/coll_alltoallv.h, written again here: weight w(s,d) = 1 +
 * (splitmix64(29 * 65536 + s * 256 + d) >> 61); rank s sends floor(T * w(s,d) / W(s)) floats to
 * every d < n-1 and the rest to n-1, with T = SIZE / 4 and W(s) the sum of rank s's weights),
 * the same size convention (SIZE = the whole send buffer of one rank), the same iteration rule
 * (clamp(2e9 / size / ranks, 3, 50), 2 warm-up calls) and busbw = algbw * (n-1)/n. Out of place.
 * Every received element is checked after the timed calls (element i of block s -> d holds
 * (31 s + 7 d + i) mod 97). Reports the slowest rank's mean time and the wrong-element count.
 * Prints the weights first ("mpi-alltoallv weights rank s: ...") so a script can compare them
 * with gradwire-perf's header. usage: mpirun -np N mpi_alltoallv SIZE_BYTES... */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int weight(int s, int d) {
  return 1 + (int)(splitmix64(29ull * 65536 + (uint64_t)s * 256 + (uint64_t)d) >> 61);
}

/* The floats rank s sends to rank d when every rank sends t floats. */
static long split(long t, int n, int s, int d) {
  uint64_t sum = 0;
  for (int j = 0; j < n; j++) sum += (uint64_t)weight(s, j);
  if (d < n - 1) return (long)((uint64_t)t * (uint64_t)weight(s, d) / sum);
  long given = 0;
  for (int j = 0; j < n - 1; j++) given += (long)((uint64_t)t * (uint64_t)weight(s, j) / sum);
  return t - given;
}

static float value(int s, int d, long i) { return (float)((31L * s + 7L * d + i) % 97); }

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (rank == 0) {
    for (int s = 0; s < n; s++) {
      printf("mpi-alltoallv weights (seed 29) rank %d:", s);
      for (int d = 0; d < n; d++) printf(" %d", weight(s, d));
      printf("\n");
    }
  }
  int *sc = malloc(n * sizeof(int)), *sd = malloc(n * sizeof(int));
  int *rc = malloc(n * sizeof(int)), *rd = malloc(n * sizeof(int));
  for (int a = 1; a < argc; a++) {
    long s = atol(argv[a]);
    long t = s / 4; /* floats this rank sends */
    long bytes = t * 4;
    long rtotal = 0;
    for (int j = 0; j < n; j++) {
      sc[j] = (int)split(t, n, rank, j);
      sd[j] = (int)(j == 0 ? 0 : sd[j - 1] + sc[j - 1]);
      rc[j] = (int)split(t, n, j, rank);
      rd[j] = (int)rtotal;
      rtotal += rc[j];
    }
    float* in = malloc(t > 0 ? t * 4 : 1);
    float* out = malloc(rtotal > 0 ? rtotal * 4 : 1);
    for (int d = 0; d < n; d++)
      for (long i = 0; i < sc[d]; i++) in[sd[d] + i] = value(rank, d, i);
    long it = 2000000000L / (bytes > 0 ? bytes : 1) / n;
    if (it < 3) it = 3;
    if (it > 50) it = 50;
    for (int w = 0; w < 2; w++)
      MPI_Alltoallv(in, sc, sd, MPI_FLOAT, out, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long i = 0; i < it; i++)
      MPI_Alltoallv(in, sc, sd, MPI_FLOAT, out, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
    double dt = (MPI_Wtime() - t0) / it, worst = 0;
    /* The check: a sentinel first, so a block the timed calls left alone is caught too. */
    for (long i = 0; i < rtotal; i++) out[i] = -1.0f;
    MPI_Alltoallv(in, sc, sd, MPI_FLOAT, out, rc, rd, MPI_FLOAT, MPI_COMM_WORLD);
    long wrong = 0, wrong_all = 0;
    for (int src = 0; src < n; src++)
      for (long i = 0; i < rc[src]; i++)
        if (out[rd[src] + i] != value(src, rank, i)) wrong++;
    MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      printf("mpi-alltoallv np=%d bytes=%ld time_ms=%.3f busbw_GBps=%.3f wrong=%ld\n", n, bytes,
             worst * 1e3, bytes * (double)(n - 1) / n / worst / 1e9, wrong_all);
      fflush(stdout);
    }
    free(in);
    free(out);
  }
  free(sc);
  free(sd);
  free(rc);
  free(rd);
  MPI_Finalize();
  return 0;
}
