// The net_af_xdp vdevs of DPDK EAL arguments, read without DPDK: the engine's port
// (dpdk_port.cc, which adds one ethdev per further receive queue of the vdev's interface) and
// `gradwire-perf doctor` (which says whether a port will hear every queue) read them with this
// one parser, so the two never disagree on a spelling or on the number of queues a port takes.
// Header-only and free of libdpdk, so that perf/ builds it on a host without DPDK.
#pragma once

#include <cstddef>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace gw::dpdk {

// The most receive queues an AF_XDP port takes (one ethdev each, 2048 umem buffers each in the
// fill ring of its queue): an interface with more is told to have fewer.
inline constexpr size_t kAfXdpMaxQueues = 16;

// EAL arguments as words: split on whitespace, no quoting (what rte_eal_init is given).
inline std::vector<std::string> split_eal_args(const std::string& args) {
  std::istringstream in(args);
  std::vector<std::string> out;
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

// The value of `key` in a vdev argument string "iface=d0,framesz=9216", or "".
inline std::string devarg(const std::string& args, const std::string& key) {
  std::istringstream in(args);
  std::string kv;
  while (std::getline(in, kv, ',')) {
    if (kv.rfind(key + "=", 0) == 0) return kv.substr(key.size() + 1);
  }
  return "";
}

// The first receive queue of a net_af_xdp vdev's arguments: its start_queue, else "0".
inline std::string af_xdp_first_queue(const std::string& args) {
  const std::string q = devarg(args, "start_queue");
  return q.empty() ? "0" : q;
}

// One net_af_xdp vdev of the EAL arguments ("--vdev net_af_xdp0,iface=eth1,start_queue=2" or
// "--vdev=...").
struct AfXdpVdev {
  std::string name;  // the ethdev's name: "net_af_xdp0"
  std::string args;  // what follows the name's comma: "iface=eth1,start_queue=2"
  std::string iface;
  // start_queue= or queue_count= given: the port holds what it names, no further queue is added.
  bool names_queue = false;
  std::string first_queue() const { return af_xdp_first_queue(args); }
};

// Every net_af_xdp vdev of EAL argument words, in order; other words are skipped.
inline std::vector<AfXdpVdev> af_xdp_vdevs(const std::vector<std::string>& words) {
  std::vector<AfXdpVdev> out;
  for (size_t i = 0; i < words.size(); ++i) {
    std::string spec;
    if (words[i] == "--vdev" && i + 1 < words.size()) {
      spec = words[++i];
    } else if (words[i].rfind("--vdev=", 0) == 0) {
      spec = words[i].substr(7);
    } else {
      continue;
    }
    if (spec.rfind("net_af_xdp", 0) != 0) continue;
    AfXdpVdev v;
    const size_t comma = spec.find(',');
    v.name = spec.substr(0, comma);
    v.args = comma == std::string::npos ? "" : spec.substr(comma + 1);
    v.iface = devarg(v.args, "iface");
    v.names_queue =
        !devarg(v.args, "start_queue").empty() || !devarg(v.args, "queue_count").empty();
    out.push_back(std::move(v));
  }
  return out;
}

// The name of the ethdev added for queue `q` of an AF_XDP vdev: "<vdev>q<q>".
inline std::string af_xdp_queue_vdev(const std::string& vdev, size_t q) {
  return vdev + "q" + std::to_string(q);
}

// The queue an ethdev named by af_xdp_queue_vdev(vdev, q) was added for: q when `name` is
// "<vdev>q<q>" with 1 <= q < kAfXdpMaxQueues spelled without leading zeros, else nothing.
inline std::optional<size_t> af_xdp_queue_of(const std::string& name, const std::string& vdev) {
  if (name.size() < vdev.size() + 2 || name.compare(0, vdev.size(), vdev) != 0 ||
      name[vdev.size()] != 'q') {
    return std::nullopt;
  }
  const std::string digits = name.substr(vdev.size() + 1);
  if (digits.size() > 4 || digits[0] == '0') return std::nullopt;
  size_t q = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    q = q * 10 + static_cast<size_t>(c - '0');
  }
  if (q < 1 || q >= kAfXdpMaxQueues) return std::nullopt;
  return q;
}

}  // namespace gw::dpdk
