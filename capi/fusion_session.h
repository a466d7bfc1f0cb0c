// A Session that fuses small gw_iallreduce calls (capi/fusion_queue.h) and forwards everything
// else to the Session it wraps. Every other collective first drains the fusion queue, so that on
// every rank it follows the fused calls issued before it.
#pragma once

#include <cstdint>
#include <memory>

#include "capi/session.h"

namespace gw::capi {

// `inner` wrapped for fusion when GW_FUSION_THRESHOLD > 0 and it has more than one rank; else
// `inner` itself. timeout_ms: the communicator's deadline. Its split() children are wrapped too.
std::unique_ptr<Session> with_fusion(std::unique_ptr<Session> inner, int64_t timeout_ms);

}  // namespace gw::capi
