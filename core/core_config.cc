#include "core/core_config.h"

#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>

namespace gw::core_config {

using config::Type;

namespace {

Status check_log_level(std::string_view text) {
  std::string v(text);
  for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const char* ok : {"trace", "debug", "info", "warn", "warning", "error", "off"}) {
    if (v == ok) return ok_status();
  }
  return invalid_arg("unknown log level (trace, debug, info, warn, error or off, any case)");
}

// A deadline is now + timeout on a nanosecond clock: keep it far from overflowing (about 24
// days, also what a C int in gw_config_t can carry).
Status check_timeout(std::string_view text) {
  const int64_t ms = std::strtoll(std::string(text).c_str(), nullptr, 10);
  if (ms <= 0 || ms > std::numeric_limits<int32_t>::max()) {
    return invalid_arg("timeout must be 1..{} ms", std::numeric_limits<int32_t>::max());
  }
  return ok_status();
}

}  // namespace

constinit const config::Row kConfigFile{
    "GW_CONFIG_FILE", Type::String, "", "",
    "TOML file of settings (key = name without GW_, lower case); the environment and the API "
    "override it"};
constinit const config::Row kLogLevel{
    "GW_LOG_LEVEL",  Type::String, "warn", "", "log level: trace, debug, info, warn, error, off",
    &check_log_level};
constinit const config::Row kTimeoutMs{
    "GW_TIMEOUT_MS",
    Type::Int,
    "300000",
    "",
    "deadline in milliseconds for every wait: store calls, connection set-up, each collective",
    &check_timeout};
constinit const config::Row kRank{"GW_RANK", Type::Int, "-1", "",
                                  "this process's rank (else torchrun/Open MPI/Slurm vars)"};
constinit const config::Row kWorldSize{"GW_WORLD_SIZE", Type::Int, "-1", "",
                                       "number of ranks in the job"};
constinit const config::Row kStore{
    "GW_STORE", Type::String, "", "",
    "host:port of the rendezvous store hosted by rank 0 (else MASTER_ADDR:MASTER_PORT)"};
constinit const config::Row kJobToken{
    "GW_JOB_TOKEN",
    Type::String,
    "",
    "",
    "shared secret checked in every handshake; rank 0 generates one when empty (printed only as "
    "set or unset)",
    nullptr,
    /*secret=*/true};
constinit const config::Row kHostId{
    "GW_HOSTID", Type::String, "", "NCCL_HOSTID",
    "override this process's host identity (ranks with equal ids share memory)"};

constinit const config::Row kJoinReportMs{
    "GW_JOIN_REPORT_MS", Type::Int, "10000", "",
    "while a rank waits for the others to join a communicator, it names the missing ranks at "
    "INFO this often (ms; 0: never)"};

constinit const config::Row kStoreMaxClients{
    "GW_STORE_MAX_CLIENTS", Type::Int, "4096", "",
    "store server (rank 0): connections served at once; at the cap one still without hello is "
    "dropped, else the newcomer is refused"};
constinit const config::Row kStoreMaxPendingHello{
    "GW_STORE_MAX_PENDING_HELLO", Type::Int, "64", "",
    "store server: connections that have not yet proved the job token (the oldest is dropped to "
    "make room once it has had 20 ms to speak; newcomers wait in the listen queue meanwhile)"};
constinit const config::Row kStoreHelloTimeoutMs{
    "GW_STORE_HELLO_TIMEOUT_MS", Type::Int, "10000", "",
    "store server: a connection must prove the job token within this many ms"};
constinit const config::Row kStoreMaxValueBytes{
    "GW_STORE_MAX_VALUE_BYTES", Type::Size, "64M", "",
    "store server: largest value a client may set (at most 64M, the wire's limit)"};
constinit const config::Row kStoreMaxKeysPerClient{
    "GW_STORE_MAX_KEYS_PER_CLIENT", Type::Int, "1000000", "",
    "store server: keys one connection may create (set or add of a new key)"};
constinit const config::Row kStoreMaxBytesPerClient{
    "GW_STORE_MAX_BYTES_PER_CLIENT", Type::Size, "1G", "",
    "store server: bytes of keys and values one connection may store"};
constinit const config::Row kStoreMaxBytes{
    "GW_STORE_MAX_BYTES", Type::Size, "4G", "",
    "store server: bytes of keys and values all connections together may store (a client that "
    "reconnects gets new per-connection budgets, not more of this)"};

constinit const config::Row kTimeline{
    "GW_TIMELINE", Type::String, "", "",
    "write a Chrome trace of every C ABI call to this path, one file per rank (%r: the rank; "
    "else .<rank> before .json); the NCCL net plugin writes its transfers beside it (.nccl "
    "before .json); core/timeline.h"};

const config::RowSet& rows() {
  static const config::RowSet set(
      "core", {&kConfigFile, &kLogLevel, &kTimeoutMs, &kRank, &kWorldSize, &kStore, &kJobToken,
               &kHostId, &kJoinReportMs, &kStoreMaxClients, &kStoreMaxPendingHello,
               &kStoreHelloTimeoutMs, &kStoreMaxValueBytes, &kStoreMaxKeysPerClient,
               &kStoreMaxBytesPerClient, &kStoreMaxBytes, &kTimeline});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::core_config
