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
#include <string>
#include <utility>
#include <vector>

#include "collectives/backoff.h"
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
  cv_.notify_all();
  return true;
}

Status P2PRequest::wait(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (timeout_ms < 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return done_; })) {
    return timeout_error("point-to-point request still running after {} ms", timeout_ms);
  }
  return status_;
}

Status P2PRequest::test(bool* done) {
  std::lock_guard<std::mutex> lock(mu_);
  *done = done_;
  return done_ ? status_ : ok_status();
}

size_t P2PRequest::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

int P2PRequest::source() const {
  std::lock_guard<std::mutex> lock(mu_);
  return source_;
}

// ---- engine -------------------------------------------------------------------------------------

namespace {

enum FrameType : uint32_t { kRts = 1, kRtsEager = 2, kCts = 3, kAck = 4, kNak = 5 };

struct Frame {
  uint32_t type;
  int32_t tag;
  uint64_t bytes;  // RTS: message size; NAK: the receive's capacity
  uint64_t id;     // the sender's id of the message
  uint64_t pad;
};
static_assert(sizeof(Frame) == 32);

// Control receives kept posted per peer: one, since a transport whose peer closed may fail every
// posted receive, also one whose frame (the last ACK) had already arrived.
constexpr int kCtlSlots = 1;
constexpr int kDataWindow = 4;  // chunks in flight per data connection

struct SendOp {
  std::shared_ptr<P2PRequest> req;
  const uint8_t* buf;
  size_t bytes;
  int peer;
  int tag;
  uint64_t id = 0;
  Deadline deadline;
  bool on_wire = false;    // its RTS was posted
  bool data_done = false;  // rendezvous: its last chunk was sent
  bool acked = false;      // the receiver's ACK arrived
  size_t posted = 0;       // data bytes posted
};

struct RecvOp {
  std::shared_ptr<P2PRequest> req;
  uint8_t* buf;
  size_t cap;
  int peer;  // or kAnySource
  int tag;
  Deadline deadline;
  int source = -1;      // once matched
  size_t bytes = 0;     // once matched
  uint64_t msg_id = 0;  // once matched: the sender's id (ACKed when all data is in)
  size_t posted = 0;    // data bytes posted
};

// A message announced to this rank that no receive has taken yet.
struct Unexpected {
  int src;
  int tag;
  uint64_t bytes;
  uint64_t id;
  std::vector<uint8_t> eager;    // kRtsEager's bytes
  std::shared_ptr<SendOp> self;  // a send to oneself
};

struct InFlight {
  net::Request* req;
  std::shared_ptr<SendOp> send;  // data chunk of this send (last: completes it)
  std::shared_ptr<RecvOp> recv;
  size_t expect = 0;  // data receive: the chunk's size
  bool last = false;
  int slot = -1;               // control receive: its buffer
  std::vector<uint8_t> frame;  // control send: the frame (kept alive while in flight)
};

struct Peer {
  std::unique_ptr<net::Listener> listen[2];
  std::unique_ptr<net::RecvComm> rc[2];
  std::unique_ptr<net::Connector> conn[2];
  std::unique_ptr<net::SendComm> sc[2];
  bool want_connect = false;
  Clock::time_point next_lookup{};
  Status broken;                             // not ok: connections closed for good
  std::deque<std::vector<uint8_t>> ctl_out;  // frames waiting for the control connection
  std::deque<InFlight> ctl_send, ctl_recv, data_send, data_recv;
  std::vector<std::vector<uint8_t>> slots;
  std::map<uint64_t, std::shared_ptr<SendOp>> awaiting;  // RTS sent, reply not yet in
  std::deque<std::shared_ptr<SendOp>> pending_rts;       // RTS not yet posted
  std::deque<std::shared_ptr<SendOp>> to_send;           // CTS received, data to post
  std::deque<std::shared_ptr<RecvOp>> to_recv;           // CTS sent, data to post
  uint64_t next_id = 1;
};

std::string key(int src, int dst, int chan) { return fmt::format("p2p/{}/{}/{}", src, dst, chan); }

std::vector<uint8_t> make_frame(uint32_t type, int tag, uint64_t bytes, uint64_t id,
                                const uint8_t* eager = nullptr) {
  const size_t extra = type == kRtsEager ? bytes : 0;
  std::vector<uint8_t> f(sizeof(Frame) + extra);
  Frame h{type, tag, bytes, id, 0};
  std::memcpy(f.data(), &h, sizeof h);
  if (extra > 0) std::memcpy(f.data() + sizeof h, eager, extra);
  return f;
}

}  // namespace

