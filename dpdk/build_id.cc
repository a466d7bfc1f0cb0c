// The build id both sides of dpdk/port_module.h compare (GW_BUILD_ID: dpdk/CMakeLists.txt).
#include "dpdk/port_module.h"

#ifndef GW_BUILD_ID
#define GW_BUILD_ID "unknown"
#endif

namespace gw::dpdk {

const char* build_id() { return GW_BUILD_ID; }

}  // namespace gw::dpdk
