#include "core/config_file.h"

#include <fmt/format.h>

#include "core/config.h"

// toml++ 3.3 (Debian 12) asserts, in debug builds, invariants that malformed input breaks, and
// tells clang to assume them in release builds (the config_toml fuzz target found several, e.g.
// `[[[x]]]` in parse_key, `t = 1:` in parse_time). This file is its only user: both are turned
// off here, so a malformed file is a parse error, never an abort or undefined behaviour.
#pragma push_macro("NDEBUG")
#undef NDEBUG
#define TOML_ASSERT(expr) static_assert(true)
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/config.h"

namespace gw::config {

namespace {

int line_of(const toml::node& n) { return static_cast<int>(n.source().begin.line); }

// Flattens a table into `key -> entry`; nested tables join their names with '_'. Iterative (an
// explicit stack of the tables still to walk), so no input depth reaches the call stack; parse()
// refuses tables nested deeper than kMaxDepth before toml++ builds them anyway. Two spellings of
// one key (`a_b = 1` beside `[a] b = 2`) are an error, returned as (line, why); else {0, ""}.
std::pair<int, std::string> flatten(const toml::table& root,
                                    std::map<std::string, ConfigFile::Entry>* out) {
  std::vector<std::pair<const toml::table*, std::string>> todo{{&root, std::string()}};
  while (!todo.empty()) {
    auto [table, prefix] = std::move(todo.back());
    todo.pop_back();
    for (const auto& [k, node] : *table) {
      std::string key = prefix + std::string(k.str());
      if (const auto* sub = node.as_table()) {
        todo.emplace_back(sub, key + "_");
        continue;
      }
      ConfigFile::Entry e;
      e.line = line_of(node);
      if (const auto* s = node.as_string()) {
        e.kind = ConfigFile::Kind::kString;
        e.kind_name = "string";
        e.text = s->get();
      } else if (const auto* i = node.as_integer()) {
        e.kind = ConfigFile::Kind::kInt;
        e.kind_name = "integer";
        e.text = fmt::format("{}", i->get());
      } else if (const auto* f = node.as_floating_point()) {
        e.kind = ConfigFile::Kind::kFloat;
        e.kind_name = "float";
        e.text = fmt::format("{}", f->get());
      } else if (const auto* b = node.as_boolean()) {
        e.kind = ConfigFile::Kind::kBool;
        e.kind_name = "boolean";
        e.text = b->get() ? "true" : "false";
      } else if (node.is_array()) {
        e.kind_name = "array";
      } else {
        e.kind_name = "date/time";
      }
      const int line = e.line;
      auto [it, added] = out->emplace(key, std::move(e));
      if (!added) {
        return {std::max(line, it->second.line),
                fmt::format("key '{}' is set twice (lines {} and {}; table names join with '_')",
                            excerpt(key), std::min(line, it->second.line),
                            std::max(line, it->second.line))};
      }
    }
  }
  return {0, ""};
}

// The code point of the UTF-8 sequence at text[i] (2 and 3 bytes; 0 for anything else).
char32_t codepoint_at(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  if (b(i) >= 0xC2 && b(i) <= 0xDF && i + 1 < text.size()) {
    return (char32_t(b(i) & 0x1F) << 6) | char32_t(b(i + 1) & 0x3F);
  }
  if (b(i) >= 0xE0 && b(i) <= 0xEF && i + 2 < text.size()) {
    return (char32_t(b(i) & 0x0F) << 12) | (char32_t(b(i + 1) & 0x3F) << 6) |
           char32_t(b(i + 2) & 0x3F);
  }
  return 0;
}

}  // namespace

// toml++ 3.3's is_non_ascii_horizontal_whitespace splits U+00A0..U+FEFF into blocks of 0x3FA code
// points and lets through, by a bit mask, the blocks holding a space character; blocks 0, 11 and 63
// hold one space each (U+00A0, U+3000, U+FEFF), which it tests before its switch, and the switch
// has cases only for blocks 5 and 7. Every other code point of blocks 0, 11 and 63 reaches its
// `default: __builtin_unreachable()`. Exhaustively checked against toml++ under UBSan by
// FuzzRegressions.ConfigEveryCodePointTomlMayTestIsRefusedOrSafe.
bool toml_whitespace_test_is_undefined(char32_t cp) {
  if (cp < 0xA0 || cp > 0xFEFF) return false;
  const uint32_t block = (static_cast<uint32_t>(cp) - 0xA0) / 0x3FA;
  if (block != 0 && block != 11 && block != 63) return false;
  return cp != 0xA0 && cp != 0x3000 && cp != 0xFEFF;
}

namespace {

// The line and column (1-based) of the first non-ASCII byte outside a string or a comment, or
// {0, 0}. Such a byte is never valid TOML 1.0, and toml++ 3.3 (Debian 12) reaches
// __builtin_unreachable on some code points in its whitespace test (see
// toml_whitespace_test_is_undefined): found by the config_toml fuzz target under UBSan. They are
// refused before toml++ sees them. Inside strings those code points are refused too: toml++ still
// tests them after a backslash in a multi-line string, or when a quote in a wrong place makes it
// read a "string" as code (`s = 0"""é"""`, fuzz again). Inside a comment (a '#' this scan reads
// as code; where it reads a string, toml++ does too or fails before) they are blanked to spaces
// in *for_toml, the text toml++ then parses: a comment may say "é".
// A UTF-8 byte order mark at the very start is toml++'s to skip. The same fuzz target
// (ASan build, where toml++'s assertions are on) found that a table header whose name does not
// start like a key (`[[[x]]]`, `[.x]`, `[#]`) fails an assertion in toml++'s parse_key (in
// release builds with clang an optimiser assumption): such a header is refused here too, with
// `*bad_header` set. Such headers and non-ASCII code
// outside strings and comments are invalid TOML; the code points refused inside them (e.g.
// U+00E9, U+3001) are valid TOML that toml++ 3.3 cannot read safely, and the error says so.
// The same scan counts how deep the tables go (`*too_deep` when a key would be deeper than
// ConfigFile::kMaxDepth): the parts of the current table header, of a dotted key, and of the keys
// whose values are the inline tables it is in. toml++ would build every level (and free them
// recursively), so `[a.a.a...]` 100,000 parts deep must not reach it.
std::pair<int, int> unsafe_non_ascii(std::string_view text, bool* bad_header, char32_t* bad_char,
                                     bool* too_deep, std::string* for_toml) {
  *bad_header = false;
  *bad_char = 0;
  *too_deep = false;
  int depth = 0;           // brackets and braces open in values and headers
  bool line_start = true;  // nothing but whitespace yet on this line
  // Table depth. A key is read at a line's start (outside values), in a header, and after '{' or
  // ',' in an inline table; its parts add to the level it starts at (`base`).
  struct Open {
    char c;     // '[' (an array) or '{' (an inline table)
    int level;  // the tables the value is in
  };
  std::vector<Open> open;  // in values only
  int header_parts = 0;    // the current [table]'s
  bool in_header = false, in_key = false;
  int key_base = 0, key_parts = 0;
  int value_level = 0;  // where a '{' or '[' read now opens
  auto start_key = [&](int base) {
    in_key = true;
    key_base = base;
    key_parts = 1;
  };
  enum class St { kCode, kComment, kBasic, kLiteral, kMlBasic, kMlLiteral } st = St::kCode;
  int line = 1, col = 0;
  size_t i = text.substr(0, 3) == "\xEF\xBB\xBF" ? 3 : 0;
  auto at = [&](size_t k, std::string_view s) { return text.substr(k, s.size()) == s; };
  for (; i < text.size(); ++i) {
    const char c = text[i];
    ++col;
    if (c == '\n') {
      ++line;
      col = 0;
      line_start = true;
      if (open.empty()) in_header = in_key = false;
      if (st == St::kComment || st == St::kBasic || st == St::kLiteral) st = St::kCode;
      continue;
    }
    if ((static_cast<unsigned char>(c) & 0x80) != 0 && st != St::kCode) {
      const char32_t cp = codepoint_at(text, i);
      if (toml_whitespace_test_is_undefined(cp)) {
        if (st == St::kComment) {
          // A comment's text is never a value: toml++ reads spaces there instead.
          const size_t len = static_cast<unsigned char>(c) < 0xE0 ? 2 : 3;
          for_toml->replace(i, len, len, ' ');
          continue;
        }
        *bad_char = cp;
        return {line, col};
      }
    }
    switch (st) {
      case St::kCode:
        if ((static_cast<unsigned char>(c) & 0x80) != 0) return {line, col};
        if (line_start && depth == 0 && c == '[') {
          size_t j = i + 1;
          if (j < text.size() && text[j] == '[') ++j;
          while (j < text.size() && (text[j] == ' ' || text[j] == '\t')) ++j;
          const char k = j < text.size() ? text[j] : '\n';
          if (!(std::isalnum(static_cast<unsigned char>(k)) || k == '_' || k == '-' || k == '"' ||
                k == '\'' || k == ']' || k == '\n')) {
            *bad_header = true;
            return {line, col};
          }
        }
        if (line_start && open.empty() && !in_header && c != ' ' && c != '\t' && c != '\r' &&
            c != '#') {
          in_header = c == '[';
          start_key(in_header ? 0 : header_parts);
        }
        if (in_key) {
          if (in_header && c == '[') {
            // the header's own bracket(s)
          } else if (c == '.') {
            ++key_parts;
          } else if (in_header && c == ']') {
            header_parts = key_parts;
            in_header = in_key = false;
          } else if (!in_header && c == '=') {
            in_key = false;
            value_level = key_base + key_parts;
          }
        } else if (c == '{' || c == '[') {
          open.push_back({c, value_level});
          if (c == '{') start_key(value_level);
        } else if (c == ',' && !open.empty()) {
          if (open.back().c == '{') start_key(open.back().level);
          value_level = open.back().level;
        } else if ((c == '}' || c == ']') && !open.empty()) {
          open.pop_back();
        }
        if (in_key && key_base + key_parts > ConfigFile::kMaxDepth) {
          *too_deep = true;
          return {line, col};
        }
        if (c != ' ' && c != '\t' && c != '\r') line_start = false;
        if (c == '[' || c == '{') ++depth;
        if ((c == ']' || c == '}') && depth > 0) --depth;
        if (c == '#') {
          st = St::kComment;
        } else if (at(i, "\"\"\"")) {
          st = St::kMlBasic;
          i += 2;
        } else if (at(i, "'''")) {
          st = St::kMlLiteral;
          i += 2;
        } else if (c == '"') {
          st = St::kBasic;
        } else if (c == '\'') {
          st = St::kLiteral;
        }
        break;
      case St::kComment:
        break;
      case St::kBasic:
      case St::kMlBasic:
        if (c == '\\') {
          // An escaped ASCII character is skipped; a non-ASCII one is still checked next.
          if (i + 1 < text.size() && text[i + 1] != '\n' &&
              (static_cast<unsigned char>(text[i + 1]) & 0x80) == 0) {
            ++i;
          }
        } else if (st == St::kBasic && c == '"') {
          st = St::kCode;
        } else if (st == St::kMlBasic && at(i, "\"\"\"")) {
          st = St::kCode;
          i += 2;
        }
        break;
      case St::kLiteral:
        if (c == '\'') st = St::kCode;
        break;
      case St::kMlLiteral:
        if (at(i, "'''")) {
          st = St::kCode;
          i += 2;
        }
        break;
    }
  }
  return {0, 0};
}

}  // namespace

namespace {

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The contents of the regular file at `path`, at most ConfigFile::kMaxBytes, or why not. Opened
// non-blocking, so a FIFO (or a device) is refused at once instead of waiting for a writer.
std::string read_settings_file(const std::string& path, std::string* text) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) return fmt::format("{}: cannot read: {}", path, std::strerror(errno));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  struct ::stat st {};
  if (::fstat(fd, &st) != 0) return fmt::format("{}: cannot read: {}", path, std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    return fmt::format("{}: is {}, not a settings file (GW_CONFIG_FILE names a regular file)", path,
                       file_type_name(st.st_mode));
  }
  if (static_cast<uint64_t>(st.st_size) > ConfigFile::kMaxBytes) {
    return fmt::format("{}: {} bytes, more than a settings file may hold ({})", path, st.st_size,
                       ConfigFile::kMaxBytes);
  }
  // The size may change while reading: read one byte past the cap to notice a file that grew.
  text->resize(ConfigFile::kMaxBytes + 1);
  size_t got = 0;
  while (got < text->size()) {
    const ssize_t n = ::read(fd, text->data() + got, text->size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fmt::format("{}: cannot read: {}", path, std::strerror(errno));
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > ConfigFile::kMaxBytes) {
    return fmt::format("{}: more than a settings file may hold ({} bytes)", path,
                       ConfigFile::kMaxBytes);
  }
  text->resize(got);
  return "";
}

}  // namespace

