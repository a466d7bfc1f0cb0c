// The stall inspector in gradwired (docs/horovod.md, "Stall inspector"): a collective that some of
// a job's trainers on this host have entered and others have not, for GW_STALL_WARN_S, is named in
// a WARN with the ranks it waits for, repeated every period until they come (or the job fails).
// The daemon sees every local trainer's submissions, so nothing is exchanged: the job thread looks
// after each wake-up, and sleeps no longer than the next warning is due. Across hosts the daemons'
// own communicator has direct mode's inspector (collectives/stall.h), whose "ranks" are the job's
// hosts.
#include <algorithm>
#include <string>
#include <vector>

#include "collectives/coll_config.h"
#include "core/config.h"
#include "core/log.h"
#include "core/sys/time.h"
#include "daemon/job.h"

namespace gw::daemon {

namespace {

std::string rank_list(const std::vector<int32_t>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i) out += ",";
    out += std::to_string(ranks[i]);
  }
  return out;
}

// "allreduce (float32 sum, 1000 elements, 4000 bytes)", "broadcast (root 3, ...)".
std::string what(const Request& r) {
  const bool reducing = r.opcode == Opcode::kAllreduce || r.opcode == Opcode::kReduceScatter ||
                        r.opcode == Opcode::kAllreduceCompressed;
  std::string s = fmt::format("{} ({}", opcode_name(r.opcode), coll::dtype_name(r.dtype));
  if (reducing) s += fmt::format(" {}", coll::op_name(r.op));
  if (r.opcode == Opcode::kBroadcast) s += fmt::format(", root {}", r.root);
  const uint64_t bytes = r.opcode == Opcode::kReduceScatter ? r.recv_bytes : r.send_bytes;
  return s + fmt::format(", {} elements, {} bytes)", r.count, bytes);
}

}  // namespace

void Job::watch_stall() {
  if (stall_warn_s < 0) stall_warn_s = config::get_double(coll::coll_config::kStallWarnS);
  std::vector<int32_t> entered, missing;
  const Request* front = nullptr;
  if (stall_warn_s > 0 && failure.ok()) {
    for (const auto& m : members) {
      if (!m) continue;
      if (m->pending.empty()) {
        missing.push_back(m->hello.rank);
      } else {
        entered.push_back(m->hello.rank);
        if (!front) front = &m->pending.front();
      }
    }
  }
  const uint64_t index = done.load(std::memory_order_relaxed) + errors.load();
  if (entered.empty() || missing.empty()) {
    stall_since_ns = 0;
    return;
  }
  const int64_t now = sys::now_ns();
  const auto period = static_cast<int64_t>(stall_warn_s * 1e9);
  if (stall_since_ns == 0 || stall_index != index) {  // a new wait (the job's next collective)
    stall_since_ns = now;
    stall_next_ns = now + period;
    stall_index = index;
    return;
  }
  if (now < stall_next_ns) return;
  stall_next_ns = now + period;
  GW_LOG_WARN(
      "stall: gradwired job {} (host {} of {}): {} has waited {:.1f} s for ranks [{}], which have "
      "not entered it (ranks [{}] of this host have; not called yet, or called another "
      "collective); GW_STALL_WARN_S={}",
      job_name(first), first.host_index, first.num_hosts, what(*front),
      static_cast<double>(now - stall_since_ns) / 1e9, rank_list(missing), rank_list(entered),
      stall_warn_s);
}

int Job::stall_poll_ms(int cap) const {
  if (stall_since_ns == 0 || !failure.ok()) return cap;  // a failed job is not watched
  const int64_t ms = (stall_next_ns - sys::now_ns()) / 1000000 + 1;
  return static_cast<int>(std::clamp<int64_t>(ms, 1, cap));
}

}  // namespace gw::daemon