struct PointToPoint::Impl {
  Impl(const Group& g, PoolOptions pool_options, P2POptions o, const std::atomic<bool>* ab)
      : group(g),
        pool(g, std::move(pool_options), ab),
        opts(o),
        aborted(ab),
        peers(static_cast<size_t>(g.size())) {}

  const Group& group;
  ConnectionPool pool;  // for its transports only (transport_for)
  P2POptions opts;
  const std::atomic<bool>* aborted;

  std::mutex mu;  // everything below; the progress thread holds it while it works
  std::condition_variable cv;
  bool started = false;
  bool stop = false;
  Status failed;  // set-up failed or the engine ended: every op fails with it
  std::thread thread;
  std::unique_lock<std::mutex>* held = nullptr;  // the progress thread's lock of mu
  std::vector<Peer> peers;
  std::list<std::shared_ptr<RecvOp>> posted;   // unmatched receives, posting order
  std::list<Unexpected> unexpected;            // unmatched messages, arrival order
  size_t active = 0;                           // ops not yet finished (for the idle wait)
  std::vector<std::weak_ptr<P2PRequest>> all;  // every op, to end them at shutdown

  int me() const { return group.rank(); }

  // Written by a new operation so that a progress thread blocked in poll() wakes at once.
  int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ~Impl() {
    if (wake_fd >= 0) ::close(wake_fd);
  }
  void wake() {
    cv.notify_all();
    if (wake_fd >= 0) {
      const uint64_t one = 1;
      (void)!::write(wake_fd, &one, sizeof one);
    }
  }
  // For Backoff::idle: the descriptors of every connection, false while some connection cannot
  // be waited on (shm, or a listener or connector still pending). Only the progress thread
  // changes the connections, so it may read them without mu.
  bool gather_fds(std::vector<pollfd>* fds) const {
    if (wake_fd < 0) return false;
    fds->push_back(pollfd{wake_fd, POLLIN, 0});
    for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
      if (p == me()) continue;
      const Peer& peer = peers[p];
      if (!peer.broken.ok()) continue;
      for (int c = 0; c < 2; ++c) {
        if (peer.listen[c] || peer.conn[c]) return false;
        if (peer.sc[c] && !peer.sc[c]->wait_fds(fds)) return false;
        if (peer.rc[c] && !peer.rc[c]->wait_fds(fds)) return false;
      }
    }
    return true;
  }

  Status start_locked();
  void loop();
  bool progress_locked();
  bool progress_peer(int p);
  void deliver(const std::shared_ptr<RecvOp>& r, Unexpected& m);
  void reply(int p, uint32_t type, uint64_t id, uint64_t bytes);
  void on_frame(int p, const uint8_t* data, size_t size);
  void break_peer(int p, const Status& why, const std::shared_ptr<P2PRequest>& culprit = nullptr,
                  const Status& culprit_status = ok_status());
  void finish_send(const std::shared_ptr<SendOp>& s, Status st) {
    if (s->req->finish(std::move(st), s->bytes, me()) && active > 0) --active;
  }
  void finish_recv(const std::shared_ptr<RecvOp>& r, Status st) {
    if (r->req->finish(std::move(st), r->bytes, r->source) && active > 0) --active;
  }
  void end_all(const Status& why);
  void flush_control(int64_t ms);
  bool check_deadlines();
};

