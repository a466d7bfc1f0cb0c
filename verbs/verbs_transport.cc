#include "verbs/verbs_transport.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>

#include "core/log.h"
#include "core/net/handshake.h"
#include "core/net/pending_accept.h"
#include "core/net/socket_util.h"
#include "core/net/tcp_config.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"
#include "verbs/device_select.h"
#include "verbs/verbs_comm.h"
#include "verbs/verbs_config.h"
#include "verbs/verbs_device.h"
#include "verbs/verbs_wire.h"

namespace gw::verbs {
namespace {

using sys::Deadline;
using UniqueFd = sys::Fd;

constexpr int64_t kRetryNs = 20 * 1000 * 1000;  // between connect() attempts on ECONNREFUSED

socklen_t sockaddr_len(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

bool retryable(int err) {
  return err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT || err == EHOSTUNREACH ||
         err == ENETUNREACH || err == EAGAIN;
}

Status configure(int fd) {
  GW_RETURN_IF_ERROR(sys::set_nonblocking(fd));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return ok_status();
}

// Moves a fixed-size message through a non-blocking socket across calls.
// Returns 1 when complete, 0 when it would block, -1 on EOF or error (errno set; 0 on EOF).
int pump_send(int fd, const void* buf, size_t len, size_t* done) {
  while (*done < len) {
    ssize_t n =
        send(fd, static_cast<const char*>(buf) + *done, len - *done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      return -1;
    }
    *done += static_cast<size_t>(n);
  }
  return 1;
}

int pump_recv(int fd, void* buf, size_t len, size_t* done) {
  while (*done < len) {
    ssize_t n = recv(fd, static_cast<char*>(buf) + *done, len - *done, MSG_DONTWAIT);
    if (n == 0) {
      errno = 0;
      return -1;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      return -1;
    }
    *done += static_cast<size_t>(n);
  }
  return 1;
}

std::string port_text(const PortWire& p) {
  ibv_gid gid;
  std::memcpy(gid.raw, p.gid, 16);
  return p.link_layer == IBV_LINK_LAYER_ETHERNET ? format_gid(gid) : fmt::format("LID {}", p.lid);
}

class VerbsListener final : public net::Listener {
 public:
  VerbsListener(UniqueFd fd, uint64_t nonce, std::shared_ptr<VerbsDevice> device,
                VerbsConfig config, net::TransportOptions options)
      : fd_(std::move(fd)),
        nonce_(nonce),
        device_(std::move(device)),
        config_(std::move(config)),
        options_(std::move(options)) {}

  Result<std::unique_ptr<net::RecvComm>> accept() override {
    // The handshakes already held move first, so a flood of new connections cannot push out one
    // that has spoken before it was read (with none held, new ones start in this call).
    std::vector<Pending>& pending = accepts_.held();
    if (pending.empty()) accept_new();
    for (size_t i = 0; i < pending.size(); ++i) {
      Result<std::unique_ptr<net::RecvComm>> r = advance(pending[i]);
      if (!pending[i].fd.valid()) {
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
        --i;
      }
      if (!r.ok()) return r.status();
      if (*r != nullptr) return r;
    }
    accept_new();
    return std::unique_ptr<net::RecvComm>();
  }

 private:
  enum class Phase { kHello, kReply, kReady };
  struct Pending {
    UniqueFd fd;
    std::string addr;
    Phase phase = Phase::kHello;
    HelloWire hello{};
    ReplyWire reply{};
    ReadyWire ready{};
    size_t io = 0;
    Deadline deadline{};
    std::unique_ptr<QpSet> qps;
    int64_t accepted_ns = 0;  // PendingAccept's: its grace period
    bool silent() const { return phase == Phase::kHello && io == 0; }
  };

  // New connections, under the policy of core/net/pending_accept.h. Never fails the caller.
  void accept_new() {
    (void)accepts_.accept_burst(
        fd_.get(), sys::now_ns(), [&](UniqueFd fd, const sockaddr_storage& addr) {
          Pending p;
          p.addr = net::format_sockaddr(reinterpret_cast<const sockaddr*>(&addr));
          p.deadline = sys::deadline_after_ms(options_.timeout_ms);
          (void)configure(fd.get());
          p.fd = std::move(fd);
          return std::optional<Pending>(std::move(p));
        });
  }

  void drop(Pending& p, std::string_view why) {
    GW_LOG_WARN("verbs accept: dropped connection from {}: {}", p.addr, why);
    p.fd.reset();
  }

  Result<std::unique_ptr<net::RecvComm>> advance(Pending& p) {
    std::unique_ptr<net::RecvComm> none;
    if (sys::expired(p.deadline)) {
      drop(p, "handshake not finished in time");
      return none;
    }
    if (p.phase == Phase::kHello) {
      int rc = pump_recv(p.fd.get(), &p.hello, sizeof(p.hello), &p.io);
      if (rc < 0) {
        p.fd.reset();  // the client went away mid-handshake
        return none;
      }
      if (rc == 0) return none;
      const HelloWire& h = p.hello;
      std::string_view why;
      if (std::memcmp(h.magic, "GWVH", 4) != 0 || h.version != kWireVersion) {
        why = "not a gradwire verbs handshake";
      } else if (h.nonce != nonce_) {
        why = "handshake for another listener (nonce mismatch)";
      } else if (options_.rank >= 0 && h.listener_rank != options_.rank) {
        why = "handshake meant for another rank";
      } else if (expected_peer() >= 0 && h.rank != expected_peer()) {
        why = "a rank other than the expected peer";
      } else if (h.nqps != static_cast<uint16_t>(config_.qps_per_conn)) {
        why = "GW_IB_QPS_PER_CONN differs between the two ends";
      }
      p.reply = ReplyWire{};
      std::memcpy(p.reply.magic, "GWVR", 4);
      p.reply.rank = options_.rank;
      p.io = 0;
      if (!why.empty()) {
        p.reply.accepted = 0;
        size_t done = 0;
        (void)pump_send(p.fd.get(), &p.reply, sizeof(p.reply), &done);
        drop(p, why);
        return none;
      }
      Result<std::unique_ptr<QpSet>> qps =
          QpSet::create(device_, config_, config_.qps_per_conn, /*receiver=*/true);
      if (!qps.ok()) return qps.status();
      p.qps = std::move(*qps);
      Status s = p.qps->connect(h.port, h.qpn);
      if (!s.ok()) {
        drop(p, s.to_string());
        return none;
      }
      Status fresh = net::handshake::fresh_nonce(&p.reply.challenge);
      if (!fresh.ok()) {
        drop(p, fresh.message());
        return none;
      }
      p.reply.proof = net::handshake::prove(options_.job_token, net::handshake::Role::kListener,
                                            verbs_transcript(h, p.reply.challenge));
      p.reply.accepted = 1;
      p.reply.nqps = static_cast<uint32_t>(p.qps->nqps());
      p.reply.port = p.qps->local_port();
      for (int i = 0; i < p.qps->nqps(); ++i) p.reply.qpn[i] = p.qps->qps()[i]->qp_num;
      p.phase = Phase::kReply;
    }
    if (p.phase == Phase::kReply) {
      int rc = pump_send(p.fd.get(), &p.reply, sizeof(p.reply), &p.io);
      if (rc < 0) {
        p.fd.reset();
        return none;
      }
      if (rc == 0) return none;
      p.phase = Phase::kReady;
      p.io = 0;
    }
    int rc = pump_recv(p.fd.get(), &p.ready, sizeof(p.ready), &p.io);
    if (rc < 0) {
      p.fd.reset();
      return none;
    }
    if (rc == 0) return none;
    if (p.ready.ready != kReady) {
      drop(p, "bad ready byte");
      return none;
    }
    // The sender's proof, checked before the comm exists (constant time).
    if (!net::handshake::verify(options_.job_token, net::handshake::Role::kConnector,
                                verbs_transcript(p.hello, p.reply.challenge),
                                p.ready.proof.data())) {
      drop(p, "job token mismatch (the sender did not prove the job token)");
      return none;
    }
    std::string peer = fmt::format("{} via verbs {} ({})", net::rank_name(p.hello.rank),
                                   port_text(p.hello.port), p.addr);
    auto comm =
        std::make_unique<VerbsRecvComm>(std::move(p.qps), std::move(p.fd), peer, p.hello.fifo_addr,
                                        p.hello.fifo_rkey, config_.use_inline);
    GW_RETURN_IF_ERROR(comm->init());
    return std::unique_ptr<net::RecvComm>(std::move(comm));
  }

  UniqueFd fd_;
  uint64_t nonce_;
  std::shared_ptr<VerbsDevice> device_;
  VerbsConfig config_;
  net::TransportOptions options_;
  net::PendingAccept<Pending> accepts_{"verbs"};
};

class VerbsConnector final : public net::Connector {
 public:
  VerbsConnector(const HandleWire& handle, sockaddr_storage addr,
                 std::shared_ptr<VerbsDevice> device, VerbsConfig config,
                 const net::TransportOptions& options)
      : addr_(addr),
        device_(std::move(device)),
        config_(std::move(config)),
        deadline_(sys::deadline_after_ms(options.timeout_ms)),
        timeout_ms_(options.timeout_ms),
        peer_(fmt::format("{} via verbs ({})", net::rank_name(handle.rank),
                          net::format_sockaddr(reinterpret_cast<const sockaddr*>(&addr)))) {
    hello_ = HelloWire{};
    std::memcpy(hello_.magic, "GWVH", 4);
    hello_.version = kWireVersion;
    hello_.nqps = static_cast<uint16_t>(config_.qps_per_conn);
    hello_.nonce = handle.nonce;
    hello_.rank = options.rank;
    hello_.listener_rank = handle.rank;
    token_ = options.job_token;
  }

  Status init() {
    GW_ASSIGN_OR_RETURN(qps_, QpSet::create(device_, config_, config_.qps_per_conn, false));
    fifo_.reset(new CtsWire[kFifoDepth]());
    GW_ASSIGN_OR_RETURN(fifo_reg_,
                        device_->acquire(fifo_.get(), sizeof(CtsWire) * kFifoDepth,
                                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE));
    hello_.port = qps_->local_port();
    for (int i = 0; i < qps_->nqps(); ++i) hello_.qpn[i] = qps_->qps()[i]->qp_num;
    hello_.fifo_addr = reinterpret_cast<uint64_t>(fifo_.get());
    hello_.fifo_rkey = fifo_reg_->mr->rkey;
    return net::handshake::fresh_nonce(&hello_.challenge);
  }

  ~VerbsConnector() override {
    if (fifo_reg_ != nullptr) {
      qps_.reset();
      device_->release(fifo_reg_);
    }
  }

  Result<std::unique_ptr<net::SendComm>> poll() override {
    if (!error_.ok()) return error_;
    if (returned_) return invalid_arg("poll: the connection to {} was already returned", peer_);
    Status s = advance();
    if (!s.ok()) {
      error_ = s;
      return error_;
    }
    if (phase_ == Phase::kDone) {
      returned_ = true;
      std::string peer =
          fmt::format("{} via verbs {} ({})", net::rank_name(reply_.rank), port_text(reply_.port),
                      net::format_sockaddr(reinterpret_cast<const sockaddr*>(&addr_)));
      GW_LOG_INFO("NET/gradwire verbs: connected to {}: {} QPs, MTU {}, {} control messages", peer,
                  qps_->nqps(), mtu_bytes(qps_->mtu()),
                  qps_->max_inline() >= sizeof(CtsWire) ? "inline" : "DMA-read");
      VerbsDevice::Registration* reg = fifo_reg_;
      fifo_reg_ = nullptr;
      return std::unique_ptr<net::SendComm>(std::make_unique<VerbsSendComm>(
          std::move(qps_), std::move(fd_), peer, std::move(fifo_), reg));
    }
    if (sys::expired(deadline_)) {
      error_ = timeout_error("connect to {}: no connection within {} ms ({})", peer_, timeout_ms_,
                             last_problem_.empty() ? "no answer" : last_problem_);
      fd_.reset();
      return error_;
    }
    return std::unique_ptr<net::SendComm>();
  }

 private:
  enum class Phase { kIdle, kConnecting, kHello, kReply, kReady, kDone };

  void retry_later(int err) {
    last_problem_ = fmt::format("last attempt: {}", strerror(err));
    fd_.reset();
    phase_ = Phase::kIdle;
    retry_at_ns_ = sys::now_ns() + kRetryNs;
  }

  Status advance() {
    while (true) {
      switch (phase_) {
        case Phase::kIdle: {
          if (sys::now_ns() < retry_at_ns_) return ok_status();
          int fd = socket(addr_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (fd < 0) return system_error("socket", errno);
          fd_.reset(fd);
          GW_RETURN_IF_ERROR(configure(fd));
          io_ = 0;
          if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr_), sockaddr_len(addr_)) == 0) {
            phase_ = Phase::kHello;
          } else if (errno == EINPROGRESS || errno == EINTR) {
            phase_ = Phase::kConnecting;
          } else if (retryable(errno)) {
            retry_later(errno);
            return ok_status();
          } else {
            return peer_error("connect to {}: {}", peer_, strerror(errno));
          }
          break;
        }
        case Phase::kConnecting: {
          pollfd pfd{fd_.get(), POLLOUT, 0};
          if (::poll(&pfd, 1, 0) == 0) return ok_status();
          int err = 0;
          socklen_t len = sizeof(err);
          if (getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          if (err == 0) {
            phase_ = Phase::kHello;
          } else if (retryable(err)) {
            retry_later(err);
            return ok_status();
          } else {
            return peer_error("connect to {}: {}", peer_, strerror(err));
          }
          break;
        }
        case Phase::kHello: {
          int rc = pump_send(fd_.get(), &hello_, sizeof(hello_), &io_);
          if (rc < 0) return peer_error("handshake with {}: {}", peer_, strerror(errno));
          if (rc == 0) return ok_status();
          phase_ = Phase::kReply;
          io_ = 0;
          break;
        }
        case Phase::kReply: {
          int rc = pump_recv(fd_.get(), &reply_, sizeof(reply_), &io_);
          if (rc < 0) {
            return peer_error("handshake with {}: {}", peer_,
                              errno == 0 ? "connection closed by the listener" : strerror(errno));
          }
          if (rc == 0) return ok_status();
          if (std::memcmp(reply_.magic, "GWVR", 4) != 0) {
            return peer_error("handshake with {}: not a gradwire verbs listener", peer_);
          }
          if (reply_.accepted != 1) {
            return peer_error(
                "handshake with {}: refused (job token mismatch, stale handle or "
                "different GW_IB_QPS_PER_CONN)",
                peer_);
          }
          // The receiver proves the token before this side writes anything more.
          if (!net::handshake::verify(token_, net::handshake::Role::kListener,
                                      verbs_transcript(hello_, reply_.challenge),
                                      reply_.proof.data())) {
            return net::handshake::listener_unproven_error(peer_);
          }
          ready_ = ReadyWire{};
          ready_.ready = kReady;
          ready_.proof = net::handshake::prove(token_, net::handshake::Role::kConnector,
                                               verbs_transcript(hello_, reply_.challenge));
          if (reply_.nqps != static_cast<uint32_t>(qps_->nqps())) {
            return peer_error("handshake with {}: {} QPs offered, {} expected", peer_, reply_.nqps,
                              qps_->nqps());
          }
          GW_RETURN_IF_ERROR(qps_->connect(reply_.port, reply_.qpn));
          phase_ = Phase::kReady;
          io_ = 0;
          break;
        }
        case Phase::kReady: {
          int rc = pump_send(fd_.get(), &ready_, sizeof(ready_), &io_);
          if (rc < 0) return peer_error("handshake with {}: {}", peer_, strerror(errno));
          if (rc == 0) return ok_status();
          phase_ = Phase::kDone;
          break;
        }
        case Phase::kDone:
          return ok_status();
      }
    }
  }

  sockaddr_storage addr_;
  std::shared_ptr<VerbsDevice> device_;
  VerbsConfig config_;
  Deadline deadline_;
  int64_t timeout_ms_;
  std::string peer_;
  HelloWire hello_{};
  ReplyWire reply_{};
  ReadyWire ready_{};
  std::string token_;
  Phase phase_ = Phase::kIdle;
  UniqueFd fd_;
  size_t io_ = 0;
  int64_t retry_at_ns_ = 0;
  std::string last_problem_;
  std::unique_ptr<QpSet> qps_;
  std::unique_ptr<CtsWire[]> fifo_;
  VerbsDevice::Registration* fifo_reg_ = nullptr;
  Status error_;
  bool returned_ = false;
};

class VerbsTransport final : public net::Transport {
 public:
  VerbsTransport(net::TransportOptions options, VerbsConfig config,
                 std::shared_ptr<VerbsDevice> device, net::Interface iface)
      : options_(std::move(options)),
        config_(std::move(config)),
        device_(std::move(device)),
        iface_(std::move(iface)) {
    props_.name = "verbs";
    props_.interfaces = device_->describe();
    // ibv_port_attr: width code 1/2/4/8/16 = 1x/4x/8x/12x/2x lanes; speed code -> Gb/s per lane.
    const ibv_port_attr& pa = device_->port_attr();
    int lanes = pa.active_width == 1    ? 1
                : pa.active_width == 2  ? 4
                : pa.active_width == 4  ? 8
                : pa.active_width == 8  ? 12
                : pa.active_width == 16 ? 2
                                        : 1;
    double lane = pa.active_speed == 1     ? 2.5
                  : pa.active_speed == 2   ? 5
                  : pa.active_speed == 4   ? 10
                  : pa.active_speed == 8   ? 10
                  : pa.active_speed == 16  ? 14
                  : pa.active_speed == 32  ? 25
                  : pa.active_speed == 64  ? 50
                  : pa.active_speed == 128 ? 100
                                           : 0;
    props_.speed_mbps = static_cast<int>(lanes * lane * 1000);
    props_.latency_us = 3;
    props_.bandwidth_gbps = props_.speed_mbps > 0 ? props_.speed_mbps / 8000.0 * 0.9 : 10;
    props_.sockets_per_conn = config_.qps_per_conn;
    props_.supports_cuda = false;
  }

