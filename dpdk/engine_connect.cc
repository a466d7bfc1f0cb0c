// Engine (dpdk/engine.h): listeners, connections and the handshake (docs/wire-dpdk.md):
// HELLO, CHALLENGE, PROOF and HELLO_ACK with the proofs of core/net/handshake.h, pending
// handshakes on the listener side, and the graceful close.
#include <fmt/format.h>
#include <openssl/crypto.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/log.h"
#include "core/net/handshake.h"
#include "dpdk/engine_internal.h"

namespace gw::dpdk {

namespace {

// How long close_conn keeps retransmitting unacknowledged reliable frames before its CLOSE.
constexpr int64_t kCloseLingerNs = 200 * 1000 * 1000;

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
  int64_t now = sys::now_ns();
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
  if (sys::now_ns() > c->deadline_ns) {
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
  const int64_t linger_until =
      sys::now_ns() + std::min<int64_t>(kCloseLingerNs, c->peer_timeout_ns);
  while (c->state == Conn::State::kOpen && !c->inflight.empty() && sys::now_ns() < linger_until) {
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
  const int64_t now = sys::now_ns();
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
  if (pit == pending_.end() || lit == listeners_.end() || pit->deadline_ns <= sys::now_ns()) {
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
  c->last_rx_ns = c->last_tx_ns = sys::now_ns();
  h.type = FrameType::kHelloAck;
  h.src_conn = c->id;
  send_ctl(f.src, h, nullptr, 0);
  l.ready.push_back(c->id);
  conns_[c->id] = std::move(c);
}

// The listener's answers to a connector's handshake: HELLO_ACK (open), HELLO_NAK (refused, or
// start over), CHALLENGE (the listener proved the token: send our PROOF).
void Engine::on_handshake_reply(Conn& c, const Frame& f, int64_t now) {
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
      return;
  }
}

}  // namespace gw::dpdk
