// The backend registry: every transport backend (tcp, shm, dpdk, verbs, test doubles) is known
// here by name, with a probe that says whether this process can use it, a factory, and the
// facts the `auto` rule (core/net/auto_backend.h) chooses by.
//
// Who registers:
// - tcp and shm live in gw_core and are registered by the registry itself on first use.
// - Backends outside gw_core (dpdk/, verbs/) are registered by the gw_backends target
//   (cmake/backends.cmake): a generated source, linked as objects into every final program, that
//   registers each backend the build has and registers each known one it lacks as unavailable,
//   with the reason (for example "not built: GW_WITH_DPDK=OFF or libdpdk-dev missing").
// - Tests register doubles under their own names.
//
// Thread-safe. Registration may happen during static initialisation (gw_backends does).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/net/transport.h"
#include "core/status.h"

namespace gw::net {

using TransportFactory =
    std::function<Result<std::unique_ptr<Transport>>(const TransportOptions& options)>;

struct Backend {
  std::string name;     // what GW_TRANSPORT / gw_config_t.transport / make_transport take
  std::string summary;  // a few words for help texts, e.g. "TCP sockets"
  // Ok when this process can use the backend, otherwise kUnsupported saying why. Cheap, and
  // claims nothing (dpdk's does not start EAL); an empty probe means "available".
  std::function<Status()> probe;
  // Empty for a backend that is known but not built (its probe says why).
  TransportFactory factory;
  // `auto` picks, among the available backends allowed for the peer (same host or not), the one
  // with the highest priority; a backend allowed for neither is used only when asked by name.
  int auto_priority = 0;
  bool auto_within_host = false;
  bool auto_across_hosts = false;
};

// A known backend this build lacks: listed, never available, `reason` being why.
Backend unbuilt_backend(const std::string& name, const std::string& reason);

// Adds a backend, or replaces an earlier one of the same name (a built backend replaces an
// unbuilt entry). Fails with kInvalidArg for an empty name, or for "tcp", "shm" and "auto".
Status register_backend(Backend backend);

// Every registered name, in registration order (tcp, shm, then the others).
std::vector<std::string> backend_names();

// A copy of every registered backend, in registration order.
std::vector<Backend> registered_backends();

// A copy of the registered backend, or kInvalidArg naming the known ones.
Result<Backend> find_backend(const std::string& name);

// The probe's verdict for a registered name (ok or kUnsupported with the reason); kInvalidArg
// naming the known ones for any other name.
Status backend_status(const std::string& name);

// Ok for "auto" and for every registered name (available or not), else kInvalidArg naming
// `what` (e.g. "communicator: transport") and listing "auto" and the registered names.
Status check_backend_name(const std::string& name, const std::string& what);

// "auto (within a host: shm, else tcp; across hosts: tcp), tcp, shm, dpdk (only by name),
// verbs (not built: ...)": the help text of GW_TRANSPORT, made from what is registered now.
std::string describe_backends();

// The same for a program that only talks across hosts (the NCCL plugin): "auto" and the
// backends auto may pick across hosts.
std::string describe_cross_host_backends();

}  // namespace gw::net
