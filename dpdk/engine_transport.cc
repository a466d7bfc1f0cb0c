#include "dpdk/engine_transport.h"

#include <arpa/inet.h>

#include <cstring>
#include <mutex>
#include <unordered_set>

#include "core/config.h"
#include "core/log.h"
#include "core/net/comm_adapter.h"
#include "core/net/handshake.h"
#include "dpdk/dpdk_config.h"

namespace gw::dpdk {

namespace {

constexpr uint32_t kHandleMagic = 0x47574448;  // "GWDH"

struct Req;  // requests are the engine's; the pointer is only passed through

net::Request* to_req(void* p) { return reinterpret_cast<net::Request*>(p); }

// A registered region: its counter tells how many zero-copy frames still point into it.
class Mr : public net::MemRegion {
 public:
  TxRefHandle zc = TxRefHandle::make();
};

// What both directions of an engine connection share; the comms forward to it
// (core/net/comm_adapter.h).
class CommBase {
 public:
  Result<net::MemRegion*> reg_mr(void* data, size_t size, net::MemType type) {
    if (type != net::MemType::kHost) {
      return unsupported(
          "dpdk reg_mr: only host memory can be registered (CUDA memory must be "
          "staged)");
    }
    if (data == nullptr && size > 0) return invalid_arg("dpdk reg_mr: null buffer");
    auto mr = std::make_unique<Mr>();
    mr->base = data;
    mr->size = size;
    mr->type = type;
    net::MemRegion* raw = mr.get();
    std::lock_guard<std::mutex> lock(mr_mu_);
    mrs_.insert(mr.release());
    return raw;
  }
  Status dereg_mr(net::MemRegion* mr) {
    if (mr == nullptr) return invalid_arg("dpdk dereg_mr: null region");
    TxRef* zc = nullptr;
    {
      std::lock_guard<std::mutex> lock(mr_mu_);
      auto it = mrs_.find(mr);  // no cast: mr may be a stale pointer (bad input)
      if (it == mrs_.end()) {
        return invalid_arg("dpdk dereg_mr: region is not registered with this comm (or released)");
      }
      zc = static_cast<Mr*>(*it)->zc.get();
    }
    // Zero-copy frames may still point into the region (a send in flight, a PMD that frees
    // lazily): the region is released only once the port let go of all of them. On timeout it
    // stays registered, so the caller knows the memory may still be read.
    if (zc->frames() > 0) {
      GW_RETURN_IF_ERROR(engine_->wait_released(
          zc, timeout_ms_,
          fmt::format("dpdk dereg_mr of {} bytes on {}", mr->size, engine_->peer_name(id_))));
    }
    std::lock_guard<std::mutex> lock(mr_mu_);
    auto it = mrs_.find(mr);
    if (it == mrs_.end()) {
      return invalid_arg("dpdk dereg_mr: region is not registered with this comm (or released)");
    }
    delete static_cast<Mr*>(*it);
    mrs_.erase(it);
    return ok_status();
  }
  Status test(net::Request* request, bool* done, size_t* size) {
    if (request == nullptr || done == nullptr || size == nullptr) {
      return invalid_arg("dpdk test: null argument");
    }
    return engine_->test(id_, request, done, size);
  }
  std::string peer_name() const { return engine_->peer_name(id_); }

