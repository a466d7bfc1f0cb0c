// Point-to-point (p2p.h): requests, the engine's set-up and thread, matching and deadlines. The
// public calls (isend, irecv, dma-buf registration): p2p_calls.cc. Moving bytes over the
// connections: p2p_progress.cc.
#include "collectives/p2p.h"

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "collectives/backoff.h"
#include "collectives/p2p_engine.h"
#include "core/log.h"

namespace gw::coll {

// ---- requests -----------------------------------------------------------------------------------

bool P2PRequest::finish(Status s, size_t bytes, int source) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return false;
  done_ = true;
  status_ = std::move(s);
  bytes_ = bytes;
  source_ = source;
  // Last: a reader that sees the flag (acquire) reads the results without mu_; they never
  // change again.
  // seq_cst, as notify_on_done's store: either this sees the fd, or its owner sees the flag.
  done_flag_.store(true, std::memory_order_seq_cst);
  cv_.notify_all();
  if (const int fd = notify_fd_.load(std::memory_order_seq_cst); fd >= 0) {
    const uint64_t one = 1;
    (void)!::write(fd, &one, sizeof one);
  }
  return true;
}

Status P2PRequest::wait(int64_t timeout_ms) {
  if (done()) return status_;  // no lock: written before the flag (finish)
  if (driver_) {
    const auto until = timeout_ms < 0 ? Clock::time_point::max()
                                      : Clock::now() + std::chrono::milliseconds(timeout_ms);
    if (PointToPoint::Impl* engine = driver_->enter()) {
      engine->drive(*this, until);
      driver_->leave();
    }
    if (timeout_ms >= 0) {
      // What is left of the caller's timeout (the drive may have ended early: engine stopping).
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
      timeout_ms = std::max<int64_t>(0, left.count());
    }
    if (done()) return status_;
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_ms < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_; })) {
    return timeout_error("point-to-point request still running after {} ms", timeout_ms);
  }
  return status_;
}

