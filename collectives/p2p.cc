// Point-to-point (p2p.h): requests, the engine's set-up and thread, matching, deadlines and the
// public calls. Moving bytes over the connections: p2p_progress.cc.
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
#include <thread>
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

Result<std::shared_ptr<P2PRequest>> PointToPoint::isend(const void* buf, size_t bytes, int peer,
                                                        int tag, net::MemRegion* mr) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.group.size()) {
    return invalid_arg("send: peer {} is not a rank of this communicator (size {})", peer,
                       m.group.size());
  }
  if (tag < 0) return invalid_arg("send: tag {} < 0", tag);
  if (bytes > 0 && buf == nullptr) return invalid_arg("send: NULL buffer with {} bytes", bytes);
  std::unique_lock<std::mutex> lock(m.mu);
  if (m.aborted->load()) return aborted_error("send: communicator aborted");
  GW_RETURN_IF_ERROR(m.start_locked());
  if (!m.failed.ok()) return m.failed;
  if (mr != nullptr && peer == m.me()) {
    return Status(Code::kUnsupported,
                  "send: a device buffer (registered region) to this rank itself: the engine "
                  "has no loopback for device memory");
  }
  if (peer != m.me() && mr == nullptr) {
    if (auto done = m.send_eager_now(peer, buf, bytes, tag)) return done;
  }
  auto s = std::make_shared<SendOp>();
  s->req = std::make_shared<P2PRequest>();
  s->req->set_driver(m.driver);
  s->buf = static_cast<const uint8_t*>(buf);
  s->bytes = bytes;
  s->peer = peer;
  s->tag = tag;
  s->mr = mr;
  s->deadline = deadline_after_ms(m.opts.timeout_ms);
  m.earliest = std::min(m.earliest, s->deadline);
  m.track(s->req);
  ++m.active;
  if (peer == m.me()) {
    // An eager send to oneself is copied now and completes (as one to another rank completes
    // once the transport holds its RTS); a larger one waits for its receive.
    Unexpected u{peer, tag, bytes, 0, {}, nullptr, bytes > PointToPoint::kEagerBytes};
    if (bytes <= PointToPoint::kEagerBytes) {
      u.eager.assign(s->buf, s->buf + bytes);
      m.finish_send(s, ok_status());
    } else {
      u.self = s;
    }
    for (auto it = m.posted.begin(); it != m.posted.end(); ++it) {
      if (((*it)->peer == peer || (*it)->peer == kAnySource) && (*it)->tag == tag) {
        auto r = std::move(*it);
        m.posted.erase(it);
        m.deliver(r, u);
        return s->req;
      }
    }
    m.unexpected.push_back(std::move(u));
    return s->req;
  }
  Peer& p = m.peers[peer];
  if (!p.broken.ok()) {
    --m.active;
    return Status(p.broken.code(), fmt::format("send to rank {}: {}", peer, p.broken.message()));
  }
  s->id = p.next_id++;
  p.pending_rts.push_back(s);
  p.want_connect = true;
  m.kick(&lock, peer, /*sends_first=*/true);
  // An eager message whose RTS the kick handed to the transport is done: the progress thread
  // tests the frame within its 1 ms wait (or the caller's next call moves the engine). Waking
  // that thread here would only make it compete with the caller (often on the same core).
  if (!(s->on_wire && bytes <= PointToPoint::kEagerBytes)) m.wake();
  return s->req;
}

Result<std::shared_ptr<P2PRequest>> PointToPoint::irecv(void* buf, size_t bytes, int peer, int tag,
                                                        net::MemRegion* mr) {
  Impl& m = *impl_;
  if (peer < kAnySource || peer >= m.group.size()) {
    return invalid_arg(
        "receive: peer {} is not a rank of this communicator (size {}) nor any "
        "source (-1)",
        peer, m.group.size());
  }
  if (tag < 0) return invalid_arg("receive: tag {} < 0", tag);
  if (bytes > 0 && buf == nullptr) return invalid_arg("receive: NULL buffer with {} bytes", bytes);
  if (mr != nullptr && (peer == kAnySource || peer == m.me())) {
    return Status(Code::kUnsupported,
                  "receive: a device buffer (registered region) takes a message of one other "
                  "rank only (its registration is with that rank's data connection)");
  }
  std::unique_lock<std::mutex> lock(m.mu);
  if (m.aborted->load()) return aborted_error("receive: communicator aborted");
  GW_RETURN_IF_ERROR(m.start_locked());
  if (!m.failed.ok()) return m.failed;
  auto match = std::find_if(m.unexpected.begin(), m.unexpected.end(), [&](const Unexpected& u) {
    return (peer == kAnySource || u.src == peer) && u.tag == tag;
  });
  // A broken peer's eager messages that arrived before it broke are still received (break_peer).
  if (match == m.unexpected.end() && peer >= 0 && peer != m.me() && !m.peers[peer].broken.ok()) {
    const Status& b = m.peers[peer].broken;
    return Status(b.code(), fmt::format("receive from rank {}: {}", peer, b.message()));
  }
  auto r = std::make_shared<RecvOp>();
  r->req = std::make_shared<P2PRequest>();
  r->req->set_driver(m.driver);
  r->buf = static_cast<uint8_t*>(buf);
  r->cap = bytes;
  r->peer = peer;
  r->tag = tag;
  r->mr = mr;
  r->deadline = deadline_after_ms(m.opts.timeout_ms);
  m.earliest = std::min(m.earliest, r->deadline);
  m.track(r->req);
  ++m.active;
  if (match != m.unexpected.end()) {
    Unexpected u = std::move(*match);
    m.unexpected.erase(match);
    m.deliver(r, u);
    return r->req;
  }
  m.posted.push_back(r);
  m.kick(&lock, peer);
  // Not m.wake(): the caller's wait or test moves the engine for the receive (the hand-off to
  // the progress thread cost a third of the tcp ping-pong's latency, docs/collectives.md), and
  // that thread takes it over within its 1 ms wait when nobody does. A lookup the kick asked for
  // woke it already.
  return r->req;
}

