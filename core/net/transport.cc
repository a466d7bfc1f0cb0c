#include "core/net/transport.h"

#include "core/net/shm_transport.h"
#include "core/net/tcp_transport.h"

namespace gw::net {

Result<std::unique_ptr<Transport>> make_transport(const std::string& name,
                                                  const TransportOptions& options) {
  if (name == "tcp") return make_tcp_transport(options);
  if (name == "shm") return make_shm_transport(options);
  // dpdk/ and verbs/ build their own libraries; core cannot reach them from here.
  if (name == "dpdk" || name == "verbs") {
    return unsupported("transport '{}' is not built into this core library", name);
  }
  return invalid_arg("unknown transport '{}' (valid: tcp, shm, dpdk, verbs)", name);
}

}  // namespace gw::net
