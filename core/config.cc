#include "core/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

namespace gw::config {

namespace {

const char* type_name(Type t) {
  switch (t) {
    case Type::Int: return "int";
    case Type::Bool: return "bool";
    case Type::String: return "string";
    case Type::Size: return "size";
    case Type::Double: return "double";
  }
  return "?";
}

Result<int64_t> parse_int(std::string_view s) {
  if (s.empty()) return invalid_arg("empty integer");
  // strtoll skips leading blanks; a value with blanks is a typo, not a number.
  if (std::isspace(static_cast<unsigned char>(s[0]))) {
    return invalid_arg("'{}' is not an integer", s);
  }
  std::string tmp(s);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(tmp.c_str(), &end, 10);
  if (errno != 0 || end == tmp.c_str() || *end != '\0') return invalid_arg("'{}' is not an integer", s);
  return static_cast<int64_t>(v);
}

Result<bool> parse_bool(std::string_view s) {
  std::string v(s);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return invalid_arg("'{}' is not a boolean (1/0, true/false, yes/no, on/off)", s);
}

Result<double> parse_double(std::string_view s) {
  std::string tmp(s);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(tmp.c_str(), &end);
  if (tmp.empty() || std::isspace(static_cast<unsigned char>(tmp[0])) || errno != 0 ||
      *end != '\0') {
    return invalid_arg("'{}' is not a number", s);
  }
  return v;
}

// Size rows are read through get_int (int64): larger sizes would wrap negative.
Result<int64_t> parse_size_i64(std::string_view v) {
  auto s = parse_size(v);
  if (!s.ok()) return s.status();
  if (*s > static_cast<uint64_t>(INT64_MAX)) return invalid_arg("size '{}' is out of range", v);
  return static_cast<int64_t>(*s);
}

Status check(const Row& r, std::string_view v) {
  switch (r.type) {
    case Type::Int: return parse_int(v).status();
    case Type::Bool: return parse_bool(v).status();
    case Type::Size: return parse_size_i64(v).status();
    case Type::Double: return parse_double(v).status();
    case Type::String: return ok_status();
  }
  return ok_status();
}

std::string value_or_default(Key key) {
  auto v = raw(key);
  return v ? *v : std::string(row(key).default_value);
}

// Zero-initialised (no constructor runs), so completions may be installed from other
// translation units' static initialisers in any order.
std::atomic<HelpCompletion> g_help_completion[static_cast<size_t>(Key::kCount)];

}  // namespace

void set_help_completion(Key key, HelpCompletion completion) {
  g_help_completion[static_cast<size_t>(key)].store(completion);
}

std::string help(const Row& r) {
  HelpCompletion completion = g_help_completion[static_cast<size_t>(r.key)].load();
  return completion != nullptr ? fmt::format("{}: {}", r.help, completion()) : r.help;
}

const std::vector<Row>& table() {
  static const std::vector<Row> rows = {
#define GW_CONFIG(id, name, type, def, alias, help) {Key::id, name, Type::type, def, alias, help},
#include "core/config_table.inc"
#undef GW_CONFIG
  };
  return rows;
}

const Row& row(Key key) { return table()[static_cast<size_t>(key)]; }

std::optional<std::string> raw(Key key) {
  const Row& r = row(key);
  if (const char* v = std::getenv(r.name)) return std::string(v);
  if (r.alias[0] != '\0') {
    if (const char* v = std::getenv(r.alias)) return std::string(v);
  }
  return std::nullopt;
}

Result<uint64_t> parse_size(std::string_view text) {
  if (text.empty()) return invalid_arg("empty size");
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) return invalid_arg("'{}' is not a size (digits with an optional K, M or G)", text);
  std::string digits(text.substr(0, i));
  errno = 0;
  unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno != 0) return invalid_arg("size '{}' is out of range", text);
  std::string_view suffix = text.substr(i);
  uint64_t mult = 1;
  if (suffix.empty() || suffix == "B" || suffix == "b") {
    mult = 1;
  } else if (suffix == "K" || suffix == "k" || suffix == "KB" || suffix == "KiB") {
    mult = 1ull << 10;
  } else if (suffix == "M" || suffix == "m" || suffix == "MB" || suffix == "MiB") {
    mult = 1ull << 20;
  } else if (suffix == "G" || suffix == "g" || suffix == "GB" || suffix == "GiB") {
    mult = 1ull << 30;
  } else {
    return invalid_arg("'{}' has an unknown size suffix (use K, M or G)", text);
  }
  if (v > UINT64_MAX / mult) return invalid_arg("size '{}' is out of range", text);
  return static_cast<uint64_t>(v * mult);
}

int64_t get_int(Key key) {
  const Row& r = row(key);
  std::string v = value_or_default(key);
  if (r.type == Type::Size) {
    auto s = parse_size_i64(v);
    return s.ok() ? *s : *parse_size_i64(r.default_value);
  }
  auto i = parse_int(v);
  return i.ok() ? *i : *parse_int(r.default_value);
}

bool get_bool(Key key) {
  auto b = parse_bool(value_or_default(key));
  return b.ok() ? *b : *parse_bool(row(key).default_value);
}

double get_double(Key key) {
  auto d = parse_double(value_or_default(key));
  return d.ok() ? *d : *parse_double(row(key).default_value);
}

std::string get_string(Key key) { return value_or_default(key); }

Status validate() {
  std::string problems;
  for (const Row& r : table()) {
    auto v = raw(r.key);
    if (!v) continue;
    Status s = check(r, *v);
    if (!s.ok()) problems += fmt::format("{}{}={}: {}", problems.empty() ? "" : "; ", r.name, *v,
                                         s.message());
  }
  if (problems.empty()) return ok_status();
  return invalid_arg("bad configuration: {}", problems);
}

std::string toml_key(const Row& r) {
  std::string name = r.name;
  if (name.rfind("GW_", 0) == 0) name = name.substr(3);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return name;
}

std::string dump(bool as_toml) {
  std::string out;
  if (as_toml) {
    out += "# gradwire configuration (current values; environment overrides these keys)\n";
    for (const Row& r : table()) {
      std::string v = value_or_default(r.key);
      out +=
          fmt::format("# {} ({}, default \"{}\")\n", help(r), type_name(r.type), r.default_value);
      if (r.type == Type::String || r.type == Type::Size) {
        out += fmt::format("{} = \"{}\"\n", toml_key(r), v);
      } else {
        out += fmt::format("{} = {}\n", toml_key(r), v);
      }
    }
    return out;
  }
  out += fmt::format("{:<22} {:<7} {:<10} {:<14} {}\n", "# variable", "type", "default", "value",
                     "meaning");
  for (const Row& r : table()) {
    auto v = raw(r.key);
    std::string shown = v ? *v : std::string("(default)");
    std::string name = r.name;
    if (r.alias[0] != '\0') name += fmt::format(" ({})", r.alias);
    out += fmt::format("{:<22} {:<7} {:<10} {:<14} {}\n", name, type_name(r.type),
                       r.default_value[0] ? r.default_value : "\"\"", shown, help(r));
  }
  return out;
}

}  // namespace gw::config
