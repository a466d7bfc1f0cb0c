#include "daemon/daemon_config.h"

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace gw::daemon_config {

using config::Type;

namespace {

Status check_daemon(std::string_view text) {
  if (text.empty() || text == "auto" || text.rfind("unix:", 0) == 0) {
    if (text.size() != 5) return ok_status();
  }
  return invalid_arg(
      "expected empty (direct mode), auto (the daemon at GW_DAEMON_SOCKET if one answers, else "
      "direct mode) or unix:/path/to/gradwired.sock");
}

// A group number must be a gid: 4294967296 would wrap to 0 (root's group) and (gid_t)-1 means
// "no change" to chown. A name is looked up when the daemon starts.
Status check_group(std::string_view text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) {
    return ok_status();
  }
  constexpr uint64_t kMaxGid = static_cast<gid_t>(-1) - 1;
  uint64_t gid = 0;
  for (char c : text) {
    gid = gid * 10 + static_cast<uint64_t>(c - '0');
    if (gid > kMaxGid) break;
  }
  if (gid > kMaxGid) return invalid_arg("a group number must be 0..{}", kMaxGid);
  return ok_status();
}

}  // namespace

constinit const config::Row kDaemon{
    "GW_DAEMON",
    Type::String,
    "",
    "",
    "daemon mode: unix:PATH of gradwired's socket; auto: the daemon at GW_DAEMON_SOCKET when one "
    "answers there, else direct mode; empty: direct mode (collectives run in this process)",
    &check_daemon};
constinit const config::Row kArena{
    "GW_DAEMON_ARENA", Type::Size, "256M", "",
    "daemon mode: size of this trainer's shared arena (gw_mem_alloc memory and staging of other "
    "buffers); the daemon may cap it"};
constinit const config::Row kChunk{
    "GW_DAEMON_CHUNK", Type::Size, "16M", "",
    "daemon mode: an allreduce or broadcast larger than this runs as chunks of it, several in "
    "flight, an allgather, reduce_scatter or alltoall larger than two of it as slices of two "
    "(buffers larger than the arena work; staging copies overlap the daemon's work); the ranks "
    "of a job take the least of theirs"};
constinit const config::Row kSocket{"GW_DAEMON_SOCKET", Type::String,
                                    "/run/gradwire/gradwired.sock", "",
                                    "gradwired: the trainers' unix socket (--socket)"};
constinit const config::Row kMaxArena{"GW_DAEMON_MAX_ARENA", Type::Size, "4G", "",
                                      "gradwired: the largest arena one trainer may ask for"};
constinit const config::Row kMaxClients{"GW_DAEMON_MAX_CLIENTS", Type::Int, "256", "",
                                        "gradwired: trainers connected at once (more are refused)"};
constinit const config::Row kTransport{
    "GW_DAEMON_TRANSPORT", Type::String, "auto", "",
    "gradwired: backend between the daemons of a job. auto: offer the best this daemon owns "
    "(verbs where an RDMA device answers, dpdk where GW_DPDK_EAL_ARGS gives it a port, then tcp) "
    "and let each job take the first its daemons all offer; a name (tcp, dpdk, verbs): that "
    "alone, and the daemon will not start where it is unavailable"};

constinit const config::Row kSpinUs{
    "GW_DAEMON_SPIN_US", Type::Int, "50", "",
    "daemon mode: microseconds a trainer polls its completion ring, yielding its core between "
    "looks, before sleeping on the eventfd (0: sleep at once)"};

constinit const config::Row kPollUs{
    "GW_DAEMON_POLL_US", Type::Int, "50", "",
    "gradwired: microseconds a job's thread busy-polls its trainers' submission rings before "
    "sleeping on their eventfds (spares a wake-up per small collective; after 4 spins in a row "
    "that found nothing it sleeps at once, until work comes within this long of a sleep; 0: "
    "never)"};

constinit const config::Row kP2pUnexpectedMax{
    "GW_DAEMON_P2P_UNEXPECTED_MAX", Type::Size, "256M", "",
    "gradwired: bytes one job's point-to-point messages from other hosts may hold here before a "
    "receive is posted for them; beyond it the job's cross-host point-to-point fails naming it"};

constinit const config::Row kReduceThreads{
    "GW_DAEMON_REDUCE_THREADS", Type::Int, "0", "",
    "gradwired: threads sharing a large collective's local sum and copy-back (the job's own "
    "included; 0: min(4, the CPUs); 1: the job's thread alone)"};

constinit const config::Row kMetrics{
    "GW_DAEMON_METRICS", Type::String, "", "",
    "gradwired: [HOST:]PORT of the Prometheus endpoint (/metrics; --metrics); no HOST: "
    "127.0.0.1, 0.0.0.0 for every address; empty: none"};

constinit const config::Row kGroup{
    "GW_DAEMON_GROUP",
    Type::String,
    "",
    "",
    "gradwired: a group (name or number) whose members may use the daemon whatever their uid: "
    "the sockets become mode 0660 and owned by it; empty: the daemon's uid (and root) only",
    &check_group};

const config::RowSet& rows() {
  static const config::RowSet set(
      "daemon", {&kDaemon, &kArena, &kChunk, &kSocket, &kMaxArena, &kMaxClients, &kTransport,
                 &kSpinUs, &kPollUs, &kP2pUnexpectedMax, &kReduceThreads, &kMetrics, &kGroup});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::daemon_config
