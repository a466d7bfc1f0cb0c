// Rows of the Communicator and its cost model; see core/config.h.
#pragma once

#include "core/config.h"

namespace gw::coll::coll_config {

extern const config::Row kSpinUs;
extern const config::Row kAlgo;
extern const config::Row kAlgoBroadcast;
extern const config::Row kAlgoAllgather;
extern const config::Row kAlgoReduceScatter;
extern const config::Row kNchannels;
extern const config::Row kChunkSize;
extern const config::Row kCostAlphaUs;
extern const config::Row kCostBwGbps;
extern const config::Row kCostIntraAlphaUs;
extern const config::Row kCostIntraBwGbps;
extern const config::Row kCostInterAlphaUs;
extern const config::Row kCostInterBwGbps;
extern const config::Row kCostCpus;
extern const config::Row kStallWarnS;
extern const config::Row kFusionThreshold;  // read by capi/fusion_session.cc
extern const config::Row kCycleTimeMs;
extern const config::Row kShmDirectMin;
extern const config::Row kShmHugepages;

// The registered set; calling it links and registers the rows in a program that reads none.
const config::RowSet& rows();

}  // namespace gw::coll::coll_config
