// Internal to gw_coll: the point-to-point engine's state (PointToPoint::Impl) and its wire
// frames, shared by p2p.cc (requests, set-up, matching, deadlines), p2p_calls.cc (the public
// calls) and p2p_progress.cc (moving the frames and data of every peer's connections).
#pragma once

#include <fmt/format.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "collectives/backoff.h"
#include "collectives/p2p.h"
#include "core/log.h"

namespace gw::coll {

// The engine's own types, named apart from the rest of gw_coll.
namespace p2p_engine {

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
inline constexpr int kCtlSlots = 1;
inline constexpr int kDataWindow = 4;  // chunks in flight per data connection
// How long destruction waits for the queued control frames to reach the transport (only while
// some are queued): the RTS of completed eager sends, the replies of received messages.
inline constexpr int64_t kFlushMs = 1000;
// A caller driving the engine (drive) polls this many times in a row, holding mu, between two
// turns of its backoff (each reads the clock, and may yield or poll()), within kQuietSpan of
// the last pass that moved something.
inline constexpr int kQuietPolls = 8;
inline constexpr std::chrono::microseconds kQuietSpan{2};
// A caller driving the engine for its own request spins this long (at most GW_SPIN_US) before
// its backoff yields the core: a round trip over loopback tcp takes 10-20 us, and a yield on a
// loaded core may hand it to another task for a time slice; Open MPI and UCX spin without
// yielding. (Not measured alone: docs/collectives.md, "An eager send without an op".)
inline constexpr std::chrono::microseconds kDrivePureSpin{20};
// check_deadlines scans every op at least this often (it skips scans until the earliest known
// deadline in between).
inline constexpr int64_t kRescanMs = 50;

struct SendOp {
  std::shared_ptr<P2PRequest> req;
  const uint8_t* buf;
  size_t bytes;
  int peer;
  int tag;
  net::MemRegion* mr = nullptr;  // a device buffer's registration: always rendezvous
  uint64_t id = 0;
  Deadline deadline;
  bool on_wire = false;    // its RTS was handed to the transport (eager: the send is done)
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
  net::MemRegion* mr = nullptr;  // a device buffer's registration: no eager message lands here
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
  std::vector<uint8_t> eager;    // kRtsEager's bytes (also an eager send to oneself)
  std::shared_ptr<SendOp> self;  // a rendezvous-size send to oneself
  // Its bytes follow a CTS (kRts: larger than kEagerBytes, or a device buffer's of any size).
  bool rendezvous = false;
};

// A control frame waiting for its connection (post_control).
struct CtlFrame {
  std::vector<uint8_t> bytes;
  // An RTS: its send. An eager one completes once the frame is handed to the transport; the RTS
  // of a send that ended first (abort, destroy, deadline) is dropped, never announced.
  std::shared_ptr<SendOp> send;
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
  Status broken;                 // not ok: connections closed for good
  std::deque<CtlFrame> ctl_out;  // frames waiting for the control connection
  std::deque<InFlight> ctl_send, ctl_recv, data_send, data_recv;
  std::vector<std::vector<uint8_t>> slots;
  std::map<uint64_t, std::shared_ptr<SendOp>> awaiting;  // rendezvous RTS sent, reply not yet in
  std::deque<std::shared_ptr<SendOp>> pending_rts;       // RTS not yet posted
  std::deque<std::shared_ptr<SendOp>> to_send;           // CTS received, data to post
  std::deque<std::shared_ptr<RecvOp>> to_recv;           // CTS sent, data to post
  uint64_t next_id = 1;
  // Control frames' buffers the transport gave back, reused so that a small message allocates
  // no frame (make_frame).
  std::vector<std::vector<uint8_t>> spare;
};

// Buffers kept per peer for reuse (each holds up to one eager frame, 16 KiB + 32 bytes).
inline constexpr size_t kSpareFrames = 8;

inline std::string key(int src, int dst, int chan) {
  return fmt::format("p2p/{}/{}/{}", src, dst, chan);
}

// A frame in one of peer's spare buffers (a new one when it has none).
inline std::vector<uint8_t> make_frame(Peer* peer, uint32_t type, int tag, uint64_t bytes,
                                       uint64_t id, const uint8_t* eager = nullptr) {
  const size_t extra = type == kRtsEager ? bytes : 0;
  std::vector<uint8_t> f;
  if (!peer->spare.empty()) {
    f = std::move(peer->spare.back());
    peer->spare.pop_back();
  }
  f.resize(sizeof(Frame) + extra);
  Frame h{type, tag, bytes, id, 0};
  std::memcpy(f.data(), &h, sizeof h);
  if (extra > 0 && eager != nullptr) std::memcpy(f.data() + sizeof h, eager, extra);
  return f;
}

// Gives a frame's buffer back to its peer (kept when the peer has fewer than kSpareFrames).
inline void recycle_frame(Peer* peer, std::vector<uint8_t>&& f) {
  if (peer->spare.size() < kSpareFrames && f.capacity() > 0) peer->spare.push_back(std::move(f));
}

}  // namespace p2p_engine

using namespace p2p_engine;  // NOLINT: the two files of the engine

// The engine as a waiting caller reaches it (P2PRequest::wait/test), without a lock: a caller
// announces itself in users, then reads impl; the engine's destruction clears impl, then waits
// (on cv, under mu) until users is 0, so a caller either finds no engine or is waited for
// (seq_cst on both sides).
struct P2PDriver {
  std::mutex mu;  // only for cv: the destruction's wait for the callers to leave
  std::condition_variable cv;
  std::atomic<PointToPoint::Impl*> impl{nullptr};
  std::atomic<int> users{0};
  // The engine, entered (leave() after), or nullptr when it is gone.
  PointToPoint::Impl* enter() {
    users.fetch_add(1, std::memory_order_seq_cst);
    PointToPoint::Impl* e = impl.load(std::memory_order_seq_cst);
    if (e == nullptr) leave();
    return e;
  }
  void leave() {
    users.fetch_sub(1, std::memory_order_seq_cst);
    if (impl.load(std::memory_order_seq_cst) == nullptr) {
      { std::lock_guard<std::mutex> lock(mu); }  // the destruction waits on cv, or sees users
      cv.notify_all();
    }
  }
};

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
  std::deque<std::shared_ptr<RecvOp>> posted;  // unmatched receives, posting order
  std::list<Unexpected> unexpected;            // unmatched messages, arrival order
  size_t active = 0;                           // ops not yet finished (for the idle wait)
  std::vector<std::weak_ptr<P2PRequest>> all;  // every op, to end them at shutdown
  // Adds an op to `all`, dropping the ended ones past 1024 (every call: a receive's as well as a
  // send's, since an eager send's fast path adds none).
  void track(const std::shared_ptr<P2PRequest>& req) {
    all.push_back(req);
    if (all.size() > 1024) {
      all.erase(std::remove_if(all.begin(), all.end(),
                               [](const std::weak_ptr<P2PRequest>& w) { return w.expired(); }),
                all.end());
    }
  }

