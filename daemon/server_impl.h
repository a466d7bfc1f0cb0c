// Server::Impl (daemon/server.h): the serve loop's state, shared by the files that make up the
// server. Everything here runs on the serve loop's thread (Server::run) unless it says otherwise;
// the jobs' threads reach it only through the eventfds and the Counters.
//
// Files: server.cc (create, the serve loop, stats), admission.cc (the trainers' socket: accept,
// credentials, hello, admit into a job, departures and reaping; the interface below), and
// control_server.cc (the gradwirectl socket, daemon/control.h).
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"
#include "daemon/control.h"
#include "daemon/counters.h"
#include "daemon/job.h"
#include "daemon/job_trace.h"
#include "daemon/protocol.h"
#include "daemon/reduce_pool.h"
#include "daemon/server.h"
#include "daemon/transport_offer.h"

namespace gw::daemon {

// A connection that has not said what it wants yet: a trainer before its hello, or a gradwirectl
// before its request. Bounded by `deadline`.
struct PendingConn {
  sys::Fd sock;
  pid_t pid = 0;
  uid_t uid = 0;
  std::vector<uint8_t> buf;
  sys::Deadline deadline;
  sys::Deadline evictable;  // its grace period's end (sys::kEvictGraceMs): no newcomer evicts it before
  // gradwirectl trace (job_trace.cc): the recording this connection waits for (its deadline is
  // the trace's end).
  std::shared_ptr<JobTrace> trace;
};

// Control connections waiting for their request at most (gradwirectl): a newcomer beyond it evicts
// the oldest past its grace period.
inline constexpr size_t kMaxControlConns = 16;

// Every one of `max` places taken by a connection still in its grace period (conns are in accept
// order): no newcomer can be taken now; the listener waits until the oldest's grace ends.
inline bool full_of_young(const std::vector<PendingConn>& conns, size_t max) {
  return conns.size() >= max && !sys::expired(conns.front().evictable);
}

// admission.cc: listening sockets (also used for the control socket by create()).
// Listens on `path` (mode 0700 by the umask: the owner's only). A socket file left by a daemon that
// died is replaced; a live daemon's is refused.
Result<sys::Fd> bind_listener(const std::string& path);
// GW_DAEMON_GROUP: a group name or number.
Result<gid_t> resolve_group(const std::string& name);
// Opens a listening socket to the group: owned by it, mode 0660.
Status share_with_group(const std::string& path, gid_t gid, const std::string& name);

// control_server.cc: sends a control answer (bounded: 500 ms) and closes the connection.
void answer_control(sys::Fd& sock, const std::string& body);

struct Server::Impl {
  ServerOptions opt;
  TransportOffer offer;          // the transports this daemon offers its jobs, best first
  DeviceBuffers device_buffers;  // whether trainers' dma-bufs can go through it, and why
  std::string host_id;
  std::string ctl_path;    // the control socket (gradwirectl)
  bool has_group = false;  // ServerOptions::group, resolved
  gid_t group_gid = 0;
  sys::Fd listen;
  sys::Fd ctl_listen;
  sys::Fd stop_efd;  // stop()
  sys::Fd wake_efd;  // a job finished or refused a trainer
  Counters counters;
  std::unique_ptr<ReducePool> pool;
  int64_t started_ns = sys::now_ns();

  // ---- admission (admission.cc) ---------------------------------------------------------------
  // The trainers: connections before their hello, every admitted trainer by id, its job, and the
  // jobs by job_key(). A trainer is admitted into its job (made on its first trainer); the job
  // starts its thread once its local_size trainers have joined.
  uint64_t next_client_id = 1;
  std::vector<PendingConn> pending;
  std::map<uint64_t, std::shared_ptr<Trainer>> clients;
  std::map<uint64_t, std::shared_ptr<Job>> client_job;
  std::map<std::string, std::shared_ptr<Job>> jobs;

