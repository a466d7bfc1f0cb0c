#include "dpdk/engine.h"

#include <fmt/format.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <random>
#include <thread>

#include "core/log.h"
#include "core/net/handshake.h"
#include "core/net/transport.h"

namespace gw::dpdk {

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The wire timestamp: microseconds, wrapping at 2^32, never 0 (0 means "none").
uint32_t wire_ts(int64_t ns) {
  const uint32_t us = static_cast<uint32_t>(ns / 1000);
  return us == 0 ? 1 : us;
}

// Receive-side sequence tracking window (bits); bounds the send window too.
constexpr uint32_t kRcvWindow = 4096;
constexpr int kFastRetxThreshold = 3;  // SACKed packets above a hole before it is resent
// A receiver acknowledges at once on a gap, a duplicate, the last fragment of a message or a
// control frame, or after this many frames; otherwise at most kAckDelayNs after the first
// unacknowledged frame (coalescing: one ACK per burst, not per frame).
constexpr uint32_t kAckEvery = 16;
constexpr int64_t kAckDelayNs = 50000;
// How long close_conn keeps retransmitting unacknowledged reliable frames before its CLOSE.
constexpr int64_t kCloseLingerNs = 200 * 1000 * 1000;
// A timeout retransmits at most this many packets at once (then backs off): a peer that was
// only descheduled must not be answered with a whole window of duplicates.
constexpr int kRtoBurst = 32;
// Fast retransmission waits at least this long after the previous transmission of a packet.
constexpr int64_t kFastRetxMinGapNs = 20000;
// test() calls that find nothing new before the caller's thread yields the CPU (spin-then-yield:
// on a shared host the peer process may need this core to answer).
constexpr int kSpinBeforeYield = 4;
// Spurious-retransmission tolerance: step per report and ceiling.
constexpr int64_t kToleranceStepNs = 250000;
constexpr int64_t kToleranceMaxNs = 2000000;
// Shortest silence before a tail loss probe.
constexpr int64_t kProbeMinNs = 200000;
// Longest interval between two scans of a connection's window for timed-out packets.
constexpr int64_t kTimerScanNs = 250000;

namespace hs = net::handshake;

// What a dpdk handshake's proofs cover (core/net/handshake.h): the listener id stands for the
// handle nonce, the session for the connection id, the connector's connection id for the index.
hs::Transcript dpdk_transcript(uint32_t listener, uint64_t session, uint32_t connector_conn,
                               int32_t connector_rank, int32_t listener_rank, const hs::Nonce& cc,
                               const hs::Nonce& cl) {
  hs::Transcript t;
  t.protocol = "dpdk";
  t.handle_nonce = listener;
  t.conn_id = session;
  t.index = connector_conn;
  t.connector_rank = connector_rank;
  t.listener_rank = listener_rank;
  t.connector_challenge = cc;
  t.listener_challenge = cl;
  return t;
}

}  // namespace

struct Engine::SendReq {
  uint32_t msg = 0;
  const uint8_t* data = nullptr;
  size_t size = 0;
  int tag = 0;
  uint64_t next_off = 0;
  bool emitted = false;  // every fragment has been sent once
  uint32_t unacked = 0;
  // Eager: a one-frame message sent before its CTS; it completes when the frame is acknowledged
  // and the CTS has shown that the receive matches (size and tag), as a rendezvous send would.
  bool eager = false;
  bool cts_ok = false;
  bool done = false;
  Status err;
  // Zero copy: this send's frames still held by the port (the send completes only when none
  // is), and the registered region's counter (held so a retransmission can count on it).
  TxRefHandle zc;
  TxRefHandle region;
  int64_t release_deadline_ns = 0;  // 0: not waiting for the port yet
};

struct Engine::RecvReq {
  uint32_t msg = 0;
  uint8_t* data = nullptr;
  size_t cap = 0;
  int tag = 0;
  uint64_t got = 0;
  uint64_t total = 0;
  bool done = false;
  Status err;
};

struct Engine::TxPkt {
  uint32_t seq = 0;
  FrameType type = FrameType::kData;
  uint16_t flags = 0;
  uint32_t msg = 0;
  int32_t tag = 0;
  uint64_t msg_len = 0;
  uint64_t offset = 0;
  uint32_t len = 0;
  const uint8_t* src = nullptr;
  SendReq* req = nullptr;
  int64_t sent_ns = 0;
  int tx_count = 0;
  bool acked = false;
};

struct Engine::Listener {
  uint32_t id = 0;
  std::string token;
  uint32_t token_tag = 0;
  int32_t rank = -1;           // this side's rank (-1: not checked)
  int32_t expected_peer = -1;  // the only rank that may connect (-1: any)
  std::deque<uint32_t> ready;
};

// A handshake the listener answered with its CHALLENGE, waiting for the connector's PROOF.
struct Engine::Pending {
  uint32_t listener = 0;
  Endpoint peer;
  uint32_t peer_conn = 0;
  uint64_t session = 0;
  int32_t rank = -1, listener_rank = -1;
  net::handshake::Nonce cc{}, cl{};
  net::handshake::Mac listener_proof{};
  int64_t deadline_ns = 0;
};

struct Engine::Conn {
  enum class State { kConnecting, kOpen, kDead };
  uint32_t id = 0;
  uint32_t peer_id = 0;
  uint64_t session = 0;
  Endpoint peer;
  bool sender = false;
  State state = State::kConnecting;
  uint32_t token_tag = 0;
  std::string token;  // connector: keys its proof (never sent)
  uint32_t listener = 0;
  std::string label;
  int32_t rank = -1;           // connector: our rank, sent in HELLO's tag field
  int32_t listener_rank = -1;  // connector: the listener's rank from the handle
  // Handshake. Connector: its challenge, and once the listener proved the token, its own proof
  // (PROOF is then retransmitted instead of HELLO). Listener side: the proof it accepted (a
  // retransmitted PROOF whose HELLO_ACK was lost is answered again).
  net::handshake::Nonce cc{};
  bool proved = false;
  net::handshake::Mac proof{};
  int64_t deadline_ns = 0;
  int64_t last_hello_ns = 0;
  bool refused = false;
  Status error;
  int64_t peer_timeout_ns = 0;
  // reliability, our direction
  uint32_t snd_una = 0, snd_next = 0;
  std::deque<TxPkt> inflight;     // seq snd_una .. snd_next-1
  std::deque<TxPkt> ctl_pending;  // reliable control frames waiting for window
  uint32_t high_sacked = 0;
  bool any_sacked = false;
  double srtt_us = 0, rttvar_us = 0;
  int64_t rto_ns = 0;
  // reliability, the peer's direction
  uint32_t rcv_next = 0;
  uint32_t rcv_high = 0;  // one past the highest seq received
  std::vector<uint8_t> rcv_bits = std::vector<uint8_t>(kRcvWindow, 0);
  bool ack_due = false;
  bool ack_now = false;         // acknowledge at the end of this pass
  uint32_t rx_since_ack = 0;    // reliable frames received since our last ACK
  int64_t ack_due_since = 0;    // first unacknowledged frame
  uint32_t peer_window = 0;     // the peer's advertised receive window (0: not heard yet)
  uint32_t ts_recent = 0;       // timestamp of the first frame our next ACK acknowledges
  bool peer_echoes_ts = false;  // the peer's ACKs echo timestamps: RTT comes from those
  // Spurious retransmissions: the receiver counts retransmitted frames it already had (sent in
  // its ACKs' seq field); each increase widens the delay the sender tolerates before it
  // declares a packet lost (the path reorders or stalls: veth backlogs on a busy 2-vCPU host).
  uint32_t spurious_rx = 0;    // receiver: retransmissions that were duplicates
  uint32_t peer_spurious = 0;  // sender: the last count the peer reported
  int64_t tolerance_ns = 0;    // sender: extra delay before fast or timeout retransmission
  uint32_t acks_since_spurious = 0;
  int backoff = 0;             // retransmission-timeout doublings since the last progress
  int64_t timer_check_ns = 0;  // no retransmission timeout can fire before this
  // Tail loss probe: the last new send or acknowledgement progress, and whether the probe for
  // the current silence went out.
  int64_t last_progress_ns = 0;
  bool probed = false;
  int64_t last_rx_ns = 0, last_tx_ns = 0;
  // messages
  uint32_t next_msg = 0;
  std::deque<std::unique_ptr<SendReq>> sends;
  std::deque<std::unique_ptr<RecvReq>> recvs;
  struct Cts {
    uint64_t cap;
    int32_t tag;
  };
  std::unordered_map<uint32_t, Cts> cts;
  // Receiver: eager messages that arrived before their receive was posted (at most
  // kMaxRequests; more are not accepted, so the sender retransmits them later).
  struct Early {
    uint64_t len;
    int32_t tag;
    std::vector<uint8_t> payload;
  };
  std::unordered_map<uint32_t, Early> early;
  // Zero-copy frames of this connection still held by the port (close waits for them).
  TxRefHandle zc = TxRefHandle::make();

