#include "core/config.h"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include "core/config_file.h"
#include "core/config_snapshot.h"
#include "core/core_config.h"

namespace gw::config {

const char* type_name(Type t) {
  switch (t) {
    case Type::Int:
      return "int";
    case Type::Bool:
      return "bool";
    case Type::String:
      return "string";
    case Type::Size:
      return "size";
    case Type::Double:
      return "double";
  }
  return "?";
}

namespace {

Result<int64_t> parse_int(std::string_view s) {
  if (s.empty()) return invalid_arg("empty integer");
  // strtoll skips leading blanks; a value with blanks is a typo, not a number.
  if (std::isspace(static_cast<unsigned char>(s[0]))) {
    return invalid_arg("'{}' is not an integer", excerpt(s));
  }
  std::string tmp(s);
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(tmp.c_str(), &end, 10);
  if (errno != 0 || end == tmp.c_str() || *end != '\0')
    return invalid_arg("'{}' is not an integer", excerpt(s));
  return static_cast<int64_t>(v);
}

Result<bool> parse_bool(std::string_view s) {
  std::string v(s);
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return invalid_arg("'{}' is not a boolean (1/0, true/false, yes/no, on/off)", excerpt(s));
}

Result<double> parse_double(std::string_view s) {
  std::string tmp(s);
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(tmp.c_str(), &end);
  if (tmp.empty() || std::isspace(static_cast<unsigned char>(tmp[0])) || errno != 0 ||
      *end != '\0') {
    return invalid_arg("'{}' is not a number", excerpt(s));
  }
  return v;
}

// Size rows are read through get_int (int64): larger sizes would wrap negative.
Result<int64_t> parse_size_i64(std::string_view v) {
  auto s = parse_size(v);
  if (!s.ok()) return s.status();
  if (*s > static_cast<uint64_t>(INT64_MAX))
    return invalid_arg("size '{}' is out of range", excerpt(v));
  return static_cast<int64_t>(*s);
}

Status check_text(const Row& r, std::string_view v) {
  Status typed = ok_status();
  switch (r.type) {
    case Type::Int:
      typed = parse_int(v).status();
      break;
    case Type::Bool:
      typed = parse_bool(v).status();
      break;
    case Type::Size:
      typed = parse_size_i64(v).status();
      break;
    case Type::Double:
      typed = parse_double(v).status();
      break;
    case Type::String:
      break;
  }
  if (!typed.ok()) return typed;
  return r.validator != nullptr ? r.validator(v) : ok_status();
}

// Whether a TOML value of `kind` may set a row of `type`: strings only for strings; sizes as an
// integer or a string with a suffix ("256K"); doubles as a float or an integer.
bool kind_fits(Type type, ConfigFile::Kind kind) {
  using K = ConfigFile::Kind;
  switch (type) {
    case Type::Int:
      return kind == K::kInt;
    case Type::Bool:
      return kind == K::kBool;
    case Type::String:
      return kind == K::kString;
    case Type::Size:
      return kind == K::kInt || kind == K::kString;
    case Type::Double:
      return kind == K::kFloat || kind == K::kInt;
  }
  return false;
}

const char* expected_kind(Type type) {
  switch (type) {
    case Type::Int:
      return "an integer";
    case Type::Bool:
      return "a boolean (true/false)";
    case Type::String:
      return "a string";
    case Type::Size:
      return "an integer or a string such as \"256K\"";
    case Type::Double:
      return "a number";
  }
  return "?";
}

struct Registry {
  std::mutex mu;
  std::vector<const RowSet*> sets;
  std::map<const Row*, std::string> api;  // the API layer
  // The file layer, parsed again when its path or the file's identity changes.
  std::shared_ptr<const ConfigFile> file;
  struct ::stat file_stat {};
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: rows may be read during exit
  return *r;
}

std::optional<std::string> api_value(const Row& r) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.api.find(&r);
  if (it == reg.api.end()) return std::nullopt;
  return it->second;
}

bool same_file(const struct ::stat& a, const struct ::stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino && a.st_size == b.st_size &&
         a.st_mtim.tv_sec == b.st_mtim.tv_sec && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec;
}

// The parsed GW_CONFIG_FILE, or nullptr when none is named. The file itself is only named by the
// environment or the API (a file cannot name another).
std::shared_ptr<const ConfigFile> current_file() {
  const Row& fr = core_config::kConfigFile;
  std::string path;
  if (auto a = api_value(fr)) {
    path = *a;
  } else if (const char* e = std::getenv(fr.name)) {
    path = e;
  }
  if (path.empty()) return nullptr;
  struct ::stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  Registry& reg = registry();
  {
    std::lock_guard<std::mutex> lock(reg.mu);
    if (reg.file && reg.file->path() == path && exists && same_file(st, reg.file_stat)) {
      return reg.file;
    }
  }
  auto file = ConfigFile::load(path);
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.file = file;
  reg.file_stat = exists ? st : (struct ::stat){};
  return file;
}

}  // namespace