  const net::Properties& properties() const override { return props_; }

  DeviceMemory device_memory() const override {
    using Mode = VerbsConfig::GpuDirect;
    DeviceMemory m;
    if (config_.gpudirect == Mode::kOff) {
      m.why = "GW_IB_GPUDIRECT=off";
      return m;
    }
    const VerbsDevice::GpuDirectSupport g = device_->gpudirect_support(config_);
    m.dmabuf = g.dmabuf && config_.gpudirect != Mode::kPeermem;
    m.reg = m.dmabuf || (g.peermem && config_.gpudirect != Mode::kDmabuf);
    m.why = g.why;
    return m;
  }

  NicDmabuf nic_dmabuf() const override {
    const VerbsDevice::DmabufProbe p = device_->dmabuf_probe();
    NicDmabuf n;
    n.ok = p.ok;
    n.why = p.why;
    return n;
  }

  Result<std::unique_ptr<net::Listener>> listen(net::Handle* handle) override {
    if (handle == nullptr) return invalid_arg("listen: null handle");
    int fd = socket(iface_.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return system_error("socket", errno);
    UniqueFd sock(fd);
    GW_RETURN_IF_ERROR(configure(fd));
    sockaddr_storage addr = iface_.addr;
    if (addr.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
    } else {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
    }
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sockaddr_len(addr)) != 0) {
      return system_error("verbs listen: bind", errno);
    }
    if (::listen(fd, SOMAXCONN) != 0) return system_error("verbs listen", errno);
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return system_error("getsockname", errno);
    }
    HandleWire h{};
    std::memcpy(h.magic, "GWV1", 4);
    h.version = kWireVersion;
    h.family = addr.ss_family;
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      h.port_be = a->sin_port;
      std::memcpy(h.addr, &a->sin_addr, 4);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      h.port_be = a->sin6_port;
      h.scope_id = a->sin6_scope_id;
      std::memcpy(h.addr, &a->sin6_addr, 16);
    }
    h.nonce = net::random_u64();
    h.rank = options_.rank;
    *handle = net::Handle{};
    std::memcpy(handle->bytes.data(), &h, sizeof(h));
    return std::unique_ptr<net::Listener>(
        std::make_unique<VerbsListener>(std::move(sock), h.nonce, device_, config_, options_));
  }

  Result<std::unique_ptr<net::Connector>> connect(const net::Handle& handle) override {
    HandleWire h;
    std::memcpy(&h, handle.bytes.data(), sizeof(h));
    if (std::memcmp(h.magic, "GWV1", 4) != 0 || h.version != kWireVersion ||
        (h.family != AF_INET && h.family != AF_INET6)) {
      return invalid_arg("verbs connect: the handle is not a verbs listener's handle");
    }
    sockaddr_storage addr{};
    if (h.family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      a->sin_family = AF_INET;
      a->sin_port = h.port_be;
      std::memcpy(&a->sin_addr, h.addr, 4);
    } else {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      a->sin6_family = AF_INET6;
      a->sin6_port = h.port_be;
      a->sin6_scope_id = h.scope_id;
      std::memcpy(&a->sin6_addr, h.addr, 16);
    }
    auto c = std::make_unique<VerbsConnector>(h, addr, device_, config_, options_);
    GW_RETURN_IF_ERROR(c->init());
    return std::unique_ptr<net::Connector>(std::move(c));
  }

 private:
  net::TransportOptions options_;
  VerbsConfig config_;
  std::shared_ptr<VerbsDevice> device_;
  net::Interface iface_;
  net::Properties props_;
};

}  // namespace

