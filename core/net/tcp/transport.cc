// The tcp backend's factory: options, interface choice, listen() and connect() (the handle).
// The parts: wire.h (wire structs), socket.{h,cc}, comm_core.{h,cc} (what both directions share:
// the I/O workers and the progress loop), send.cc, recv.cc, listener.cc, connector.cc.
#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include "core/config.h"
#include "core/log.h"
#include "core/net/handshake.h"
#include "core/net/socket_util.h"
#include "core/net/tcp/connector.h"
#include "core/net/tcp/listener.h"
#include "core/net/tcp/socket.h"
#include "core/net/tcp/wire.h"
#include "core/net/tcp_config.h"
#include "core/net/tcp_transport.h"
#include "core/sys/fd.h"

namespace gw::net {

StripeRange tcp_stripe(size_t size, int nsocks, size_t unit, int index) {
  size_t n = static_cast<size_t>(std::max(nsocks, 1));
  size_t part = std::max(unit, (size + n - 1) / n);
  size_t begin = std::min(size, part * static_cast<size_t>(index));
  size_t end = std::min(size, begin + part);
  return {begin, end};
}

namespace tcp {
namespace {

using sys::Fd;

class TcpTransport final : public Transport {
 public:
  TcpTransport(TransportOptions options, TcpConfig config, Interface iface)
      : options_(std::move(options)), config_(config), iface_(std::move(iface)) {
    props_.name = "tcp";
    std::string ip = format_sockaddr(reinterpret_cast<const sockaddr*>(&iface_.addr));
    ip = ip.substr(0, ip.rfind(':'));  // drop the port
    props_.interfaces = fmt::format("{}:{}", iface_.name, ip);
    props_.sockets_per_conn = config_.nsocks;
    props_.io_threads = std::min(config_.threads, config_.nsocks);
    props_.speed_mbps = read_link_speed(iface_.name);
    props_.latency_us = 30;
    // Loopback and unknown links: what this path measures on a small box; else ~90% of line rate.
    props_.bandwidth_gbps =
        iface_.loopback || props_.speed_mbps == 0 ? 2.0 : props_.speed_mbps / 8000.0 * 0.9;
    props_.supports_cuda = false;
  }

  const Properties& properties() const override { return props_; }

  Result<std::unique_ptr<Listener>> listen(Handle* handle) override {
    if (handle == nullptr) return invalid_arg("tcp listen: null handle");
    int fd = socket(iface_.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return system_error("tcp listen: socket", errno);
    Fd owned(fd);
    // Accepted sockets inherit the buffer sizes (they must be set before listen()) and busy
    // polling.
    GW_RETURN_IF_ERROR(configure_socket(fd, config_.bufsize, config_.busy_poll_us));
    sockaddr_storage addr = iface_.addr;
    if (addr.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
    } else {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
    }
    std::string where = fmt::format("{} ({})", props_.interfaces, iface_.name);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sockaddr_len(addr)) != 0) {
      return system_error(fmt::format("tcp listen: bind {}", where), errno);
    }
    if (::listen(fd, SOMAXCONN) != 0) return system_error("tcp listen: listen", errno);
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return system_error("tcp listen: getsockname", errno);
    }
    HandleWire wire{};
    handshake::put_magic(wire.magic, "GWT1");
    wire.version = kVersion;
    wire.nsocks = static_cast<uint16_t>(config_.nsocks);
    wire.family = addr.ss_family;
    if (addr.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
      wire.port_be = in->sin_port;
      std::memcpy(wire.addr, &in->sin_addr, 4);
    } else {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
      wire.port_be = in6->sin6_port;
      wire.scope_id = in6->sin6_scope_id;
      std::memcpy(wire.addr, &in6->sin6_addr, 16);
    }
    wire.nonce = random_u64();
    wire.rank = options_.rank;
    *handle = Handle{};
    std::memcpy(handle->bytes.data(), &wire, sizeof(wire));
    GW_LOG_DEBUG("tcp listening on {}", format_sockaddr(reinterpret_cast<sockaddr*>(&addr)));
    return make_listener(std::move(owned), wire.nonce, config_, options_);
  }

