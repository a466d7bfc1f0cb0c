#include "core/net/auto_backend.h"

#include <fmt/format.h>

#include <algorithm>

namespace gw::net {
namespace {

std::vector<AutoCandidate> eligible_by_priority(bool same_host,
                                                const std::vector<AutoCandidate>& candidates) {
  std::vector<AutoCandidate> out;
  for (const AutoCandidate& c : candidates) {
    if (same_host ? c.within_host : c.across_hosts) out.push_back(c);
  }
  std::stable_sort(out.begin(), out.end(), [](const AutoCandidate& a, const AutoCandidate& b) {
    return a.priority > b.priority;
  });
  return out;
}

std::vector<AutoCandidate> candidates_of(const std::vector<Backend>& backends, bool probe) {
  std::vector<AutoCandidate> out;
  for (const Backend& b : backends) {
    AutoCandidate c;
    c.name = b.name;
    c.priority = b.auto_priority;
    c.within_host = b.auto_within_host;
    c.across_hosts = b.auto_across_hosts;
    // A backend auto never picks is not probed (a probe may look for files or load a module).
    if (probe && b.probe && (b.auto_within_host || b.auto_across_hosts)) c.status = b.probe();
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

Result<AutoChoice> choose_auto(bool same_host, const std::vector<AutoCandidate>& candidates) {
  const char* where = same_host ? "this host" : "another host";
  std::string passed_over;
  for (const AutoCandidate& c : eligible_by_priority(same_host, candidates)) {
    if (c.status.ok()) {
      return AutoChoice{
          c.name, fmt::format("auto chose {} for a peer on {}{}", c.name, where, passed_over)};
    }
    passed_over += fmt::format("; {} unavailable: {}", c.name, c.status.message());
  }
  return unsupported("auto: no backend is available for a peer on {}{}", where,
                     passed_over.empty() ? std::string("; none may be picked there") : passed_over);
}

Result<AutoChoice> choose_auto_backend(bool same_host, const std::vector<std::string>& excluded) {
  std::vector<AutoCandidate> candidates = candidates_of(registered_backends(), true);
  for (AutoCandidate& c : candidates) {
    if (c.status.ok() && std::find(excluded.begin(), excluded.end(), c.name) != excluded.end()) {
      c.status = unsupported("it failed to start here earlier");
    }
  }
  return choose_auto(same_host, candidates);
}

std::string auto_order(bool same_host) {
  std::string s;
  for (const AutoCandidate& c :
       eligible_by_priority(same_host, candidates_of(registered_backends(), false))) {
    s += (s.empty() ? "" : ", else ") + c.name;
  }
  return s.empty() ? std::string("none") : s;
}

std::string describe_auto_rule() {
  return fmt::format("within a host: {}; across hosts: {}", auto_order(true), auto_order(false));
}

}  // namespace gw::net