  std::string name() const {
    return fmt::format("{}dpdk {}:{} conn {}->{}", label.empty() ? "" : label + " via ",
                       format_ip(peer.ip), peer.port, id, peer_id);
  }
};

Result<std::shared_ptr<Engine>> Engine::create(std::unique_ptr<FramePort> port,
                                               const EngineConfig& config) {
  if (!port) return invalid_arg("dpdk engine: no port");
  if (config.burst <= 0 || config.burst > 1024) {
    return invalid_arg("dpdk engine: burst {} out of range 1..1024", config.burst);
  }
  if (config.window < 0 || config.window >= static_cast<int>(kRcvWindow)) {
    return invalid_arg("dpdk engine: window {} out of range 0..{}", config.window, kRcvWindow - 1);
  }
  auto fail_prob = [](double p) { return !(p >= 0 && p < 1); };
  if (fail_prob(config.faults.loss) || fail_prob(config.faults.reorder) ||
      fail_prob(config.faults.dup) ||
      config.faults.loss + config.faults.dup + config.faults.reorder >= 1) {
    return invalid_arg(
        "dpdk engine: fault probabilities loss={} dup={} reorder={} must be in [0,1)",
        config.faults.loss, config.faults.dup, config.faults.reorder);
  }
  size_t mtu = std::min(config.mtu, port->mtu());
  if (mtu < kIpLen + kUdpLen + kGwLen + 64) {
    return invalid_arg("dpdk engine: MTU {} of port {} too small", mtu, port->name());
  }
  std::shared_ptr<Engine> e(new Engine(std::move(port), config));
  e->payload_max_ = std::min<size_t>(mtu - kIpLen - kUdpLen - kGwLen, 0xffff);
  if (config.progress_interval_us > 0) {
    Engine* raw = e.get();
    e->thread_ = std::thread([raw] {
      std::unique_lock<std::mutex> lk(raw->thread_mu_);
      while (!raw->stop_) {
        raw->thread_cv_.wait_for(lk, std::chrono::microseconds(raw->config_.progress_interval_us));
        if (raw->stop_) break;
        // The application is polling: it drives the loop, this thread only fills the gaps.
        const int64_t since = now_ns() - raw->last_progress_ns_.load(std::memory_order_relaxed);
        if (since < raw->config_.progress_interval_us * 500) continue;
        lk.unlock();
        raw->progress();
        lk.lock();
      }
    });
  }
  return e;
}

Engine::Engine(std::unique_ptr<FramePort> port, const EngineConfig& config)
    : port_(std::move(port)), config_(config), faults_(config.faults) {
  local_.mac = port_->mac();
  local_.ip = config.ip;
  local_.port = config.udp_port;
  offload_ = port_->tx_l4_offload();
  std::random_device rd;
  rng_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(now_ns());
  // Ids start at a random point so frames of an earlier incarnation rarely hit a new connection.
  next_id_ = static_cast<uint32_t>(rng_state_ % 0x7fffffffu) + 1;
  rx_batch_.resize(config.burst);
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(thread_mu_);
    stop_ = true;
  }
  thread_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [id, c] : conns_) {
    if (c->state == Conn::State::kOpen) send_simple(*c, FrameType::kClose);
  }
  release_held(true);
  flush_tx();
  for (auto& [id, c] : conns_) {
    Status s = wait_released_locked(c->zc.get(), 1000, c->name());
    if (!s.ok()) GW_LOG_WARN("dpdk: engine shutdown: {}", s.to_string());
  }
  for (auto& b : tx_batch_) port_->free(b);
  tx_batch_.clear();
}

std::string Engine::port_name() const { return port_->name(); }

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.yields = yields_;
  s.port = port_->drops();
  return s;
}

uint32_t Engine::new_id() {
  uint32_t id;
  do {
    id = next_id_++;
    if (next_id_ == 0) next_id_ = 1;
  } while (id == 0 || conns_.count(id) || listeners_.count(id));
  return id;
}

Engine::Conn* Engine::find(uint32_t id) {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}
const Engine::Conn* Engine::find(uint32_t id) const {
  auto it = conns_.find(id);
  return it == conns_.end() ? nullptr : it->second.get();
}

uint32_t Engine::listen(const std::string& token, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto l = std::make_unique<Listener>();
  l->id = new_id();
  l->token = token;
  l->token_tag = token_tag(token);
  l->rank = rank < 0 ? -1 : rank;
  uint32_t id = l->id;
  listeners_[id] = std::move(l);
  return id;
}

void Engine::expect_peer(uint32_t listener, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = listeners_.find(listener);
  if (it != listeners_.end()) it->second->expected_peer = rank < 0 ? -1 : rank;
}

void Engine::close_listener(uint32_t listener) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = listeners_.find(listener);
  if (it == listeners_.end()) return;
  std::erase_if(pending_, [&](const Pending& p) { return p.listener == listener; });
  // Connections accepted by the handshake but never taken by accept() are closed too.
  for (uint32_t id : it->second->ready) {
    if (Conn* c = find(id)) {
      send_simple(*c, FrameType::kClose);
      conns_.erase(id);
    }
  }
  listeners_.erase(it);
  flush_tx();
}

Result<uint32_t> Engine::accept(uint32_t listener) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_locked();
  auto it = listeners_.find(listener);
  if (it == listeners_.end()) return invalid_arg("dpdk accept: unknown listener {}", listener);
  if (it->second->ready.empty()) return 0u;
  uint32_t id = it->second->ready.front();
  it->second->ready.pop_front();
  return id;
}

uint32_t Engine::connect(const ConnectTarget& target, const std::string& token, int64_t timeout_ms,
                         std::string label, int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto c = std::make_unique<Conn>();
  c->id = new_id();
  c->sender = true;
  c->peer = target.ep;
  c->listener = target.listener_id;
  c->token = token;
  c->token_tag = token_tag(token);
  c->label = std::move(label);
  c->rank = rank < 0 ? -1 : rank;
  c->listener_rank = target.listener_rank;
  if (Status st = hs::fresh_nonce(&c->cc); !st.ok()) {
    c->error = st;  // connect_poll reports it; no predictable challenge goes out
    c->state = Conn::State::kDead;
  }
  rng_state_ = rng_state_ * 6364136223846793005ull + 1442695040888963407ull;
  c->session = rng_state_ ^ (static_cast<uint64_t>(c->id) << 17) ^ 0x9e3779b97f4a7c15ull;
  if (c->session == 0) c->session = 1;
  int64_t now = now_ns();
  c->deadline_ns = now + timeout_ms * 1000000;
  c->peer_timeout_ns =
      std::min(config_.peer_timeout_ms, std::max<int64_t>(timeout_ms, 1)) * 1000000;
  c->rto_ns = config_.rto_min_us * 1000;
  c->last_rx_ns = now;
  uint32_t id = c->id;
  Conn& ref = *c;
  conns_[id] = std::move(c);
  // First HELLO now; progress resends it (or, once challenged, the PROOF) every
  // hello_interval_ms.
  if (ref.state == Conn::State::kConnecting) send_hello(ref, now);
  flush_tx();
  return id;
}

void Engine::send_hello(Conn& c, int64_t now) {
  GwHeader h;
  h.dst_conn = c.listener;
  h.src_conn = c.id;
  h.session = c.session;
  h.token_tag = c.token_tag;
  h.tag = c.rank;
  h.msg = static_cast<uint32_t>(c.listener_rank);
  if (c.proved) {
    h.type = FrameType::kProof;
    send_ctl(c.peer, h, c.proof.data(), c.proof.size());
  } else {
    h.type = FrameType::kHello;
    send_ctl(c.peer, h, c.cc.data(), c.cc.size());
  }
  c.last_hello_ns = now;
}

