#include "daemon/transport_offer.h"

#include <fmt/format.h>

#include <algorithm>

namespace gw::daemon {

Result<TransportOffer> offer_transports(const std::string& configured,
                                        const std::function<Status(const std::string&)>& status_of,
                                        bool dpdk_port) {
  TransportOffer o;
  if (configured != "auto") {
    if (configured == "shm") {
      return invalid_arg(
          "gradwired: GW_DAEMON_TRANSPORT shm: the daemons of a job are on different hosts; "
          "shared memory does not cross hosts (auto, tcp, dpdk or verbs)");
    }
    Status s = status_of(configured);
    if (s.code() == Code::kInvalidArg) return s.with_context("gradwired: GW_DAEMON_TRANSPORT");
    if (!s.ok()) {
      return unsupported("gradwired: GW_DAEMON_TRANSPORT {} is unavailable here: {}", configured,
                         s.message());
    }
    o.names = {configured};
    o.reason = fmt::format("{} (GW_DAEMON_TRANSPORT)", configured);
    return o;
  }
  std::string why;
  Status verbs = status_of("verbs");
  if (verbs.ok()) {
    o.names.push_back("verbs");
    why += "verbs: an RDMA device answers";
  } else {
    why += fmt::format("verbs unavailable ({})", verbs.message());
  }
  Status dpdk = status_of("dpdk");
  if (!dpdk.ok()) {
    why += fmt::format("; dpdk unavailable ({})", dpdk.message());
  } else if (!dpdk_port) {
    why += "; dpdk: no port given (GW_DPDK_EAL_ARGS is empty)";
  } else {
    o.names.push_back("dpdk");
    why += "; dpdk: GW_DPDK_EAL_ARGS gives this daemon a port";
  }
  o.names.push_back("tcp");
  o.reason = fmt::format("auto offers {} ({})", encode_offer(o.names), why);
  return o;
}

DeviceBuffers device_buffers_verdict(const TransportOffer& offer,
                                     const std::function<DeviceBuffers()>& probe_verbs_nic) {
  DeviceBuffers d;
  if (std::find(offer.names.begin(), offer.names.end(), "verbs") == offer.names.end()) {
    d.why = fmt::format(
        "no: this daemon offers {} between hosts; device buffers (dma-bufs) need verbs "
        "(GW_DAEMON_TRANSPORT verbs, or auto with an RDMA device)",
        encode_offer(offer.names));
    return d;
  }
  const DeviceBuffers nic = probe_verbs_nic();
  d.yes = nic.yes;
  d.why = fmt::format("{}: {}", nic.yes ? "yes" : "no", nic.why);
  return d;
}

std::string encode_offer(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

Result<std::vector<std::string>> decode_offer(const std::string& text) {
  if (text.size() > kMaxOfferNames * (kMaxOfferNameBytes + 1)) {
    return invalid_arg("transport offer of {} bytes: too long", text.size());
  }
  std::vector<std::string> names;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string name =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.empty() || name.size() > kMaxOfferNameBytes) {
      return invalid_arg("transport offer '{}': a name is empty or longer than {} bytes", text,
                         kMaxOfferNameBytes);
    }
    for (char c : name) {
      if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) {
        return invalid_arg("transport offer: name '{}' has a character outside [a-z0-9_-]",
                           fmt::format("{:.{}}", name, kMaxOfferNameBytes));
      }
    }
    if (std::find(names.begin(), names.end(), name) != names.end()) {
      return invalid_arg("transport offer '{}': {} given twice", text, name);
    }
    names.push_back(name);
    if (names.size() > kMaxOfferNames) {
      return invalid_arg("transport offer: more than {} names", kMaxOfferNames);
    }
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

Result<std::string> agree_transport(const std::vector<std::vector<std::string>>& offers) {
  if (offers.empty()) return invalid_arg("agree_transport: no offers");
  for (const std::string& name : offers[0]) {
    bool everywhere = true;
    for (const auto& o : offers) {
      everywhere = everywhere && std::find(o.begin(), o.end(), name) != o.end();
    }
    if (everywhere) return name;
  }
  std::string all;
  for (size_t h = 0; h < offers.size(); ++h) {
    all += fmt::format("{}host {}: {}", h == 0 ? "" : "; ", h, encode_offer(offers[h]));
  }
  return unsupported(
      "the job's daemons share no transport ({}); set GW_DAEMON_TRANSPORT so they do, or "
      "leave it auto (every daemon then offers tcp)",
      all);
}

}  // namespace gw::daemon
