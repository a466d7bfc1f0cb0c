#include "core/net/shm_config.h"

namespace gw::net::shm_config {

using config::Type;

constinit const config::Row kShmSlotSize{"GW_SHM_SLOT_SIZE", Type::Size, "1M", "",
                                         "bytes per slot of a shared-memory connection's ring"};
constinit const config::Row kShmNslots{"GW_SHM_NSLOTS", Type::Int, "8", "",
                                       "slots per shared-memory connection ring"};

const config::RowSet& rows() {
  static const config::RowSet set("shm", {&kShmSlotSize, &kShmNslots});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::net::shm_config