RowSet::RowSet(const char* component, std::initializer_list<const Row*> rows, const char* reader)
    : RowSet(component, rows) {
  reader_ = reader;
}

RowSet::RowSet(const char* component, std::initializer_list<const Row*> rows)
    : component_(component), rows_(rows) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  if (std::find(reg.sets.begin(), reg.sets.end(), this) == reg.sets.end()) reg.sets.push_back(this);
}

std::vector<const RowSet*> row_sets() {
  std::vector<const RowSet*> sets;
  {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    sets = reg.sets;
  }
  // A stable order whatever the link order: core first, then by component name.
  std::stable_sort(sets.begin(), sets.end(), [](const RowSet* a, const RowSet* b) {
    const bool ca = std::string_view(a->component()) == "core";
    const bool cb = std::string_view(b->component()) == "core";
    if (ca != cb) return ca;
    return std::string_view(a->component()) < std::string_view(b->component());
  });
  return sets;
}

std::vector<const Row*> table() {
  std::vector<const Row*> out;
  for (const RowSet* s : row_sets()) out.insert(out.end(), s->rows().begin(), s->rows().end());
  return out;
}

std::string component_of(const Row& row) {
  for (const RowSet* s : row_sets()) {
    for (const Row* r : s->rows()) {
      if (r == &row) return s->component();
    }
  }
  return "";
}

const Row* find(std::string_view name) {
  for (const Row* r : table()) {
    if (name == r->name || name == toml_key(*r)) return r;
  }
  return nullptr;
}

Value resolve(const Row& r) {
  Value v;
  if (auto a = api_value(r)) {
    v.text = std::move(*a);
    v.source = Source::kApi;
  } else if (const char* e = std::getenv(r.name)) {
    v.text = e;
    v.source = Source::kEnv;
    v.origin = r.name;
  } else if (const char* al = r.alias[0] != '\0' ? std::getenv(r.alias) : nullptr) {
    v.text = al;
    v.source = Source::kEnv;
    v.origin = r.alias;
  } else {
    const ConfigFile::Entry* entry = nullptr;
    std::shared_ptr<const ConfigFile> file;
    if (&r != &core_config::kConfigFile && (file = current_file())) {
      entry = file->find(toml_key(r));
      if (entry && !kind_fits(r.type, entry->kind)) entry = nullptr;  // validate() says so
    }
    if (entry) {
      v.text = entry->text;
      v.source = Source::kFile;
      v.origin = fmt::format("{}:{}", file->path(), entry->line);
    } else {
      v.text = r.default_value;
    }
  }
  v.valid = check_text(r, v.text).ok();
  return v;
}

std::optional<std::string> raw(const Row& r) {
  Value v = resolve(r);
  if (v.source == Source::kDefault) return std::nullopt;
  return std::move(v.text);
}

Result<uint64_t> parse_size(std::string_view text) {
  if (text.empty()) return invalid_arg("empty size");
  size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  if (i == 0) {
    return invalid_arg("'{}' is not a size (digits with an optional K, M or G)", excerpt(text));
  }
  std::string digits(text.substr(0, i));
  errno = 0;
  unsigned long long v = std::strtoull(digits.c_str(), nullptr, 10);
  if (errno != 0) return invalid_arg("size '{}' is out of range", excerpt(text));
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
    return invalid_arg("'{}' has an unknown size suffix (use K, M or G)", excerpt(text));
  }
  if (v > UINT64_MAX / mult) return invalid_arg("size '{}' is out of range", excerpt(text));
  return static_cast<uint64_t>(v * mult);
}

// An invalid value (wrong type or refused by the row's validator) reads as the default.
int64_t as_int(const Row& r, const Value& v) {
  const std::string_view text = v.valid ? std::string_view(v.text) : r.default_value;
  if (r.type == Type::Size) {
    auto s = parse_size_i64(text);
    return s.ok() ? *s : *parse_size_i64(r.default_value);
  }
  auto i = parse_int(text);
  return i.ok() ? *i : *parse_int(r.default_value);
}

bool as_bool(const Row& r, const Value& v) {
  auto b = parse_bool(v.valid ? std::string_view(v.text) : r.default_value);
  return b.ok() ? *b : *parse_bool(r.default_value);
}

