// The tcp listener (listener.cc). Internal to core/net/tcp/.
#pragma once

#include <cstdint>
#include <memory>

#include "core/net/tcp/wire.h"
#include "core/net/transport.h"
#include "core/sys/fd.h"

namespace gw::net::tcp {

// A listener on the bound, listening, non-blocking socket `fd`, for the handle that carries
// `nonce`: accept() never blocks; it returns a RecvComm once every socket of a connection has
// passed the handshake, nullptr while none has.
std::unique_ptr<Listener> make_listener(sys::Fd fd, uint64_t nonce, TcpConfig config,
                                        TransportOptions options);

}  // namespace gw::net::tcp
