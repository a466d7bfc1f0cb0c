// The point-to-point engine's progress: per peer, connecting, posting and testing the control
// frames and the data chunks of every operation (p2p_engine.h has the state).
#include <algorithm>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "collectives/p2p_engine.h"
#include "core/log.h"

namespace gw::coll {

namespace {
// Tests the oldest request of a connection; true when it completed (set *size).
Status test_front(net::Comm* c, std::deque<InFlight>& q, bool* done, size_t* size) {
  *done = false;
  if (q.empty()) return ok_status();
  return c->test(q.front().req, done, size);
}
}  // namespace

// Control receives: keeps kCtlSlots posted and handles the frames in order. false: the peer
// broke (a failed connection, or a frame that broke it).
bool PointToPoint::Impl::receive_control(int p, bool* any) {
  Peer& peer = peers[p];
  net::RecvComm* rc = peer.rc[0].get();
  if (rc == nullptr) return true;
  auto fail = [&](const Status& s) {
    break_peer(p, s.with_context(fmt::format("point-to-point: control message from rank {}", p)));
    return false;
  };
  while (true) {
    bool done;
    size_t size;
    Status s = test_front(rc, peer.ctl_recv, &done, &size);
    if (!s.ok()) return fail(s);
    if (!done) break;
    const int slot = peer.ctl_recv.front().slot;
    peer.ctl_recv.pop_front();
    *any = true;
    on_frame(p, peer.slots[slot].data(), size);
    if (!peer.broken.ok()) return false;
    auto r = rc->irecv(peer.slots[slot].data(), peer.slots[slot].size(), 0, nullptr);
    if (!r.ok()) return fail(r.status());
    if (*r == nullptr) return fail(internal_error("no request slot"));
    InFlight f{};
    f.req = *r;
    f.slot = slot;
    peer.ctl_recv.push_back(std::move(f));
  }
  if (peer.ctl_recv.empty()) {
    for (int slot = 0; slot < kCtlSlots; ++slot) {
      auto r = rc->irecv(peer.slots[slot].data(), peer.slots[slot].size(), 0, nullptr);
      if (!r.ok()) return fail(r.status());
      if (*r == nullptr) break;
      InFlight f{};
      f.req = *r;
      f.slot = slot;
      peer.ctl_recv.push_back(std::move(f));
    }
  }
  return true;
}

bool PointToPoint::Impl::progress_locked() {
  bool any = false;
  for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
    if (p == me() || !peers[p].broken.ok()) continue;
    any = progress_peer(p) || any;
  }
  return any;
}

std::shared_ptr<P2PRequest> PointToPoint::Impl::send_eager_now(int p, const void* buf, size_t bytes,
                                                               int tag) {
  Peer& peer = peers[p];
  net::SendComm* sc = peer.sc[0].get();
  if (bytes > kEagerBytes || !peer.broken.ok() || sc == nullptr || !peer.sc[1] ||
      !peer.pending_rts.empty() || !peer.ctl_out.empty() ||
      peer.ctl_send.size() >= static_cast<size_t>(net::kMaxRequests)) {
    return nullptr;
  }
  std::vector<uint8_t> f =
      make_frame(&peer, kRtsEager, tag, bytes, peer.next_id, static_cast<const uint8_t*>(buf));
  auto r = sc->isend(f.data(), f.size(), 0, nullptr);
  if (!r.ok() || *r == nullptr) {  // the ordinary path posts it later, or fails the peer
    recycle_frame(&peer, std::move(f));
    return nullptr;
  }
  ++peer.next_id;
  // A frame the transport took whole at once (shm's ring, a tcp socket with room) is retired
  // here, not queued for the next pass (only behind no older one: requests end in order).
  bool done = false;
  if (peer.ctl_send.empty()) {
    size_t size = 0;
    Status st = sc->test(*r, &done, &size);
    if (!st.ok()) {
      // The send is done (standard mode: the transport took its frame) and the connection
      // failed: as a pass would, the peer's last frames first, then the peer breaks.
      bool any = false;
      if (receive_control(p, &any) && peer.broken.ok()) {
        break_peer(p,
                   st.with_context(fmt::format("point-to-point: control message to rank {}", p)));
      }
      done = true;
    }
  }
  if (done) {
    recycle_frame(&peer, std::move(f));
  } else {
    InFlight fl{};
    fl.req = *r;
    fl.frame = std::move(f);
    peer.ctl_send.push_back(std::move(fl));
  }
  auto req = std::make_shared<P2PRequest>();
  req->finish(ok_status(), bytes, me());
  return req;
}