 protected:
  CommBase(std::shared_ptr<Engine> e, uint32_t id, int64_t timeout_ms)
      : engine_(std::move(e)), id_(id), timeout_ms_(timeout_ms) {}
  ~CommBase() {
    engine_->close_conn(id_);
    for (net::MemRegion* mr : mrs_) delete static_cast<Mr*>(mr);
  }
  // The region's zero-copy counter (null when `mr` is null; check_mr validated it).
  TxRef* region_ref(net::MemRegion* mr) {
    return mr == nullptr ? nullptr : static_cast<Mr*>(mr)->zc.get();
  }
  Status check_args(const void* data, size_t size, int tag, bool any_tag_ok, net::MemRegion* mr,
                    const char* op) {
    if (data == nullptr && size > 0)
      return invalid_arg("dpdk {}: null buffer of {} bytes", op, size);
    if (tag < 0 && !(any_tag_ok && tag == net::kAnyTag)) {
      return invalid_arg("dpdk {}: tag {} is negative{}", op, tag,
                         any_tag_ok ? " (only kAnyTag)" : "");
    }
    return check_mr(data, size, mr);
  }
  Status check_mr(const void* data, size_t size, net::MemRegion* mr) {
    if (mr == nullptr) return ok_status();
    {
      std::lock_guard<std::mutex> lock(mr_mu_);
      if (!mrs_.count(mr)) {
        return invalid_arg("dpdk: memory region is not registered with this comm");
      }
    }
    const auto* b = static_cast<const uint8_t*>(mr->base);
    const auto* d = static_cast<const uint8_t*>(data);
    if (size > 0 && (d < b || d + size > b + mr->size)) {
      return invalid_arg("dpdk: buffer of {} bytes lies outside its registered region", size);
    }
    return ok_status();
  }
  std::shared_ptr<Engine> engine_;
  uint32_t id_;
  int64_t timeout_ms_;
  std::mutex mr_mu_;
  std::unordered_set<net::MemRegion*> mrs_;  // owned (Mr); freed with the comm
};

class DpdkSendCore : public CommBase {
 public:
  DpdkSendCore(std::shared_ptr<Engine> e, uint32_t id, int64_t timeout_ms)
      : CommBase(std::move(e), id, timeout_ms) {}
  Result<net::Request*> isend(const void* data, size_t size, int tag, net::MemRegion* mr) {
    GW_RETURN_IF_ERROR(check_args(data, size, tag, false, mr, "isend"));
    GW_ASSIGN_OR_RETURN(void* r, engine_->isend(id_, data, size, tag, region_ref(mr)));
    return to_req(r);
  }
};

class DpdkRecvCore : public CommBase {
 public:
  DpdkRecvCore(std::shared_ptr<Engine> e, uint32_t id, int64_t timeout_ms)
      : CommBase(std::move(e), id, timeout_ms) {}
  Result<net::Request*> irecv(void* data, size_t size, int tag, net::MemRegion* mr) {
    GW_RETURN_IF_ERROR(check_args(data, size, tag, true, mr, "irecv"));
    GW_ASSIGN_OR_RETURN(void* r, engine_->irecv(id_, data, size, tag));
    return to_req(r);
  }
};

using DpdkSendComm = net::SendCommAdapter<DpdkSendCore>;
using DpdkRecvComm = net::RecvCommAdapter<DpdkRecvCore>;

class DpdkListener : public net::Listener {
 public:
  DpdkListener(std::shared_ptr<Engine> e, uint32_t id, int64_t timeout_ms)
      : engine_(std::move(e)), id_(id), timeout_ms_(timeout_ms) {}
  ~DpdkListener() override { engine_->close_listener(id_); }
  Result<std::unique_ptr<net::RecvComm>> accept() override {
    GW_ASSIGN_OR_RETURN(uint32_t conn, engine_->accept(id_));
    if (conn == 0) return std::unique_ptr<net::RecvComm>();
    engine_->set_peer_timeout(conn,
                              std::min<int64_t>(timeout_ms_, engine_->config().peer_timeout_ms));
    return std::unique_ptr<net::RecvComm>(new DpdkRecvComm(engine_, conn, timeout_ms_));
  }

 protected:
  // The engine runs the handshakes in its progress loop, so it checks the rank itself.
  void on_expect_peer(int rank) override { engine_->expect_peer(id_, rank); }

