// Starting real processes from integration tests: fork + exec with a clean environment, merged
// stdout/stderr captured, a deadline on every wait, and every process (and its process group,
// e.g. mpirun's ranks) killed and reaped on timeout, on failure and in the destructor.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tests/support/free_port.h"

namespace gw::test {

struct ProcResult {
  pid_t pid = -1;
  bool exited = false;  // exited normally (exit_code is valid)
  int exit_code = -1;
  int signal = 0;          // killed by this signal
  bool timed_out = false;  // still running at the deadline and killed by the harness
  std::string output;      // stdout + stderr
  double elapsed_ms = 0;   // from start to exit
  std::string describe() const;
};

using Env = std::map<std::string, std::string>;

// The current environment without any launcher or gradwire variable (GW_*, RANK, WORLD_SIZE,
// LOCAL_*, MASTER_*, OMPI_*, PMIX_*, SLURM_*), so a test states exactly what its ranks see.
Env clean_env();

class ProcGroup {
 public:
  ProcGroup() = default;
  ProcGroup(const ProcGroup&) = delete;
  ProcGroup& operator=(const ProcGroup&) = delete;
  ~ProcGroup();  // kills and reaps whatever still runs

  // Starts argv[0] (a path) with exactly `env`; returns the index of the process.
  size_t start(const std::vector<std::string>& argv, const Env& env);

  // Reads output until process `index`'s output contains `needle` (true) or the deadline passes
  // or the process exits without it (false). The output read so far is returned by output().
  bool wait_for_output(size_t index, const std::string& needle, int64_t deadline_ms);
  std::string output(size_t index) const;

  // Waits until every process has exited or `deadline_ms` from now has passed (then kills the
  // rest, marking them timed_out). With kill_on_failure, the first process that exits non-zero or
  // by a signal gets the others killed after grace_ms.
  std::vector<ProcResult> wait_all(int64_t deadline_ms, bool kill_on_failure = false,
                                   int64_t grace_ms = 5000);

 private:
  struct Proc;
  void kill_all();
  std::vector<Proc*> procs_;
};

// A free TCP port on 127.0.0.1 for a private store (tests/support/free_port.h says how it is
// chosen).
using gw::testing::free_port;

// Parses "key=value" fields of the first line starting with `tag` ("RESULT") that contains
// `must_contain`; nullopt when there is none.
std::optional<std::map<std::string, std::string>> parse_tagged_line(
    const std::string& output, const std::string& tag, const std::string& must_contain = "");

}  // namespace gw::test
