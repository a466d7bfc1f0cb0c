// Rows of the shared-memory backend (core/net/shm_transport.cc); see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::net::shm_config {

extern const config::Row kShmSlotSize;
extern const config::Row kShmNslots;
extern const config::Row kShmCmaMin;
extern const config::Row kShmCmaInjectRefuse;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::net::shm_config
