// gradwire's tunables: each component declares its rows and registers them here; values resolve
// in layers and are read through typed getters.
//
// A row is one knob (name, type, default, help). A component owns its rows: it declares them in
// its own `<component>_config.h` (`extern const config::Row kX;`) and defines them, with one
// RowSet that registers them, in `<component>_config.cc` (see core/core_config.cc). The
// component's code reads its rows, so linking the component links the rows and the RowSet's
// static initialiser registers them; a component that is not built has no rows and no knobs.
//
// Layers, lowest first (a higher one wins):
//   1. the row's default;
//   2. the TOML file named by GW_CONFIG_FILE (key = the name without GW_, lower case, at the top
//      level or as `[component] rest`: `timeout_ms = 60000`, `[dpdk] port = "ring"`);
//   3. the environment (the GW_* name, then its alias);
//   4. the API: values a program sets with config::set() (gw_config_set() in the C ABI).
// Every read sees the environment and the file as they are at that moment (the file is parsed
// again when its path, size or modification time changes), so tests may change the environment
// between communicators. Reads are thread-safe. Components read once at start-up, ideally
// through a Snapshot (core/config_snapshot.h) they receive in their constructor.
//
// validate() reports every malformed value at once (file errors name the file, line and key);
// components call it at start-up and refuse to start with GW_ERR_INVALID_ARG rather than guess.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gw::config {

enum class Type { Int, Bool, String, Size, Double };
const char* type_name(Type type);  // "int", "bool", "string", "size", "double"

// One knob. Rows are constants with static storage (constant-initialised, so they may be read
// before any static initialiser has run); a row is identified by its address.
struct Row {
  const char* name;  // environment variable, GW_*
  Type type;
  const char* default_value;
  const char* alias;  // second environment variable honoured when the first is unset ("" = none)
  const char* help;
  // Checks a value's text beyond its type (allowed names, ranges); nullptr: the type is enough.
  // Its message says what is allowed; validate() and set() prefix the variable and the value.
  Status (*validator)(std::string_view text) = nullptr;
  // A secret (GW_JOB_TOKEN): read as any row, but printed only as set or unset, never by value
  // (shown(): --dump-config, gradwirectl config, gradwire-perf's header and JSON, errors).
  bool secret = false;
};

// Registers a component's rows (in the given order) for the file, validate(), dump() and
// Snapshot::capture(). A component defines one, as a function-local static returned by its
// `rows()` and also bound to a namespace-scope reference so that loading the component registers
// it (core/core_config.cc shows the pattern). Thread-safe.
class RowSet {
 public:
  RowSet(const char* component, std::initializer_list<const Row*> rows);
  // A set that one program reads (`reader`, e.g. "the NCCL net plugin") while others link it only
  // to list it (gradwire-perf --dump-config): the TOML dump writes its rows as comments, since
  // the library and the daemon refuse keys they do not have.
  RowSet(const char* component, std::initializer_list<const Row*> rows, const char* reader);
  const char* component() const { return component_; }
  const std::vector<const Row*>& rows() const { return rows_; }
  const char* reader() const { return reader_; }  // nullptr: every program that links the set

 private:
  const char* component_;
  std::vector<const Row*> rows_;
  const char* reader_ = nullptr;
};

// Where a value came from.
enum class Source { kDefault, kFile, kEnv, kApi };

// A resolved value: the text (before parsing into the row's type) and its origin.
struct Value {
  std::string text;
  Source source = Source::kDefault;
  std::string origin;  // kFile: "path:line"; kEnv: the variable read (name or alias); else ""
  bool valid = true;   // false: the text does not parse as the row's type (the default is used)
};

// Every registered row: core's first, then component by component in name order, each set's rows
// in the order it lists them.
std::vector<const Row*> table();
// The registered sets (component name and rows).
std::vector<const RowSet*> row_sets();
// The registered component owning a row; "" when the row is not registered.
std::string component_of(const Row& row);
// The registered row named `name` (GW_* variable or TOML key), or nullptr.
const Row* find(std::string_view name);

// Resolves one row through the layers now.
Value resolve(const Row& row);

// The value when a layer above the default sets it (the file, the environment or the API), else
// nullopt: "was this set explicitly".
std::optional<std::string> raw(const Row& row);

// Typed reads of the resolved value; a malformed value yields the default (validate() says so).
int64_t get_int(const Row& row);  // Int and Size rows (Size parses K/M/G suffixes)
bool get_bool(const Row& row);    // 1/0, true/false, yes/no, on/off
double get_double(const Row& row);
std::string get_string(const Row& row);

// Typed parse of a value's text for a row (the default when it does not parse).
int64_t as_int(const Row& row, const Value& v);
bool as_bool(const Row& row, const Value& v);
double as_double(const Row& row, const Value& v);
std::string as_string(const Row& row, const Value& v);

// The API layer: a value set here beats the environment and the file, process-wide, until
// cleared. The value must parse as the row's type (else GW_ERR_INVALID_ARG, nothing set).
Status set(const Row& row, std::string_view value);
// By name: the GW_* variable or the TOML key of a registered row.
Status set(std::string_view name, std::string_view value);
void clear(const Row& row);
void clear_all();

// Parses "64", "4K", "1M", "2G" (powers of 1024). Used for Size rows and the perf tool.
Result<uint64_t> parse_size(std::string_view text);

// Checks the file (syntax, unknown keys, value types) and every row's resolved value; the
// message lists each problem: `GW_X=value: why` for the environment and the API,
// `path:line: key 'k': why` for the file. Same as Snapshot::capture().validate().
Status validate();

// Whether `text` parses as the row's type.
Status check(const Row& row, std::string_view text);
// The file layer's problems now: syntax, unknown keys, values of the wrong TOML type.
std::vector<std::string> file_problems();
// "" when v is valid, else the problem in validate()'s words.
std::string value_problem(const Row& row, const Value& v);

// "GW_TIMEOUT_MS" -> "timeout_ms": the row's key in the TOML file.
std::string toml_key(const Row& row);
// "default", "env", "env NCCL_HOSTID", "api" or "path:line".
std::string source_text(const Value& v);

// A row whose help names a list known only at run time (GW_TRANSPORT's backends, which the
// backend registry holds) has it completed by its owner: `completion` returns the text printed
// after the row's own help. Install it during static initialisation or before printing.
using HelpCompletion = std::string (*)();
void set_help_completion(const Row& row, HelpCompletion completion);

// The row's help with its completion, if any: what dump() prints.
std::string help(const Row& row);

// Human-readable table (name, type, default, value, source, help) or TOML with comments, of
// every registered row as resolved now. The TOML loads back (into the library, the daemon and the
// perf tool) and dumps again the same: the file's own name, secrets and rows only another program
// reads are written as comments. Callers check validate() first: a malformed value is dumped as
// the default it reads as.
std::string dump(bool as_toml);

// How a value is printed anywhere outside the component that reads it: a secret row's as "(set)"
// or "(unset)", any other as its text.
std::string shown(const Row& row, const Value& v);
// A value as an error message quotes it: whole up to kExcerptBytes, else its first kExcerptBytes
// and its length, so a 10 MB value does not make a 10 MB message.
inline constexpr size_t kExcerptBytes = 64;
std::string excerpt(std::string_view text);

}  // namespace gw::config
