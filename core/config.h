// The table of tunables (core/config_table.inc) and typed access to it.
//
// Values come from the environment (the GW_* name, then its alias); an unset variable yields the
// default. Reads are cheap and thread-safe (getenv only), so tests may change the environment
// between communicators. validate() reports every malformed value at once; components call it
// at start-up and refuse to start with GW_ERR_INVALID_ARG rather than guess.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gw::config {

enum class Type { Int, Bool, String, Size, Double };

enum class Key : int {
#define GW_CONFIG(id, name, type, def, alias, help) id,
#include "core/config_table.inc"
#undef GW_CONFIG
  kCount
};

struct Row {
  Key key;
  const char* name;   // environment variable
  Type type;
  const char* default_value;
  const char* alias;  // second environment variable honoured when the first is unset ("" = none)
  const char* help;
};

const std::vector<Row>& table();
const Row& row(Key key);

// Raw value: the environment (name, then alias), or nullopt when neither is set.
std::optional<std::string> raw(Key key);

int64_t get_int(Key key);      // Int and Size rows (Size parses K/M/G suffixes)
bool get_bool(Key key);        // 1/0, true/false, yes/no, on/off
double get_double(Key key);
std::string get_string(Key key);

// Parses "64", "4K", "1M", "2G" (powers of 1024). Used for Size rows and the perf tool.
Result<uint64_t> parse_size(std::string_view text);

// Checks every row that is set; the message lists each malformed variable with its value.
Status validate();

// "GW_TIMEOUT_MS" -> "timeout_ms": the key of the daemon's TOML config.
std::string toml_key(const Row& row);

// A row whose help names a list known only at run time (GW_TRANSPORT's backends, which the
// backend registry holds) has it completed by its owner: `completion` returns the text printed
// after the row's own help. Install it during static initialisation or before printing.
using HelpCompletion = std::string (*)();
void set_help_completion(Key key, HelpCompletion completion);

// The row's help with its completion, if any: what dump() prints.
std::string help(const Row& row);

// Human-readable table (name, type, default, current value, help) or TOML with comments.
std::string dump(bool as_toml);

}  // namespace gw::config
