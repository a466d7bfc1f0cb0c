#include "core/config_file.h"

#include <fmt/format.h>

// toml++ 3.3 (Debian 12) asserts, in debug builds, invariants that malformed input breaks, and
// tells clang to assume them in release builds (the config_toml fuzz target found several, e.g.
// `[[[x]]]` in parse_key, `t = 1:` in parse_time). This file is its only user: both are turned
// off here, so a malformed file is a parse error, never an abort or undefined behaviour.
#pragma push_macro("NDEBUG")
#undef NDEBUG
#define TOML_ASSERT(expr) static_assert(true)
#include <toml++/toml.h>
#pragma pop_macro("NDEBUG")

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace gw::config {

namespace {

int line_of(const toml::node& n) { return static_cast<int>(n.source().begin.line); }

// Flattens a table into `prefix + key` entries; nested tables join their names with '_'.
void flatten(const toml::table& table, const std::string& prefix,
             std::map<std::string, ConfigFile::Entry>* out) {
  for (const auto& [k, node] : table) {
    std::string key = prefix + std::string(k.str());
    ConfigFile::Entry e;
    e.line = line_of(node);
    if (const auto* sub = node.as_table()) {
      flatten(*sub, key + "_", out);
      continue;
    }
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
    (*out)[key] = std::move(e);
  }
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
std::pair<int, int> unsafe_non_ascii(std::string_view text, bool* bad_header, char32_t* bad_char,
                                     std::string* for_toml) {
  *bad_header = false;
  *bad_char = 0;
  int depth = 0;           // brackets and braces open in values and headers
  bool line_start = true;  // nothing but whitespace yet on this line
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

std::shared_ptr<const ConfigFile> ConfigFile::load(const std::string& path) {
  auto file = std::make_shared<ConfigFile>();
  file->path_ = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    file->errors_.push_back(fmt::format("{}: cannot read: {}", path, std::strerror(err)));
    return file;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return parse(ss.str(), path);
}

std::shared_ptr<const ConfigFile> ConfigFile::parse(std::string_view text,
                                                    const std::string& path) {
  auto file = std::make_shared<ConfigFile>();
  file->path_ = path;
  bool bad_header = false;
  char32_t bad_char = 0;
  std::string for_toml(text);
  if (auto [line, col] = unsafe_non_ascii(text, &bad_header, &bad_char, &for_toml); line > 0) {
    const std::string why =
        bad_header ? std::string("a table header whose name does not start like a key")
        : bad_char != 0
            ? fmt::format("character U+{:04X} is not supported (toml++ 3.3 mishandles it)",
                          static_cast<uint32_t>(bad_char))
            : std::string("a non-ASCII character outside a string or a comment");
    file->errors_.push_back(fmt::format("{}:{}:{}: {}", path, line, col, why));
    return file;
  }
  try {
    toml::table table = toml::parse(for_toml, path);
    flatten(table, "", &file->entries_);
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
