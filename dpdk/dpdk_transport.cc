#include "dpdk/dpdk_transport.h"

#include <mutex>

#include "core/config.h"
#include "core/log.h"
#include "dpdk/dpdk_config.h"
#include "dpdk/dpdk_port.h"
#include "dpdk/engine_transport.h"
#include "dpdk/port_module.h"

namespace gw::dpdk {

Result<std::shared_ptr<Engine>> process_engine() {
  // EAL and the port are process-wide by nature; so is the engine that owns the port.
  static std::mutex mu;
  static std::shared_ptr<Engine> engine;
  static Status failed;
  std::lock_guard<std::mutex> lock(mu);
  if (engine) return engine;
  if (!failed.ok()) return failed;
  DpdkPortOptions po;
  po.eal_args = config::get_string(dpdk_config::kDpdkEalArgs);
  po.port = config::get_string(dpdk_config::kDpdkPort);
  po.mtu = static_cast<size_t>(config::get_int(dpdk_config::kDpdkMtu));
  po.nb_mbufs = static_cast<int>(config::get_int(dpdk_config::kDpdkNbMbufs));
  po.zero_copy = config::get_string(dpdk_config::kDpdkZeroCopy);
  auto port = open_port_through_module(po);
  if (!port.ok()) {
    failed = port.status();
    return failed;
  }
  auto cfg = engine_config_from_table((*port)->mac());
  if (!cfg.ok()) return cfg.status();
  auto e = Engine::create(std::move(*port), *cfg);
  if (!e.ok()) {
    failed = e.status();
    return failed;
  }
  engine = *e;
  GW_LOG_INFO("dpdk: engine on {} ip {} udp {} payload/frame {} B", engine->port_name(),
              format_ip(engine->local().ip), engine->local().port, engine->payload_max());
  return engine;
}

Result<std::unique_ptr<net::Transport>> make_dpdk_transport(const net::TransportOptions& options) {
  if (options.timeout_ms <= 0) {
    return invalid_arg("dpdk transport: timeout_ms {} must be > 0", options.timeout_ms);
  }
  GW_ASSIGN_OR_RETURN(std::shared_ptr<Engine> e, process_engine());
  return make_engine_transport(std::move(e), options);
}

net::Backend dpdk_backend() {
  net::Backend b;
  b.name = "dpdk";
  b.summary = "kernel-bypass UDP on a DPDK port, one rank per port";
  b.factory = &make_dpdk_transport;
  // Whether the port module is installed (a file lookup, no dlopen: cheap); its absence is said
  // once at INFO, and only the dpdk backend is affected.
  b.probe = [] {
    auto found = find_port_module();
    if (found.ok()) return ok_status();
    static std::once_flag said;
    std::call_once(said, [&] { GW_LOG_INFO("{}", found.status().message()); });
    return found.status();
  };
  return b;
}

}  // namespace gw::dpdk