 private:
  std::shared_ptr<Engine> engine_;
  uint32_t id_;
  int64_t timeout_ms_;
};

class DpdkConnector : public net::Connector {
 public:
  DpdkConnector(std::shared_ptr<Engine> e, uint32_t id, int64_t timeout_ms)
      : engine_(std::move(e)), id_(id), timeout_ms_(timeout_ms) {}
  ~DpdkConnector() override {
    if (id_ != 0) engine_->close_conn(id_);
  }
  Result<std::unique_ptr<net::SendComm>> poll() override {
    if (id_ == 0) return invalid_arg("dpdk connector: poll after the connection was returned");
    GW_ASSIGN_OR_RETURN(bool ready, engine_->connect_poll(id_));
    if (!ready) return std::unique_ptr<net::SendComm>();
    uint32_t id = id_;
    id_ = 0;
    return std::unique_ptr<net::SendComm>(new DpdkSendComm(engine_, id, timeout_ms_));
  }

 private:
  std::shared_ptr<Engine> engine_;
  uint32_t id_;
  int64_t timeout_ms_;
};

class DpdkTransport : public net::Transport {
 public:
  DpdkTransport(std::shared_ptr<Engine> e, const net::TransportOptions& o)
      : engine_(std::move(e)), options_(o) {
    props_.name = "dpdk";
    props_.interfaces = fmt::format("{}:{}", engine_->port_name(), format_ip(engine_->local().ip));
    props_.speed_mbps = static_cast<int>(engine_->config().link_gbps * 1000);
    props_.latency_us = 20;
    props_.bandwidth_gbps = engine_->config().link_gbps / 8;
  }
  const net::Properties& properties() const override { return props_; }
  Result<std::unique_ptr<net::Listener>> listen(net::Handle* handle) override {
    if (handle == nullptr) return invalid_arg("dpdk listen: null handle");
    uint32_t id = engine_->listen(options_.job_token, options_.rank);
    encode_handle(ConnectTarget{engine_->local(), id, options_.rank < 0 ? -1 : options_.rank},
                  handle);
    return std::unique_ptr<net::Listener>(new DpdkListener(engine_, id, options_.timeout_ms));
  }
  Result<std::unique_ptr<net::Connector>> connect(const net::Handle& handle) override {
    GW_ASSIGN_OR_RETURN(ConnectTarget t, decode_handle(handle));
    std::string label = options_.rank >= 0 ? fmt::format("rank {}", options_.rank) : "";
    uint32_t id =
        engine_->connect(t, options_.job_token, options_.timeout_ms, label, options_.rank);
    return std::unique_ptr<net::Connector>(new DpdkConnector(engine_, id, options_.timeout_ms));
  }