PointToPoint::PointToPoint(const Group& group, PoolOptions pool, P2POptions options,
                           const std::atomic<bool>* aborted)
    : impl_(std::make_unique<Impl>(group, std::move(pool), options, aborted)) {}

PointToPoint::~PointToPoint() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    impl_->cv.notify_all();
  }
  if (impl_->thread.joinable()) impl_->thread.join();
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& w : impl_->all) {
    if (auto r = w.lock())
      r->finish(aborted_error("point-to-point: communicator destroyed"), 0, -1);
  }
  impl_->flush_control(200);
  impl_->end_all(aborted_error("point-to-point: communicator destroyed"));
}

// Best effort, bounded: sends the control frames already queued (the ACKs of messages this rank
// received), so that a rank that received its last message and closes does not leave the sender
// without its answer.
void PointToPoint::Impl::flush_control(int64_t ms) {
  const Deadline deadline = deadline_after_ms(ms);

  while (Clock::now() < deadline) {
    bool pending = false;
    for (auto& peer : peers) {
      net::SendComm* sc = peer.sc[0].get();
      if (!sc || !peer.broken.ok()) continue;
      while (!peer.ctl_send.empty()) {
        bool done = false;
        size_t size = 0;
        if (!sc->test(peer.ctl_send.front().req, &done, &size).ok()) {
          peer.ctl_out.clear();
          peer.ctl_send.clear();
          break;
        }
        if (!done) break;
        peer.ctl_send.pop_front();
      }
      while (!peer.ctl_out.empty() &&
             peer.ctl_send.size() < static_cast<size_t>(net::kMaxRequests)) {
        auto r = sc->isend(peer.ctl_out.front().data(), peer.ctl_out.front().size(), 0, nullptr);
        if (!r.ok()) {
          peer.ctl_out.clear();
          break;
        }
        if (*r == nullptr) break;
        InFlight f{};
        f.req = *r;
        f.frame = std::move(peer.ctl_out.front());
        peer.ctl_out.pop_front();
        peer.ctl_send.push_back(std::move(f));
      }
      pending = pending || !peer.ctl_send.empty() || !peer.ctl_out.empty();
    }
    if (!pending) return;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
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
    bool moved = progress_locked();
    moved = check_deadlines() || moved;
    if (moved) {
      backoff.reset();
      continue;
    }
    if (active == 0) {
      cv.wait_for(lock, std::chrono::milliseconds(1));
    } else {
      lock.unlock();
      backoff.idle([this](std::vector<pollfd>* fds) { return gather_fds(fds); });
      lock.lock();
    }
  }
}

void PointToPoint::Impl::reply(int p, uint32_t type, uint64_t id, uint64_t bytes) {
  Peer& peer = peers[p];
  if (!peer.broken.ok()) return;
  peer.ctl_out.push_back(make_frame(type, 0, bytes, id));
  peer.want_connect = true;
}