Status P2PRequest::test(bool* out) {
  if (done()) {
    *out = true;
    return status_;
  }
  if (driver_) {
    // One pass of the engine in this thread, so that a caller that only polls sees its op end
    // as soon as its bytes are in (not when the progress thread next looks, up to 1 ms later).
    if (PointToPoint::Impl* engine = driver_->enter()) {
      engine->step();
      driver_->leave();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  *out = done_;
  return done_ ? status_ : ok_status();
}

size_t P2PRequest::bytes() const {
  if (done()) return bytes_;
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int P2PRequest::source() const {
  if (done()) return source_;
  std::lock_guard<std::mutex> lock(mu_);
  return source_;
}

PointToPoint::PointToPoint(const Group& group, PoolOptions pool, P2POptions options,
                           const std::atomic<bool>* aborted)
    : impl_(std::make_unique<Impl>(group, std::move(pool), options, aborted)) {
  impl_->driver->impl.store(impl_.get());
}

PointToPoint::~PointToPoint() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    impl_->cv.notify_all();
  }
  {
    // No caller may enter the engine from here on; those inside leave at their next step (stop).
    impl_->driver->impl.store(nullptr, std::memory_order_seq_cst);
    std::unique_lock<std::mutex> lock(impl_->driver->mu);
    if (!impl_->driver->cv.wait_for(lock, std::chrono::seconds(10),
                                    [&] { return impl_->driver->users.load() == 0; })) {
      GW_LOG_ERROR("point-to-point: a waiting caller did not leave the engine within 10 s");
    }
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& w : impl_->all) {
    if (auto r = w.lock())
      r->finish(aborted_error("point-to-point: communicator destroyed"), 0, -1);
  }
  impl_->flush_control(kFlushMs);
  impl_->end_all(aborted_error("point-to-point: communicator destroyed"));
}

// Best effort, bounded: posts the control frames already queued and waits until the transport
// took them. They are the RTS of eager sends that completed (their frame must reach the wire
// although this rank leaves) and the replies of messages this rank received (so that a rank that
// received its last message and closes does not leave the sender without its answer). The RTS of
// sends that ended before it was posted (destroy and abort end them first) is dropped.
void PointToPoint::Impl::flush_control(int64_t ms) {
  const Deadline deadline = deadline_after_ms(ms);

  while (Clock::now() < deadline) {
    bool pending = false;
    for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
      Peer& peer = peers[p];
      net::SendComm* sc = peer.sc[0].get();
      if (!sc || !peer.broken.ok()) continue;
      bool failed_conn = false;
      while (!peer.ctl_send.empty()) {
        bool done = false;
        size_t size = 0;
        if (!sc->test(peer.ctl_send.front().req, &done, &size).ok()) {
          failed_conn = true;
          break;
        }
        if (!done) break;
        peer.ctl_send.pop_front();
      }
      bool moved = false;
      Status why;
      if (failed_conn || !post_control(p, &moved, &why)) {
        peer.ctl_out.clear();
        peer.ctl_send.clear();
        continue;
      }
      pending = pending || !peer.ctl_send.empty() || !peer.ctl_out.empty();
    }
    if (!pending) return;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  GW_LOG_DEBUG("point-to-point: control frames still queued after {} ms at shutdown", ms);
}

bool PointToPoint::Impl::post_control(int p, bool* moved, Status* why) {
  Peer& peer = peers[p];
  net::SendComm* sc = peer.sc[0].get();
  while (!peer.ctl_out.empty() && peer.ctl_send.size() < static_cast<size_t>(net::kMaxRequests)) {
    CtlFrame& fr = peer.ctl_out.front();
    if (fr.send && fr.send->req->done()) {  // ended meanwhile (abort, destroy): never announced
      peer.ctl_out.pop_front();
      continue;
    }
    auto r = sc->isend(fr.bytes.data(), fr.bytes.size(), 0, nullptr);
    if (!r.ok()) {
      *why = r.status();
      return false;
    }
    if (*r == nullptr) break;
    InFlight f{};
    f.req = *r;
    f.frame = std::move(fr.bytes);
    std::shared_ptr<SendOp> s = std::move(fr.send);
    peer.ctl_out.pop_front();
    peer.ctl_send.push_back(std::move(f));
    *moved = true;
    if (s) {
      s->on_wire = true;
      // Standard mode: the payload is in the frame, which the transport now holds; the receiver
      // sends nothing back for it.
      if (s->bytes <= kEagerBytes && s->mr == nullptr) finish_send(s, ok_status());
    }
  }
  return true;
}

void PointToPoint::Impl::end_all(const Status& why) {
  for (auto& p : peers) {
    for (int c = 0; c < 2; ++c) {
      p.sc[c].reset();
      p.rc[c].reset();
      p.conn[c].reset();
      p.listen[c].reset();
    }
    p.ctl_send.clear();
    p.ctl_recv.clear();
    p.data_send.clear();
    p.data_recv.clear();
    p.awaiting.clear();
    p.pending_rts.clear();
    p.to_send.clear();
    p.to_recv.clear();
    if (p.broken.ok()) p.broken = why;
  }
  posted.clear();
  unexpected.clear();
  for (auto& w : all) {
    if (auto r = w.lock()) r->finish(why, 0, -1);
  }
  all.clear();
  active = 0;
  if (failed.ok()) failed = why;
}

Status PointToPoint::Impl::start_locked() {
  if (started) return failed;
  // The destructor set stop under mu before joining the progress thread: a call racing with it
  // must not start a thread that nobody would join (std::terminate at the Impl's end).
  if (stop) return aborted_error("point-to-point: communicator destroyed");
  started = true;
  const Deadline deadline = deadline_after_ms(opts.timeout_ms);
  for (int p = 0; p < group.size(); ++p) {
    if (p == me()) continue;
    peers[p].slots.assign(kCtlSlots, std::vector<uint8_t>(sizeof(Frame) + kEagerBytes));
    for (int c = 0; c < 2; ++c) {
      auto ctx = [&] {
        return fmt::format("point-to-point: listen for rank {} (channel {})", p, c);
      };
      auto t = pool.transport_for(p);
      if (!t.ok()) return failed = t.status().with_context(ctx());
      net::Handle h;
      auto l = (*t)->listen(&h);
      if (!l.ok()) return failed = l.status().with_context(ctx());
      (*l)->expect_peer(p);
      Status s =
          group.store()->set(key(p, me(), c), Bytes(h.bytes.begin(), h.bytes.end()), deadline);
      if (!s.ok()) return failed = s.with_context(ctx());
      peers[p].listen[c] = std::move(*l);
    }
  }
  thread = std::thread([this] { loop(); });
  return ok_status();
}

void PointToPoint::Impl::loop() {
  Backoff backoff(opts.spin_us);
  std::unique_lock<std::mutex> lock(mu);
  held = &lock;
  while (!stop) {
    if (aborted->load()) {
      const Status why = aborted_error("point-to-point: communicator aborted");
      for (auto& w : all) {
        if (auto r = w.lock()) r->finish(why, 0, -1);
      }
      flush_control(200);
      end_all(why);
      return;
    }
    if (wake_fd >= 0) {
      uint64_t n;
      (void)!::read(wake_fd, &n, sizeof n);
    }
    if (drivers.load() > 0) {
      // A caller waiting on its request moves the engine now (P2PRequest::wait): stand aside
      // rather than compete with it for mu and the core; it notifies cv when it leaves.
      cv.wait_for(lock, std::chrono::milliseconds(1));
      backoff.reset();
      continue;
    }
    held = &lock;
    bool moved = progress_locked();
    moved = check_deadlines(Clock::now()) || moved;
    if (moved) {
      backoff.reset();
      continue;
    }
    // Completed eager sends leave their frames with the transport, which moves their bytes only
    // when tested (a full socket buffer): the thread keeps at them as for an active op.
    if (active == 0 && !control_pending()) {
      cv.wait_for(lock, std::chrono::milliseconds(1));
    } else {
      lock.unlock();
      backoff.idle(
          [this, &lock](std::vector<pollfd>* fds) { return gather_fds_locked(lock, fds); });
      lock.lock();
    }
  }
}

void PointToPoint::Impl::drive(const P2PRequest& req, Clock::time_point until) {
  drivers.fetch_add(1);
  std::unique_lock<std::mutex> lock(mu);
  if (!started || stop) {
    drivers.fetch_sub(1);
    cv.notify_all();
    return;
  }
  Backoff backoff(opts.spin_us,
                  std::max(std::chrono::microseconds(2),
                           std::min(kDrivePureSpin, std::chrono::microseconds(opts.spin_us))));
  const bool bounded = until != Clock::time_point::max();
  // One clock read per pass, shared by the caller's bound, the deadlines and the backoff: the
  // backoff's (taken before it yields or polls: up to 1 ms old, so a deadline is seen one pass
  // later at worst), or a fresh one after a pass that moved something.
  // Within kQuietSpan of the last pass that moved something (the backoff's pure spin), up to
  // kQuietPolls passes that move nothing poll again at once, mu kept, between two such reads: a
  // message that lands then is seen a clock read (~20-50 ns) sooner, the deadlines checked a
  // few hundred nanoseconds late at worst. A longer wait goes through the backoff on every pass
  // (it yields the core), as before.
  auto now = Clock::now();
  auto moved_at = now;
  int quiet = 0;
  while (!req.done() && !stop && !aborted->load()) {
    if (bounded && now >= until) break;
    held = &lock;
    bool moved = progress_locked();
    moved = check_deadlines(now) || moved;
    if (req.done()) break;
    if (moved) {
      backoff.reset();
      quiet = 0;
      now = Clock::now();
      moved_at = now;
      continue;
    }
    if (now - moved_at < kQuietSpan && ++quiet < kQuietPolls) continue;
    quiet = 0;
    lock.unlock();
    now = backoff.idle(
        [this, &lock](std::vector<pollfd>* fds) { return gather_fds_locked(lock, fds); });
    lock.lock();
  }
  drivers.fetch_sub(1);
  // The progress thread takes over at once when there is something for it (an abort, other
  // requests); otherwise it looks again within its 1 ms wait, and a caller that goes on to its
  // next call does not have it woken on its core first.
  if (active > 0 || aborted->load() || stop) cv.notify_all();
}

void PointToPoint::Impl::step() {
  // Announced as a driver (as drive does), so that a progress thread that looks meanwhile stands
  // aside for its 1 ms wait instead of competing with a caller polling in a loop; not woken when
  // leaving (it takes over within that wait if the caller stops polling), except for a
  // connection's set-up: the store lookup, which may wait, is the progress thread's.
  drivers.fetch_add(1);
  bool wake_thread = false;
  {
    std::unique_lock<std::mutex> lock(mu, std::try_to_lock);
    // Taken: another thread is moving the engine right now, which is all this pass would do.
    if (lock.owns_lock() && started && !stop && !aborted->load()) {
      held = &lock;
      polling = true;
      progress_locked();
      check_deadlines(Clock::now());
      polling = false;
      wake_thread = lookup_wanted;
      lookup_wanted = false;
    }
  }
  drivers.fetch_sub(1);
  if (wake_thread || aborted->load()) cv.notify_all();
}

void PointToPoint::Impl::kick(std::unique_lock<std::mutex>* lock, int peer, bool sends_first) {
  if (peer == kAnySource || peer == me()) return;
  const Peer& p = peers[peer];
  // Not while this rank's connection to the peer is being set up: the progress thread looks the
  // store up for it. (The peer's connection to this rank may still be pending: a rank that only
  // sends eager messages to another is never connected back.)
  if (!p.broken.ok() || (p.want_connect && !p.sc[0])) return;
  held = lock;
  polling = true;  // a frame that asks for a connection back leaves its lookup to the thread
  progress_peer(peer, sends_first);
  polling = false;
  if (lookup_wanted) {
    lookup_wanted = false;
    wake();
  }
}

void PointToPoint::Impl::reply(int p, uint32_t type, uint64_t id, uint64_t bytes) {
  Peer& peer = peers[p];
  if (!peer.broken.ok()) return;
  peer.ctl_out.push_back(CtlFrame{make_frame(&peer, type, 0, bytes, id), nullptr});
  peer.want_connect = true;
}

void PointToPoint::Impl::deliver(const std::shared_ptr<RecvOp>& r, Unexpected& m,
                                 const uint8_t* eager_bytes) {
  r->source = m.src;
  const bool eager = !m.rendezvous;
  if (eager && r->mr != nullptr) {
    // Its bytes are in a frame here: landing them in device memory would take a CPU copy.
    r->bytes = 0;
    finish_recv(r, Status(Code::kUnsupported,
                          fmt::format("point-to-point: rank {} sent {} bytes with tag {} from a "
                                      "host buffer (eagerly); a device receive takes only a "
                                      "device send's (rendezvous) message",
                                      m.src, m.bytes, m.tag)));
    return;
  }
  if (m.bytes > r->cap) {
    r->bytes = 0;
    finish_recv(r,
                truncated_error("point-to-point: message truncated: rank {} sent {} bytes with tag "
                                "{}, the receive holds {} bytes",
                                m.src, m.bytes, m.tag, r->cap));
    // An eager send completed already (standard mode): only the receive fails.
    if (eager) return;
    if (m.self) {
      finish_send(m.self,
                  truncated_error("point-to-point: message truncated: the receive for tag {} on "
                                  "rank {} holds {} bytes, the message has {}",
                                  m.tag, me(), r->cap, m.bytes));
    } else {
      reply(m.src, kNak, m.id, r->cap);
    }
    return;
  }
  r->bytes = m.bytes;
  if (eager) {  // from the RTS (or, sent to oneself, the copy made by isend); nothing goes back
    if (m.bytes > 0) std::memcpy(r->buf, eager_bytes ? eager_bytes : m.eager.data(), m.bytes);
    finish_recv(r, ok_status());
  } else if (m.self) {
    if (m.bytes > 0) std::memcpy(r->buf, m.self->buf, m.bytes);
    finish_recv(r, ok_status());
    finish_send(m.self, ok_status());
  } else {
    r->msg_id = m.id;
    peers[m.src].to_recv.push_back(r);
    reply(m.src, kCts, m.id, 0);
  }
}

void PointToPoint::Impl::on_frame(int p, const uint8_t* data, size_t size) {
  Peer& peer = peers[p];
  Frame h;
  if (size < sizeof h) {
    break_peer(p, peer_error("point-to-point: rank {} sent a control frame of {} bytes", p, size));
    return;
  }
  std::memcpy(&h, data, sizeof h);
  GW_LOG_DEBUG("point-to-point: frame {} from rank {} (tag {}, {} bytes, id {})", h.type, p, h.tag,
               h.bytes, h.id);
  if (h.type == kRts || h.type == kRtsEager) {
    // A device send's RTS (kRts) may announce any size; an eager one at most kEagerBytes.
    if ((h.type == kRtsEager && h.bytes > kEagerBytes) ||
        (h.type == kRtsEager && size != sizeof h + h.bytes) || h.tag < 0) {
      break_peer(p, peer_error("point-to-point: rank {} sent a malformed message header", p));
      return;
    }
    // A rendezvous message is answered (CTS or NAK, then ACK); an eager one is not, so a rank
    // that only receives eager messages never connects back (nothing to fail when it leaves).
    if (h.type == kRts) peer.want_connect = true;
    Unexpected m{p, h.tag, h.bytes, h.id, {}, nullptr, h.type == kRts};
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      if (((*it)->peer == p || (*it)->peer == kAnySource) && (*it)->tag == h.tag) {
        auto r = std::move(*it);
        posted.erase(it);
        deliver(r, m, data + sizeof h);  // an eager message's bytes straight from the slot
        return;
      }
    }
    if (h.type == kRtsEager) m.eager.assign(data + sizeof h, data + size);
    unexpected.push_back(std::move(m));
    return;
  }
  auto it = peer.awaiting.find(h.id);
  if (it == peer.awaiting.end() || (h.type != kCts && h.type != kAck && h.type != kNak)) {
    break_peer(p,
               peer_error("point-to-point: rank {} answered a message this rank did not send", p));
    return;
  }
  auto s = it->second;
  if (h.type == kAck) {
    // Every byte arrived (its last chunk may not have tested done here yet; it completes then).
    s->acked = true;
    if (s->data_done) {
      peer.awaiting.erase(it);
      finish_send(s, ok_status());
    }
  } else if (h.type == kNak) {
    peer.awaiting.erase(it);
    finish_send(s,
                truncated_error("point-to-point: message truncated: the receive for tag {} on rank "
                                "{} holds {} bytes, the message has {}",
                                s->tag, p, h.bytes, s->bytes));
  } else {
    peer.to_send.push_back(s);  // stays in awaiting until its ACK
  }
}

