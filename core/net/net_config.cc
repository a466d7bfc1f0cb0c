#include "core/net/net_config.h"

#include "core/net/backend_registry.h"

namespace gw::net::net_config {

using config::Type;

constinit const config::Row kTransport{
    "GW_TRANSPORT", Type::String, "auto", "",
    "transport between ranks, auto or one of the backends this build registers"};

constinit const config::Row kListenMaxPending{
    "GW_LISTEN_MAX_PENDING", Type::Int, "64", "",
    "handshakes a tcp, shm or verbs listener (or the dpdk engine) holds before they prove the "
    "job token; beyond it the silent ones, then the oldest, are dropped (a listener's only "
    "once it has had 20 ms to speak; newcomers wait in the listen queue meanwhile)"};

const config::RowSet& rows() {
  static const config::RowSet set("net", {&kTransport, &kListenMaxPending});
  // The list of backends is known only at run time: the registry prints it.
  static const bool hooked = [] {
    config::set_help_completion(kTransport, [] { return describe_backends(); });
    return true;
  }();
  (void)hooked;
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::net::net_config
