// Bootstrap through PMIx, for jobs started by a PMIx launcher (Open MPI's mpirun, Slurm's
// `srun --mpi=pmix`, PRRTE's prterun) that give no store address: rank 0 chooses the store's
// address (127.0.0.1 when every rank is on its node, else the address GW_SOCKET_IFNAME picks) and
// a free port, and, unless GW_JOB_TOKEN is set, a job token; it publishes them with PMIx_Put, a
// PMIx_Fence follows, and every rank reads rank 0's values. The token then never enters the
// store: only the job's own processes can read it.
//
// libpmix is loaded with dlopen when this is first needed, so libgradwire.so does not depend on
// it; a build without pmix.h (the GPU test machine) reports kUnsupported.
#pragma once

#include <string>

#include "core/status.h"

namespace gw {

struct PmixJob {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;        // -1 when PMIx does not say
  int local_world_size = -1;  // -1 when PMIx does not say
  std::string store_host;
  int store_port = 0;
  std::string job_token;  // empty when GW_JOB_TOKEN is set (each rank has it already)
};

// Whether this process was started by a PMIx launcher (PMIX_NAMESPACE and PMIX_RANK are set).
bool in_pmix_job();

// Runs the exchange above; every rank of the job must call it (it is collective). The first
// result is kept: later calls in the same process return it without another fence, so a second
// communicator from the same environment reaches the same store. kUnsupported when libpmix
// cannot be loaded or PMIx_Init fails (the message says which); kTimeout when the fence does not
// complete within `timeout_ms`.
Result<PmixJob> pmix_bootstrap(int64_t timeout_ms);

}  // namespace gw
