#include "core/config_snapshot.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "core/core_config.h"

namespace gw::config {

struct Snapshot::Data {
  std::vector<std::pair<const Row*, Value>> rows;    // registration order
  std::vector<std::pair<const Row*, size_t>> index;  // sorted by row address
  std::vector<std::string> file_problems;

  void reindex() {
    index.clear();
    for (size_t i = 0; i < rows.size(); ++i) index.emplace_back(rows[i].first, i);
    std::sort(index.begin(), index.end());
  }
};

Snapshot Snapshot::capture() {
  auto d = std::make_shared<Data>();
  for (const Row* r : table()) d->rows.emplace_back(r, resolve(*r));
  d->reindex();
  d->file_problems = file_problems();
  Snapshot s;
  s.data_ = std::move(d);
  return s;
}

Value Snapshot::value(const Row& row) const {
  if (data_) {
    auto it = std::lower_bound(data_->index.begin(), data_->index.end(),
                               std::pair<const Row*, size_t>(&row, 0));
    if (it != data_->index.end() && it->first == &row) return data_->rows[it->second].second;
  }
  return resolve(row);
}

Result<Snapshot> Snapshot::with(const Row& row, std::string_view text) const {
  Status ok = check(row, text);
  if (!ok.ok()) {
    return invalid_arg("{}={}: {}", row.name, row.secret ? std::string("(set)") : excerpt(text),
                       ok.message());
  }
  Value v;
  v.text = std::string(text);
  v.source = Source::kApi;
  auto d = std::make_shared<Data>(data_ ? *data_ : *capture().data_);
  auto it =
      std::find_if(d->rows.begin(), d->rows.end(), [&](const auto& e) { return e.first == &row; });
  if (it != d->rows.end()) {
    it->second = std::move(v);
  } else {
    d->rows.emplace_back(&row, std::move(v));
    d->reindex();
  }
  Snapshot s;
  s.data_ = std::move(d);
  return s;
}

Status Snapshot::validate() const {
  if (!data_) return capture().validate();
  std::vector<std::string> problems = data_->file_problems;
  for (const auto& [row, v] : data_->rows) {
    std::string p = value_problem(*row, v);
    if (!p.empty()) problems.push_back(std::move(p));
  }
  if (problems.empty()) return ok_status();
  return invalid_arg("bad configuration: {}", fmt::join(problems, "; "));
}

std::vector<std::pair<const Row*, Value>> Snapshot::entries() const {
  if (!data_) return capture().entries();
  return data_->rows;
}

namespace {

// `text` as a TOML basic string: quotes, backslashes and control characters escaped, non-ASCII
// characters as \u escapes (the loader refuses some raw code points toml++ 3.3 mishandles); nullopt
// when it is not UTF-8, which no TOML string can hold.
std::optional<std::string> toml_string(std::string_view text) {
  std::string out = "\"";
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += static_cast<char>(c);
      } else if (c < 0x20 || c == 0x7F) {
        out += fmt::format("\\u{:04X}", c);
      } else {
        out += static_cast<char>(c);
      }
      ++i;
      continue;
    }
    const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
    if (len == 0 || c > 0xF4 || i + len > text.size()) return std::nullopt;
    char32_t cp = c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xC0) != 0x80) return std::nullopt;
      cp = (cp << 6) | (cc & 0x3F);
    }
    const char32_t min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return std::nullopt;
    out += cp > 0xFFFF ? fmt::format("\\U{:08X}", static_cast<uint32_t>(cp))
                       : fmt::format("\\u{:04X}", static_cast<uint32_t>(cp));
    i += len;
  }
  return out + "\"";
}

// The row's value as a TOML value, in the form the loader reads back to the same text; nullopt
// when TOML cannot hold it.
std::optional<std::string> toml_value(const Row& r, const Value& v) {
  switch (r.type) {
    case Type::Bool:
      return std::string(as_bool(r, v) ? "true" : "false");
    case Type::Int:
      return fmt::format("{}", as_int(r, v));
    case Type::Double:
      return fmt::format("{}", as_double(r, v));
    case Type::String:
    case Type::Size:
      return toml_string(as_string(r, v));
  }
  return std::nullopt;
}

}  // namespace

std::string Snapshot::dump(bool as_toml) const {
  std::string out;
  const auto rows = entries();
  if (as_toml) {
    std::map<const Row*, const char*> reader;
    for (const RowSet* set : row_sets()) {
      for (const Row* r : set->rows()) reader[r] = set->reader();
    }
    out +=
        "# gradwire configuration (current values). Layers: default < this file (GW_CONFIG_FILE) "
        "< environment < API\n";
    for (const auto& [r, v] : rows) {
      out += fmt::format("# {} ({}, default \"{}\"; from {})\n", help(*r), type_name(r->type),
                         r->default_value, source_text(v));
      const std::string key = toml_key(*r);
      const auto it = reader.find(r);
      const std::optional<std::string> value = toml_value(*r, v);
      // Lines the library would refuse, or that must not be printed, stay comments.
      if (r == &core_config::kConfigFile) {
        out += fmt::format(
            "# (a file cannot name another: GW_CONFIG_FILE or the API names it)\n"
            "# {} = {}\n",
            key, value.value_or("\"\""));
      } else if (r->secret) {
        out +=
            fmt::format("# (a secret, never printed: write its value here yourself)\n# {} = {}\n",
                        key, shown(*r, v));
      } else if (it != reader.end() && it->second != nullptr) {
        out += fmt::format(
            "# (read by {} only; the library and gradwired refuse this key)\n"
            "# {} = {}\n",
            it->second, key, value.value_or("?"));
      } else if (!value) {
        out += fmt::format(
            "# (not UTF-8, which TOML cannot hold: set it in the environment)\n"
            "# {} = ?\n",
            key);
      } else {
        out += fmt::format("{} = {}\n", key, *value);
      }
    }
    return out;
  }
  out += fmt::format("{:<24} {:<7} {:<10} {:<14} {:<10} {}\n", "# variable", "type", "default",
                     "value", "source", "meaning");
  for (const auto& [r, v] : rows) {
    std::string name = r->name;
    if (r->alias[0] != '\0') name += fmt::format(" ({})", r->alias);
    const std::string value = shown(*r, v);
    out += fmt::format("{:<24} {:<7} {:<10} {:<14} {:<10} {}\n", name, type_name(r->type),
                       r->default_value[0] ? r->default_value : "\"\"",
                       value.empty() ? "\"\"" : value, source_text(v), help(*r));
  }
  return out;
}

}  // namespace gw::config