Result<bool> Engine::connect_poll(uint32_t conn) {
  std::lock_guard<std::mutex> lock(mu_);
  progress_locked();
  Conn* c = find(conn);
  if (c == nullptr) return invalid_arg("dpdk connect: unknown connection {}", conn);
  if (c->refused) return hs::refused_error(c->name());
  if (!c->error.ok()) return c->error;
  if (c->state == Conn::State::kOpen) return true;
  if (now_ns() > c->deadline_ns) {
    return timeout_error(
        "dpdk connect to {}: no answer to the handshake before the deadline{}", c->name(),
        link_up_ ? "" : fmt::format(" (port {} reports its link down)", port_->name()));
  }
  return false;
}

std::string Engine::peer_name(uint32_t conn) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Conn* c = find(conn);
  return c ? c->name() : fmt::format("dpdk conn {} (closed)", conn);
}

void Engine::set_peer_timeout(uint32_t conn, int64_t ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Conn* c = find(conn)) c->peer_timeout_ns = std::max<int64_t>(ms, 1) * 1000000;
}

void Engine::close_conn(uint32_t conn) {
  std::unique_lock<std::mutex> lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr) return;
  // A graceful close delivers what was already sent: reliable frames still unacknowledged (a
  // receiver's CTS, say, whose loss would leave the peer's delivered send failing) get their
  // retransmissions for a bounded time first. A dead peer costs at most kCloseLingerNs.
  const int64_t linger_until = now_ns() + std::min<int64_t>(kCloseLingerNs, c->peer_timeout_ns);
  while (c->state == Conn::State::kOpen && !c->inflight.empty() && now_ns() < linger_until) {
    if (progress_locked() == 0) {
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      lock.lock();
    }
    c = find(conn);
    if (c == nullptr) return;
  }
  if (c->state == Conn::State::kOpen) {
    // Twice: CLOSE is not retransmitted; heartbeat silence is the backstop.
    send_simple(*c, FrameType::kClose);
    send_simple(*c, FrameType::kClose);
  } else if (c->state == Conn::State::kConnecting && c->sender) {
    // Tell a listener that may already have accepted us.
    GwHeader h;
    h.type = FrameType::kClose;
    h.dst_conn = c->listener;
    h.src_conn = c->id;
    h.session = c->session;
    h.token_tag = c->token_tag;
    send_ctl(c->peer, h, nullptr, 0);
  }
  flush_tx();
  // Requests in flight are abandoned, but their memory may not be read after the close returns:
  // wait (bounded) until the port let go of every zero-copy frame of this connection.
  if (c->zc.get()->frames() > 0) {
    Status s = wait_released_locked(c->zc.get(), std::min<int64_t>(config_.peer_timeout_ms, 1000),
                                    c->name());
    if (!s.ok()) GW_LOG_WARN("dpdk: close: {}", s.to_string());
  }
  conns_.erase(conn);
}

uint32_t Engine::window_of(const Conn& c) const {
  uint32_t w;
  if (config_.window > 0) {
    w = static_cast<uint32_t>(config_.window);
  } else {
    // Bandwidth-delay product, doubled so loss recovery does not stall the pipe.
    double rtt_us = std::max(c.srtt_us, 100.0);
    double bdp_bytes = config_.link_gbps * 1e9 / 8 * rtt_us * 1e-6;
    double pkts = 2 * bdp_bytes / static_cast<double>(payload_max_);
    w = static_cast<uint32_t>(std::clamp(pkts, 32.0, static_cast<double>(config_.max_window)));
  }
  if (c.peer_window > 0) w = std::min(w, c.peer_window);
  return std::min(w, kRcvWindow - 1);
}

uint32_t Engine::advertised_window() const {
  // What our RX ring absorbs while this process is off the CPU, shared with the other direction.
  return static_cast<uint32_t>(
      std::clamp<size_t>(port_->rx_ring_size() / 2, 16, static_cast<size_t>(kRcvWindow - 1)));
}

Result<void*> Engine::isend(uint32_t conn, const void* data, size_t size, int tag, TxRef* region) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr || !c->sender) return invalid_arg("dpdk isend: unknown connection {}", conn);
  if (data == nullptr && size > 0)
    return invalid_arg("isend to {}: null buffer of {} bytes", c->name(), size);
  if (!c->error.ok()) return c->error.with_context("isend: ");
  if (c->sends.size() >= static_cast<size_t>(net::kMaxRequests)) return static_cast<void*>(nullptr);
  auto r = std::make_unique<SendReq>();
  r->msg = c->next_msg++;
  r->data = static_cast<const uint8_t*>(data);
  r->size = size;
  r->tag = tag;
  const bool zc_size =
      config_.zero_copy_min == 0 ? size > payload_max_ : size >= config_.zero_copy_min;
  if (region != nullptr && port_->zero_copy() && zc_size) {
    r->zc = TxRefHandle::make();
    region->hold();
    r->region = TxRefHandle(region);
  }
  void* handle = r.get();
  c->sends.push_back(std::move(r));
  pump(*c);
  flush_tx();
  return handle;
}

Result<void*> Engine::irecv(uint32_t conn, void* data, size_t size, int tag) {
  std::lock_guard<std::mutex> lock(mu_);
  Conn* c = find(conn);
  if (c == nullptr || c->sender) return invalid_arg("dpdk irecv: unknown connection {}", conn);
  if (data == nullptr && size > 0)
    return invalid_arg("irecv from {}: null buffer of {} bytes", c->name(), size);
  if (!c->error.ok()) return c->error.with_context("irecv: ");
  if (c->recvs.size() >= static_cast<size_t>(net::kMaxRequests)) return static_cast<void*>(nullptr);
  auto r = std::make_unique<RecvReq>();
  r->msg = c->next_msg++;
  r->data = static_cast<uint8_t*>(data);
  r->cap = size;
  r->tag = tag;
  TxPkt p;
  p.type = FrameType::kCts;
  p.msg = r->msg;
  p.tag = tag;
  p.msg_len = size;
  void* handle = r.get();
  if (auto e = c->early.find(r->msg); e != c->early.end()) {
    deliver_eager(*c, *r, e->second.len, e->second.tag, e->second.payload.data());
    c->early.erase(e);
  }
  c->recvs.push_back(std::move(r));
  c->ctl_pending.push_back(p);  // the sender's eager send completes on it
  pump(*c);
  flush_tx();
  return handle;
}

Status Engine::test(uint32_t conn, void* request, bool* done, size_t* size) {
  bool idle = false;
  Status s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    s = test_locked(conn, request, done, size, &idle);
    if (!idle || !s.ok() || *done) {
      idle_tests_ = 0;
      idle = false;
    } else {
      idle = ++idle_tests_ >= kSpinBeforeYield;
    }
  }
  if (idle) {
    ++yields_;
    std::this_thread::yield();
  }
  return s;
}