  Result<std::unique_ptr<Connector>> connect(const Handle& handle) override {
    HandleWire wire;
    std::memcpy(&wire, handle.bytes.data(), sizeof(wire));
    GW_RETURN_IF_ERROR(handshake::check_handle("tcp", wire.magic, "GWT1", wire.version, kVersion));
    if (wire.nsocks < 1 || wire.nsocks > 16) {
      return invalid_arg("tcp connect: handle asks for {} sockets (1-16)", wire.nsocks);
    }
    sockaddr_storage addr{};
    if (wire.family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&addr);
      in->sin_family = AF_INET;
      in->sin_port = wire.port_be;
      std::memcpy(&in->sin_addr, wire.addr, 4);
    } else if (wire.family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = wire.port_be;
      in6->sin6_scope_id = wire.scope_id;
      std::memcpy(&in6->sin6_addr, wire.addr, 16);
    } else {
      return invalid_arg("tcp connect: handle has address family {}", wire.family);
    }
    if (wire.port_be == 0) return invalid_arg("tcp connect: handle has port 0");
    return make_connector(wire, addr, config_, options_);
  }

 private:
  TransportOptions options_;
  TcpConfig config_;
  Interface iface_;
  Properties props_;
};

}  // namespace
}  // namespace tcp

Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportOptions& options) {
  sys::raise_descriptor_limit();
  const config::Snapshot settings =
      options.config.empty() ? config::Snapshot::capture() : options.config;
  tcp::TcpConfig cfg;
  int64_t nsocks = settings.get_int(net::tcp_config::kSocketNsocks);
  if (nsocks < 0 || nsocks > 16) {
    return invalid_arg("GW_SOCKET_NSOCKS={} is out of range (0 = auto, 1-16)", nsocks);
  }
  int64_t threads = settings.get_int(net::tcp_config::kSocketNthreads);
  if (threads < -1 || threads > 16) {
    return invalid_arg("GW_SOCKET_NTHREADS={} is out of range (-1 = none, 0 = auto, 1-16)",
                       threads);
  }
  if (options.socket_threads < 0 || options.socket_threads > 16 || options.socket_nsocks < 0 ||
      options.socket_nsocks > 16) {
    return invalid_arg("tcp: socket_threads {} / socket_nsocks {} out of range (0-16)",
                       options.socket_threads, options.socket_nsocks);
  }
  // An explicit GW_SOCKET_NTHREADS wins; auto (0) takes the caller's policy (the Communicator
  // keeps 0, the caller's thread; the NCCL plugin chooses from the host, plugin/net_plugin.cc).
  cfg.threads =
      threads > 0 ? static_cast<int>(threads) : (threads == 0 ? options.socket_threads : 0);
  cfg.bufsize = settings.get_int(net::tcp_config::kSocketBufsize);
  if (cfg.bufsize < 0 || cfg.bufsize > (int64_t{1} << 30)) {
    return invalid_arg("GW_SOCKET_BUFSIZE={} is out of range (0-1G)", cfg.bufsize);
  }
  int64_t chunk = settings.get_int(net::tcp_config::kSocketChunk);
  if (chunk < 4096 || chunk > (int64_t{1} << 30)) {
    return invalid_arg("GW_SOCKET_CHUNK={} is out of range (4K-1G)", chunk);
  }
  cfg.chunk = static_cast<size_t>(chunk);
  GW_ASSIGN_OR_RETURN(cfg.zerocopy,
                      tcp::parse_zc_mode(settings.get_string(net::tcp_config::kSocketZerocopy)));
  int64_t zc_min = settings.get_int(net::tcp_config::kSocketZerocopyMin);
  if (zc_min < 0 || zc_min > (int64_t{1} << 40)) {
    return invalid_arg("GW_SOCKET_ZEROCOPY_MIN={} is out of range (0-1T)", zc_min);
  }
  cfg.zerocopy_min = static_cast<size_t>(zc_min);
  const int64_t busy_poll = settings.get_int(net::tcp_config::kSocketBusyPoll);
  if (busy_poll < 0 || busy_poll > 1000000) {
    return invalid_arg("GW_SOCKET_BUSY_POLL={} is out of range (0 = off, 1-1000000 us)", busy_poll);
  }
  cfg.busy_poll_us = static_cast<int>(busy_poll);
  if (cfg.busy_poll_us > 0) {
    // Said once per process and setting: a transport is made per communicator.
    static std::mutex said_mu;
    static int said = 0;
    Status can = tcp::probe_busy_poll(cfg.busy_poll_us);
    std::lock_guard<std::mutex> lock(said_mu);
    if (!can.ok()) {
      if (said != -cfg.busy_poll_us) {
        GW_LOG_WARN(
            "tcp: GW_SOCKET_BUSY_POLL={}: the kernel refuses it ({}): sockets are not busy-polled "
            "(above net.core.busy_read, now {}, it needs CAP_NET_ADMIN; or raise that sysctl, "
            "which busy-polls every socket of the host)",
            cfg.busy_poll_us, can.message(), tcp::read_busy_read());
        said = -cfg.busy_poll_us;
      }
      cfg.busy_poll_us = 0;
    } else if (said != cfg.busy_poll_us) {
      GW_LOG_INFO(
          "tcp: busy-polling every socket {} us (GW_SOCKET_BUSY_POLL: SO_BUSY_POLL, "
          "SO_PREFER_BUSY_POLL); it helps where packets arrive through a NAPI context (a NIC "
          "queue, a veth with XDP), not over loopback",
          cfg.busy_poll_us);
      said = cfg.busy_poll_us;
    }
  }
  GW_RETURN_IF_ERROR(handshake::check_options("tcp", options));
  GW_ASSIGN_OR_RETURN(std::vector<Interface> all, list_interfaces());
  // The interface that routes to the store's host, as NCCL follows the route to its bootstrap
  // address; without a store (or a route) the first one that is up.
  std::optional<sockaddr_storage> route;
  if (!options.route_host.empty()) {
    auto src = route_source(options.route_host);
    if (src.ok()) {
      route = *src;
    } else {
      GW_LOG_DEBUG("tcp: no route to the store's host ({}): the first interface that is up",
                   src.status().to_string());
    }
  }
  GW_ASSIGN_OR_RETURN(Interface iface,
                      select_interface(settings.get_string(net::tcp_config::kSocketIfname), all,
                                       route ? &*route : nullptr));
  // Auto: striping pays on links a single TCP stream cannot fill (>= 25 Gb/s). Elsewhere, and
  // over loopback or between ranks of one host, extra sockets only add wake-ups and cold copies
  // (docs/perf.md, "Why the defaults"). NCCL's Socket transport also defaults to one socket per
  // connection.
  int link_mbps = iface.loopback ? 0 : tcp::read_link_speed(iface.name);
  cfg.nsocks = nsocks > 0                  ? static_cast<int>(nsocks)
               : options.socket_nsocks > 0 ? options.socket_nsocks
                                           : (link_mbps >= 25000 ? 4 : 1);
  return std::unique_ptr<Transport>(std::make_unique<tcp::TcpTransport>(options, cfg, iface));
}

Backend tcp_backend() {
  Backend b;
  b.name = "tcp";
  b.summary = "TCP sockets";
  b.factory = &make_tcp_transport;
  b.auto_priority = 10;  // below shm within a host
  b.auto_within_host = true;
  b.auto_across_hosts = true;
  return b;
}

}  // namespace gw::net
