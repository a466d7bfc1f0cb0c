// The NCCL tuner the plugin library exports (ncclTunerPlugin_v5, exports.cc), found by NCCL in the
// net plugin's library when NCCL_TUNER_PLUGIN is unset.
//
// What it can and cannot do, read from NCCL 2.28.9 (src/init.cc, src/enqueue.cc): NCCL loads the
// tuner after it has connected the communicator's channels, and caps the per-collective channel
// count a tuner returns at the channels the communicator has. So a tuner cannot give a
// communicator more channels than NCCL's topology search (or NCCL_MIN_NCHANNELS, read before
// the channels are connected) did; the plugin's init still asks for them through
// NCCL_MIN_NCHANNELS (net_plugin.cc, request_channels). The tuner then keeps every network
// collective of a communicator the plugin serves on all of those channels from
// kTunerBytesPerChannel x channels up, where NCCL's own model would run mid-size collectives on
// fewer (it trims channels while bytes < channels x threads x a per-protocol threshold).
//
// It passes every choice to NCCL (sets nothing) for a communicator on another net (NCCL_NET=
// Socket with this library loaded), on one node, or when the plugin set no channel count (the
// user's NCCL_MIN_NCHANNELS or NCCL_MAX_NCHANNELS, GW_PLUGIN_MIN_CHANNELS=-1, or auto on a host
// without I/O threads): a user's own settings win. NCCL_TUNER_PLUGIN=none turns it off. It never
// touches the cost table (algorithm and protocol stay NCCL's).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"
#include "plugin/nccl_tuner_abi.h"

namespace gw::plugin {

inline constexpr size_t kTunerBytesPerChannel = 64 << 10;

struct TunerContext {
  static constexpr uint32_t kMagic = 0x47575455;  // "GWTU"
  uint32_t magic = kMagic;
  uint64_t comm_id = 0;
  size_t nranks = 0;
  size_t nnodes = 0;
  int channels = 0;      // asked for per network collective; 0 = NCCL's choice throughout
  size_t min_bytes = 0;  // from this collective size up
  std::string decision;  // for the INFO line
};

Result<TunerContext*> tuner_init(uint64_t comm_id, size_t nranks, size_t nnodes);
// *nchannels is left alone unless the tuner asks for a count.
Status tuner_coll_info(void* ctx, int coll, size_t bytes, int* nchannels);
Status tuner_finalize(void* ctx);  // ctx may be nullptr

}  // namespace gw::plugin
