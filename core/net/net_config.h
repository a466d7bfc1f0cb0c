// Rows of the transport choice shared by every backend; see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::net::net_config {

extern const config::Row kTransport;
extern const config::Row kListenMaxPending;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::net::net_config
