// gradwired's engine: the trainers' unix socket, one shared arena per trainer, and one job per
// (job token, store, world) that sums its local trainers' buffers and runs the inter-host
// collective with the job's other daemons over a gw::coll::Communicator.
//
// Threads: run() is the accept/hello/liveness loop (it alone touches the sockets); every job has
// a thread of its own that reads its trainers' submission rings, runs the collectives and writes
// the completions. stop() is async-signal-safe and thread-safe.
//
// Faults: a trainer that disconnects (killed or done) fails its job: every pending and later
// request of the job's other trainers completes with kPeer and the job's communicator is aborted
// so the other daemons' trainers fail too; its arena is unmapped once the job lets go of it. A
// trainer that sends a malformed hello, a malformed or out-of-arena submission, or overflows a
// ring is refused (counted in stats().refused) and disconnected; other jobs do not notice.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "daemon/protocol.h"

namespace gw::daemon {

struct ServerOptions {
  std::string socket_path;  // created owner-only; an existing stale socket file is replaced
  // A group (name or number) whose members may connect whatever their uid (GW_DAEMON_GROUP): both
  // sockets are then mode 0660 and owned by it, and a peer of another uid is accepted when its
  // SO_PEERCRED gid or one of its supplementary groups is this group. "": owner (and root) only.
  std::string group;
  // Between the daemons of a job: "auto" (offer the best this daemon owns,
  // daemon/transport_offer.h) or a backend name (offer that alone; refused at create when
  // unavailable here).
  std::string transport = "tcp";
  uint64_t max_arena_bytes = 4ull << 30;
  int max_clients = 256;
  uint32_t ring_entries = 64;  // per ring, a power of two
  std::string host_id;         // "": bootstrap host_identity() (GW_HOSTID)
  int64_t hello_timeout_ms = 5000;
  int64_t spin_us =
      0;  // a job thread busy-polls its rings this long before sleeping (GW_DAEMON_POLL_US)
  // Threads that share a large collective's local sum and copy-back (the job's thread included;
  // 0: min(4, the CPUs); 1: the job's thread alone). Shared by the jobs: one at a time.
  int reduce_threads = 0;
  // Called by run()'s loop at least every tick_ms (when > 0; else every 200 ms), on its thread:
  // gradwired pings the systemd watchdog from here, so a stuck loop stops the pings.
  std::function<void()> on_tick;
  int64_t tick_ms = 0;
  // Called by run() once stop() is seen, before the jobs are ended (which may wait for a job's
  // daemons still meeting): gradwired tells systemd STOPPING=1 from here.
  std::function<void()> on_stopping;
};

// Collectives by kind: the opcodes of daemon/protocol.h (1..kNumOpcodes), index opcode - 1.

// What went wrong, for gradwired_errors_total{kind} (error_kind_name()).
enum class ErrorKind {
  kHello,        // a malformed, late or disagreeing hello (host identity, layout, a taken rank)
  kCredentials,  // a peer of another uid
  kCapacity,     // too many clients, an arena beyond GW_DAEMON_MAX_ARENA
  kProtocol,     // after the hello: a bad submission, an out-of-arena offset, ring overflow, bytes
  kCollective,   // a collective that completed with an error (its code in collective_errors)
};
inline constexpr int kNumErrorKinds = 5;
const char* error_kind_name(ErrorKind kind);  // "hello", "credentials", ...

// The phases of a collective in the daemon, for gradwired_phase_seconds{phase}.
enum class Phase { kLocalReduce, kInterHost, kCopyBack };
inline constexpr int kNumPhases = 3;
const char* phase_name(Phase phase);  // "local_reduce", "inter_host", "copy_back"

// A histogram of durations in seconds: counts per bucket (not cumulative), bucket i holding
// samples <= kBounds[i] and above the previous bound, the last one those above every bound.
struct DurationHistogram {
  static constexpr double kBounds[] = {1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 0.01,
                                       0.05, 0.1,  0.5,  1,    5,    10};
  static constexpr int kBuckets = sizeof(kBounds) / sizeof(kBounds[0]) + 1;
  uint64_t buckets[kBuckets] = {};
  uint64_t count = 0;
  double sum_s = 0;
};

// One parameter-server store in this daemon (a job's share of its keys; docs/parameter-server.md).
struct KvStoreStats {
  std::string job;  // the job's name (gradwirectl jobs)
  int32_t host_index = 0;
  uint64_t store = 0;  // the store's id in its job
  std::string mode, update;
  std::string codec;  // the pushes' codec spec (canonical), "none" for raw pushes
  uint32_t workers = 0, live = 0, lost = 0;
  uint64_t keys = 0, partitions = 0, bytes = 0;
  uint64_t min_clock = 0, max_clock = 0;  // over the live workers / every worker
  uint64_t dropped = 0;
  std::string state;  // "open", "finished" (every worker done), "failed"
};

// One NCCL job of the plugin's daemon mode (docs/nccl-plugin.md "Daemon mode"): its connections
// in this daemon now, and the bytes they carried since the daemon started.
struct NcclJobStats {
  std::string job;  // 16 hex digits: an HMAC of its job token (daemon/job.h nccl_job_of)
  uint64_t connections = 0;
  uint64_t bytes = 0;
};

struct ServerStats {
  uint64_t accepted = 0;  // hellos accepted
  uint64_t refused = 0;   // connections refused or cut for misbehaviour
  uint64_t live_clients = 0;
  uint64_t live_arenas = 0;   // arenas still mapped in the daemon
  uint64_t live_imports = 0;  // trainers' device allocations open in the daemon
  uint64_t live_jobs = 0;
  uint64_t collectives = 0;  // completed OK (counted once per job-wide collective)
  uint64_t failed = 0;       // completed with an error
  // The same by opcode: [opcode - 1][0 ok, 1 error].
  uint64_t by_opcode[kNumOpcodes][2] = {};
  uint64_t errors[kNumErrorKinds] = {};  // by ErrorKind
  uint64_t collective_errors[9] = {};    // failed collectives by Code (core/status.h)
  // Bytes: "arena" = read from the trainers' buffers (in) and written back into them (out);
  // inter-host = the payload the daemon handed its inter-host collectives (out) and got back
  // (in), over `transport` (not the wire bytes: the algorithm decides those).
  uint64_t arena_bytes_in = 0, arena_bytes_out = 0;
  uint64_t inter_bytes_in = 0, inter_bytes_out = 0;  // over every transport
  struct TransportBytes {
    std::string transport;
    uint64_t in = 0, out = 0;
  };
  // By the transport the jobs' daemons agreed on: each this daemon offers, and any other that
  // carried bytes.
  std::vector<TransportBytes> inter;
  std::string transport;                 // what this daemon offers, best first ("dpdk,tcp")
  DurationHistogram phases[kNumPhases];  // by Phase
  std::vector<KvStoreStats> kv_stores;   // by job, then store id
  std::vector<NcclJobStats> nccl_jobs;   // by NCCL job id
};

class Server {
 public:
  // Binds the socket (kSystem/kInvalidArg on failure).
  static Result<std::unique_ptr<Server>> create(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until stop(); then ends every job (their trainers see the socket close) and returns.
  Status run();
  // Async-signal-safe, thread-safe, idempotent.
  void stop();
  ServerStats stats() const;
  const std::string& socket_path() const;
  const std::string& host_id() const;
  // The transports it offers other daemons and why ("auto offers dpdk,tcp (...)"): for the one
  // line gradwired prints when it listens (main.cc).
  const std::string& transport_note() const;

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gw::daemon
