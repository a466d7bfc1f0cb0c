// Rows of the DPDK backend (dpdk/, docs/dpdk.md); see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::dpdk::dpdk_config {

extern const config::Row kDpdkEalArgs;
extern const config::Row kDpdkPort;
extern const config::Row kDpdkIp;
extern const config::Row kDpdkUdpPort;
extern const config::Row kDpdkMtu;
extern const config::Row kDpdkNbMbufs;
extern const config::Row kDpdkWindow;
extern const config::Row kDpdkMaxWindow;
extern const config::Row kDpdkLinkGbps;
extern const config::Row kDpdkRtoUs;
extern const config::Row kDpdkHeartbeatMs;
extern const config::Row kDpdkPeerTimeoutMs;
extern const config::Row kDpdkBurst;
extern const config::Row kDpdkProgressUs;
extern const config::Row kDpdkZeroCopy;
extern const config::Row kDpdkEager;
extern const config::Row kDpdkInjectLoss;
extern const config::Row kDpdkInjectReorder;
extern const config::Row kDpdkInjectDup;
extern const config::Row kDpdkInjectSeed;
extern const config::Row kDpdkModule;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::dpdk::dpdk_config
