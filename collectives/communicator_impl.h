// Internal entry point of the Communicator: create() with an injected transport factory, so
// tests run N ranks as threads over an in-process transport (tests/support/inproc_transport.h).
// Not part of the public API; communicator.h's create() calls this with net::make_transport.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "core/net/transport.h"

namespace gw::coll {

// Called with a backend name (the requested one, or auto's per-peer choice) and the
// communicator's transport options.
// Must be thread-safe if several communicators are created at once.
using TransportFactory = std::function<Result<std::unique_ptr<net::Transport>>(
    const std::string& name, const net::TransportOptions& options)>;

struct CommInternalOptions {
  TransportFactory transport_factory;  // empty: net::make_transport
};

Result<std::unique_ptr<Communicator>> create_communicator(const CommOptions& options,
                                                          const CommInternalOptions& internal);

}  // namespace gw::coll
