// The NCCL plugin's side of GW_TIMELINE (core/timeline.h): with GW_TIMELINE set, the plugin writes
// a Chrome trace (the same trace-event JSON as the C ABI's) of every transfer NCCL runs through it
// and of each connection's set-up and memory registrations.
//
// The file: GW_TIMELINE's pattern with ".nccl" before a trailing ".json" (or at the end), and the
// rank put in as the C ABI does ("%r", else ".<rank>"), e.g. /tmp/tl/rank%r.json ->
// rank3.nccl.json; a separate file because a process may also load libgradwire (the C ABI), whose
// copy of the timeline writes the plain name. pid = the rank: the launcher's (GW_RANK, RANK,
// OMPI_COMM_WORLD_RANK, PMI_RANK, SLURM_PROCID, the first set), as the C ABI's communicator takes
// it; with none set, the OS process id. perf/merge_timeline.py merges it with the other files.
//
// Events (category "nccl-net"): isend / irecv / iflush from the post to the test() that saw them
// complete (bytes, tag, peer, comm, conn, transport; irecv also the posted size; failed when test
// failed); regMr / regMrDmaBuf / deregMr (the call: bytes, type); connect / accept (from the first
// call for the connection to the one that returned it). Off, each entry point costs one relaxed
// load (timeline::on()); a request posted while off is never traced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gw::plugin {

class PluginComm;

namespace trace {

// The file pattern handed to timeline::open for GW_TIMELINE's `pattern` (see above).
std::string plugin_pattern(std::string_view pattern);

// The rank for the file and the pid, and where it came from ("RANK", "process id").
struct RankChoice {
  int rank = 0;
  std::string source;
};
RankChoice launcher_rank();

// Opens the timeline when GW_TIMELINE is set (the first call does; later ones return ""). Returns
// the line for the plugin's INFO log, "" when there is nothing to say; an error when the file
// cannot be created (the plugin warns and runs without it).
Result<std::string> open_from_env();

// The JSON members naming `c` in its events (peer, comm, conn, transport), from its origin.
std::string origin_args(const PluginComm& c);

// A new connection number (1, 2, ...).
int next_conn();

// The events. `ts_us` is when the thing began; the end is now.
void transfer(const PluginComm& c, const char* name, int64_t ts_us, size_t bytes, size_t posted,
              int tag, bool failed);
void registration(const PluginComm& c, const char* name, int64_t ts_us, size_t bytes,
                  const char* type, bool failed);
void setup(const PluginComm& c, const char* name, int64_t ts_us);
// A set-up that failed before there was a comm.
void setup_failed(const char* name, uint64_t comm_id, int64_t ts_us, std::string_view why);

}  // namespace trace
}  // namespace gw::plugin
