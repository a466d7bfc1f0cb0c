#include "collectives/compress/compress_config.h"

#include <string>

namespace gw::coll::compress_config {

using config::Type;

namespace {

Status check_hier(std::string_view text) {
  if (text == "auto" || text == "on" || text == "off") return ok_status();
  return invalid_arg("must be auto, on or off");
}

}  // namespace

constinit const config::Row kHier{
    "GW_COMPRESS_HIER",
    Type::String,
    "auto",
    "",
    "hierarchical compressed allreduce: auto (when the ranks span more than one host and some "
    "host has several), on (whenever they span more than one host), off (always flat); it sums "
    "each host's ranks exactly and compresses only what crosses hosts",
    &check_hier};

const config::RowSet& rows() {
  static const config::RowSet set("compress", {&kHier});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::coll::compress_config
