// A parameter server: a listening socket, one thread per worker connection, and the stores it
// serves (kv/rules.h, one per store id, created by the first worker's Hello). Run as its own
// process (gw_kv_serve, GW_ROLE=server) or as a thread of every worker (GW_KV_SERVERS=0).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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
  // goodbye or died) and no new store came within a second; kTimeout when no worker came within
  // timeout_ms.
  Status serve();
  // Waits until store `id` is finished, or the deadline (kTimeout naming the workers missing).
  Status wait_finished(uint64_t id, sys::Deadline deadline);
  // Ends every connection and thread; idempotent.
  void stop();

 private:
  struct Conn {
    sys::Fd fd;
    std::mutex write_mu;
    uint64_t store = 0;
    uint32_t worker = 0;
    bool joined = false;
  };
  struct StoreEntry {
    std::unique_ptr<StoreRules> rules;
    std::string token;
    std::map<uint32_t, std::shared_ptr<Conn>> conns;  // by worker
  };

  explicit Server(const ServerOptions& options);
  void accept_loop();
  void serve_conn(std::shared_ptr<Conn> conn);
  // Hello: joins the connection to its store. An Error frame is sent when refused.
  Status join(Conn& conn, const Header& h, const std::vector<uint8_t>& payload);
  void send(uint64_t store, std::vector<Answer>& answers);
  void send_error(Conn& conn, const Header& h, const Status& s);

  const ServerOptions options_;
  sys::Fd listen_fd_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, StoreEntry> stores_;
  std::vector<std::thread> threads_;
  sys::Deadline last_store_{};
  int open_conns_ = 0;
};

}  // namespace gw::kv