std::shared_ptr<const ConfigFile> ConfigFile::load(const std::string& path) {
  std::string text;
  if (std::string why = read_settings_file(path, &text); !why.empty()) {
    auto file = std::make_shared<ConfigFile>();
    file->path_ = path;
    file->errors_.push_back(std::move(why));
    return file;
  }
  return parse(text, path);
}

std::shared_ptr<const ConfigFile> ConfigFile::parse(std::string_view text,
                                                    const std::string& path) {
  auto file = std::make_shared<ConfigFile>();
  file->path_ = path;
  if (text.size() > kMaxBytes) {
    file->errors_.push_back(fmt::format("{}: {} bytes, more than a settings file may hold ({})",
                                        path, text.size(), kMaxBytes));
    return file;
  }
  bool bad_header = false, too_deep = false;
  char32_t bad_char = 0;
  std::string for_toml(text);
  if (auto [line, col] = unsafe_non_ascii(text, &bad_header, &bad_char, &too_deep, &for_toml);
      line > 0) {
    const std::string why =
        too_deep ? fmt::format(
                       "tables nested more than {} levels deep (gradwire's keys have at "
                       "most two parts)",
                       kMaxDepth)
        : bad_header ? std::string("a table header whose name does not start like a key")
        : bad_char != 0
            ? fmt::format("character U+{:04X} is not supported (toml++ 3.3 mishandles it)",
                          static_cast<uint32_t>(bad_char))
            : std::string("a non-ASCII character outside a string or a comment");
    file->errors_.push_back(fmt::format("{}:{}:{}: {}", path, line, col, why));
    return file;
  }
  try {
    toml::table table = toml::parse(for_toml, path);
    if (auto [line, why] = flatten(table, &file->entries_); line > 0) {
      file->entries_.clear();
      file->errors_.push_back(fmt::format("{}:{}: {}", path, line, why));
    }
  } catch (const toml::parse_error& e) {
    file->errors_.push_back(fmt::format("{}:{}:{}: {}", path, e.source().begin.line,
                                        e.source().begin.column, e.description()));
  }
  return file;
}

const ConfigFile::Entry* ConfigFile::find(const std::string& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace gw::config
