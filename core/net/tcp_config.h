// Rows of the TCP backend (core/net/tcp/); see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::net::tcp_config {

extern const config::Row kSocketIfname;
extern const config::Row kSocketNsocks;
extern const config::Row kSocketNthreads;
extern const config::Row kSocketBufsize;
extern const config::Row kSocketChunk;
extern const config::Row kSocketZerocopy;
extern const config::Row kSocketZerocopyMin;
extern const config::Row kSocketBusyPoll;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::net::tcp_config
