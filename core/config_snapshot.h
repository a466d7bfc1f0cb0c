// An immutable view of the configuration at one moment: every registered row resolved through
// the layers (core/config.h), with where each value came from.
//
// Components receive one in their constructor (or their options) and read from it, so a
// component sees one consistent configuration however the environment changes afterwards.
// Copies share the resolved values (copying is a reference-count increment); reads are
// lock-free and thread-safe. A default-constructed Snapshot is empty; capture() takes one.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config.h"

namespace gw::config {

class Snapshot {
 public:
  Snapshot() = default;

  // Resolves every registered row now. Problems (malformed values, file errors) are kept and
  // reported by validate(); reads of a malformed row yield its default.
  static Snapshot capture();

  // Whether this snapshot holds values (false for a default-constructed one).
  bool empty() const { return data_ == nullptr; }

  // The row's value; a row absent from the snapshot (not registered when it was captured, or an
  // empty snapshot) is resolved now.
  Value value(const Row& row) const;
  int64_t get_int(const Row& row) const { return as_int(row, value(row)); }
  bool get_bool(const Row& row) const { return as_bool(row, value(row)); }
  double get_double(const Row& row) const { return as_double(row, value(row)); }
  std::string get_string(const Row& row) const { return value(row).text; }
  Source source(const Row& row) const { return value(row).source; }

  // A copy whose `row` has `text` at the API layer (this snapshot is unchanged). The text must
  // parse as the row's type.
  Result<Snapshot> with(const Row& row, std::string_view text) const;

  // The problems found when this snapshot was captured (as config::validate() words them).
  Status validate() const;

  // The rows in registration order with their values.
  std::vector<std::pair<const Row*, Value>> entries() const;

  // Human-readable table (name, type, default, value, source, help) or TOML with comments.
  std::string dump(bool as_toml) const;

 private:
  struct Data;
  std::shared_ptr<const Data> data_;
};

}  // namespace gw::config
