// Backends that live outside gw_core (dpdk/, verbs/, test doubles) make themselves reachable
// through make_transport() by registering a factory under their name.
//
// Thread-safe. A registration replaces an earlier one of the same name; "tcp" and "shm" are
// built in and cannot be replaced. gw::dpdk::make_dpdk_transport is also found without
// registration when the program links gw_dpdk (a weak reference from core/net/transport.cc).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "core/net/transport.h"

namespace gw::net {

using TransportFactory =
    std::function<Result<std::unique_ptr<Transport>>(const TransportOptions& options)>;

// Fails with kInvalidArg for an empty name, a built-in name or an empty factory.
Status register_transport(const std::string& name, TransportFactory factory);

}  // namespace gw::net
