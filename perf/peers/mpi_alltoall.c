/* Peer baseline for `gradwire-perf alltoall`: MPI_Alltoall of float32, same size convention
 * (SIZE = the whole send buffer of one rank, SIZE/N bytes to each rank), same iteration rule
 * (clamp(2e9 / size / ranks, 3, 50), 2 warm-up calls) and the nccl-tests busbw factor (n-1)/n.
 * Out of place, like gradwire-perf's timed calls. Reports the slowest rank's mean time.
 * usage: mpirun -np N mpi_alltoall SIZE_BYTES... */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (int a = 1; a < argc; a++) {
    long s = atol(argv[a]);
    long per = s / 4 / n; /* floats per destination block */
    long bytes = per * 4 * n;
    float* in = malloc(bytes > 0 ? bytes : 1);
    float* out = malloc(bytes > 0 ? bytes : 1);
    for (long i = 0; i < per * n; i++) in[i] = (float)(rank + i % 7);
    long it = 2000000000L / (bytes > 0 ? bytes : 1) / n;
    if (it < 3) it = 3;
    if (it > 50) it = 50;
    for (int w = 0; w < 2; w++)
      MPI_Alltoall(in, per, MPI_FLOAT, out, per, MPI_FLOAT, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t = MPI_Wtime();
    for (long i = 0; i < it; i++)
      MPI_Alltoall(in, per, MPI_FLOAT, out, per, MPI_FLOAT, MPI_COMM_WORLD);
    double dt = (MPI_Wtime() - t) / it, worst = 0;
    MPI_Reduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
      printf("mpi-alltoall np=%d bytes=%ld time_ms=%.3f busbw_GBps=%.3f\n", n, bytes, worst * 1e3,
             bytes * (double)(n - 1) / n / worst / 1e9);
    }
    free(in);
    free(out);
  }
  MPI_Finalize();
  return 0;
}
