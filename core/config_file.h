// The TOML layer of the configuration (GW_CONFIG_FILE), parsed with toml++.
//
// The file is flattened to `key -> value`: a top-level `timeout_ms = 60000` is "timeout_ms", and
// `[dpdk] port = "ring"` is "dpdk_port" (tables join their names with '_'). Each entry keeps its
// line so errors can name it. Whether a key exists and whether the value's type fits the row is
// decided by core/config.cc against the registered rows.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace gw::config {

class ConfigFile {
 public:
  enum class Kind { kString, kInt, kFloat, kBool, kOther };

  struct Entry {
    std::string text;  // the value as an environment variable would spell it
    Kind kind = Kind::kOther;
    const char* kind_name = "";  // "string", "integer", "float", "boolean", "array", ...
    int line = 0;
  };

  // A settings file is a few kilobytes; anything larger is refused unread (a device such as
  // /dev/zero, a log named by mistake).
  static constexpr size_t kMaxBytes = 1 << 20;
  // Tables nested deeper than this (`[a.b.c...]`, `a.b.c... = 1`, inline tables within inline
  // tables) are refused before toml++ builds them: gradwire's keys have at most two parts, and
  // toml++ 3.3 frees its tables recursively.
  static constexpr int kMaxDepth = 16;

  // Reads and parses `path`. Never fails: a file that cannot be read or parsed yields no entries
  // and one error ("path:line:column: why"). Only a regular file is read (a directory, a FIFO or a
  // device is refused without blocking), and at most kMaxBytes of it.
  static std::shared_ptr<const ConfigFile> load(const std::string& path);
  // Parses `text` as the contents of `path` (load() reads the file and calls this; the fuzz
  // target calls it directly). Never fails, as load(); text over kMaxBytes is refused.
  static std::shared_ptr<const ConfigFile> parse(std::string_view text, const std::string& path);

  const std::string& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::vector<std::string>& errors() const { return errors_; }
  const Entry* find(const std::string& key) const;

 private:
  std::string path_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> errors_;
};

// Whether toml++ 3.3's whitespace test is undefined behaviour for `cp` (it reaches
// __builtin_unreachable); parse() refuses such code points, but in a comment, where toml++ is
// handed spaces instead. Exposed for tests.
bool toml_whitespace_test_is_undefined(char32_t cp);

}  // namespace gw::config
