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
#include <memory>
#include <string>

#include "core/status.h"

namespace gw::daemon {

struct ServerOptions {
  std::string socket_path;  // created with mode 0600; an existing stale socket file is replaced
  std::string transport = "tcp";  // between the daemons of a job
  uint64_t max_arena_bytes = 4ull << 30;
  int max_clients = 256;
  uint32_t ring_entries = 64;  // per ring, a power of two
  std::string host_id;         // "": bootstrap host_identity() (GW_HOSTID)
  int64_t hello_timeout_ms = 5000;
  int64_t spin_us = 0;  // a job thread busy-polls its rings this long before sleeping
};

struct ServerStats {
  uint64_t accepted = 0;  // hellos accepted
  uint64_t refused = 0;   // connections refused or cut for misbehaviour
  uint64_t live_clients = 0;
  uint64_t live_arenas = 0;  // arenas still mapped in the daemon
  uint64_t live_jobs = 0;
  uint64_t collectives = 0;  // completed OK (counted once per job-wide collective)
  uint64_t failed = 0;       // completed with an error
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

  struct Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gw::daemon
