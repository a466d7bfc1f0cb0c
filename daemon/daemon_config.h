// The daemon's rows (see core/config.h): the client's (GW_DAEMON, GW_DAEMON_ARENA) and gradwired's
// own (socket, arena cap, clients cap, transport between daemons). Linked into libgradwire.so and
// gradwired; a [daemon] table in the TOML file sets them (`[daemon] socket = "..."`).
#pragma once

#include "core/config.h"

namespace gw::daemon_config {

extern const config::Row kDaemon;
extern const config::Row kArena;
extern const config::Row kChunk;
extern const config::Row kSocket;
extern const config::Row kMaxArena;
extern const config::Row kMaxClients;
extern const config::Row kTransport;
extern const config::Row kSpinUs;
extern const config::Row kPollUs;
extern const config::Row kP2pUnexpectedMax;
extern const config::Row kReduceThreads;
extern const config::Row kMetrics;
extern const config::Row kGroup;

const config::RowSet& rows();

}  // namespace gw::daemon_config
