// Runs N ranks of a benchmark as forked processes on this machine, with no launcher.
//
// Why fork instead of threads: every rank is its own process, as under torchrun or mpirun, so the
// collectives run through libgradwire.so exactly as a user's job would, and a rank that dies is a
// real dead process. The parent never touches the library; it only supervises:
// - each child gets a pipe to the parent and sends one-line messages over it (see send_message);
//   rank 0 uses it to hand its result rows to the parent, which writes the JSON file;
// - a child that exits non-zero or is killed ends the run: the parent gives the others
//   kFailureGraceMs to report their own error, then SIGKILLs and reaps every remaining child;
// - if no child has sent anything for idle_timeout_ms the parent declares a hang, kills all
//   children and returns kTimeout, so even a bug in the library cannot hang the tool;
// - children die with the parent (PR_SET_PDEATHSIG), so an interrupted parent leaves nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "core/status.h"

namespace gw::perf {

inline constexpr int64_t kFailureGraceMs = 2000;

struct ForkOptions {
  int nranks = 2;
  // Bind rank r to the r-th CPU this process may run on, when there are at least nranks of them.
  bool bind_cores = true;
  int64_t idle_timeout_ms = 330000;
};

// Runs body(rank, msg_fd) in nranks forked children; the child exits with body's return value.
// on_message(rank, line) is called in the parent for every line a child sends. Returns OK when
// every child exited 0; otherwise a Status naming the first rank that failed and how.
Status run_forked(const ForkOptions& options, const std::function<int(int rank, int msg_fd)>& body,
                  const std::function<void(int rank, const std::string& line)>& on_message);

// The line a failed forked run ends with: the ranks' own first error when a rank exited with a
// status (it reported why, a user's mistake as often as not), else run_forked's status (a rank
// killed by a signal is the cause; the first error reported follows it).
std::string run_failure_text(const Status& status, const std::string& first_error);

// Sends one line (no '\n' inside) to the parent. msg_fd < 0 (not forked) is a no-op.
void send_message(int msg_fd, const std::string& line);

// Whether a launcher's environment names this process's rank (GW_RANK or GW_WORLD_SIZE set, or
// torchrun's RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID): then a benchmark without --np runs as one
// rank of the launcher's job instead of forking its own ranks.
bool launched_by_launcher();

// "rank 3 (SLURM_PROCID)": the rank the launcher's environment names (GW_RANK, RANK,
// OMPI_COMM_WORLD_RANK, SLURM_PROCID, the first set), for messages written before the library
// knows the rank; "" when none is set.
std::string launcher_rank_text();

// What to do when no launcher environment names a rank: the advice for an error message.
std::string no_launcher_advice();

// Asks the kernel for a free TCP port on 127.0.0.1 (bind to port 0, read it, close). Used for the
// private store of forked ranks: rank 0 hosts the store there.
Result<int> reserve_loopback_port();

}  // namespace gw::perf