Result<std::unique_ptr<net::Transport>> make_verbs_transport(const net::TransportOptions& options) {
  sys::raise_descriptor_limit();
  if (options.timeout_ms <= 0) {
    return invalid_arg("verbs: timeout_ms must be positive (got {})", options.timeout_ms);
  }
  if (options.job_token.size() > kMaxToken) {
    return invalid_arg("verbs: job token of {} bytes is longer than {}", options.job_token.size(),
                       kMaxToken);
  }
  const config::Snapshot snapshot =
      options.config.empty() ? config::Snapshot::capture() : options.config;
  GW_ASSIGN_OR_RETURN(VerbsConfig config, load_verbs_config(snapshot));
  GW_ASSIGN_OR_RETURN(std::shared_ptr<VerbsDevice> device, VerbsDevice::open(config));
  GW_ASSIGN_OR_RETURN(std::vector<net::Interface> all, net::list_interfaces());
  GW_ASSIGN_OR_RETURN(
      net::Interface iface,
      net::select_interface(snapshot.get_string(net::tcp_config::kSocketIfname), all));
  return std::unique_ptr<net::Transport>(
      std::make_unique<VerbsTransport>(options, std::move(config), std::move(device), iface));
}

Status probe_verbs() {
  // The emulator is always there; the library and its devices are looked for once per process
  // (the probe runs for every peer that `auto` places).
  if (config::get_bool(verbs_config::kVerbsEmulate)) return ok_status();
  static const Status* const found = [] {
    Result<const IbvTable*> ibv = ibv_table(false);
    if (!ibv.ok()) return new Status(Code::kUnsupported, ibv.status().message());
    return new Status(rdma_devices_present(**ibv));
  }();
  return *found;
}

net::Backend verbs_backend() {
  net::Backend b;
  b.name = "verbs";
  b.summary = "RDMA verbs: InfiniBand or RoCE, RC queue pairs";
  b.probe = &probe_verbs;
  b.factory = &make_verbs_transport;
  b.auto_priority = 30;  // above tcp (10) across hosts
  b.auto_within_host = false;
  b.auto_across_hosts = true;
  return b;
}

}  // namespace gw::verbs
