/* Peer driver for the point-to-point comparison (perf/p2p_peers.sh): Open MPI's MPI_Send /
 * MPI_Recv between 2 ranks, printed with the columns of `gradwire-perf p2p --capi` so one parser
 * reads both.
 * - bandwidth: ITERS messages of SIZE bytes (default 4 MiB; ITERS default clamp(2 GiB / SIZE,
 *   8, 1000), rounded to whole windows), rank 0 to rank 1, WINDOW MPI_Isends (rank 1:
 *   MPI_Irecvs) outstanding then MPI_Waitall, one untimed window first; the clock on rank 0 stops
 *   when rank 1's 1-byte reply after its last receive arrived, so every byte is counted as
 *   received. BW = bytes / time in MB/s (10^6).
 * - latency: LAT_ITERS ping-pongs of LAT_SIZE bytes (default 8) with blocking MPI_Send /
 *   MPI_Recv after 100 untimed ones; each sample is the round trip / 2, in microseconds:
 *   t_min, the median (t_typical), the 99th percentile, t_max. The first byte of every message
 *   is checked (rank 1 echoes what it got, rank 0 sends its iteration number); wrong echoes are
 *   counted and printed.
 * usage: mpirun -np 2 mpi_pingpong [-s SIZE] [-w WINDOW] [-n ITERS] [-l LAT_ITERS] [-L LAT_SIZE]
 * Exit status 0, or 1 on a bad argument, a wrong rank count or a wrong echo. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static long parse_size(const char* s) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || v < 0) return -1;
  if (*end == 'K' || *end == 'k')
    v <<= 10, ++end;
  else if (*end == 'M' || *end == 'm')
    v <<= 20, ++end;
  if (*end != '\0') return -1;
  return v;
}

static double pct(const double* v, long n, double q) {
  long i = (long)(q * (double)(n - 1) + 0.5);
  return v[i < n ? i : n - 1] * 1e6;
}

int main(int argc, char** argv) {
  long size = 4L << 20, window = 4, iters = 0, lat_iters = 2000, lat_size = 8;
  MPI_Init(&argc, &argv);
  int rank = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (int i = 1; i < argc; i++) {
    long* dst = NULL;
    if (strcmp(argv[i], "-s") == 0)
      dst = &size;
    else if (strcmp(argv[i], "-w") == 0)
      dst = &window;
    else if (strcmp(argv[i], "-n") == 0)
      dst = &iters;
    else if (strcmp(argv[i], "-l") == 0)
      dst = &lat_iters;
    else if (strcmp(argv[i], "-L") == 0)
      dst = &lat_size;
    if (dst == NULL || i + 1 >= argc || (*dst = parse_size(argv[++i])) < 0) {
      if (rank == 0) fprintf(stderr, "mpi_pingpong: bad argument '%s'\n", argv[i]);
      MPI_Finalize();
      return 1;
    }
  }
  if (n != 2 || window < 1 || size > (1L << 30) || lat_size < 1 || lat_size > (1L << 30)) {
    if (rank == 0) {
      fprintf(stderr, "mpi_pingpong: needs exactly 2 ranks (got %d), -w >= 1, sizes <= 1 GiB\n", n);
    }
    MPI_Finalize();
    return 1;
  }
  if (iters <= 0) {
    iters = size > 0 ? (2L << 30) / size : 1000;
    if (iters < 8) iters = 8;
    if (iters > 1000) iters = 1000;
  }
  long rounds = iters / window;
  if (rounds < 1) rounds = 1;
  const int peer = 1 - rank;
  char* buf = malloc((size_t)(size > lat_size ? size : lat_size) + 1);
  MPI_Request* reqs = malloc(sizeof(MPI_Request) * (size_t)window);
  double* lat = malloc(sizeof(double) * (size_t)(lat_iters > 0 ? lat_iters : 1));
  if (buf == NULL || reqs == NULL || lat == NULL) {
    fprintf(stderr, "mpi_pingpong: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  memset(buf, 1, (size_t)(size > lat_size ? size : lat_size) + 1);

  /* Bandwidth: one untimed window, then the timed rounds and the reply. */
  if (rank == 0) {
    printf(
        "# mpi_pingpong: Open MPI, 2 ranks, window %ld, MPI_Isend/MPI_Irecv (bandwidth) and "
        "MPI_Send/MPI_Recv (latency)\n",
        window);
    printf("#bytes     #messages      BW average[MB/s]\n");
  }
  double t0 = 0;
  for (long r = -1; r < rounds; r++) {
    if (r == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      t0 = MPI_Wtime();
    }
    for (long w = 0; w < window; w++) {
      if (rank == 0)
        MPI_Isend(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[w]);
      else
        MPI_Irecv(buf, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, &reqs[w]);
    }
    MPI_Waitall((int)window, reqs, MPI_STATUSES_IGNORE);
  }
  char ack = 0;
  if (rank == 0) {
    MPI_Recv(&ack, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    const double sec = MPI_Wtime() - t0;
    printf(" %-10ld %-14ld %-.2f\n", size, rounds * window,
           (double)size * (double)(rounds * window) / sec / 1e6);
    fflush(stdout);
  } else {
    MPI_Send(&ack, 1, MPI_BYTE, peer, 3, MPI_COMM_WORLD);
  }

  /* Latency. */
  long wrong = 0;
  for (long i = -100; i < lat_iters; i++) {
    if (rank == 0) {
      const char mark = (char)(i & 0x7f);
      buf[0] = mark;
      const double t = MPI_Wtime();
      MPI_Send(buf, (int)lat_size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
      MPI_Recv(buf, (int)lat_size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      if (i >= 0) lat[i] = (MPI_Wtime() - t) / 2;
      if (buf[0] != mark) wrong++;
    } else {
      MPI_Recv(buf, (int)lat_size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      MPI_Send(buf, (int)lat_size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
    }
  }
  if (rank == 0 && lat_iters > 0) {
    qsort(lat, (size_t)lat_iters, sizeof(double), cmp_double);
    printf(
        "#\n#bytes #iterations  t_min[usec]  t_typical[usec]  99%%[usec]  t_max[usec]  "
        "(half round trip of MPI_Send + MPI_Recv)\n");
    printf(" %-6ld %-11ld  %-11.2f  %-15.2f  %-9.2f  %-.2f\n", lat_size, lat_iters,
           pct(lat, lat_iters, 0), pct(lat, lat_iters, 0.5), pct(lat, lat_iters, 0.99),
           pct(lat, lat_iters, 1.0));
    printf("# t_typical is the median; wrong echoes: %ld\n", wrong);
    fflush(stdout);
  }
  free(buf);
  free(reqs);
  free(lat);
  MPI_Finalize();
  return wrong == 0 ? 0 : 1;
}
