#include "core/net/net_config.h"

#include "core/net/backend_registry.h"

namespace gw::net::net_config {

using config::Type;

constinit const config::Row kTransport{
    "GW_TRANSPORT", Type::String, "auto", "",
    "transport between ranks, auto or one of the backends this build registers"};

const config::RowSet& rows() {
  static const config::RowSet set("net", {&kTransport});
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