void PointToPoint::Impl::break_peer(int p, const Status& why,
                                    const std::shared_ptr<P2PRequest>& culprit,
                                    const Status& culprit_status) {
  Peer& peer = peers[p];
  if (!peer.broken.ok()) return;
  bool pending = !peer.ctl_out.empty() || !peer.data_send.empty() || !peer.data_recv.empty() ||
                 !peer.awaiting.empty() || !peer.pending_rts.empty() || !peer.to_send.empty() ||
                 !peer.to_recv.empty();
  for (const auto& r : posted) pending = pending || r->peer == p;
  if (pending) {
    GW_LOG_WARN("rank {}: {}", me(), why.to_string());
  } else {
    // Nothing of this rank's was waiting on the peer: the usual end of a communicator whose
    // peer went first (its later ops with the peer fail with `why`).
    GW_LOG_DEBUG("rank {}: {}", me(), why.to_string());
  }
  peer.broken = why;
  for (int c = 0; c < 2; ++c) {
    peer.sc[c].reset();
    peer.rc[c].reset();
    peer.conn[c].reset();
    peer.listen[c].reset();
  }
  auto st = [&](const std::shared_ptr<P2PRequest>& r) {
    return r == culprit ? culprit_status : why;
  };
  for (auto& f : peer.ctl_out) {
    if (f.send) finish_send(f.send, st(f.send->req));  // its RTS never reached the transport
  }
  peer.ctl_out.clear();
  peer.ctl_send.clear();
  peer.ctl_recv.clear();
  for (auto& f : peer.data_send) {
    if (f.send && f.last && !f.send->acked) finish_send(f.send, st(f.send->req));
  }
  for (auto& f : peer.data_recv) {
    if (f.recv && f.last) finish_recv(f.recv, st(f.recv->req));
  }
  peer.data_send.clear();
  peer.data_recv.clear();
  for (auto& kv : peer.awaiting) {
    // An ACKed send whose last chunk had not tested done yet: the receiver has every byte.
    finish_send(kv.second, kv.second->acked ? ok_status() : st(kv.second->req));
  }
  peer.awaiting.clear();
  for (auto& s : peer.pending_rts) finish_send(s, st(s->req));
  peer.pending_rts.clear();
  for (auto& s : peer.to_send) {
    if (s->posted == 0 || s->posted < s->bytes) finish_send(s, st(s->req));
  }
  peer.to_send.clear();
  for (auto& r : peer.to_recv) {
    if (r->posted == 0 || r->posted < r->bytes) finish_recv(r, st(r->req));
  }
  peer.to_recv.clear();
  for (auto it = posted.begin(); it != posted.end();) {
    if ((*it)->peer == p) {
      finish_recv(*it, st((*it)->req));
      it = posted.erase(it);
    } else {
      ++it;
    }
  }
  // Eager messages that arrived stay receivable: their sends completed, and the peer may have
  // closed right after them (a rank that sends and destroys). Per tag only up to the first
  // rendezvous one, whose bytes will not come: a later receive must not skip it.
  std::set<int> cut;
  for (auto it = unexpected.begin(); it != unexpected.end();) {
    if (it->src == p && (it->rendezvous || cut.count(it->tag) > 0)) {
      cut.insert(it->tag);
      it = unexpected.erase(it);
    } else {
      ++it;
    }
  }
}

