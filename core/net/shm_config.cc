#include "core/net/shm_config.h"

namespace gw::net::shm_config {

using config::Type;

constinit const config::Row kShmSlotSize{"GW_SHM_SLOT_SIZE", Type::Size, "1M", "",
                                         "bytes per slot of a shared-memory connection's ring"};
constinit const config::Row kShmNslots{"GW_SHM_NSLOTS", Type::Int, "8", "",
                                       "slots per shared-memory connection ring"};

constinit const config::Row kShmCmaMin{
    "GW_SHM_CMA_MIN", Type::Size, "1M", "",
    "messages of at least this many bytes are read straight from the sender's buffer "
    "(process_vm_readv, one copy instead of two) when the kernel allows it; 0 = always the ring"};
constinit const config::Row kShmCmaInjectRefuse{
    "GW_SHM_CMA_INJECT_REFUSE", Type::Bool, "0", "",
    "fault injection: the receiver's single-copy probe fails as if ptrace access were refused"};

const config::RowSet& rows() {
  static const config::RowSet set("shm",
                                  {&kShmSlotSize, &kShmNslots, &kShmCmaMin, &kShmCmaInjectRefuse});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::net::shm_config