  // Accepts the connections waiting on `listen` into `pending` (or refuses them: credentials,
  // GW_DAEMON_MAX_CLIENTS); beyond kMaxPendingHellos a newcomer evicts the oldest pending one
  // past its grace period (sys::kEvictGraceMs), or waits in the backlog while none is.
  void accept_all();
  // Reads what a pending connection sent; true when it is finished with (welcomed or refused).
  bool step_pending(PendingConn& p);
  // Refuses a pending connection whose hello did not come within GW_DAEMON_HELLO_TIMEOUT (checked
  // every round, whether or not it sent something).
  void expire_pending(PendingConn& p);
  // Whether a peer may talk to this daemon (either socket): same uid as the daemon, root, or a
  // member of the configured group (its gid or a supplementary group).
  Status check_peer(int sock, const ucred& cred) const;
  // Answers a refusal (a welcome with the error) best effort and closes the connection; counted.
  void refuse_conn(sys::Fd& sock, pid_t pid, const Status& why, ErrorKind kind = ErrorKind::kHello);
  // A complete, decoded hello: checks it against the daemon and its job, makes the arena, sends
  // the welcome with its descriptors and joins the job (starting it when complete).
  Status admit(PendingConn& p, const Hello& h);
  // Reads what the admitted trainers' sockets say (only a close is expected) and forgets every
  // trainer that closed, misbehaved or was refused by its job thread.
  // Version 8: a trainer's descriptor records (protocol.h FdRecord) of `n` new bytes `b` with
  // the descriptors that came with them, handed to its job thread by ticket; kPeer for anything
  // else (the trainer is then cut).
  Status take_fd_records(Trainer& t, const uint8_t* b, size_t n, std::vector<sys::Fd>* fds);
  void poll_clients(const std::vector<pollfd>& pfds, size_t first,
                    const std::vector<uint64_t>& ids);
  // A trainer is gone: its job fails (started) or frees its place (joining).
  void client_gone(uint64_t id, const std::string& why);
  // Joins and forgets finished jobs; with `all`, stops and forgets every job and connection.
  void reap_jobs(bool all);

  // ---- the control socket (control_server.cc) -------------------------------------------------
  std::vector<PendingConn> ctl_pending;  // control connections waiting for their request
  void accept_control();
  // Reads a control connection's request; true when it is finished with (answered or refused).
  bool step_control(PendingConn& p);
  // Answers a control connection whose request did not come in time.
  void expire_control(PendingConn& p);
  nlohmann::json answer(ControlCommand command) const;
  // gradwirectl trace (job_trace.cc): starts recording the job the request names (false: the
  // connection waits for the trace's end) or answers why not (true); a traced connection that
  // closes or speaks again ends its trace; at its deadline the trace is answered.
  bool start_trace(PendingConn& p, const uint8_t* body, size_t size);
  bool step_trace(PendingConn& p);
  void finish_trace(PendingConn& p);

  // ---- the serve loop (server.cc) -------------------------------------------------------------
  Status serve();

  // A daemon that offers dpdk brings its port up at start, in port_start (server.cc
  // start_dpdk_port), which says how that went in dpdk_port: "starting", "open: <port> in N ms" or
  // "failed: <reason>" (gradwirectl status); "" while the daemon offers no dpdk. Shared with the
  // thread. port_start is last: destroyed (joined) first, before anything else of the Impl goes.
  struct PortState {
    std::mutex mu;
    std::string text;
    bool drop_dpdk = false;  // it failed under auto (with more to offer): job_offer leaves dpdk out
  };
  std::shared_ptr<PortState> dpdk_port = std::make_shared<PortState>();
  // The transports offered to a job starting now: the offer, less dpdk when the daemon chose it
  // (auto) and its port failed to come up (jobs then meet over what else it offers, tcp).
  std::vector<std::string> job_offer() const;
  std::jthread port_start;
};

}  // namespace gw::daemon