  int me() const { return group.rank(); }

  // Callers moving the engine in P2PRequest::wait (the progress thread stands aside meanwhile),
  // and how they reach it. Atomic: a caller announces itself before it takes mu, so that the
  // progress thread (which holds mu while it spins) lets go at its next step.
  std::atomic<int> drivers{0};
  std::shared_ptr<P2PDriver> driver = std::make_shared<P2PDriver>();
  // A caller's turn at moving the engine for req, until req is done, until, or the engine stops.
  void drive(const P2PRequest& req, Clock::time_point until);
  // A polling caller's turn (P2PRequest::test): one non-blocking pass of progress and deadlines,
  // skipped when another thread holds mu (it is moving the engine then).
  void step();
  bool polling = false;        // step's and kick's pass: no store lookups (they may wait)
  bool lookup_wanted = false;  // step skipped one: the progress thread is woken for it
  // A new op's first step, in the caller's thread with mu held (lock): its peer's connections
  // moved once (an RTS posted, so an eager send is done; an arrived message matched) before any
  // thread hand-off.
  void kick(std::unique_lock<std::mutex>* lock, int peer, bool sends_first = false);

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
  // be waited on (shm). A listener or connector still pending has no descriptor, but the
  // backoff's poll() returns within 1 ms and the pass after it looks at them, so they do not
  // force the yield-and-sleep loop: a data listener that is never connected to (a peer that
  // sends this rank only eager messages) left the thread waking every 50 us for the job's life,
  // and a message arriving meanwhile waited for the next of those wake-ups. Under mu: a
  // connection's wait_fds reads its posted requests, which a caller's isend changes
  // (ThreadSanitizer found the race when a waiting caller gathered while another thread posted).
  bool gather_fds_locked(std::unique_lock<std::mutex>& lock, std::vector<pollfd>* fds) const {
    lock.lock();
    const bool ok = gather_fds(fds);
    lock.unlock();
    return ok;
  }
  bool gather_fds(std::vector<pollfd>* fds) const {
    if (wake_fd < 0) return false;
    fds->push_back(pollfd{wake_fd, POLLIN, 0});
    for (int p = 0; p < static_cast<int>(peers.size()); ++p) {
      if (p == me()) continue;
      const Peer& peer = peers[p];
      if (!peer.broken.ok()) continue;
      for (int c = 0; c < 2; ++c) {
        if (peer.listen[c] || peer.conn[c]) continue;  // looked at after the poll (<= 1 ms)
        if (peer.sc[c] && !peer.sc[c]->wait_fds(fds)) return false;
        if (peer.rc[c] && !peer.rc[c]->wait_fds(fds)) return false;
      }
    }
    return true;
  }