Status Engine::test_locked(uint32_t conn, void* request, bool* done, size_t* size, bool* idle) {
  Conn* c = find(conn);
  if (c == nullptr) return invalid_arg("dpdk test: unknown connection {}", conn);
  *idle = progress_locked() == 0;
  auto finish = [&](auto& q, auto it, size_t bytes) -> Status {
    // Requests complete in posting order: an earlier unfinished one holds this one back.
    for (auto e = q.begin(); e != it; ++e) {
      if (!(*e)->done) {
        *done = false;
        return ok_status();
      }
    }
    Status s = (*it)->err;
    // A send that failed early (an eager message the CTS refused) may still have its frame in
    // flight: that frame must not point at the request once it is gone.
    for (TxPkt& p : c->inflight) {
      if (p.req == static_cast<void*>(it->get())) p.req = nullptr;
    }
    q.erase(it);
    if (s.ok()) {
      *done = true;
      *size = bytes;
    }
    return s;
  };
  if (c->sender) {
    auto it = std::find_if(c->sends.begin(), c->sends.end(),
                           [&](const auto& r) { return r.get() == request; });
    if (it == c->sends.end()) return invalid_arg("test on {}: unknown request", c->name());
    SendReq& r = **it;
    if (!r.done && !c->error.ok()) {
      r.done = true;
      r.err = c->error.with_context(fmt::format("send of {} bytes", r.size));
    }
    if (!r.done) {
      *done = false;
      return ok_status();
    }
    if (r.zc && r.zc.get()->frames() > 0) {
      // Acknowledged, but the port still holds frames that point into the user's buffer (a
      // retransmitted copy in a ring, a PMD that frees lazily): not complete until it lets go.
      const int64_t now = now_ns();
      if (r.release_deadline_ns == 0) {
        r.release_deadline_ns = now + c->peer_timeout_ns;
      }
      port_->tx_cleanup();
      if (r.zc.get()->frames() > 0) {
        if (now < r.release_deadline_ns) {
          *done = false;
          return ok_status();
        }
        if (r.err.ok()) {
          r.err = timeout_error(
              "send of {} bytes to {}: {} zero-copy frame(s) still held by port {} {} ms after "
              "the send was acknowledged (the buffer may still be read)",
              r.size, c->name(), r.zc.get()->frames(), port_->name(), c->peer_timeout_ns / 1000000);
        }
      }
    }
    return finish(c->sends, it, r.size);
  }
  auto it = std::find_if(c->recvs.begin(), c->recvs.end(),
                         [&](const auto& r) { return r.get() == request; });
  if (it == c->recvs.end()) return invalid_arg("test on {}: unknown request", c->name());
  RecvReq& r = **it;
  if (!r.done && !c->error.ok()) {
    r.done = true;
    r.err = c->error.with_context(fmt::format("recv into {} bytes", r.cap));
  }
  if (!r.done) {
    *done = false;
    return ok_status();
  }
  return finish(c->recvs, it, r.total);
}

void Engine::progress() {
  std::lock_guard<std::mutex> lock(mu_);
  progress_locked();
}

void Engine::inject_rx(const uint8_t* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  FrameBuf b;
  b.data = const_cast<uint8_t*>(data);
  b.len = len;
  handle_frame(b);
  flush_tx();
}

void Engine::set_frame_tap(std::function<void(const Frame&)> tap) {
  std::lock_guard<std::mutex> lock(mu_);
  frame_tap_ = std::move(tap);
}

Status Engine::wait_released(TxRef* ref, int64_t timeout_ms, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  return wait_released_locked(ref, timeout_ms, what);
}

Status Engine::wait_released_locked(TxRef* ref, int64_t timeout_ms, const std::string& what) {
  if (ref == nullptr || ref->frames() <= 0) return ok_status();
  const int64_t deadline = now_ns() + std::max<int64_t>(timeout_ms, 0) * 1000000;
  while (true) {
    // Our own RX loop frees what a loopback port (net_ring) hands back; the PMD frees what it
    // finished sending.
    progress_locked();
    port_->tx_cleanup();
    if (ref->frames() <= 0) return ok_status();
    if (now_ns() >= deadline) {
      return timeout_error("{}: {} zero-copy frame(s) still held by port {} after {} ms", what,
                           ref->frames(), port_->name(), timeout_ms);
    }
    std::this_thread::yield();
  }
}

size_t Engine::progress_locked() {
  ++stats_.polls;
  last_progress_ns_.store(now_ns(), std::memory_order_relaxed);
  size_t total = 0;
  for (int round = 0; round < 4; ++round) {
    size_t n = port_->rx_burst(rx_batch_.data(), rx_batch_.size());
    if (round == 0 && n == 0) ++stats_.idle_polls;
    for (size_t i = 0; i < n; ++i) {
      handle_frame(rx_batch_[i]);
      port_->free(rx_batch_[i]);
    }
    total += n;
    if (n < rx_batch_.size()) break;
  }
  const int64_t now = now_ns();
  if (now >= next_link_check_ns_) {
    next_link_check_ns_ = now + kLinkCheckNs;
    link_up_ = port_->check_link();
  }
  for (auto& [id, c] : conns_) {
    timers(*c);
    pump(*c);
    if (c->ack_due &&
        (c->ack_now || c->rx_since_ack >= kAckEvery || now - c->ack_due_since >= kAckDelayNs)) {
      if (c->ack_now) ++stats_.acks_prompt;
      send_ack(*c);
    }
  }
  release_held(false);
  flush_tx();
  return total;
}

void Engine::fail_conn(Conn& c, Status s) {
  if (!c.error.ok()) return;
  GW_LOG_DEBUG("dpdk: {}: {}", c.name(), s.to_string());
  c.error = std::move(s);
  c.state = Conn::State::kDead;
}

void Engine::timers(Conn& c) {
  const int64_t now = now_ns();
  if (c.state == Conn::State::kConnecting) {
    if (c.sender && now - c.last_hello_ns >= config_.hello_interval_ms * 1000000 &&
        now < c.deadline_ns && !c.refused) {
      send_hello(c, now);
    }
    return;
  }
  if (c.state != Conn::State::kOpen) return;
  if (now - c.last_rx_ns > c.peer_timeout_ns) {
    fail_conn(c, peer_error("{}: no frame from the peer for {} ms (host dead or unreachable)",
                            c.name(), (now - c.last_rx_ns) / 1000000));
    return;
  }
  // Retransmission on timeout: RTO from the measured RTT (Jacobson, floored), doubled per
  // timeout without progress (reset by any new acknowledgement). At most kRtoBurst of the
  // timed-out packets go out per firing; SACK-driven fast retransmission recovers the rest once
  // acknowledgements flow again.
  // Tail loss probe: when nothing was sent or acknowledged for two RTTs (at least 200 us) and
  // packets are outstanding, the newest unacknowledged one is resent once. If the tail of a
  // message was lost, no later packet's SACK can reveal it; the probe's ACK (with SACK) does,
  // long before the RTO would.
  if (!c.probed && !c.inflight.empty() &&
      now - c.last_progress_ns >=
          std::max<int64_t>(static_cast<int64_t>(2 * c.srtt_us * 1000), kProbeMinNs) +
              c.tolerance_ns) {
    for (auto it = c.inflight.rbegin(); it != c.inflight.rend(); ++it) {
      if (it->acked || it->tx_count == 0) continue;
      ++stats_.tail_probes;
      send_pkt(c, *it, true);
      break;
    }
    c.probed = true;
  }
  // The scan over the window runs only when the earliest deadline may have come (and at least
  // every kTimerScanNs, since the RTO may shrink): not on every pass of a busy loop.
  const int64_t rto = (c.rto_ns + c.tolerance_ns) << std::min(c.backoff, 6);
  if (now >= c.timer_check_ns) {
    int resent = 0;
    int64_t next = now + kTimerScanNs;
    for (TxPkt& p : c.inflight) {
      if (p.acked || p.tx_count == 0) continue;
      if (now - p.sent_ns < rto) {
        next = std::min(next, p.sent_ns + rto);
        continue;
      }
      if (p.tx_count > config_.max_retx) {
        fail_conn(c, peer_error("{}: packet {} not acknowledged after {} transmissions", c.name(),
                                p.seq, p.tx_count));
        return;
      }
      ++stats_.timeout_retransmits;
      send_pkt(c, p, true);
      if (++resent >= kRtoBurst) {
        next = now;  // more may be due: look again on the next pass
        break;
      }
    }
    if (resent > 0) ++c.backoff;
    c.timer_check_ns = next;
  }
  if (now - c.last_tx_ns >= config_.heartbeat_ms * 1000000) send_ack(c);
}

bool Engine::emit_reliable(Conn& c, TxPkt pkt) {
  if (c.snd_next - c.snd_una >= window_of(c)) return false;
  pkt.seq = c.snd_next++;
  c.inflight.push_back(pkt);
  send_pkt(c, c.inflight.back(), false);
  c.last_progress_ns = c.inflight.back().sent_ns;
  c.probed = false;
  return true;
}

