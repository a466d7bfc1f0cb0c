#include "core/net/backend_registry.h"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>

#include "core/config.h"
#include "core/net/auto_backend.h"
#include "core/net/net_config.h"
#include "core/net/shm_transport.h"
#include "core/net/tcp_transport.h"

namespace gw::net {
namespace {

class Registry {
 public:
  Registry() {
    backends_.push_back(tcp_backend());
    backends_.push_back(shm_backend());
  }

  Status add(Backend b) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(backends_.begin(), backends_.end(),
                           [&](const Backend& x) { return x.name == b.name; });
    if (it != backends_.end()) {
      *it = std::move(b);
    } else {
      backends_.push_back(std::move(b));
    }
    return ok_status();
  }

  std::vector<Backend> all() const {
    std::lock_guard<std::mutex> lock(mu_);
    return backends_;
  }

 private:
  mutable std::mutex mu_;
  std::vector<Backend> backends_;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: usable from static destructors
  return *r;
}

std::string known_list(const std::vector<Backend>& all) {
  std::string out;
  for (const Backend& b : all) out += (out.empty() ? "" : ", ") + b.name;
  return out;
}

Status unknown_name(const std::string& name) {
  return invalid_arg("unknown transport '{}' (known: {})", name, known_list(registry().all()));
}

Status probe(const Backend& b) { return b.probe ? b.probe() : ok_status(); }

// GW_TRANSPORT names the choice made here: linking the registry registers the row.
[[maybe_unused]] const config::RowSet& net_rows = net_config::rows();

}  // namespace

Backend unbuilt_backend(const std::string& name, const std::string& reason) {
  Backend b;
  b.name = name;
  b.summary = "not built";
  b.probe = [reason] { return Status(Code::kUnsupported, reason); };
  return b;
}

Status register_backend(Backend backend) {
  if (backend.name.empty()) return invalid_arg("register_backend: empty name");
  if (backend.name == "tcp" || backend.name == "shm" || backend.name == "auto") {
    return invalid_arg("register_backend: '{}' is built in", backend.name);
  }
  return registry().add(std::move(backend));
}

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Backend& b : registry().all()) names.push_back(b.name);
  return names;
}

std::vector<Backend> registered_backends() { return registry().all(); }

Result<Backend> find_backend(const std::string& name) {
  for (Backend& b : registry().all()) {
    if (b.name == name) return std::move(b);
  }
  return unknown_name(name);
}

Status backend_status(const std::string& name) {
  GW_ASSIGN_OR_RETURN(Backend b, find_backend(name));
  return probe(b);
}

Status check_backend_name(const std::string& name, const std::string& what) {
  if (name == "auto") return ok_status();
  const std::vector<Backend> all = registry().all();
  for (const Backend& b : all) {
    if (b.name == name) return ok_status();
  }
  return invalid_arg("{} '{}': expected auto or one of {}", what, name, known_list(all));
}

std::string describe_backends() {
  std::string out = fmt::format("auto ({})", describe_auto_rule());
  for (const Backend& b : registry().all()) {
    Status s = probe(b);
    if (!s.ok()) {
      out += fmt::format(", {} ({})", b.name, s.message());
    } else if (!b.auto_within_host && !b.auto_across_hosts) {
      out += fmt::format(", {} ({}; only by name)", b.name, b.summary);
    } else {
      out += fmt::format(", {} ({})", b.name, b.summary);
    }
  }
  return out;
}

std::string describe_cross_host_backends() {
  std::string out = fmt::format("auto (across hosts: {})", auto_order(false));
  for (const Backend& b : registry().all()) {
    if (b.auto_across_hosts) out += ", " + b.name;
  }
  return out;
}

Result<std::unique_ptr<Transport>> make_transport(const std::string& name,
                                                  const TransportOptions& options) {
  GW_ASSIGN_OR_RETURN(Backend b, find_backend(name));
  Status s = probe(b);
  if (!s.ok()) return s.with_context(fmt::format("transport '{}' is unavailable", name));
  if (!b.factory) return unsupported("transport '{}' has no factory in this program", name);
  return b.factory(options);
}

}  // namespace gw::net
