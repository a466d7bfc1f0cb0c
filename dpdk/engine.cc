// Engine (dpdk/engine.h): construction and shutdown, the background progress thread, the request
// API (isend, irecv, test) and one pass of the RX/TX loop. The protocol's other parts live in
// engine_connect.cc, engine_tx.cc, engine_rx.cc and engine_loss.cc (see engine_internal.h).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "core/log.h"
#include "core/net/transport.h"
#include "dpdk/engine_internal.h"

namespace gw::dpdk {

namespace {

// A receiver acknowledges at once on a gap, a duplicate, the last fragment of a message or a
// control frame, or after this many frames; otherwise at most kAckDelayNs after the first
// unacknowledged frame (coalescing: one ACK per burst, not per frame; engine_internal.h).
constexpr uint32_t kAckEvery = 16;
// test() calls that find nothing new before the caller's thread yields the CPU (spin-then-yield:
// on a shared host the peer process may need this core to answer).
constexpr int kSpinBeforeYield = 4;

}  // namespace

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
        const int64_t since =
            sys::now_ns() - raw->last_progress_ns_.load(std::memory_order_relaxed);
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
  rng_state_ = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(sys::now_ns());
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
  if (::gw::log::get().should_log(spdlog::level::debug)) {
    EngineStats st = stats_;
    st.yields = yields_;
    st.port = port_->drops();
    GW_LOG_DEBUG("dpdk: engine on {} at shutdown: {}", port_->name(), describe(st));
  }
}

std::string describe(const EngineStats& st) {
  return fmt::format(
      "tx {} rx {} data_tx {} data_rx {} retx {} (timeout {} fast {} probe {}) dups {} spurious {} "
      "tolerance {:.0f} us acks tx/rx {}/{} prompt {} carried {} polls {} idle {} srtt {:.0f} us "
      "rttvar {:.0f} rto {:.0f} us pool_empty {} tx_ring_full {} decode_drops {} port: "
      "rx_missed {} rx_err {} rx_nombuf {} tx_err {} slow rx/tx {}/{} max {}/{} us injected "
      "drop/dup/hold "
      "{}/{}/{} zc frames {} bytes {} fallbacks {} rx_split {} yields {} eager {} early_full {} "
      "not_for_us {} unknown_conn {} wrong_session {} wrong_token {} hello_refused {} bad_ack {} "
      "out_of_window {}",
      st.tx_frames, st.rx_frames, st.data_frames_tx, st.data_frames_rx, st.retransmits,
      st.timeout_retransmits, st.fast_retransmits, st.tail_probes, st.duplicates,
      st.spurious_retransmits, st.tolerance_us, st.acks_tx, st.acks_rx, st.acks_prompt,
      st.acks_carried, st.polls, st.idle_polls, st.srtt_us, st.rttvar_us, st.rto_us, st.pool_empty,
      st.tx_ring_full, st.decode_drops_total(), st.port.rx_missed, st.port.rx_errors,
      st.port.rx_nombuf, st.port.tx_errors, st.port.slow_rx, st.port.slow_tx, st.port.max_rx_us,
      st.port.max_tx_us, st.injected_drops, st.injected_dups, st.injected_holds, st.zc_frames_tx,
      st.zc_bytes_tx, st.zc_fallbacks, st.rx_split_frames, st.yields, st.eager_sends, st.early_full,
      st.not_for_us, st.unknown_conn, st.wrong_session, st.wrong_token, st.hello_refused,
      st.bad_ack, st.out_of_window);
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
  acks_with_answer();
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
  acks_with_answer();
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
    // flight: it must not point at the request once it is gone, nor at the caller's buffer,
    // which is the caller's again: a copy of its bytes goes with the frame (the receiver judges
    // the message on it, and its sequence number must be delivered).
    for (TxPkt& p : c->inflight) {
      if (p.req != static_cast<void*>(it->get())) continue;
      p.req = nullptr;
      if (!s.ok() && p.len > 0 && !p.owned) {
        p.owned = std::make_shared<const std::vector<uint8_t>>(p.src, p.src + p.len);
        p.src = p.owned->data();
      }
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
      const int64_t now = sys::now_ns();
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
  background_pass_ = true;
  progress_locked();
  background_pass_ = false;
}

size_t Engine::progress_locked() {
  ++stats_.polls;
  ++pass_;
  // One clock reading serves the pass (a second one once frames came in): an idle pass of a
  // busy-polling caller read it four or five times, 14-16 % of an 8-byte ping-pong's samples.
  const int64_t start = sys::now_ns();
  last_progress_ns_.store(start, std::memory_order_relaxed);
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
  const int64_t now = total > 0 ? sys::now_ns() : start;
  if (now >= next_link_check_ns_) {
    next_link_check_ns_ = now + kLinkCheckNs;
    link_up_ = port_->check_link();
  }
  for (auto& [id, c] : conns_) {
    timers(*c, now);
    pump(*c);
    // An ACK of a message's end or a control frame waits for the next pass: the caller that
    // learns of the message from this pass answers it first (a reply, a CTS), and the ACK leaves
    // after the answer's frames rather than ahead of them (a frame sent over a copy-mode PMD costs
    // its sender microseconds). The background thread's pass, with no caller, sends it at once.
    const bool soon = c->ack_soon && (background_pass_ || pass_ > c->ack_soon_pass);
    if (c->ack_due &&
        (c->ack_now || soon || c->rx_since_ack >= kAckEvery || now >= c->ack_deadline_ns)) {
      if (c->ack_now || soon) ++stats_.acks_prompt;
      send_ack(*c);
    }
  }
  release_held(false);
  flush_tx();
  return total;
}

// The caller's answer (this isend's or irecv's frames, queued) leaves in one burst with the ACKs
// that waited for it (ack_soon: the end of a message, a control frame): over a copy-mode PMD each
// burst is a system call that also runs the peer's receive path, and the peer, a ping-pong's
// sender, waits for both the answer and the ACK (its send completes on the ACK).
void Engine::acks_with_answer() {
  for (auto& [id, c] : conns_) {
    if (c->ack_due && c->ack_soon) {
      ++stats_.acks_prompt;
      send_ack(*c);
    }
  }
}

void Engine::fail_conn(Conn& c, Status s) {
  if (!c.error.ok()) return;
  GW_LOG_DEBUG("dpdk: {}: {}", c.name(), s.to_string());
  c.error = std::move(s);
  c.state = Conn::State::kDead;
}

}  // namespace gw::dpdk
