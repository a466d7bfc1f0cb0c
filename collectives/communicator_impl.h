// Internal entry point of the Communicator: create() with an injected transport factory, so
// tests run N ranks as threads over an in-process transport (tests/support/inproc_transport.h).
// Not part of the public API; communicator.h's create() calls this with net::make_transport.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "collectives/communicator.h"
#include "collectives/connection_pool.h"
#include "core/net/transport.h"

namespace gw::coll {

struct CommInternalOptions {
  TransportFactory transport_factory;  // empty: net::make_transport
};

Result<std::unique_ptr<Communicator>> create_communicator(const CommOptions& options,
                                                          const CommInternalOptions& internal);

}  // namespace gw::coll
