#include "core/net/net_config.h"

namespace gw::net::net_config {

using config::Type;

constinit const config::Row kTransport{
    "GW_TRANSPORT", Type::String, "auto", "",
    "transport between ranks: auto (shm within a host, tcp across), tcp, shm"};

const config::RowSet& rows() {
  static const config::RowSet set("net", {&kTransport});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::net::net_config