bool PointToPoint::Impl::check_deadlines(Clock::time_point now) {
  // No op ends before `earliest` (each new op lowers it; every scan sets it anew from what it
  // saw): the scan is skipped until then, and at least every kRescanMs in any case.
  if (now < earliest) return false;
  earliest = now + std::chrono::milliseconds(kRescanMs);
  auto seen = [&](Clock::time_point d) { earliest = std::min(earliest, d); };
  bool any = false;
  // Receives no message has matched yet touch nothing: they end alone.
  for (auto it = posted.begin(); it != posted.end();) {
    if (now >= (*it)->deadline) {
      auto r = std::move(*it);
      it = posted.erase(it);
      const std::string from =
          r->peer == kAnySource ? std::string("any rank") : fmt::format("rank {}", r->peer);
      finish_recv(r, timeout_error("point-to-point: receive from {} with tag {}: no message "
                                   "within {} ms",
                                   from, r->tag, opts.timeout_ms));
      any = true;
    } else {
      seen((*it)->deadline);
      ++it;
    }
  }
  // A send to oneself that no receive took.
  for (auto it = unexpected.begin(); it != unexpected.end();) {
    if (it->self && now >= it->self->deadline) {
      finish_send(it->self, timeout_error("point-to-point: send to this rank (its own) with tag {} "
                                          "not received within {} ms",
                                          it->tag, opts.timeout_ms));
      it = unexpected.erase(it);
      any = true;
    } else {
      if (it->self) seen(it->self->deadline);
      ++it;
    }
  }
  // An op with a peer that passed its deadline: its peer's connections are closed (bytes may be
  // on the wire), which ends the peer's ops too.
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    Peer& peer = peers[p];
    if (!peer.broken.ok()) continue;
    std::shared_ptr<P2PRequest> late;
    std::string what;
    auto check_send = [&](const std::shared_ptr<SendOp>& s) {
      seen(s->deadline);
      if (!late && now >= s->deadline) {
        late = s->req;
        what = fmt::format("send to rank {} with tag {} ({} bytes)", p, s->tag, s->bytes);
      }
    };
    auto check_recv = [&](const std::shared_ptr<RecvOp>& r) {
      seen(r->deadline);
      if (!late && now >= r->deadline) {
        late = r->req;
        what = fmt::format("receive from rank {} with tag {} ({} bytes)", p, r->tag, r->bytes);
      }
    };
    for (auto& s : peer.pending_rts) check_send(s);
    for (auto& f : peer.ctl_out) {
      if (f.send) check_send(f.send);
    }
    for (auto& kv : peer.awaiting) check_send(kv.second);
    for (auto& s : peer.to_send) check_send(s);
    for (auto& r : peer.to_recv) check_recv(r);
    for (auto& f : peer.data_send) {
      if (f.last) check_send(f.send);
    }
    for (auto& f : peer.data_recv) {
      if (f.last) check_recv(f.recv);
    }
    if (late) {
      Status culprit =
          timeout_error("point-to-point: {} not done within {} ms", what, opts.timeout_ms);
      break_peer(p,
                 peer_error("point-to-point: connections with rank {} closed after a timeout: {}",
                            p, what),
                 late, culprit);
      any = true;
    }
  }
  return any;
}

}  // namespace gw::coll
