// Point-to-point (p2p.h): the public calls: isend and irecv (checks, the eager fast path, queuing
// for the engine), the registration and flush of dma-buf regions on a peer's data connection, and
// the Communicator's defaults for communicators without point-to-point. The engine: p2p.cc and
// p2p_progress.cc.
#include <fmt/format.h>

#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "collectives/p2p.h"
#include "collectives/p2p_engine.h"

namespace gw::coll {
namespace {

using Impl = PointToPoint::Impl;

// What isend and irecv check of their arguments before taking the engine's lock (`what`: "send"
// or "receive"; the peer is checked by each, a receive's may be any source).
Status check_message(const char* what, const void* buf, size_t bytes, int tag) {
  if (tag < 0) return invalid_arg("{}: tag {} < 0", what, tag);
  if (bytes > 0 && buf == nullptr) return invalid_arg("{}: NULL buffer with {} bytes", what, bytes);
  return ok_status();
}

// The engine can take an op now (m.mu held): not aborted, started, not failed.
Status check_ready_locked(Impl& m, const char* what) {
  if (m.aborted->load()) return aborted_error("{}: communicator aborted", what);
  GW_RETURN_IF_ERROR(m.start_locked());
  return m.failed;
}

// A new send or receive op of the engine (m.mu held): its request, where it goes, its deadline;
// counted as active until it completes.
template <class Op>
std::shared_ptr<Op> new_op(Impl& m, int peer, int tag, net::MemRegion* mr) {
  auto o = std::make_shared<Op>();
  o->req = std::make_shared<P2PRequest>();
  o->req->set_driver(m.driver);
  o->peer = peer;
  o->tag = tag;
  o->mr = mr;
  o->deadline = deadline_after_ms(m.opts.timeout_ms);
  m.earliest = std::min(m.earliest, o->deadline);
  m.track(o->req);
  ++m.active;
  return o;
}

// The dma-buf calls name another rank of the communicator.
Status check_other_rank(const Impl& m, int peer, const char* what) {
  if (peer < 0 || peer >= m.group.size() || peer == m.me()) {
    return invalid_arg("{}: peer {} is not another rank of this communicator", what, peer);
  }
  return ok_status();
}

// The peer's data connection in one direction (m.mu held); nullptr while there is none (not made
// yet, or gone with its registrations).
net::RecvComm* data_from(Impl& m, int peer) { return m.peers[peer].rc[1].get(); }
net::Comm* data_comm(Impl& m, int peer, bool send) {
  if (send) return m.peers[peer].sc[1].get();
  return data_from(m, peer);
}

}  // namespace

Result<std::shared_ptr<P2PRequest>> PointToPoint::isend(const void* buf, size_t bytes, int peer,
                                                        int tag, net::MemRegion* mr) {
  Impl& m = *impl_;
  if (peer < 0 || peer >= m.group.size()) {
    return invalid_arg("send: peer {} is not a rank of this communicator (size {})", peer,
                       m.group.size());
  }
  GW_RETURN_IF_ERROR(check_message("send", buf, bytes, tag));
  std::unique_lock<std::mutex> lock(m.mu);
  GW_RETURN_IF_ERROR(check_ready_locked(m, "send"));
  if (mr != nullptr && peer == m.me()) {
    return Status(Code::kUnsupported,
                  "send: a device buffer (registered region) to this rank itself: the engine "
                  "has no loopback for device memory");
  }
  if (peer != m.me() && mr == nullptr) {
    if (auto done = m.send_eager_now(peer, buf, bytes, tag)) return done;
  }
  auto s = new_op<SendOp>(m, peer, tag, mr);
  s->buf = static_cast<const uint8_t*>(buf);
  s->bytes = bytes;
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
  GW_RETURN_IF_ERROR(check_message("receive", buf, bytes, tag));
  if (mr != nullptr && (peer == kAnySource || peer == m.me())) {
    return Status(Code::kUnsupported,
                  "receive: a device buffer (registered region) takes a message of one other "
                  "rank only (its registration is with that rank's data connection)");
  }
  std::unique_lock<std::mutex> lock(m.mu);
  GW_RETURN_IF_ERROR(check_ready_locked(m, "receive"));
  auto match = std::find_if(m.unexpected.begin(), m.unexpected.end(), [&](const Unexpected& u) {
    return (peer == kAnySource || u.src == peer) && u.tag == tag;
  });
  // A broken peer's eager messages that arrived before it broke are still received (break_peer).
  if (match == m.unexpected.end() && peer >= 0 && peer != m.me() && !m.peers[peer].broken.ok()) {
    const Status& b = m.peers[peer].broken;
    return Status(b.code(), fmt::format("receive from rank {}: {}", peer, b.message()));
  }
  auto r = new_op<RecvOp>(m, peer, tag, mr);
  r->buf = static_cast<uint8_t*>(buf);
  r->cap = bytes;
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
  GW_RETURN_IF_ERROR(check_other_rank(m, peer, "dma-buf registration"));
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
    net::Comm* c = data_comm(m, peer, send);
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
  GW_RETURN_IF_ERROR(check_other_rank(m, peer, "dma-buf deregistration"));
  std::lock_guard<std::mutex> lock(m.mu);
  net::Comm* c = data_comm(m, peer, send);
  // The connection is gone (the peer left or broke, or the engine ended): its registrations went
  // with it, so there is nothing left to deregister. That is the usual end when the peer finishes
  // first, not an error.
  if (c == nullptr) return ok_status();
  return c->dereg_mr(mr);
}

Result<bool> PointToPoint::flush_dmabuf(int peer, void* iova, size_t bytes, net::MemRegion* mr,
                                        Deadline deadline) {
  Impl& m = *impl_;
  GW_RETURN_IF_ERROR(check_other_rank(m, peer, "dma-buf flush"));
  // Under the engine's lock, as the progress thread's use of the same connection.
  std::unique_lock<std::mutex> lock(m.mu);
  net::RecvComm* rc = data_from(m, peer);
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
    if (data_from(m, peer) != rc) {
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