  Status start_locked();
  void loop();
  bool progress_locked();
  // An eager send's fast path (isend): with peer p connected and nothing of its queued before
  // it, the frame goes to the transport at once and the request is done; no op, no pass over
  // the connections. nullptr: the ordinary path takes the send (nothing was sent).
  std::shared_ptr<P2PRequest> send_eager_now(int p, const void* buf, size_t bytes, int tag);
  // sends_first: a new send's kick (its RTS posted before the control receive is tested).
  bool progress_peer(int p, bool sends_first = false);
  // Turns peer p's new sends into RTS frames, retires the control sends the transport finished
  // and posts the queued frames (post_control). false: the connection failed (*why).
  bool send_control(int p, bool* any, Status* why);
  bool receive_control(int p, bool* any);
  // eager: the message's bytes where they are (a control slot), else m.eager.
  void deliver(const std::shared_ptr<RecvOp>& r, Unexpected& m, const uint8_t* eager = nullptr);
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
  // Some peer has control frames queued or not yet taken by the transport.
  bool control_pending() const {
    for (const Peer& p : peers) {
      if (p.broken.ok() && (!p.ctl_send.empty() || !p.ctl_out.empty())) return true;
    }
    return false;
  }
  // Posts the control frames already queued (the RTS of eager sends that completed, the replies
  // of messages this rank received) and waits until the transport took them, up to ms.
  void flush_control(int64_t ms);
  // Posts peer p's queued control frames while the transport has request slots; an eager send
  // whose RTS is posted completes here. false: the connection failed (*why).
  bool post_control(int p, bool* moved, Status* why);
  // Ends the ops past their deadline (now); skipped while now < earliest.
  bool check_deadlines(Clock::time_point now);
  Clock::time_point earliest{};  // no op's deadline is before it (a scan finds the next one)
};

}  // namespace gw::coll
