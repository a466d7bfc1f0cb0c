// The TCP store's server (store_server.cc), started by TcpStore::create on the rank that hosts the
// store (core/store.h). One thread serves every client with poll(); TcpStoreLimits bound what a
// client may hold. Internal to the store: other code uses TcpStore.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "core/store.h"

namespace gw {

// The options' limits, each 0 taken from its configuration row (GW_STORE_*), so every field of
// the result is set; an error names a bad one.
Result<TcpStoreLimits> server_limits(const TcpStoreOptions& options);

struct TcpStoreServerDeleter {
  // Stops the server thread (bounded: it is woken at once) and closes every client's socket;
  // connected clients see EOF and fail with kPeer.
  void operator()(TcpStoreServer* server) const;
};
using TcpStoreServerPtr = std::unique_ptr<TcpStoreServer, TcpStoreServerDeleter>;

// Listens on host:port (port 0: the kernel picks) and starts the server thread. On a failed
// bind *failed_errno (if given) is its errno.
Result<TcpStoreServerPtr> start_store_server(const std::string& host, int port, std::string token,
                                             TcpStoreLimits limits, int* failed_errno);
// The port it listens on.
int store_server_port(const TcpStoreServer& server);

}  // namespace gw
