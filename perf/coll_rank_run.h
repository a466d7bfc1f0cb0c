// One rank of a collective sweep of gradwire-perf: it makes the communicator, times and checks
// every size, and (rank 0) prints the table and writes or sends the JSON.
#pragma once

#include "gradwire/gradwire.h"
#include "perf/coll_bench.h"

namespace gw::perf {

// Runs the sweep of `c` as one rank: a communicator from `config` (or, when it is null, from the
// launcher's environment), the sizes in turn, destroyed at the end. Rank 0 prints the table; with
// msg_fd >= 0 (a rank forked by run_collective) it sends the JSON pieces to the parent on that
// descriptor ("config ...", "row ...", "summary ...", "error ..."), otherwise it writes c.json_path
// itself. Returns the exit status: 0 ok, 1 wrong results, 2 error.
int run_coll_rank(const CollConfig& c, int msg_fd, const gw_config_t* config);

}  // namespace gw::perf
