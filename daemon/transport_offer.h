// Which backend the daemons of a job talk over. Each daemon offers the backends it owns, best
// first (GW_DAEMON_TRANSPORT=auto: verbs where an RDMA device answers, dpdk where
// GW_DPDK_EAL_ARGS gives this daemon a port, then tcp; a name: that backend alone). When a job's
// daemons meet, each publishes its offer in the job's store and all take the first backend of
// host 0's offer that every host offers (agree_transport), so hosts with different NICs still
// meet (over tcp) instead of failing to connect.
//
// The offer travels through the job's store as text, "dpdk,tcp": decode_offer checks it (bytes
// another daemon wrote) and is fuzzed (tests/fuzz/daemon_proto_fuzz.cc). Thread-compatible.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/status.h"

namespace gw::daemon {

inline constexpr size_t kMaxOfferNames = 8;
inline constexpr size_t kMaxOfferNameBytes = 32;

struct TransportOffer {
  std::vector<std::string> names;  // best first; never empty
  std::string reason;              // how they were chosen, for the INFO line
};

// The offer of a daemon configured with `configured` (GW_DAEMON_TRANSPORT). status_of(name): the
// backend's probe verdict (kInvalidArg for an unknown name); dpdk_port: whether this daemon was
// given a DPDK port (GW_DPDK_EAL_ARGS set). A named backend must exist, cross hosts (not shm) and
// be available here, else kInvalidArg/kUnsupported saying why: a daemon refuses to start with a
// transport it cannot use rather than failing its first job.
Result<TransportOffer> offer_transports(const std::string& configured,
                                        const std::function<Status(const std::string&)>& status_of,
                                        bool dpdk_port);

// Whether trainers' device buffers (dma-bufs, docs/wire-daemon.md "Device buffers as dma-bufs")
// can go through this daemon: yes only when its offer holds verbs (GW_DAEMON_TRANSPORT verbs, or
// auto with a verbs device) and the verbs NIC takes dma-bufs. probe_verbs_nic() asks the NIC of
// the verbs device this daemon's jobs would use (called only when verbs is offered): its verdict
// and one line. `why` is one line either way (gradwirectl status, the plugin's start-up line).
// A job whose daemons then agree another transport (a peer daemon without verbs) still refuses
// its dma-bufs, saying so.
struct DeviceBuffers {
  bool yes = false;
  std::string why;
};
DeviceBuffers device_buffers_verdict(const TransportOffer& offer,
                                     const std::function<DeviceBuffers()>& probe_verbs_nic);

// "dpdk,tcp".
std::string encode_offer(const std::vector<std::string>& names);
// Refuses an empty offer, more than kMaxOfferNames names, a name that is empty, longer than
// kMaxOfferNameBytes or not made of [a-z0-9_-], and a name given twice.
Result<std::vector<std::string>> decode_offer(const std::string& text);

// The backend of the job: the first of offers[0] (host 0's) that every offer holds; kUnsupported
// naming every host's offer when they share none.
Result<std::string> agree_transport(const std::vector<std::vector<std::string>>& offers);

}  // namespace gw::daemon
