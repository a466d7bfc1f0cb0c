// The connections of one communicator: one SendComm and one RecvComm per (peer, channel),
// created the first time a plan needs them and kept until close_all() or destruction, over
// transports created per backend name on first use.
//
// Set-up goes through the group's store: the receiver listens and publishes its handle under a
// key naming (src, dst, channel), the sender reads it and connects; connects and accepts are
// polled in one loop, so no set-up order can deadlock. Not thread-safe: the communicator calls it
// from one collective at a time.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "collectives/group.h"
#include "collectives/schedule.h"
#include "core/config_snapshot.h"
#include "core/net/transport.h"
#include "core/status.h"

namespace gw::coll {

// Called with a backend name (the requested one, or auto's per-link choice) and the
// communicator's transport options. Must be thread-safe if several communicators are created at
// once.
using TransportFactory = std::function<Result<std::unique_ptr<net::Transport>>(
    const std::string& name, const net::TransportOptions& options)>;

struct PoolOptions {
  std::string mode = "auto";  // auto (core/net/auto_backend.h) or a registered backend
  TransportFactory factory;   // empty: net::make_transport
  int64_t timeout_ms = 0;     // for the transports and the set-up error messages
  int64_t spin_us = 50;
  config::Snapshot config;  // handed to the transports
  std::string route_host;   // handed to the transports (TransportOptions::route_host)
};

// Who a rank is, as ConnectionPool::announce publishes it in the store ("pid start pidns": the
// pid, its start time in clock ticks after boot, the pid namespace's inode). parse_announcement
// takes a peer's bytes: nullopt unless exactly three decimal fields, pid > 0 and pidns > 0.
struct ProcessAnnouncement {
  long pid = 0;
  unsigned long long start = 0;
  unsigned long long pidns = 0;
};
std::string format_announcement(const ProcessAnnouncement& a);
std::optional<ProcessAnnouncement> parse_announcement(std::string_view text);

class ConnectionPool {
 public:
  // `group` (its store) and `aborted` must outlive the pool.
  ConnectionPool(const Group& group, PoolOptions options, const std::atomic<bool>* aborted);
  ~ConnectionPool();

  // The transport that carries traffic to `peer` (created on first use).
  Result<net::Transport*> transport_for(int peer) {
    return transport_for_link(group_.same_host(peer), peer);
  }
  // The transport for links within a host (same_host) or across hosts (`peer` names the rank in
  // errors; -1 for none).
  Result<net::Transport*> transport_for_link(bool same_host, int peer = -1);
  // Establishes every connection the plans use that is not up yet; blocks until all are up, the
  // deadline passes or the communicator is aborted.
  Status connect_all(const char* name, const std::vector<Plan>& plans, Deadline deadline);
  // Requires connect_all() to have established them.
  net::SendComm* send_comm(int peer, int chan) const { return send_.at({peer, chan}).get(); }
  net::RecvComm* recv_comm(int peer, int chan) const { return recv_.at({peer, chan}).get(); }
  // Closes every connection (peers' pending operations then fail fast).
  void close_all();

  // Publishes which process this rank is (pid, its start time and pid namespace), so that a peer
  // on the same host that waits on it to connect learns at once that it has exited (a rank that
  // leaves after set-up, before its first collective, publishes no handle and refuses nothing).
  // Call once, during set-up, before the ranks' last exchange.
  Status announce(Deadline deadline);

 private:
  static std::string key(int src, int dst, int chan) {
    return fmt::format("conn/{}/{}/{}", src, dst, chan);
  }

  // Why `peer` is known gone ("" when it is not known): a rank on this host whose announced
  // process has exited. Reads the peer's announcement once; cheap enough to ask every 100 ms.
  std::string gone(int peer);

  const Group& group_;
  PoolOptions options_;
  const std::atomic<bool>* aborted_;
  std::map<std::string, std::unique_ptr<net::Transport>> transports_;
  std::vector<std::string> auto_failed_;  // backends auto saw fail with kUnsupported here
  std::map<std::pair<int, int>, std::unique_ptr<net::SendComm>> send_;  // (peer, chan)
  std::map<std::pair<int, int>, std::unique_ptr<net::RecvComm>> recv_;
  std::map<int, std::string> announced_;  // peer -> its announcement, once read
};

}  // namespace gw::coll