double as_double(const Row& r, const Value& v) {
  auto d = parse_double(v.valid ? std::string_view(v.text) : r.default_value);
  return d.ok() ? *d : *parse_double(r.default_value);
}

std::string as_string(const Row& r, const Value& v) {
  return v.valid ? v.text : std::string(r.default_value);
}

int64_t get_int(const Row& r) { return as_int(r, resolve(r)); }
bool get_bool(const Row& r) { return as_bool(r, resolve(r)); }
double get_double(const Row& r) { return as_double(r, resolve(r)); }
std::string get_string(const Row& r) { return as_string(r, resolve(r)); }

Status check(const Row& r, std::string_view text) { return check_text(r, text); }

Status set(const Row& r, std::string_view value) {
  Status s = check(r, value);
  if (!s.ok()) {
    return invalid_arg("{}={}: {}", r.name, r.secret ? std::string("(set)") : excerpt(value),
                       s.message());
  }
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.api[&r] = std::string(value);
  return ok_status();
}

Status set(std::string_view name, std::string_view value) {
  const Row* r = find(name);
  if (r == nullptr) return invalid_arg("unknown setting '{}'", excerpt(name));
  return set(*r, value);
}

void clear(const Row& r) {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.api.erase(&r);
}

void clear_all() {
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.api.clear();
}

std::vector<std::string> file_problems() {
  std::vector<std::string> problems;
  auto file = current_file();
  if (!file) return problems;
  problems = file->errors();
  const std::vector<const Row*> rows = table();
  for (const auto& [key, entry] : file->entries()) {
    const Row* r = nullptr;
    for (const Row* c : rows) {
      if (toml_key(*c) == key) r = c;
    }
    if (r == nullptr || r == &core_config::kConfigFile) {
      problems.push_back(fmt::format("{}:{}: key '{}': unknown key ({})", file->path(), entry.line,
                                     excerpt(key),
                                     r ? "the file is named by the environment or the API"
                                       : "no such setting in this program"));
    } else if (!kind_fits(r->type, entry.kind)) {
      problems.push_back(fmt::format("{}:{}: key '{}': expected {}, got {}", file->path(),
                                     entry.line, key, expected_kind(r->type), entry.kind_name));
    }
  }
  return problems;
}

namespace {
std::string shown_excerpt(const Row& r, const Value& v) { return excerpt(shown(r, v)); }
}  // namespace

std::string value_problem(const Row& r, const Value& v) {
  if (v.valid) return "";
  Status s = check(r, v.text);
  if (v.source == Source::kFile) {
    return fmt::format("{}: key '{}' = \"{}\": {}", v.origin, toml_key(r), shown_excerpt(r, v),
                       s.message());
  }
  return fmt::format("{}={}: {}", v.source == Source::kEnv ? v.origin : r.name, shown_excerpt(r, v),
                     s.message());
}

Status validate() { return Snapshot::capture().validate(); }

std::string toml_key(const Row& r) {
  std::string name = r.name;
  if (name.rfind("GW_", 0) == 0) name = name.substr(3);
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return name;
}

std::string source_text(const Value& v) {
  switch (v.source) {
    case Source::kDefault:
      return "default";
    case Source::kFile:
      return v.origin;
    case Source::kEnv:
      return v.origin.rfind("GW_", 0) == 0 ? "env" : "env " + v.origin;
    case Source::kApi:
      return "api";
  }
  return "?";
}

namespace {
struct Completions {
  std::mutex mu;
  std::map<const Row*, HelpCompletion> by_row;
};
Completions& completions() {
  static Completions* c = new Completions;  // never destroyed: read by exit-time dumps
  return *c;
}
}  // namespace

void set_help_completion(const Row& row, HelpCompletion completion) {
  Completions& c = completions();
  std::lock_guard<std::mutex> lock(c.mu);
  c.by_row[&row] = completion;
}

std::string help(const Row& row) {
  HelpCompletion completion = nullptr;
  {
    Completions& c = completions();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.by_row.find(&row);
    if (it != c.by_row.end()) completion = it->second;
  }
  return completion != nullptr ? fmt::format("{}: {}", row.help, completion()) : row.help;
}

std::string dump(bool as_toml) { return Snapshot::capture().dump(as_toml); }

std::string shown(const Row& row, const Value& v) {
  if (!row.secret) return v.text;
  return v.text.empty() ? "(unset)" : "(set)";
}

std::string excerpt(std::string_view text) {
  if (text.size() <= kExcerptBytes) return std::string(text);
  // Cut at a UTF-8 character boundary.
  size_t cut = kExcerptBytes;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes)", text.substr(0, cut), text.size());
}

}  // namespace gw::config