Result<net::MemRegion*> PointToPoint::reg_dmabuf(int peer, bool send, void* iova, size_t bytes,
                                                 uint64_t offset, int fd, Deadline deadline) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.group.size() || peer == m.me()) {
    return invalid_arg("dma-buf registration: peer {} is not another rank of this communicator",
                       peer);
  }
  const char* dir = send ? "to" : "from";
  std::unique_lock<std::mutex> lock(m.mu);
  GW_RETURN_IF_ERROR(m.start_locked());
  for (;;) {
    if (m.aborted->load()) return aborted_error("dma-buf registration: communicator aborted");
    if (!m.failed.ok()) return m.failed;
    Peer& p = m.peers[peer];
    if (!p.broken.ok()) {
      return Status(p.broken.code(), fmt::format("dma-buf registration for the connection {} "
                                                 "rank {}: {}",
                                                 dir, peer, p.broken.message()));
    }
    net::Comm* c = send ? static_cast<net::Comm*>(p.sc[1].get()) : p.rc[1].get();
    if (c != nullptr) {
      auto mr = c->reg_mr_dmabuf(iova, bytes, offset, fd);
      if (!mr.ok()) {
        return mr.status().with_context(
            fmt::format("dma-buf registration on the connection {} rank {}", dir, peer));
      }
      return *mr;
    }
    if (send && !p.want_connect) {
      p.want_connect = true;
      m.wake();
    }
    if (Clock::now() >= deadline) {
      return timeout_error("dma-buf registration: no data connection {} rank {} yet{}", dir, peer,
                           send ? "" : " (it is made at the peer's first send here)");
    }
    m.cv.wait_for(lock, std::chrono::milliseconds(1));  // the progress thread connects meanwhile
  }
}

Status PointToPoint::dereg_dmabuf(int peer, bool send, net::MemRegion* mr) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.group.size() || peer == m.me()) {
    return invalid_arg("dma-buf deregistration: peer {} is not another rank", peer);
  }
  std::lock_guard<std::mutex> lock(m.mu);
  Peer& p = m.peers[peer];
  net::Comm* c = send ? static_cast<net::Comm*>(p.sc[1].get()) : p.rc[1].get();
  if (c == nullptr) {
    return invalid_arg(
        "dma-buf deregistration: the connection with rank {} is gone (and its "
        "registrations with it)",
        peer);
  }
  return c->dereg_mr(mr);
}

Result<bool> PointToPoint::flush_dmabuf(int peer, void* iova, size_t bytes, net::MemRegion* mr,
                                        Deadline deadline) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.group.size() || peer == m.me()) {
    return invalid_arg("dma-buf flush: peer {} is not another rank", peer);
  }
  // Under the engine's lock, as the progress thread's use of the same connection.
  std::unique_lock<std::mutex> lock(m.mu);
  net::RecvComm* rc = m.peers[peer].rc[1].get();
  if (rc == nullptr) {
    return invalid_arg(
        "dma-buf flush: the data connection from rank {} is gone (and its "
        "registrations with it)",
        peer);
  }
  auto r = rc->iflush(iova, bytes, mr);
  if (!r.ok()) return r.status().with_context(fmt::format("dma-buf flush (from rank {})", peer));
  if (*r == nullptr) return false;  // nothing needs doing
  for (;;) {
    bool done = false;
    size_t n = 0;
    const Status st = rc->test(*r, &done, &n);
    if (!st.ok()) return st.with_context(fmt::format("dma-buf flush (from rank {})", peer));
    if (done) return true;
    if (Clock::now() >= deadline) {
      return timeout_error("dma-buf flush: the connection from rank {} did not end it in time",
                           peer);
    }
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
    if (m.peers[peer].rc[1].get() != rc) {
      return peer_error("dma-buf flush: the data connection from rank {} went meanwhile", peer);
    }
  }
}

Result<bool> Communicator::flush_dmabuf(int, void*, size_t, net::MemRegion*, Deadline) {
  return Status(Code::kUnsupported,
                "dma-buf flush: this communicator has no point-to-point engine");
}

Result<net::MemRegion*> Communicator::reg_dmabuf(int, bool, void*, size_t, uint64_t, int,
                                                 Deadline) {
  return Status(Code::kUnsupported,
                "dma-buf registration: this communicator has no "
                "point-to-point");
}

Status Communicator::dereg_dmabuf(int, bool, net::MemRegion*) {
  return Status(Code::kUnsupported,
                "dma-buf deregistration: this communicator has no "
                "point-to-point");
}

Result<std::shared_ptr<P2PRequest>> Communicator::isend_registered(const void*, size_t, int, int,
                                                                   net::MemRegion*) {
  return Status(Code::kUnsupported, "send: this communicator has no point-to-point");
}

Result<std::shared_ptr<P2PRequest>> Communicator::irecv_registered(void*, size_t, int, int,
                                                                   net::MemRegion*) {
  return Status(Code::kUnsupported, "receive: this communicator has no point-to-point");
}

Result<std::shared_ptr<P2PRequest>> Communicator::isend(const void*, size_t, int, int) {
  return Status(Code::kUnsupported, "send: this communicator has no point-to-point");
}

Result<std::shared_ptr<P2PRequest>> Communicator::irecv(void*, size_t, int, int) {
  return Status(Code::kUnsupported, "receive: this communicator has no point-to-point");
}

}  // namespace gw::coll
