#include "core/net/transport.h"

#include <map>
#include <mutex>

#include "core/net/shm_transport.h"
#include "core/net/tcp_transport.h"
#include "core/net/transport_registry.h"

// Defined in gw_dpdk when the program links it; null otherwise (gw_core cannot depend on it).
namespace gw::dpdk {
Result<std::unique_ptr<net::Transport>> make_dpdk_transport(const net::TransportOptions& options)
    __attribute__((weak));
}  // namespace gw::dpdk
namespace gw::verbs {
Result<std::unique_ptr<net::Transport>> make_verbs_transport(const net::TransportOptions& options)
    __attribute__((weak));
}  // namespace gw::verbs

namespace gw::net {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, TransportFactory> factories;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: usable from static destructors
  return *r;
}

}  // namespace

Status register_transport(const std::string& name, TransportFactory factory) {
  if (name.empty() || !factory) return invalid_arg("register_transport: empty name or factory");
  if (name == "tcp" || name == "shm") {
    return invalid_arg("register_transport: '{}' is built in", name);
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
  return ok_status();
}

Result<std::unique_ptr<Transport>> make_transport(const std::string& name,
                                                  const TransportOptions& options) {
  if (name == "tcp") return make_tcp_transport(options);
  if (name == "shm") return make_shm_transport(options);
  TransportFactory factory;
  std::string known = "tcp, shm, dpdk, verbs";
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
    for (const auto& [n, f] : r.factories) {
      if (n != "dpdk" && n != "verbs") known += ", " + n;
    }
  }
  if (factory) return factory(options);
  if (name == "dpdk" && gw::dpdk::make_dpdk_transport != nullptr) {
    return gw::dpdk::make_dpdk_transport(options);
  }
  if (name == "verbs" && gw::verbs::make_verbs_transport != nullptr) {
    return gw::verbs::make_verbs_transport(options);
  }
  if (name == "dpdk" || name == "verbs") {
    return unsupported(
        "transport '{}' is not built into this program (GW_WITH_{} off, or its "
        "library not linked)",
        name, name == "dpdk" ? "DPDK" : "VERBS");
  }
  return invalid_arg("unknown transport '{}' (valid: {})", name, known);
}

}  // namespace gw::net