bool PointToPoint::Impl::send_control(int p, bool* any, Status* why) {
  Peer& peer = peers[p];
  net::SendComm* sc = peer.sc[0].get();
  if (sc == nullptr || !peer.sc[1]) return true;
  while (!peer.pending_rts.empty()) {
    auto s = peer.pending_rts.front();
    peer.pending_rts.pop_front();
    // Eager: the payload is copied into the frame here; the send completes when the frame is
    // posted (post_control). Rendezvous: answered by CTS or NAK.
    const bool eager = s->bytes <= kEagerBytes && s->mr == nullptr;
    peer.ctl_out.push_back(
        CtlFrame{make_frame(&peer, eager ? kRtsEager : kRts, s->tag, s->bytes, s->id, s->buf), s});
    if (!eager) peer.awaiting[s->id] = s;
  }
  while (true) {
    bool done;
    size_t size;
    Status st = test_front(sc, peer.ctl_send, &done, &size);
    if (!st.ok()) {
      *why = std::move(st);
      return false;
    }
    if (!done) break;
    recycle_frame(&peer, std::move(peer.ctl_send.front().frame));
    peer.ctl_send.pop_front();
    *any = true;
  }
  return post_control(p, any, why);
}

bool PointToPoint::Impl::progress_peer(int p, bool sends_first) {
  Peer& peer = peers[p];
  bool any = false;
  auto fail = [&](const Status& s, const char* what) {
    break_peer(p, s.with_context(fmt::format("point-to-point: {} rank {}", what, p)));
    return true;
  };
  // A new send's kick: its RTS goes out before the control receive's test (on tcp a system
  // call, most often finding nothing) so that the test is not on the message's way. A failed
  // send takes the peer's frames first (below, as a normal pass does).
  if (sends_first) {
    if (Status why; !send_control(p, &any, &why)) {
      receive_control(p, &any);
      if (!peer.broken.ok()) return true;
      return fail(why, "control message to");
    }
  }
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
      }
    }
  }
  // Control receives before this rank's own set-up steps: frames the peer sent before it left
  // (its last eager messages) are taken before a failed connection back to it breaks the peer.
  if (!receive_control(p, &any)) return true;
  const bool lookup_due =
      peer.want_connect && !peer.sc[0] && !peer.conn[0] && Clock::now() >= peer.next_lookup;
  // A polling caller's pass (step) leaves the store's round trip, which may wait, to the thread.
  if (lookup_due && polling) lookup_wanted = true;
  if (lookup_due && !polling) {
    peer.next_lookup = Clock::now() + std::chrono::milliseconds(2);
    // Both handles (the peer publishes them together); mu is released for the store's round trip.
    Result<Bytes> v[2] = {Status(Code::kTimeout, ""), Status(Code::kTimeout, "")};
    // held is this thread's lock (the progress thread's or a waiting caller's, P2PRequest::wait);
    // another may move the engine meanwhile, so it is kept here and set again after.
    std::unique_lock<std::mutex>* mine = held;
    mine->unlock();
    v[0] = group.store()->get(key(me(), p, 0), deadline_after_ms(20));
    if (v[0].ok()) v[1] = group.store()->get(key(me(), p, 1), deadline_after_ms(1000));
    mine->lock();
    held = mine;
    if (stop || !peer.broken.ok()) return true;
    if (peer.sc[0] || peer.conn[0]) return true;  // connected meanwhile by the other thread
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
  // Control sends: RTS of new sends, then replies, in order.
  if (Status why; !send_control(p, &any, &why)) return fail(why, "control message to");
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
      auto r = sc->isend(s->buf + s->posted, n, 1, s->mr);
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
      auto q = rc->irecv(r->buf + r->posted, n, 1, r->mr);
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

}  // namespace gw::coll
