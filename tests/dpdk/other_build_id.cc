// A build id no real build has: the module built with it stands for one of another build.
#include "dpdk/port_module.h"

namespace gw::dpdk {

const char* build_id() { return "another build"; }

}  // namespace gw::dpdk
