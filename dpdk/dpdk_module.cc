// Module side of dpdk/port_module.h: the one symbol libgradwire_dpdk.so exports.
#include <cstdio>
#include <cstring>

#include "core/log.h"
#include "dpdk/dpdk_port.h"
#include "dpdk/port_module.h"

namespace gw::dpdk {
namespace {

void adopt_logger(std::shared_ptr<spdlog::logger> logger) { log::adopt(std::move(logger)); }

FramePort* open_port(const DpdkPortOptions* options, int* code, char* err, size_t err_len) {
  auto port = open_dpdk_port(*options);
  if (port.ok()) return port->release();
  if (code != nullptr) *code = static_cast<int>(port.status().code());
  if (err != nullptr && err_len > 0) {
    std::snprintf(err, err_len, "%s", port.status().message().c_str());
  }
  return nullptr;
}

}  // namespace
}  // namespace gw::dpdk

extern "C" __attribute__((visibility("default"))) const gw::dpdk::PortModuleV1*
gw_dpdk_port_module_v1() {
  static const gw::dpdk::PortModuleV1 module{sizeof(gw::dpdk::PortModuleV1), gw::dpdk::build_id(),
                                             &gw::dpdk::adopt_logger, &gw::dpdk::open_port};
  return &module;
}
