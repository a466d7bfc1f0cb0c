// Rows of the compressed allreduce (gw_compress); see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::coll::compress_config {

// GW_COMPRESS_HIER: auto | on | off (see compress.h, "Hierarchical form").
extern const config::Row kHier;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::coll::compress_config