void Engine::pump(Conn& c) {
  if (c.state != Conn::State::kOpen) return;
  while (!c.ctl_pending.empty()) {
    if (!emit_reliable(c, c.ctl_pending.front())) return;
    c.ctl_pending.pop_front();
  }
  if (!c.sender) return;
  for (auto& rp : c.sends) {
    SendReq& r = *rp;
    if (r.emitted || r.done) continue;
    auto cts = c.cts.find(r.msg);
    if (cts == c.cts.end()) {
      // A message that fits one frame goes at once (eager); larger ones wait for the receive
      // to be posted (rendezvous), and so do all messages after them, to keep frames in order.
      if (!config_.eager || r.size > payload_max_ || r.next_off != 0) return;
      TxPkt p;
      p.type = FrameType::kData;
      p.flags = kFlagLast | kFlagEager;
      p.msg = r.msg;
      p.tag = r.tag;
      p.msg_len = r.size;
      p.len = static_cast<uint32_t>(r.size);
      p.src = r.data;
      p.req = &r;
      if (!emit_reliable(c, p)) return;
      ++stats_.eager_sends;
      r.eager = true;
      r.unacked = 1;
      r.next_off = r.size;
      r.emitted = true;
      continue;
    }
    if (r.next_off == 0 && r.unacked == 0) {
      const bool trunc = r.size > cts->second.cap;
      const bool tag_bad = cts->second.tag != net::kAnyTag && cts->second.tag != r.tag;
      if (trunc || tag_bad) {
        TxPkt e;
        e.type = FrameType::kMsgErr;
        e.flags = trunc ? kFlagErrTrunc : kFlagErrTag;
        e.msg = r.msg;
        e.tag = r.tag;
        e.msg_len = r.size;
        if (c.snd_next - c.snd_una >= window_of(c)) return;
        emit_reliable(c, e);
        r.emitted = true;
        r.done = true;
        r.err = trunc ? invalid_arg(
                            "send to {}: message truncated: {} bytes sent, receive posted "
                            "{} bytes",
                            c.name(), r.size, cts->second.cap)
                      : internal_error(
                            "send to {}: tag mismatch: sent tag {}, receive posted "
                            "tag {}",
                            c.name(), r.tag, cts->second.tag);
        c.cts.erase(cts);
        continue;
      }
    }
    while (!r.emitted) {
      TxPkt p;
      p.type = FrameType::kData;
      p.msg = r.msg;
      p.tag = r.tag;
      p.msg_len = r.size;
      p.offset = r.next_off;
      p.len = static_cast<uint32_t>(std::min<uint64_t>(payload_max_, r.size - r.next_off));
      p.src = r.data + r.next_off;
      p.req = &r;
      if (r.next_off + p.len == r.size) p.flags = kFlagLast;
      if (!emit_reliable(c, p)) return;
      ++r.unacked;
      r.next_off += p.len;
      if (r.next_off == r.size) {
        r.emitted = true;
        c.cts.erase(cts);
      }
    }
  }
}

void Engine::send_pkt(Conn& c, TxPkt& p, bool retx) {
  GwHeader h;
  h.type = p.type;
  h.flags = static_cast<uint16_t>(p.flags | (retx ? kFlagRetx : 0));
  h.dst_conn = c.peer_id;
  h.src_conn = c.id;
  h.session = c.session;
  h.seq = p.seq;
  h.ack = c.rcv_next;
  h.msg = p.msg;
  h.tag = p.tag;
  h.msg_len = p.msg_len;
  h.offset = p.offset;
  h.window = advertised_window();
  h.token_tag = c.token_tag;
  FrameBuf b;
  p.sent_ns = now_ns();
  h.ts = wire_ts(p.sent_ns);
  ++p.tx_count;
  if (retx) ++stats_.retransmits;
  if (!port_->alloc(&b)) {
    ++stats_.pool_empty;  // counts as a loss; the timer resends it
    return;
  }
  // Zero copy: a data fragment of a send from registered memory goes as headers + the user's
  // bytes in place (a retransmission attaches them again). The request's, the region's and the
  // connection's counters follow the frame until the port releases it.
  bool zc = false;
  if (p.type == FrameType::kData && p.req != nullptr && p.req->zc && p.len > 0) {
    b.len = encode_headers(b.data, b.cap, local_, c.peer, h, p.src, p.len, ip_id_, offload_);
    TxRef* refs[3] = {p.req->zc.get(), c.zc.get(), p.req->region.get()};
    zc = b.len != 0 && port_->attach_external(&b, p.src, p.len, refs, p.req->region ? 3 : 2);
    if (zc) {
      ++ip_id_;
      ++stats_.zc_frames_tx;
      stats_.zc_bytes_tx += p.len;
    } else {
      ++stats_.zc_fallbacks;
    }
  }
  if (!zc) {
    b.len = encode_frame(b.data, b.cap, local_, c.peer, h, p.src, p.len, ip_id_++, offload_);
  }
  if (b.len == 0) {
    port_->free(b);
    return;
  }
  if (p.type == FrameType::kData) ++stats_.data_frames_tx;
  c.last_tx_ns = p.sent_ns;
  queue_tx(b);
}

void Engine::send_ack(Conn& c) {
  GwHeader h;
  h.type = FrameType::kAck;
  h.dst_conn = c.peer_id;
  h.src_conn = c.id;
  h.session = c.session;
  h.ack = c.rcv_next;
  h.window = advertised_window();
  h.token_tag = c.token_tag;
  uint8_t sack[kMaxSackBits / 8] = {};
  uint32_t nbits = 0;
  if (seq_lt(c.rcv_next + 1, c.rcv_high)) {
    nbits = std::min<uint32_t>(c.rcv_high - c.rcv_next - 1, kMaxSackBits);
    for (uint32_t i = 0; i < nbits; ++i) {
      if (c.rcv_bits[(c.rcv_next + 1 + i) % kRcvWindow]) sack[i / 8] |= (1u << (i % 8));
    }
  }
  h.sack_bits = static_cast<uint16_t>(nbits);
  h.seq = c.spurious_rx;  // ACKs are not sequenced: the field reports spurious retransmissions
  h.ts = c.ts_recent;
  c.ts_recent = 0;
  send_ctl(c.peer, h, sack, (nbits + 7) / 8);
  ++stats_.acks_tx;
  c.last_tx_ns = now_ns();
  c.ack_due = false;
  c.ack_now = false;
  c.rx_since_ack = 0;
}

void Engine::send_simple(Conn& c, FrameType type, const void* payload, size_t len) {
  GwHeader h;
  h.type = type;
  h.dst_conn = c.peer_id;
  h.src_conn = c.id;
  h.session = c.session;
  h.ack = c.rcv_next;
  h.token_tag = c.token_tag;
  send_ctl(c.peer, h, payload, len);
}

void Engine::send_ctl(const Endpoint& dst, GwHeader hdr, const void* payload, size_t len) {
  FrameBuf b;
  if (!port_->alloc(&b)) {
    ++stats_.pool_empty;
    return;
  }
  b.len = encode_frame(b.data, b.cap, local_, dst, hdr, payload, len, ip_id_++, offload_);
  if (b.len == 0) {
    port_->free(b);
    return;
  }
  queue_tx(b);
}

