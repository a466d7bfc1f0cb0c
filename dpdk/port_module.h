// The DPDK port layer as a loadable module, so that libgradwire.so, the NCCL plugin and the tools
// need no DPDK library: only libgradwire_dpdk.so (dpdk_port.cc and this file's module side) links
// libdpdk, and the dpdk backend (dpdk_transport.cc, the protocol engine) loads it with dlopen the
// first time a port is opened. Where it is missing, the dpdk backend says so (one INFO line, and
// kUnsupported from its probe) and every other backend works as before.
//
// The boundary is the FramePort interface (dpdk/frame_port.h): the module opens the port and hands
// back a FramePort whose calls the engine makes; everything above the port stays in the loader.
// The module carries its own copy of the little of gw_core it uses, with hidden symbols, and logs
// through the loader's logger (core/log.h adopt). A FramePort is a C++ object, so module and
// loader must come from one build: the module's build id must equal the loader's, or it is refused
// with both ids named.
//
// Where the loader looks, first match wins: GW_DPDK_MODULE (a file); beside the library or
// program that holds the loader (libgradwire.so's directory, the plugin's); the build tree's
// module directory (for programs run from the build tree); ../lib beside the program and the
// install libdir (for installed programs).
#pragma once

#include <spdlog/logger.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "dpdk/dpdk_port.h"
#include "dpdk/frame_port.h"

namespace gw::dpdk {

inline constexpr const char* kPortModuleFile = "libgradwire_dpdk.so";
inline constexpr const char* kPortModuleSymbol = "gw_dpdk_port_module_v1";

// What the module's one exported symbol returns.
struct PortModuleV1 {
  uint32_t size;         // sizeof(PortModuleV1) in the module's build
  const char* build_id;  // kBuildId of the module's build
  // From now on the module logs through `logger` (the loader's).
  void (*adopt_logger)(std::shared_ptr<spdlog::logger> logger);
  // Opens the port (EAL once per process, dpdk_port.h). Returns null on failure, with the
  // status code (gw::Code) in *code and the reason, NUL-terminated, in err[0..err_len).
  FramePort* (*open_port)(const DpdkPortOptions* options, int* code, char* err, size_t err_len);
};
using PortModuleEntry = const PortModuleV1* (*)();

// The id both sides compare: version, commit, compiler and sanitizers of the build.
const char* build_id();

// Loader side (gw_dpdk_backend).

// Where the module would be loaded from (the first candidate file that exists; no dlopen, so it
// is cheap), or kUnsupported saying where it looked.
Result<std::string> find_port_module();

// Every place find_port_module looks, in order (for messages and tests).
std::vector<std::string> port_module_candidates();

// Loads the module (once per process; a failure is remembered) and opens a port through it.
Result<std::unique_ptr<FramePort>> open_port_through_module(const DpdkPortOptions& options);

// The module's path once loaded ("" before).
std::string loaded_port_module();

}  // namespace gw::dpdk
