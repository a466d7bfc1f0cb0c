/* The smallest gradwire program, in C: every rank contributes its rank + 1 to a 4-element
 * allreduce and checks the sum. Run it under a launcher (torchrun, mpirun, srun) or with
 * GW_RANK, GW_WORLD_SIZE and GW_STORE=host:port; a single rank needs only GW_RANK=0 and
 * GW_WORLD_SIZE=1. Build it against an installed gradwire (README, "Building against it"):
 *
 *   cc hello_allreduce.c $(pkg-config --cflags --libs gradwire) -o hello_allreduce
 */
#include <gradwire/gradwire.h>
#include <stdio.h>

int main(void) {
  gw_comm_t comm;
  if (gw_comm_init_from_env(&comm) != GW_OK) {
    fprintf(stderr, "hello_allreduce: %s\n", gw_last_error());
    return 1;
  }
  int rank = 0, size = 0;
  gw_comm_rank(comm, &rank);
  gw_comm_size(comm, &size);
  float grads[4];
  for (int i = 0; i < 4; ++i) grads[i] = (float)(rank + 1);
  if (gw_allreduce(comm, grads, grads, 4, GW_FLOAT32, GW_SUM) != GW_OK) {
    fprintf(stderr, "hello_allreduce: %s\n", gw_last_error());
    gw_comm_destroy(comm);
    return 1;
  }
  const float want = (float)size * (float)(size + 1) / 2.0f;
  int ok = 1;
  for (int i = 0; i < 4; ++i) ok = ok && grads[i] == want;
  printf("hello_allreduce: rank %d of %d, gradwire %s: sum %g (%s)\n", rank, size, gw_version(),
         grads[0], ok ? "ok" : "WRONG");
  gw_comm_destroy(comm);
  return ok ? 0 : 1;
}
