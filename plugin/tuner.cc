#include "plugin/tuner.h"

#include <fmt/format.h>

#include "plugin/net_plugin.h"

namespace gw::plugin {
namespace {

// The collectives NCCL runs over the network as rings or trees, one channel per stripe.
bool network_collective(int coll) {
  switch (coll) {
    case ncclFuncBroadcast:
    case ncclFuncReduce:
    case ncclFuncAllGather:
    case ncclFuncReduceScatter:
    case ncclFuncAllReduce:
      return true;
    default:
      return false;
  }
}

}  // namespace

Result<TunerContext*> tuner_init(uint64_t comm_id, size_t nranks, size_t nnodes) {
  NetPlugin& plugin = NetPlugin::instance();
  auto* ctx = new TunerContext;
  ctx->comm_id = comm_id;
  ctx->nranks = nranks;
  ctx->nnodes = nnodes;
  const int set = plugin.channels_set();
  if (!plugin.serves(comm_id)) {
    ctx->decision = "NCCL's choices kept: the communicator is not on the gradwire net";
  } else if (nnodes < 2) {
    ctx->decision = "NCCL's choices kept: one node, no network collectives";
  } else if (set <= 0) {
    ctx->decision = "NCCL's choices kept: the plugin set no channel count (see its NET line)";
  } else {
    ctx->channels = set;
    ctx->min_bytes = kTunerBytesPerChannel * static_cast<size_t>(set);
    ctx->decision = fmt::format(
        "{} channels for network collectives of {} bytes and more (NCCL_MIN_NCHANNELS={} set by "
        "the plugin; NCCL_TUNER_PLUGIN=none turns this off)",
        set, ctx->min_bytes, set);
  }
  GWP_INFO(NCCL_INIT | NCCL_TUNING, "TUNER/gradwire: comm {:#x} ({} ranks, {} nodes): {}", comm_id,
           nranks, nnodes, ctx->decision);
  return ctx;
}

Status tuner_coll_info(void* p, int coll, size_t bytes, int* nchannels) {
  auto* ctx = static_cast<TunerContext*>(p);
  if (ctx == nullptr || ctx->magic != TunerContext::kMagic) {
    return internal_error("getCollInfo on a context this tuner did not create");
  }
  if (nchannels == nullptr) return internal_error("getCollInfo with a NULL nChannels");
  if (ctx->channels > 0 && network_collective(coll) && bytes >= ctx->min_bytes) {
    *nchannels = ctx->channels;
  }
  return ok_status();
}

Status tuner_finalize(void* p) {
  if (p == nullptr) return ok_status();
  auto* ctx = static_cast<TunerContext*>(p);
  if (ctx->magic != TunerContext::kMagic) {
    return internal_error("finalize on a context this tuner did not create");
  }
  ctx->magic = 0;
  delete ctx;
  return ok_status();
}

}  // namespace gw::plugin
