// The tcp connector (connector.cc). Internal to core/net/tcp/.
#pragma once

#include <sys/socket.h>

#include <memory>

#include "core/net/tcp/wire.h"
#include "core/net/transport.h"

namespace gw::net::tcp {

// A connector to the listener of `handle` at `addr`: poll() never blocks; it returns the
// SendComm once every socket has passed the handshake, and fails after options.timeout_ms.
std::unique_ptr<Connector> make_connector(const HandleWire& handle, const sockaddr_storage& addr,
                                          TcpConfig config, const TransportOptions& options);

}  // namespace gw::net::tcp