void PointToPoint::Impl::deliver(const std::shared_ptr<RecvOp>& r, Unexpected& m) {
  r->source = m.src;
  if (m.bytes > r->cap) {
    r->bytes = 0;
    finish_recv(r, invalid_arg("point-to-point: message truncated: rank {} sent {} bytes with tag "
                               "{}, the receive holds {} bytes",
                               m.src, m.bytes, m.tag, r->cap));
    if (m.self) {
      finish_send(m.self,
                  invalid_arg("point-to-point: message truncated: the receive for tag {} on "
                              "rank {} holds {} bytes, the message has {}",
                              m.tag, me(), r->cap, m.bytes));
    } else {
      reply(m.src, kNak, m.id, r->cap);
    }
    return;
  }
  r->bytes = m.bytes;
  if (m.self) {
    if (m.bytes > 0) std::memcpy(r->buf, m.self->buf, m.bytes);
    finish_recv(r, ok_status());
    finish_send(m.self, ok_status());
  } else if (m.bytes <= kEagerBytes) {
    if (m.bytes > 0) std::memcpy(r->buf, m.eager.data(), m.bytes);
    finish_recv(r, ok_status());
    reply(m.src, kAck, m.id, 0);
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
    if ((h.type == kRtsEager) != (h.bytes <= kEagerBytes) ||
        (h.type == kRtsEager && size != sizeof h + h.bytes) || h.tag < 0) {
      break_peer(p, peer_error("point-to-point: rank {} sent a malformed message header", p));
      return;
    }
    peer.want_connect = true;  // replies go back
    Unexpected m{p, h.tag, h.bytes, h.id, {}, nullptr};
    if (h.type == kRtsEager) m.eager.assign(data + sizeof h, data + size);
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      if (((*it)->peer == p || (*it)->peer == kAnySource) && (*it)->tag == h.tag) {
        auto r = *it;
        posted.erase(it);
        deliver(r, m);
        return;
      }
    }
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
    // Eager: matched and copied. Rendezvous: every byte arrived (its last chunk may not have
    // tested done here yet; it completes then).
    s->acked = true;
    if (s->bytes <= kEagerBytes || s->data_done) {
      peer.awaiting.erase(it);
      finish_send(s, ok_status());
    }
  } else if (h.type == kNak) {
    peer.awaiting.erase(it);
    finish_send(s, invalid_arg("point-to-point: message truncated: the receive for tag {} on rank "
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
  GW_LOG_WARN("rank {}: {}", me(), why.to_string());
  peer.broken = why;
  for (int c = 0; c < 2; ++c) {
    peer.sc[c].reset();
    peer.rc[c].reset();
    peer.conn[c].reset();
    peer.listen[c].reset();
  }
  peer.ctl_out.clear();
  peer.ctl_send.clear();
  peer.ctl_recv.clear();
  auto st = [&](const std::shared_ptr<P2PRequest>& r) {
    return r == culprit ? culprit_status : why;
  };
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
  unexpected.remove_if([p](const Unexpected& m) { return m.src == p; });
}

bool PointToPoint::Impl::check_deadlines() {
  const auto now = Clock::now();
  bool any = false;
  // Receives no message has matched yet touch nothing: they end alone.
  for (auto it = posted.begin(); it != posted.end();) {
    if (now >= (*it)->deadline) {
      auto r = *it;
      it = posted.erase(it);
      const std::string from =
          r->peer == kAnySource ? std::string("any rank") : fmt::format("rank {}", r->peer);
      finish_recv(r, timeout_error("point-to-point: receive from {} with tag {}: no message "
                                   "within {} ms",
                                   from, r->tag, opts.timeout_ms));
      any = true;
    } else {
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
      if (!late && now >= s->deadline) {
        late = s->req;
        what = fmt::format("send to rank {} with tag {} ({} bytes)", p, s->tag, s->bytes);
      }
    };
    auto check_recv = [&](const std::shared_ptr<RecvOp>& r) {
      if (!late && now >= r->deadline) {
        late = r->req;
        what = fmt::format("receive from rank {} with tag {} ({} bytes)", p, r->tag, r->bytes);
      }
    };
    for (auto& s : peer.pending_rts) check_send(s);
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

namespace {
// Tests the oldest request of a connection; true when it completed (set *size).
Status test_front(net::Comm* c, std::deque<InFlight>& q, bool* done, size_t* size) {
  *done = false;
  if (q.empty()) return ok_status();
  return c->test(q.front().req, done, size);
}
}  // namespace

bool PointToPoint::Impl::progress_locked() {
  bool any = false;
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    if (p == me() || !peers[p].broken.ok()) continue;
    any = progress_peer(p) || any;
  }
  return any;
}

bool PointToPoint::Impl::progress_peer(int p) {
  Peer& peer = peers[p];
  bool any = false;
  auto fail = [&](const Status& s, const char* what) {
    break_peer(p, s.with_context(fmt::format("point-to-point: {} rank {}", what, p)));
    return true;
  };
  // Set-up: accept what the peer connects, connect where this rank has something to say.
  for (int c = 0; c < 2; ++c) {
    if (peer.listen[c]) {
      auto rc = peer.listen[c]->accept();
      if (!rc.ok()) return fail(rc.status(), "accept from");
      if (*rc) {
        peer.rc[c] = std::move(*rc);
        peer.listen[c].reset();
        GW_LOG_DEBUG("point-to-point: accepted rank {} channel {}", p, c);
        any = true;
        if (c == 0) peer.want_connect = true;
      }
    }
  }
  if (peer.want_connect && !peer.sc[0] && !peer.conn[0] && Clock::now() >= peer.next_lookup) {
    peer.next_lookup = Clock::now() + std::chrono::milliseconds(2);
    // Both handles (the peer publishes them together); mu is released for the store's round trip.
    Result<Bytes> v[2] = {Status(Code::kTimeout, ""), Status(Code::kTimeout, "")};
    held->unlock();
    v[0] = group.store()->get(key(me(), p, 0), deadline_after_ms(20));
    if (v[0].ok()) v[1] = group.store()->get(key(me(), p, 1), deadline_after_ms(1000));
    held->lock();
    if (stop || !peer.broken.ok()) return true;
    if (!v[0].ok() && v[0].status().code() == Code::kTimeout) {
      GW_LOG_DEBUG("point-to-point: no handle of rank {} yet: {}", p, v[0].status().to_string());
      return any;
    }
    for (int c = 0; c < 2; ++c) {
      if (!v[c].ok()) return fail(v[c].status(), "connect to");
      if (v[c]->size() != net::kHandleSize) {
        return fail(peer_error("handle of {} bytes", v[c]->size()), "connect to");
      }
      net::Handle h;
      std::copy(v[c]->begin(), v[c]->end(), h.bytes.begin());
      auto t = pool.transport_for(p);
      if (!t.ok()) return fail(t.status(), "connect to");
      auto cn = (*t)->connect(h);
      if (!cn.ok()) return fail(cn.status(), "connect to");
      peer.conn[c] = std::move(*cn);
      GW_LOG_DEBUG("point-to-point: connecting to rank {} channel {}", p, c);
      any = true;
    }
  }
  for (int c = 0; c < 2; ++c) {
    if (peer.conn[c]) {
      auto sc = peer.conn[c]->poll();
      if (!sc.ok()) return fail(sc.status(), "connect to");
      if (*sc) {
        peer.sc[c] = std::move(*sc);
        peer.conn[c].reset();
        GW_LOG_DEBUG("point-to-point: connected to rank {} channel {}", p, c);
        any = true;
      }
    }
  }
  // Control receives: keep kCtlSlots posted, handle frames in order.
  if (net::RecvComm* rc = peer.rc[0].get()) {
    while (true) {
      bool done;
      size_t size;
      Status s = test_front(rc, peer.ctl_recv, &done, &size);
      if (!s.ok()) return fail(s, "control message from");
      if (!done) break;
      const int slot = peer.ctl_recv.front().slot;
      peer.ctl_recv.pop_front();
      any = true;
      on_frame(p, peer.slots[slot].data(), size);
      if (!peer.broken.ok()) return true;
      auto r = rc->irecv(peer.slots[slot].data(), peer.slots[slot].size(), 0, nullptr);
      if (!r.ok()) return fail(r.status(), "control receive from");
      if (*r == nullptr) return fail(internal_error("no request slot"), "control receive from");
      InFlight f{};
      f.req = *r;
      f.slot = slot;
      peer.ctl_recv.push_back(std::move(f));
    }
    if (peer.ctl_recv.empty() && peer.broken.ok()) {
      for (int slot = 0; slot < kCtlSlots; ++slot) {
        auto r = rc->irecv(peer.slots[slot].data(), peer.slots[slot].size(), 0, nullptr);
        if (!r.ok()) return fail(r.status(), "control receive from");
        if (*r == nullptr) break;
        InFlight f{};
        f.req = *r;
        f.slot = slot;
        peer.ctl_recv.push_back(std::move(f));
      }
    }
  }
  // Control sends: RTS of new sends, then replies, in order.
  if (net::SendComm* sc = peer.sc[0].get(); sc && peer.sc[1]) {
    while (!peer.pending_rts.empty()) {
      auto s = peer.pending_rts.front();
      peer.pending_rts.pop_front();
      const bool eager = s->bytes <= kEagerBytes;
      peer.ctl_out.push_back(make_frame(eager ? kRtsEager : kRts, s->tag, s->bytes, s->id, s->buf));
      s->on_wire = true;
      peer.awaiting[s->id] = s;
    }
    while (true) {
      bool done;
      size_t size;
      Status st = test_front(sc, peer.ctl_send, &done, &size);
      if (!st.ok()) return fail(st, "control message to");
      if (!done) break;
      peer.ctl_send.pop_front();
      any = true;
    }
    while (!peer.ctl_out.empty() && peer.ctl_send.size() < static_cast<size_t>(net::kMaxRequests)) {
      auto& fr = peer.ctl_out.front();
      auto r = sc->isend(fr.data(), fr.size(), 0, nullptr);
      if (!r.ok()) return fail(r.status(), "control message to");
      if (*r == nullptr) break;
      InFlight f{};
      f.req = *r;
      f.frame = std::move(fr);
      peer.ctl_out.pop_front();
      peer.ctl_send.push_back(std::move(f));
      any = true;
    }
  }
  const size_t chunk = std::max<size_t>(opts.chunk_bytes, 4096);
  // Data sends: in CTS order, chunked, kDataWindow in flight.
  if (net::SendComm* sc = peer.sc[1].get()) {
    while (true) {
      bool done;
      size_t size;
      Status st = test_front(sc, peer.data_send, &done, &size);
      if (!st.ok()) return fail(st, "data to");
      if (!done) break;
      InFlight f = std::move(peer.data_send.front());
      peer.data_send.pop_front();
      if (f.last) {
        f.send->data_done = true;
        if (f.send->acked) {
          peer.awaiting.erase(f.send->id);
          finish_send(f.send, ok_status());
        }
      }
      any = true;
    }
    while (!peer.to_send.empty() && peer.data_send.size() < kDataWindow) {
      auto& s = peer.to_send.front();
      const size_t n = std::min(chunk, s->bytes - s->posted);
      auto r = sc->isend(s->buf + s->posted, n, 1, nullptr);
      if (!r.ok()) return fail(r.status(), "data to");
      if (*r == nullptr) break;
      s->posted += n;
      InFlight f{};
      f.req = *r;
      f.send = s;
      f.last = s->posted == s->bytes;
      peer.data_send.push_back(std::move(f));
      if (s->posted == s->bytes) peer.to_send.pop_front();
      any = true;
    }
  }
  // Data receives: in CTS order, the same chunks.
  if (net::RecvComm* rc = peer.rc[1].get()) {
    while (true) {
      bool done;
      size_t size;
      Status st = test_front(rc, peer.data_recv, &done, &size);
      if (!st.ok()) return fail(st, "data from");
      if (!done) break;
      InFlight f = std::move(peer.data_recv.front());
      peer.data_recv.pop_front();
      any = true;
      if (size != f.expect) {
        return fail(peer_error("a chunk of {} bytes where {} were announced", size, f.expect),
                    "data from");
      }
      if (f.last) {
        finish_recv(f.recv, ok_status());
        reply(p, kAck, f.recv->msg_id, 0);
      }
    }
    while (!peer.to_recv.empty() && peer.data_recv.size() < kDataWindow) {
      auto& r = peer.to_recv.front();
      const size_t n = std::min(chunk, r->bytes - r->posted);
      auto q = rc->irecv(r->buf + r->posted, n, 1, nullptr);
      if (!q.ok()) return fail(q.status(), "data from");
      if (*q == nullptr) break;
      r->posted += n;
      InFlight f{};
      f.req = *q;
      f.recv = r;
      f.expect = n;
      f.last = r->posted == r->bytes;
      peer.data_recv.push_back(std::move(f));
      if (r->posted == r->bytes) peer.to_recv.pop_front();
      any = true;
    }
  }
  return any;
}

Result<std::shared_ptr<P2PRequest>> PointToPoint::isend(const void* buf, size_t bytes, int peer,
                                                        int tag) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.group.size()) {
    return invalid_arg("send: peer {} is not a rank of this communicator (size {})", peer,
                       m.group.size());
  }
  if (tag < 0) return invalid_arg("send: tag {} < 0", tag);
  if (bytes > 0 && buf == nullptr) return invalid_arg("send: NULL buffer with {} bytes", bytes);
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.aborted->load()) return aborted_error("send: communicator aborted");
  GW_RETURN_IF_ERROR(m.start_locked());
  if (!m.failed.ok()) return m.failed;
  auto s = std::make_shared<SendOp>();
  s->req = std::make_shared<P2PRequest>();
  s->buf = static_cast<const uint8_t*>(buf);
  s->bytes = bytes;
  s->peer = peer;
  s->tag = tag;
  s->deadline = deadline_after_ms(m.opts.timeout_ms);
  m.all.push_back(s->req);
  if (m.all.size() > 1024) {
    m.all.erase(std::remove_if(m.all.begin(), m.all.end(),
                               [](const std::weak_ptr<P2PRequest>& w) { return w.expired(); }),
                m.all.end());
  }
  ++m.active;
  if (peer == m.me()) {
    Unexpected u{peer, tag, bytes, 0, {}, s};
    for (auto it = m.posted.begin(); it != m.posted.end(); ++it) {
      if (((*it)->peer == peer || (*it)->peer == kAnySource) && (*it)->tag == tag) {
        auto r = *it;
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
  m.wake();
  return s->req;
}

Result<std::shared_ptr<P2PRequest>> PointToPoint::irecv(void* buf, size_t bytes, int peer,
                                                        int tag) {
  Impl& m = *impl_;
  if (peer < kAnySource || peer >= m.group.size()) {
    return invalid_arg(
        "receive: peer {} is not a rank of this communicator (size {}) nor any "
        "source (-1)",
        peer, m.group.size());
  }
  if (tag < 0) return invalid_arg("receive: tag {} < 0", tag);
  if (bytes > 0 && buf == nullptr) return invalid_arg("receive: NULL buffer with {} bytes", bytes);
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.aborted->load()) return aborted_error("receive: communicator aborted");
  GW_RETURN_IF_ERROR(m.start_locked());
  if (!m.failed.ok()) return m.failed;
  if (peer >= 0 && peer != m.me() && !m.peers[peer].broken.ok()) {
    const Status& b = m.peers[peer].broken;
    return Status(b.code(), fmt::format("receive from rank {}: {}", peer, b.message()));
  }
  auto r = std::make_shared<RecvOp>();
  r->req = std::make_shared<P2PRequest>();
  r->buf = static_cast<uint8_t*>(buf);
  r->cap = bytes;
  r->peer = peer;
  r->tag = tag;
  r->deadline = deadline_after_ms(m.opts.timeout_ms);
  m.all.push_back(r->req);
  ++m.active;
  for (auto it = m.unexpected.begin(); it != m.unexpected.end(); ++it) {
    if ((peer == kAnySource || it->src == peer) && it->tag == tag) {
      Unexpected u = std::move(*it);
      m.unexpected.erase(it);
      m.deliver(r, u);
      return r->req;
    }
  }
  m.posted.push_back(r);
  m.wake();
  return r->req;
}

Result<std::shared_ptr<P2PRequest>> Communicator::isend(const void*, size_t, int, int) {
  return Status(Code::kUnsupported, "send: this communicator has no point-to-point");
}

Result<std::shared_ptr<P2PRequest>> Communicator::irecv(void*, size_t, int, int) {
  return Status(Code::kUnsupported, "receive: this communicator has no point-to-point");
}

}  // namespace gw::coll
