#include "core/config_file.h"

#include <fmt/format.h>
#include <toml++/toml.h>

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
  try {
    toml::table table = toml::parse(text, path);
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
