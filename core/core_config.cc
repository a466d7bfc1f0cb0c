#include "core/core_config.h"

namespace gw::core_config {

using config::Type;

constinit const config::Row kConfigFile{
    "GW_CONFIG_FILE", Type::String, "", "",
    "TOML file of settings (key = name without GW_, lower case); the environment and the API "
    "override it"};
constinit const config::Row kLogLevel{"GW_LOG_LEVEL", Type::String, "warn", "",
                                      "log level: trace, debug, info, warn, error, off"};
constinit const config::Row kTimeoutMs{
    "GW_TIMEOUT_MS", Type::Int, "300000", "",
    "deadline in milliseconds for every wait: store calls, connection set-up, each collective"};
constinit const config::Row kRank{"GW_RANK", Type::Int, "-1", "",
                                  "this process's rank (else torchrun/Open MPI/Slurm vars)"};
constinit const config::Row kWorldSize{"GW_WORLD_SIZE", Type::Int, "-1", "",
                                       "number of ranks in the job"};
constinit const config::Row kStore{
    "GW_STORE", Type::String, "", "",
    "host:port of the rendezvous store hosted by rank 0 (else MASTER_ADDR:MASTER_PORT)"};
constinit const config::Row kJobToken{
    "GW_JOB_TOKEN", Type::String, "", "",
    "shared secret checked in every handshake; rank 0 generates one when empty"};
constinit const config::Row kHostId{
    "GW_HOSTID", Type::String, "", "NCCL_HOSTID",
    "override this process's host identity (ranks with equal ids share memory)"};

const config::RowSet& rows() {
  static const config::RowSet set("core", {&kConfigFile, &kLogLevel, &kTimeoutMs, &kRank,
                                           &kWorldSize, &kStore, &kJobToken, &kHostId});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::core_config
