// A parameter server: a listening socket, per worker connection a reader thread and a writer
// thread (its queue of replies, so that a connection's pulls are sent while pushes arrive on
// every connection, and no reader waits on another worker's socket), and the stores it serves
// (kv/rules.h, one per store id, created by the first worker's Hello). Run as its own process
// (gw_kv_serve, GW_ROLE=server), as a thread of every worker (GW_KV_SERVERS=0), or in gradwired
// for every job (daemon/job.h).
//
// Idle, it costs one thread asleep in poll() on the listening socket and two eventfds (stop, and
// "a connection ended"), and no timer: no wake-up until a worker connects. A connection's threads
// are joined as soon as it ends (the accept thread reaps them), so a long-lived server with many
// short connections holds threads only for the connections open now.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/compress/codec.h"
#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"
#include "kv/rules.h"

namespace gw::kv {

struct ServerOptions {
  int rank = 0;            // this server's index among the store's servers (for messages)
  std::string token;       // the job token a worker's Hello must carry
  int64_t timeout_ms = 0;  // the deadline of a Hello, of a write to a worker, of an idle server
  std::string route_host;  // the store's host: the address advertised is the route toward it
};

class Server {
 public:
  static Result<std::unique_ptr<Server>> start(const ServerOptions& options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // "host:port" the workers connect to.
  const std::string& address() const { return address_; }
  // gw_kv_serve: returns OK once every store this server has seen is finished (its workers said
  // goodbye or died), no connection is open, and either job_alive() says the job is gone (its
  // rendezvous store no longer answers) or timeout_ms passed without a new store; kTimeout when
  // no worker came within timeout_ms. job_alive is called at most every half second.
  Status serve(const std::function<bool()>& job_alive);
  // Waits until store `id` is finished, or the deadline (kTimeout naming the workers missing).
  Status wait_finished(uint64_t id, sys::Deadline deadline);
  // Waits until every store this server has seen is finished, the deadline (kTimeout) or *stop
  // (kAborted): a daemon's server outlives its own trainers until the job's other workers are
  // done with it too.
  Status wait_all_finished(sys::Deadline deadline, const std::atomic<bool>* stop);
  // Every store this server holds, by id (gradwirectl kv, /metrics). Thread-safe.
  struct StoreInfo {
    uint64_t id = 0;
    StoreSummary summary;
  };
  std::vector<StoreInfo> stores() const;
  // Connection threads not yet joined: those of the connections open now, plus any that ended a
  // moment ago and wait for the accept thread to reap them. Thread-safe.
  size_t connection_threads() const;
  // Ends every connection and thread; idempotent.
  void stop();

 private:
  // A reply waiting for its connection's writer; the payload is shared with nothing else but
  // moved, never copied, out of the rules' answer.
  struct Outgoing {
    Header h;
    std::shared_ptr<const std::vector<uint8_t>> payload;
  };
  struct Conn {
    sys::Fd fd;
    std::mutex write_mu;  // one frame at a time on the socket (writer, send_error)
    uint64_t store = 0;
    uint32_t worker = 0;
    bool joined = false;
    std::mutex q_mu;  // queue, closing, broken
    std::condition_variable q_cv;
    std::deque<Outgoing> queue;
    bool closing = false;  // the reader ended: the writer sends what is queued, then returns
    bool broken = false;   // a write failed: later replies are dropped
    std::thread writer;
  };
  struct StoreEntry {
    std::unique_ptr<StoreRules> rules;
    std::string token;
    std::shared_ptr<const coll::Codec> codec;         // the pushes' codec (null: raw pushes)
    std::map<uint32_t, std::shared_ptr<Conn>> conns;  // by worker
  };

  explicit Server(const ServerOptions& options);
  // Sleeps in poll() on the listening socket, stop_efd_ and reap_efd_ (no timeout: stop() ends
  // it); accepts, reaps ended connection threads, returns at stop().
  void accept_loop();
  // Joins the threads of the connections that ended (ended_).
  void reap_ended();
  void serve_conn(std::shared_ptr<Conn> conn);
  // Hello: joins the connection to its store. An Error frame is sent when refused.
  Status join(Conn& conn, const Header& h, const std::vector<uint8_t>& payload);
  // Queues each answer on its worker's connection (mu_ held: the rules' order is kept).
  void dispatch_locked(uint64_t store, std::vector<Answer>& answers);
  // A connection's writer: sends its queue in order, each frame within timeout_ms.
  void write_loop(Conn* conn);
  // Ends the writer after what is queued (at once when the server stops).
  void close_writer(Conn& conn);
  void send_error(Conn& conn, const Header& h, const Status& s);

  const ServerOptions options_;
  sys::Fd listen_fd_;
  std::string address_;
  std::atomic<bool> stop_{false};
  sys::Fd stop_efd_;  // written once by stop(), never drained: every poll on it sees it
  sys::Fd reap_efd_;  // written by a connection's thread as it ends; drained by accept_loop
  std::thread accept_thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, StoreEntry> stores_;
  std::map<uint64_t, std::thread> conn_threads_;  // by connection number
  std::vector<uint64_t> ended_;                   // connections whose thread returns now
  uint64_t next_conn_ = 0;
  sys::Deadline last_store_{};  // the last new store, or the last store finishing
  int open_conns_ = 0;
};

}  // namespace gw::kv
