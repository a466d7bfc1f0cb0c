// The one rule `auto` follows to pick a backend for a peer. Every caller that resolves "auto"
// (the Communicator per peer, the NCCL plugin for its devices) goes through here.
//
// Rule: among the backends that are available (probe ok) and that auto may pick for this peer
// (Backend::auto_within_host for a peer on this host, auto_across_hosts for one on another host),
// take the one with the highest auto_priority; ties go to the one registered first. With tcp and
// shm this is: shm within a host, tcp across hosts, tcp within a host when shm is unavailable;
// dpdk, which owns a port, is never picked.
#pragma once

#include <string>
#include <vector>

#include "core/net/backend_registry.h"
#include "core/status.h"

namespace gw::net {

struct AutoCandidate {
  std::string name;
  int priority = 0;
  bool within_host = false;
  bool across_hosts = false;
  Status status;  // the backend's probe verdict
};

struct AutoChoice {
  std::string name;
  std::string reason;  // for logs: the peer's placement, and why better-ranked backends lost
};

// The rule itself, over explicit candidates (in registration order). kUnsupported listing every
// eligible backend's reason when none is available, or naming the peer's placement when none is
// eligible at all.
Result<AutoChoice> choose_auto(bool same_host, const std::vector<AutoCandidate>& candidates);

// The rule over the registered backends, leaving out `excluded` (backends whose factory the
// caller already saw fail with kUnsupported, reported as such in the reason).
Result<AutoChoice> choose_auto_backend(bool same_host,
                                       const std::vector<std::string>& excluded = {});

// "shm, else tcp": the backends auto may pick for a peer on this host (or another), best first,
// over the registered backends for help texts (availability not considered); "none" if none.
std::string auto_order(bool same_host);

// "within a host: shm, else tcp; across hosts: tcp": the rule's outcome over the registered
// backends in priority order, for help texts (availability not considered).
std::string describe_auto_rule();

}  // namespace gw::net
