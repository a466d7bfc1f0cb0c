// core's rows (logging, deadlines, bootstrap, the config file itself); see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::core_config {

extern const config::Row kConfigFile;
extern const config::Row kLogLevel;
extern const config::Row kTimeoutMs;
extern const config::Row kRank;
extern const config::Row kWorldSize;
extern const config::Row kStore;
extern const config::Row kJobToken;
extern const config::Row kHostId;
extern const config::Row kJoinReportMs;
// The rendezvous store server's limits (TcpStoreOptions fields left at 0 take these).
extern const config::Row kStoreMaxClients;
extern const config::Row kStoreMaxPendingHello;
extern const config::Row kStoreHelloTimeoutMs;
extern const config::Row kStoreMaxValueBytes;
extern const config::Row kStoreMaxKeysPerClient;
extern const config::Row kStoreMaxBytesPerClient;
extern const config::Row kStoreMaxBytes;
extern const config::Row kTimeline;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::core_config
