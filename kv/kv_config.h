// Rows of the parameter server (kv/); see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::kv::kv_config {

extern const config::Row kServers;
extern const config::Row kServerRank;
extern const config::Row kPartitionBytes;
extern const config::Row kChunkBytes;
extern const config::Row kRole;

const config::RowSet& rows();

}  // namespace gw::kv::kv_config
