#include "plugin/plugin_config.h"

#include "core/net/backend_registry.h"

namespace gw::plugin::plugin_config {

using config::Type;

constinit const config::Row kPluginBackend{"GW_PLUGIN_BACKEND", Type::String, "auto", "",
                                           "transport under the NCCL net plugin, auto or a backend "
                                           "auto may pick across hosts, or dpdk (by name only)"};
constinit const config::Row kPluginMinChannels{
    "GW_PLUGIN_MIN_CHANNELS", Type::Int, "0", "",
    "NCCL channels the plugin asks for by setting NCCL_MIN_NCHANNELS when the user has not: "
    "0 = auto (4 when tcp comms have I/O threads, else none), -1 = never, 1-32"};
constinit const config::Row kPluginNapUs{
    "GW_PLUGIN_NAP_US", Type::Int, "-1", "",
    "daemon mode: once a request has been pending 100 us, test() sleeps up to this many "
    "microseconds until any of the process's daemon-mode comms gets a completion, instead of "
    "yielding the core (0 = never; -1 = auto: 200 on hosts with fewer than 8 online CPUs, else 0)"};
constinit const config::Row kPluginPin{
    "GW_PLUGIN_PIN", Type::Bool, "1", "",
    "keep the NCCL plugin loaded after the last communicator (works around NCCL 2.28 reload bug)"};

const config::RowSet& rows() {
  // gradwire-perf and the tests link these rows to list them; only the plugin reads them.
  static const config::RowSet set(
      "plugin", {&kPluginBackend, &kPluginMinChannels, &kPluginNapUs, &kPluginPin},
      "the NCCL net plugin");
  static const bool hooked = [] {
    config::set_help_completion(kPluginBackend, [] { return net::describe_cross_host_backends(); });
    return true;
  }();
  (void)hooked;
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::plugin::plugin_config
