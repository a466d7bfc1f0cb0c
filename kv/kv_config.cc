#include "kv/kv_config.h"

#include <string>

namespace gw::kv::kv_config {

using config::Type;

namespace {

Status check_role(std::string_view text) {
  if (text == "worker" || text == "server") return ok_status();
  return invalid_arg("'{}' is not worker or server", text);
}

}  // namespace

constinit const config::Row kServers{
    "GW_KV_SERVERS", Type::Int, "0", "",
    "parameter-server processes of the job (GW_ROLE=server, gw_kv_serve); 0 = a server thread "
    "in every worker (co-located)"};
constinit const config::Row kServerRank{
    "GW_KV_SERVER_RANK", Type::Int, "0", "",
    "this server process's index in [0, GW_KV_SERVERS) (gw_kv_serve)"};
constinit const config::Row kPartitionBytes{
    "GW_KV_PARTITION_BYTES", Type::Size, "4M", "",
    "a parameter-server value is cut into partitions of at most this many bytes, spread over the "
    "servers (gw_kv_config_t.partition_bytes = 0)"};
constinit const config::Row kChunkBytes{
    "GW_KV_CHUNK_BYTES", Type::Size, "256K", "",
    "a partition is pushed, summed and answered in chunks of at most this many bytes, so a "
    "server answers a chunk as soon as every worker pushed it (0: whole partitions; every worker "
    "of a store must agree)"};
constinit const config::Row kRole{
    "GW_ROLE",
    Type::String,
    "worker",
    "",
    "worker or server: a server process runs gw_kv_serve (gradwire-run --servers), and "
    "gw_kv_create refuses to run in it",
    &check_role};

const config::RowSet& rows() {
  static const config::RowSet set(
      "kv", {&kServers, &kServerRank, &kPartitionBytes, &kChunkBytes, &kRole});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::kv::kv_config
