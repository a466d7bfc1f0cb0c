// Daemon mode of the NCCL plugin (daemon_transport.h): where a connection's two processes meet.
// The listening process's store for the cross-host leg, the key a connector of another host
// announces itself under, the job key of one connection in the daemon, joining the daemon as one
// of a connection job's two trainers; and GW_DAEMON's resolution (plugin_daemon_address).
// Internal to the plugin.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "core/store.h"
#include "daemon/client.h"
#include "plugin/daemon_handle.h"
#include "plugin/daemon_transport.h"

namespace gw::plugin::daemon_mode {

using daemon::Client;

// The store a listening process hosts for the cross-host leg (one per transport, made at the
// first listen): its daemons and a connector's announcement meet there. Requires the job token.
struct ListenStore {
  std::mutex mu;
  std::shared_ptr<TcpStore> store;
  std::string address;  // "host:port" as the handle carries it
};

struct Shared {
  DaemonNetOptions options;
  std::string host_id;
  uint64_t host = 0;
  int64_t spin_ns = 0;
  std::shared_ptr<ListenStore> listen_store = std::make_shared<ListenStore>();
};

// The address of the interface GW_SOCKET_IFNAME / NCCL_SOCKET_IFNAME picks (direct mode's rule).
Result<std::string> store_interface_address();

// The listening process's store, started on first use on an ephemeral port.
Result<std::shared_ptr<TcpStore>> listen_store(const Shared& s, std::string* address);

// Where a cross-host connection's store is and what it requires: the listener's host:port.
struct StorePlace {
  std::string host;
  int port = 0;
};

// The key under which a connector of another host announces itself to the listener.
std::string announce_key(const std::string& token);

// The key of one connection's job in the daemon: "nccl-<job id>-<connection>". Only a process
// with the same job token that holds the handle computes the connection part; the job id (an
// HMAC of the token, which it does not reveal) lets gradwirectl group a job's connections
// (daemon/job.h nccl_job_of). Hex, so it is a printable token as the hello wants.
std::string connection_token(const std::string& job_token, const std::array<uint8_t, 16>& nonce);

// rank 0: the connector, 1: the listener. With `xhost`, each is its host's only trainer of a job
// of two hosts (host index = rank) whose daemons meet in the listener's store.
Result<std::unique_ptr<Client>> join(const Shared& s, const std::string& token, int rank,
                                     const StorePlace* xhost = nullptr);

// A connection end joining its daemon (join) with its first message posted: the connector's
// 0-byte send, the listener's receive of it (daemon_transport.h "Connect").
struct Joining {
  std::unique_ptr<Client> client;
  uint64_t seq = 0;
};
Result<Joining> join_and_post(const Shared& s, const std::string& token, bool sender,
                              const StorePlace* xhost = nullptr);
// Whether the joining message completed: true with the client ready, false while pending.
Result<bool> joined(Joining& j, const char* what);
// "daemon connection <token> (to listener pid N)" for messages.
std::string conn_name(const std::string& token, const DaemonHandle& h, bool send);

}  // namespace gw::plugin::daemon_mode
