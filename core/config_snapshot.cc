#include "core/config_snapshot.h"

#include <fmt/format.h>

#include <algorithm>

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
  if (!ok.ok()) return invalid_arg("{}={}: {}", row.name, text, ok.message());
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

std::string Snapshot::dump(bool as_toml) const {
  std::string out;
  const auto rows = entries();
  if (as_toml) {
    out +=
        "# gradwire configuration (current values). Layers: default < this file (GW_CONFIG_FILE) "
        "< environment < API\n";
    for (const auto& [r, v] : rows) {
      out += fmt::format("# {} ({}, default \"{}\"; from {})\n", help(*r), type_name(r->type),
                         r->default_value, source_text(v));
      if (r->type == Type::String || r->type == Type::Size) {
        out += fmt::format("{} = \"{}\"\n", toml_key(*r), v.text);
      } else if (r->type == Type::Bool) {
        out += fmt::format("{} = {}\n", toml_key(*r), as_bool(*r, v) ? "true" : "false");
      } else {
        out += fmt::format("{} = {}\n", toml_key(*r), v.text);
      }
    }
    return out;
  }
  out += fmt::format("{:<24} {:<7} {:<10} {:<14} {:<10} {}\n", "# variable", "type", "default",
                     "value", "source", "meaning");
  for (const auto& [r, v] : rows) {
    std::string name = r->name;
    if (r->alias[0] != '\0') name += fmt::format(" ({})", r->alias);
    out += fmt::format("{:<24} {:<7} {:<10} {:<14} {:<10} {}\n", name, type_name(r->type),
                       r->default_value[0] ? r->default_value : "\"\"",
                       v.text.empty() ? "\"\"" : v.text, source_text(v), help(*r));
  }
  return out;
}

}  // namespace gw::config