 private:
  std::shared_ptr<Engine> engine_;
  net::TransportOptions options_;
  net::Properties props_;
};

}  // namespace

void encode_handle(const ConnectTarget& t, net::Handle* handle) {
  handle->bytes.fill(0);
  uint8_t* p = handle->bytes.data();
  uint32_t magic = htonl(kHandleMagic);
  std::memcpy(p, &magic, 4);
  p[4] = kVersion;
  std::memcpy(p + 8, t.ep.mac.data(), 6);
  uint32_t ip = htonl(t.ep.ip);
  std::memcpy(p + 16, &ip, 4);
  uint16_t port = htons(t.ep.port);
  std::memcpy(p + 20, &port, 2);
  uint32_t lid = htonl(t.listener_id);
  std::memcpy(p + 24, &lid, 4);
  uint32_t rank = htonl(static_cast<uint32_t>(t.listener_rank));
  std::memcpy(p + 28, &rank, 4);
}

Result<ConnectTarget> decode_handle(const net::Handle& handle) {
  const uint8_t* p = handle.bytes.data();
  uint32_t magic, ip, lid;
  uint16_t port;
  std::memcpy(&magic, p, 4);
  if (ntohl(magic) != kHandleMagic || p[4] != kVersion) {
    return invalid_arg("dpdk connect: the handle was not made by a dpdk listener");
  }
  ConnectTarget t;
  std::memcpy(t.ep.mac.data(), p + 8, 6);
  std::memcpy(&ip, p + 16, 4);
  std::memcpy(&port, p + 20, 2);
  std::memcpy(&lid, p + 24, 4);
  uint32_t rank;
  std::memcpy(&rank, p + 28, 4);
  t.listener_rank = static_cast<int32_t>(ntohl(rank));
  if (t.listener_rank < -1)
    return invalid_arg("dpdk connect: handle names rank {}", t.listener_rank);
  t.ep.ip = ntohl(ip);
  t.ep.port = ntohs(port);
  t.listener_id = ntohl(lid);
  if (t.listener_id == 0) return invalid_arg("dpdk connect: handle names no listener");
  return t;
}

Result<EngineConfig> engine_config_from_table(const MacAddr& mac) {
  GW_RETURN_IF_ERROR(config::validate());
  EngineConfig c;
  const std::string ip = config::get_string(dpdk_config::kDpdkIp);
  if (ip.empty()) {
    c.ip = (10u << 24) | (static_cast<uint32_t>(mac[3]) << 16) |
           (static_cast<uint32_t>(mac[4]) << 8) | mac[5];
  } else {
    in_addr a;
    if (inet_pton(AF_INET, ip.c_str(), &a) != 1) {
      return invalid_arg("GW_DPDK_IP '{}' is not an IPv4 address", ip);
    }
    c.ip = ntohl(a.s_addr);
  }
  const int64_t port = config::get_int(dpdk_config::kDpdkUdpPort);
  if (port <= 0 || port > 65535) return invalid_arg("GW_DPDK_UDP_PORT {} out of range", port);
  c.udp_port = static_cast<uint16_t>(port);
  c.mtu = static_cast<size_t>(config::get_int(dpdk_config::kDpdkMtu));
  c.window = static_cast<int>(config::get_int(dpdk_config::kDpdkWindow));
  c.max_window = static_cast<int>(config::get_int(dpdk_config::kDpdkMaxWindow));
  if (c.max_window < 32 || c.max_window > 4000) {
    return invalid_arg("GW_DPDK_MAX_WINDOW {} out of range 32..4000", c.max_window);
  }
  c.link_gbps = config::get_double(dpdk_config::kDpdkLinkGbps);
  if (!(c.link_gbps > 0)) return invalid_arg("GW_DPDK_LINK_GBPS must be > 0");
  c.rto_min_us = config::get_int(dpdk_config::kDpdkRtoUs);
  c.heartbeat_ms = config::get_int(dpdk_config::kDpdkHeartbeatMs);
  c.peer_timeout_ms = config::get_int(dpdk_config::kDpdkPeerTimeoutMs);
  c.burst = static_cast<int>(config::get_int(dpdk_config::kDpdkBurst));
  c.progress_interval_us = config::get_int(dpdk_config::kDpdkProgressUs);
  c.eager = config::get_bool(dpdk_config::kDpdkEager);
  c.max_pending_handshakes = static_cast<int>(net::handshake::max_pending());
  if (c.rto_min_us <= 0 || c.heartbeat_ms <= 0 || c.peer_timeout_ms <= c.heartbeat_ms) {
    return invalid_arg(
        "GW_DPDK_RTO_US, GW_DPDK_HEARTBEAT_MS must be > 0 and "
        "GW_DPDK_PEER_TIMEOUT_MS > GW_DPDK_HEARTBEAT_MS");
  }
  c.faults.loss = config::get_double(dpdk_config::kDpdkInjectLoss);
  c.faults.reorder = config::get_double(dpdk_config::kDpdkInjectReorder);
  c.faults.dup = config::get_double(dpdk_config::kDpdkInjectDup);
  c.faults.seed = static_cast<uint64_t>(config::get_int(dpdk_config::kDpdkInjectSeed));
  return c;
}

std::unique_ptr<net::Transport> make_engine_transport(std::shared_ptr<Engine> engine,
                                                      const net::TransportOptions& options) {
  // Callers (make_dpdk_transport, tests) pass valid options; make_dpdk_transport checks them.
  return std::make_unique<DpdkTransport>(std::move(engine), options);
}

}  // namespace gw::dpdk
