// Pieces of detect_launch() that the C ABI also needs on their own (gw_comm_init with an explicit
// rank and world size still takes the store address from the environment).
#pragma once

#include <string>

#include "core/status.h"

namespace gw {

struct StoreAddress {
  std::string host;  // empty: the environment names no store
  int port = 0;
  std::string source;  // "GW_STORE" or "MASTER_ADDR/MASTER_PORT"
};

// GW_STORE ("host:port", "[v6]:port"), else MASTER_ADDR + MASTER_PORT. Both unset: an empty
// address. Malformed or half-given (only one of MASTER_ADDR/MASTER_PORT): kInvalidArg naming the
// variable.
Result<StoreAddress> store_address_from_env();

// Strict decimal integer of an environment variable (no spaces, no suffix, fits in int);
// kInvalidArg "NAME='value' is not an integer" otherwise.
Result<int> parse_env_int(const char* name, const std::string& value);

}  // namespace gw
