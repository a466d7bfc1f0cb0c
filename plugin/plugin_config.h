// Rows of the NCCL net plugin (plugin/); see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::plugin::plugin_config {

extern const config::Row kPluginBackend;
extern const config::Row kPluginMinChannels;
extern const config::Row kPluginNapUs;
extern const config::Row kPluginPin;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::plugin::plugin_config