void Engine::queue_tx(FrameBuf b) {
  if (faults_.enabled()) {
    switch (faults_.decide()) {
      case FaultAction::kDrop:
        ++stats_.injected_drops;
        port_->free(b);
        return;
      case FaultAction::kDup: {
        FrameBuf d;
        if (port_->alloc(&d) && d.cap >= b.len + b.len2) {
          // A zero-copy frame is duplicated as one copied segment (same bytes, same checksum).
          std::memcpy(d.data, b.data, b.len);
          if (b.len2 > 0) std::memcpy(d.data + b.len, b.data2, b.len2);
          d.len = b.len + b.len2;
          tx_batch_.push_back(d);
          ++stats_.injected_dups;
        } else if (d.data) {
          port_->free(d);
        }
        break;
      }
      case FaultAction::kHold:
        ++stats_.injected_holds;
        held_.push_back(Held{b, faults_.hold_distance(), now_ns()});
        return;
      case FaultAction::kPass:
        break;
    }
    // Frames held back go out after `countdown` later frames: that is the reordering.
    for (size_t i = 0; i < held_.size();) {
      if (--held_[i].countdown <= 0) {
        tx_batch_.push_back(b);
        b = held_[i].buf;
        held_.erase(held_.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
  }
  tx_batch_.push_back(b);
  if (tx_batch_.size() >= static_cast<size_t>(config_.burst)) flush_tx();
}

void Engine::release_held(bool all) {
  const int64_t now = now_ns();
  for (size_t i = 0; i < held_.size();) {
    if (all || now - held_[i].since_ns > 200000) {
      tx_batch_.push_back(held_[i].buf);
      held_.erase(held_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
}

void Engine::flush_tx() {
  size_t off = 0;
  int spins = 0;
  while (off < tx_batch_.size()) {
    for (size_t i = off; i < tx_batch_.size(); ++i) {
      stats_.tx_bytes += tx_batch_[i].len + tx_batch_[i].len2;
    }
    size_t n = port_->tx_burst(tx_batch_.data() + off, tx_batch_.size() - off);
    for (size_t i = off + n; i < tx_batch_.size(); ++i) {
      stats_.tx_bytes -= tx_batch_[i].len + tx_batch_[i].len2;
    }
    stats_.tx_frames += n;
    off += n;
    if (n == 0 && ++spins > 64) break;
  }
  for (size_t i = off; i < tx_batch_.size(); ++i) {
    ++stats_.tx_ring_full;  // lost; retransmission recovers it
    port_->free(tx_batch_[i]);
  }
  tx_batch_.clear();
}

void Engine::handle_frame(const FrameBuf& b) {
  ++stats_.rx_frames;
  stats_.rx_bytes += b.len + b.len2;
  if (b.len2 > 0) ++stats_.rx_split_frames;
  Frame f;
  DecodeError e = decode_frame_split(b.data, b.len, b.data2, b.len2, b.l4_checksum_ok, &f);
  if (e != DecodeError::kOk) {
    ++stats_.decode_drops[static_cast<int>(e)];
    return;
  }
  if (frame_tap_) frame_tap_(f);
  if (f.dst.ip != local_.ip || f.dst.port != local_.port ||
      (f.dst.mac != local_.mac && f.dst.mac != MacAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})) {
    ++stats_.not_for_us;
    return;
  }
  if (f.hdr.type == FrameType::kHello) {
    handle_hello(f);
    return;
  }
  if (f.hdr.type == FrameType::kProof) {
    handle_proof(f);
    return;
  }
  Conn* c = find(f.hdr.dst_conn);
  if (c == nullptr) {
    if (f.hdr.type == FrameType::kClose) {
      // A connector that gave up before accept(): forget what its handshake created.
      for (auto& [lid, l] : listeners_) {
        for (auto it = l->ready.begin(); it != l->ready.end(); ++it) {
          Conn* a = find(*it);
          if (a && a->peer_id == f.hdr.src_conn && a->session == f.hdr.session) {
            conns_.erase(*it);
            l->ready.erase(it);
            return;
          }
        }
      }
    }
    ++stats_.unknown_conn;
    // A reliable frame for a connection we no longer have: tell the peer, at most every 10 ms.
    if (is_reliable(f.hdr.type)) {
      int64_t now = now_ns();
      if (now - last_rst_ns_ > 10000000) {
        last_rst_ns_ = now;
        GwHeader h;
        h.type = FrameType::kClose;
        h.dst_conn = f.hdr.src_conn;
        h.src_conn = f.hdr.dst_conn;
        h.session = f.hdr.session;
        h.token_tag = f.hdr.token_tag;
        send_ctl(f.src, h, nullptr, 0);
      }
    }
    return;
  }
  if (f.hdr.token_tag != c->token_tag) {
    ++stats_.wrong_token;
    return;
  }
  if (f.hdr.session != c->session || !(f.src == c->peer) ||
      (c->state != Conn::State::kConnecting && f.hdr.src_conn != c->peer_id)) {
    ++stats_.wrong_session;
    return;
  }
  handle_conn_frame(*c, f);
}

void Engine::handle_hello(const Frame& f) {
  GwHeader h;
  h.dst_conn = f.hdr.src_conn;
  h.session = f.hdr.session;
  h.token_tag = f.hdr.token_tag;
  // A late duplicate HELLO of a connection already made: its PROOF follows, nothing to answer.
  for (auto& [id, c] : conns_) {
    if (!c->sender && c->listener == f.hdr.dst_conn && c->peer_id == f.hdr.src_conn &&
        c->session == f.hdr.session && c->peer == f.src) {
      return;
    }
  }
  auto it = listeners_.find(f.hdr.dst_conn);
  if (it == listeners_.end()) {
    ++stats_.unknown_conn;  // no listener: the connector times out
    return;
  }
  Listener& l = *it->second;
  h.src_conn = l.id;
  h.type = FrameType::kHelloNak;
  if (f.hdr.token_tag != l.token_tag) {
    ++stats_.wrong_token;
    ++stats_.hello_refused;
    send_ctl(f.src, h, nullptr, 0);
    return;
  }
  // The same checks as the tcp and shm listeners: the HELLO is for this listener's rank, and
  // from the rank it expects.
  static const char kMagicField[4] = {'G', 'W', 'D', 'P'};
  const std::string why =
      hs::refusal(hs::HelloView{kMagicField, l.id, f.hdr.tag, static_cast<int32_t>(f.hdr.msg)},
                  hs::HelloExpect{"dpdk", "GWDP", l.id, l.rank, l.expected_peer});
  if (!why.empty()) {
    ++stats_.wrong_rank;
    ++stats_.hello_refused;
    GW_LOG_WARN("dpdk listener {}: refused a handshake from {}:{}: {}", l.id, format_ip(f.src.ip),
                f.src.port, why);
    send_ctl(f.src, h, nullptr, 0);
    return;
  }
  const int64_t now = now_ns();
  std::erase_if(pending_, [&](const Pending& p) {
    if (p.deadline_ns > now) return false;
    ++stats_.handshakes_dropped;
    return true;
  });
  hs::Nonce cc;
  std::memcpy(cc.data(), f.payload, cc.size());
  Pending* p = nullptr;
  for (Pending& q : pending_) {
    if (q.listener == l.id && q.peer == f.src && q.peer_conn == f.hdr.src_conn &&
        q.session == f.hdr.session) {
      p = &q;
      break;
    }
  }
  if (p != nullptr && (p->cc != cc || p->rank != f.hdr.tag ||
                       p->listener_rank != static_cast<int32_t>(f.hdr.msg))) {
    // Not a retransmission of the HELLO it answered: forget it and start over.
    pending_.erase(pending_.begin() + (p - pending_.data()));
    p = nullptr;
  }
  if (p == nullptr) {
    // At most max_pending_handshakes wait for their PROOF; the oldest goes first.
    const size_t cap = static_cast<size_t>(std::max(config_.max_pending_handshakes, 1));
    while (pending_.size() >= cap) {
      pending_.erase(pending_.begin());
      ++stats_.handshakes_dropped;
    }
    Pending q;
    q.listener = l.id;
    q.peer = f.src;
    q.peer_conn = f.hdr.src_conn;
    q.session = f.hdr.session;
    q.rank = f.hdr.tag;
    q.listener_rank = static_cast<int32_t>(f.hdr.msg);
    q.cc = cc;
    if (!hs::fresh_nonce(&q.cl).ok()) return;  // no challenge, no answer: the peer retries
    q.listener_proof = hs::prove(
        l.token, hs::Role::kListener,
        dpdk_transcript(l.id, q.session, q.peer_conn, q.rank, q.listener_rank, q.cc, q.cl));
    q.deadline_ns = now + std::max<int64_t>(config_.handshake_timeout_ms, 1) * 1000000;
    pending_.push_back(q);
    p = &pending_.back();
  }
  uint8_t payload[kChallengePayload];
  std::memcpy(payload, p->cl.data(), p->cl.size());
  std::memcpy(payload + p->cl.size(), p->listener_proof.data(), p->listener_proof.size());
  h.type = FrameType::kChallenge;
  send_ctl(f.src, h, payload, sizeof(payload));
}

void Engine::handle_proof(const Frame& f) {
  GwHeader h;
  h.dst_conn = f.hdr.src_conn;
  h.session = f.hdr.session;
  h.token_tag = f.hdr.token_tag;
  // A retransmitted PROOF (our HELLO_ACK was lost): answer again with the connection already
  // made. This must work after the listener is gone too: a Communicator closes its listeners as
  // soon as it has accepted, and a connector whose only HELLO_ACK was lost would otherwise
  // retransmit into "no listener" until its deadline (seen in the 4-host netns test).
  for (auto& [id, c] : conns_) {
    if (!c->sender && c->listener == f.hdr.dst_conn && c->peer_id == f.hdr.src_conn &&
        c->session == f.hdr.session && c->peer == f.src) {
      if (CRYPTO_memcmp(c->proof.data(), f.payload, c->proof.size()) == 0) {
        h.type = FrameType::kHelloAck;
        h.src_conn = c->id;
        send_ctl(f.src, h, nullptr, 0);
      }
      return;
    }
  }
  auto pit = std::find_if(pending_.begin(), pending_.end(), [&](const Pending& p) {
    return p.listener == f.hdr.dst_conn && p.peer == f.src && p.peer_conn == f.hdr.src_conn &&
           p.session == f.hdr.session;
  });
  auto lit = listeners_.find(f.hdr.dst_conn);
  h.src_conn = f.hdr.dst_conn;
  h.type = FrameType::kHelloNak;
  if (pit == pending_.end() || lit == listeners_.end() || pit->deadline_ns <= now_ns()) {
    // No challenge of ours is waiting for this proof (dropped at the cap or the deadline, or a
    // replayed PROOF): the connector starts over with a HELLO.
    if (pit != pending_.end()) {
      pending_.erase(pit);
      ++stats_.handshakes_dropped;
    }
    ++stats_.unknown_conn;
    if (lit != listeners_.end()) {
      h.flags = kFlagRestart;
      send_ctl(f.src, h, nullptr, 0);
    }
    return;
  }
  Listener& l = *lit->second;
  const Pending p = *pit;
  pending_.erase(pit);
  if (!hs::verify(
          l.token, hs::Role::kConnector,
          dpdk_transcript(l.id, p.session, p.peer_conn, p.rank, p.listener_rank, p.cc, p.cl),
          f.payload)) {
    ++stats_.wrong_token;
    ++stats_.hello_refused;
    GW_LOG_WARN("dpdk listener {}: refused a handshake from {}:{}: wrong proof of the job token",
                l.id, format_ip(f.src.ip), f.src.port);
    send_ctl(f.src, h, nullptr, 0);
    return;
  }
  auto c = std::make_unique<Conn>();
  c->id = new_id();
  c->peer_id = f.hdr.src_conn;
  c->session = f.hdr.session;
  c->peer = f.src;
  c->sender = false;
  c->state = Conn::State::kOpen;
  c->token_tag = l.token_tag;
  c->listener = l.id;
  std::memcpy(c->proof.data(), f.payload, c->proof.size());
  if (p.rank >= 0) c->label = fmt::format("rank {}", p.rank);
  c->rto_ns = config_.rto_min_us * 1000;
  c->peer_timeout_ns = config_.peer_timeout_ms * 1000000;
  c->last_rx_ns = c->last_tx_ns = now_ns();
  h.type = FrameType::kHelloAck;
  h.src_conn = c->id;
  send_ctl(f.src, h, nullptr, 0);
  l.ready.push_back(c->id);
  conns_[c->id] = std::move(c);
}

void Engine::handle_conn_frame(Conn& c, const Frame& f) {
  const int64_t now = now_ns();
  switch (f.hdr.type) {
    case FrameType::kHelloAck:
      if (c.state == Conn::State::kConnecting && c.sender) {
        c.peer_id = f.hdr.src_conn;
        c.state = Conn::State::kOpen;
        c.last_rx_ns = c.last_tx_ns = now;
      }
      return;
    case FrameType::kHelloNak:
      if (c.state == Conn::State::kConnecting && c.sender) {
        if (f.hdr.flags & kFlagRestart) {
          c.proved = false;  // the listener lost our handshake: HELLO again at the next timer
        } else {
          c.refused = true;
          ++stats_.hello_refused;
        }
      }
      return;
    case FrameType::kChallenge:
      if (c.state == Conn::State::kConnecting && c.sender && !c.proved) {
        hs::Nonce cl;
        std::memcpy(cl.data(), f.payload, cl.size());
        const hs::Transcript t =
            dpdk_transcript(c.listener, c.session, c.id, c.rank, c.listener_rank, c.cc, cl);
        if (!hs::verify(c.token, hs::Role::kListener, t, f.payload + cl.size())) {
          // Never answer a listener that cannot prove the token.
          ++stats_.wrong_token;
          fail_conn(c, hs::listener_unproven_error(c.name()));
          return;
        }
        c.proof = hs::prove(c.token, hs::Role::kConnector, t);
        c.proved = true;
        send_hello(c, now);  // the PROOF
      }
      return;
    default:
      break;
  }
  if (c.state != Conn::State::kOpen) return;
  c.last_rx_ns = now;
  if (f.hdr.window > 0) c.peer_window = f.hdr.window;
  if (f.hdr.type == FrameType::kClose) {
    // The CLOSE carries the peer's cumulative ack like every frame: what it received before it
    // went completes here (its ACK may have been lost), and only what it never got fails.
    on_ack(c, f);
    fail_conn(c, peer_error("{}: the peer closed the connection", c.name()));
    return;
  }
  on_ack(c, f);
  if (is_reliable(f.hdr.type)) on_reliable(c, f);
}

void Engine::rtt_sample(Conn& c, double sample) {
  {
    if (c.srtt_us == 0) {
      c.srtt_us = sample;
      c.rttvar_us = sample / 2;
    } else {
      c.rttvar_us = 0.75 * c.rttvar_us + 0.25 * std::fabs(c.srtt_us - sample);
      c.srtt_us = 0.875 * c.srtt_us + 0.125 * sample;
    }
    c.rto_ns = std::max<int64_t>(config_.rto_min_us * 1000,
                                 static_cast<int64_t>((c.srtt_us + 4 * c.rttvar_us) * 1000));
    stats_.srtt_us = c.srtt_us;
    stats_.rttvar_us = c.rttvar_us;
    stats_.rto_us = static_cast<double>(c.rto_ns) / 1000;
  }
}

void Engine::acked(Conn& c, TxPkt& p) {
  if (p.acked) return;
  p.acked = true;
  // Karn: only unambiguous samples, and only when the peer does not echo timestamps (those also
  // measure the packets Karn has to skip: the delayed ones that caused a retransmission).
  if (p.tx_count == 1 && !c.peer_echoes_ts) {
    rtt_sample(c, static_cast<double>(now_ns() - p.sent_ns) / 1000.0);
  }
  if (p.req != nullptr) {
    SendReq& r = *p.req;
    if (r.unacked > 0) --r.unacked;
    if (r.emitted && r.unacked == 0 && !r.done && (!r.eager || r.cts_ok)) r.done = true;
  }
}

void Engine::on_ack(Conn& c, const Frame& f) {
  const uint32_t a = f.hdr.ack;
  if (seq_lt(c.snd_next, a)) {
    ++stats_.bad_ack;  // acknowledges what we never sent
    return;
  }
  if (!c.inflight.empty() && seq_lt(c.snd_una, a)) {
    c.backoff = 0;
    c.last_progress_ns = now_ns();
    c.probed = false;
  }
  while (!c.inflight.empty() && seq_lt(c.snd_una, a)) {
    acked(c, c.inflight.front());
    c.inflight.pop_front();
    ++c.snd_una;
  }
  if (c.inflight.empty()) c.snd_una = c.snd_next;
  if (f.hdr.type != FrameType::kAck) return;
  ++stats_.acks_rx;
  if (f.hdr.seq != c.peer_spurious) {
    const uint32_t n = f.hdr.seq - c.peer_spurious;
    c.peer_spurious = f.hdr.seq;
    if (n < 0x80000000u) {
      stats_.spurious_retransmits += n;
      // Linear and capped: a retransmission too many costs one frame, a tolerance too large
      // delays every real recovery by as much.
      c.tolerance_ns = std::min<int64_t>(c.tolerance_ns + kToleranceStepNs, kToleranceMaxNs);
      c.acks_since_spurious = 0;
    }
  } else if (c.tolerance_ns > 0 && ++c.acks_since_spurious >= 64) {
    c.tolerance_ns = c.tolerance_ns * 3 / 4;  // the path calmed down
    c.acks_since_spurious = 0;
  }
  stats_.tolerance_us = static_cast<double>(c.tolerance_ns) / 1000;
  if (f.hdr.ts != 0) {
    const uint32_t d = wire_ts(now_ns()) - f.hdr.ts;
    if (d < 60000000u) {  // a sane sample (< 60 s); anything else is a forged or stale echo
      c.peer_echoes_ts = true;
      rtt_sample(c, static_cast<double>(d));
    }
  }
  if (a != c.snd_una) return;  // stale ack
  bool any = false;
  uint32_t high = 0;
  for (uint32_t i = 0; i < f.hdr.sack_bits; ++i) {
    if (!(f.payload[i / 8] & (1u << (i % 8)))) continue;
    uint32_t seq = a + 1 + i;
    uint32_t idx = seq - c.snd_una;
    if (idx >= c.inflight.size()) break;
    if (!c.inflight[idx].acked) {
      c.backoff = 0;
      c.last_progress_ns = now_ns();
      c.probed = false;
    }
    acked(c, c.inflight[idx]);
    any = true;
    high = seq;
  }
  if (!any || c.inflight.empty()) return;
  // Fast retransmit: a hole with enough SACKed packets above it, resent at most once per RTT.
  const int64_t now = now_ns();
  const int64_t min_gap =
      std::max<int64_t>(static_cast<int64_t>(c.srtt_us * 1000), kFastRetxMinGapNs) + c.tolerance_ns;
  for (TxPkt& p : c.inflight) {
    if (!seq_lt(p.seq, high)) break;
    if (p.acked || static_cast<int32_t>(high - p.seq) < kFastRetxThreshold) continue;
    if (now - p.sent_ns < min_gap) continue;
    ++stats_.fast_retransmits;
    send_pkt(c, p, true);
  }
}

void Engine::deliver_eager(Conn& c, RecvReq& r, uint64_t len, int32_t tag, const uint8_t* payload) {
  r.done = true;
  if (len > r.cap) {
    r.err =
        invalid_arg("recv from {}: message truncated: peer sent {} bytes into a {}-byte receive",
                    c.name(), len, r.cap);
  } else if (r.tag != net::kAnyTag && r.tag != tag) {
    r.err = internal_error("recv from {}: tag mismatch: receive posted tag {}, peer sent tag {}",
                           c.name(), r.tag, tag);
    if (c.error.ok()) c.error = r.err;  // out of step from here on, as with MSG_ERR
  } else {
    if (len > 0) std::memcpy(r.data, payload, len);
    r.got = r.total = len;
  }
}

void Engine::on_reliable(Conn& c, const Frame& f) {
  const uint32_t s = f.hdr.seq;
  if (!c.ack_due) {
    c.ack_due_since = now_ns();
    c.ts_recent = f.hdr.ts;
  }
  c.ack_due = true;
  ++c.rx_since_ack;
  // Prompt ACKs: a gap (the sender's fast retransmission needs the SACK), the end of a message
  // (the send completes on it), control frames, and a sender about to fill the window we give it.
  if (s != c.rcv_next || f.hdr.type != FrameType::kData || (f.hdr.flags & kFlagLast) ||
      c.rx_since_ack >= advertised_window() / 4) {
    c.ack_now = true;
  }
  if (seq_lt(s, c.rcv_next)) {
    ++stats_.duplicates;  // replayed or retransmitted: already delivered
    if (f.hdr.flags & kFlagRetx) ++c.spurious_rx;
    return;
  }
  if (s - c.rcv_next >= kRcvWindow) {
    ++stats_.out_of_window;
    return;
  }
  uint8_t& bit = c.rcv_bits[s % kRcvWindow];
  if (bit) {
    ++stats_.duplicates;
    if (f.hdr.flags & kFlagRetx) ++c.spurious_rx;
    return;
  }
  // Validate before accepting the sequence number, so a bad frame can be resent correctly.
  switch (f.hdr.type) {
    case FrameType::kData: {
      if (c.sender) return;
      auto it = std::find_if(c.recvs.begin(), c.recvs.end(),
                             [&](const auto& r) { return r->msg == f.hdr.msg; });
      if (f.hdr.flags & kFlagEager) {
        if (f.hdr.offset != 0 || f.hdr.payload_len != f.hdr.msg_len) {
          ++stats_.stale_msg;  // an eager message is one whole frame
          break;
        }
        if (it == c.recvs.end()) {
          if (seq_lt(f.hdr.msg, c.next_msg) || c.early.count(f.hdr.msg)) {
            ++stats_.stale_msg;  // its receive came and went: not from a sane peer
            break;
          }
          if (c.early.size() >= static_cast<size_t>(net::kMaxRequests)) {
            ++stats_.early_full;
            return;  // not accepted: the sender retransmits it
          }
          c.early[f.hdr.msg] = Conn::Early{
              f.hdr.msg_len, f.hdr.tag, std::vector<uint8_t>(f.payload, f.payload + f.payload_len)};
          ++stats_.data_frames_rx;
          break;
        }
        if (!(*it)->done) deliver_eager(c, **it, f.hdr.msg_len, f.hdr.tag, f.payload);
        ++stats_.data_frames_rx;
        break;
      }
      // A frame for no posted receive, or larger than it, is not from a sane peer: its sequence
      // number is consumed (so it is not resent forever) and its payload dropped.
      if (it == c.recvs.end() || (*it)->done || f.hdr.msg_len > (*it)->cap) {
        ++stats_.stale_msg;
        break;
      }
      RecvReq& r = **it;
      ++stats_.data_frames_rx;
      if (f.payload_len > 0) std::memcpy(r.data + f.hdr.offset, f.payload, f.payload_len);
      r.got += f.payload_len;
      r.total = f.hdr.msg_len;
      if (r.got >= r.total) r.done = true;
      break;
    }
    case FrameType::kCts: {
      if (!c.sender) return;
      auto it = std::find_if(c.sends.begin(), c.sends.end(),
                             [&](const auto& r) { return r->msg == f.hdr.msg && r->eager; });
      if (it == c.sends.end()) {
        c.cts[f.hdr.msg] = Conn::Cts{f.hdr.msg_len, f.hdr.tag};
        break;
      }
      // The CTS of an eager message: the receiver judges the frame by the same rules.
      SendReq& r = **it;
      if (r.done) break;
      if (r.size > f.hdr.msg_len) {
        r.done = true;
        r.err = invalid_arg("send to {}: message truncated: {} bytes sent, receive posted {} bytes",
                            c.name(), r.size, f.hdr.msg_len);
      } else if (f.hdr.tag != net::kAnyTag && f.hdr.tag != r.tag) {
        r.done = true;
        r.err = internal_error("send to {}: tag mismatch: sent tag {}, receive posted tag {}",
                               c.name(), r.tag, f.hdr.tag);
      } else {
        r.cts_ok = true;
        if (r.unacked == 0) r.done = true;
      }
      break;
    }
    case FrameType::kMsgErr: {
      if (c.sender) return;
      auto it = std::find_if(c.recvs.begin(), c.recvs.end(),
                             [&](const auto& r) { return r->msg == f.hdr.msg; });
      if (it != c.recvs.end() && !(*it)->done) {
        RecvReq& r = **it;
        r.done = true;
        if (f.hdr.flags & kFlagErrTrunc) {
          r.err = invalid_arg(
              "recv from {}: message truncated: peer sent {} bytes into a "
              "{}-byte receive",
              c.name(), f.hdr.msg_len, r.cap);
        } else {
          r.err = internal_error(
              "recv from {}: tag mismatch: receive posted tag {}, peer sent "
              "tag {}",
              c.name(), r.tag, f.hdr.tag);
          // The streams are out of step from here on: the comm stays failed (the protocol
          // keeps running so the peer's frames are still acknowledged).
          if (c.error.ok()) c.error = r.err;
        }
      }
      break;
    }
    default:
      return;
  }
  bit = 1;
  if (seq_lt(c.rcv_high, s + 1) || c.rcv_high == c.rcv_next) c.rcv_high = s + 1;
  while (c.rcv_bits[c.rcv_next % kRcvWindow]) {
    c.rcv_bits[c.rcv_next % kRcvWindow] = 0;
    ++c.rcv_next;
  }
  if (seq_lt(c.rcv_high, c.rcv_next)) c.rcv_high = c.rcv_next;
}

}  // namespace gw::dpdk
