// Daemon mode's point-to-point (gw_send, gw_recv, gw_isend, gw_irecv): each call is one send or
// recv submission (protocol version 7, docs/wire-daemon.md "Point-to-point") whose buffer lies in
// the arena (gw_mem_alloc memory, used in place) or is staged there; gradwired matches it among
// the job's trainers of this host (daemon/job_p2p.h) and copies the message once, arena to arena,
// or hands it to the daemon of the peer's host (daemon/job_p2p_remote.h).
// Its completion may come before or after the trainer's other submissions'.
//
// A request's waits run in short slices, letting go of the session between them, so that a
// thread blocked in gw_recv does not keep another thread of the same rank from posting the send
// that it waits for.
#include <algorithm>
#include <memory>
#include <mutex>
#include <thread>

#include "capi/daemon_session.h"
#include "capi/daemon_session_trace.h"
#include "core/sys/time.h"

namespace gw::capi {

using daemon::Opcode;
using daemon::SqEntry;

namespace {
// How long one slice of a point-to-point wait holds the session.
constexpr int64_t kP2pSliceMs = 5;
}  // namespace

class DaemonP2pRequest final : public SessionRequest {
 public:
  DaemonP2pRequest(std::shared_ptr<DaemonSession::Link> link, uint64_t seq, bool send,
                   DaemonSession::Placed placed, void* user, size_t bytes)
      : link_(std::move(link)),
        seq_(seq),
        send_(send),
        placed_(placed),
        user_(user),
        bytes_(bytes) {}
  ~DaemonP2pRequest() override {
    if (!finished_) (void)wait(-1);  // bounded by the communicator's deadline
  }
  Status wait(int64_t timeout_ms) override {
    sys::Deadline deadline{};
    bool first = true;
    for (;;) {
      {
        std::lock_guard<std::mutex> held(link_->mu);
        DaemonSession* s = link_->session;
        if (s == nullptr) return orphaned();
        if (first) {
          deadline = sys::deadline_after_ms(timeout_ms < 0 ? s->timeout_ms_ : timeout_ms);
          first = false;
        }
        std::lock_guard<std::mutex> lock(s->mu_);
        Status st = step(s, std::min(deadline, sys::deadline_after_ms(kP2pSliceMs)));
        if (finished_) return st;
        if (sys::expired(deadline)) {
          if (timeout_ms >= 0) return st;  // kTimeout: still pending; wait or test again
          // The communicator's deadline ends it. The daemon may still match it, so its staging
          // stays allocated (until the communicator goes) rather than be reused under it.
          finished_ = true;
          final_ = timeout_error("{}: no match within the communicator's deadline ({} ms)", what(),
                                 s->timeout_ms_);
          return final_;
        }
      }
      std::this_thread::yield();  // another thread of this rank may post meanwhile
    }
  }
  Status test(bool* done) override {
    std::lock_guard<std::mutex> held(link_->mu);
    DaemonSession* s = link_->session;
    if (s == nullptr) {
      *done = true;
      return orphaned();
    }
    std::lock_guard<std::mutex> lock(s->mu_);
    Status st = step(s, sys::kNoWait);
    *done = finished_;
    return finished_ ? st : ok_status();
  }
  bool p2p_result(size_t* bytes, int* source) const override {
    if (!finished_ || !final_.ok()) return false;
    *bytes = got_bytes_;
    *source = source_;
    return true;
  }

 private:
  const char* what() const { return send_ ? "gw_isend" : "gw_irecv"; }
  Status orphaned() {
    if (!finished_) {
      finished_ = true;
      final_ = aborted_error("{}: the communicator was destroyed before it completed", what());
    }
    return final_;
  }
  Status step(DaemonSession* s, sys::Deadline deadline) {
    if (finished_) return final_;
    bool done = false;
    daemon::CompressedDone info;
    Status st = s->client_->wait_for(seq_, deadline, &done, what(), &info);
    if (!done) return st;  // kTimeout: still pending
    if (st.ok()) {
      const daemon::P2pDone d = daemon::p2p_done(info);
      if (d.bytes > bytes_ || d.source < 0 || d.source >= s->size_) {
        st = s->client_->broken(
            peer_error("{}: gradwired answered {} bytes from rank {} for a buffer of {} bytes",
                       what(), d.bytes, d.source, bytes_));
      } else {
        got_bytes_ = static_cast<size_t>(d.bytes);
        source_ = d.source;
        if (!send_ && placed_.staged && got_bytes_ > 0) {
          copy_from_arena(user_, s->data() + placed_.off, got_bytes_);
        }
      }
    }
    s->client_->unplace(placed_);
    finished_ = true;
    final_ = st;
    return st;
  }
  std::shared_ptr<DaemonSession::Link> link_;
  uint64_t seq_;
  bool send_;
  DaemonSession::Placed placed_;
  void* user_;
  size_t bytes_;
  bool finished_ = false;
  Status final_;
  size_t got_bytes_ = 0;
  int source_ = -1;
};

Result<std::unique_ptr<SessionRequest>> DaemonSession::isend(const void* buf, size_t bytes,
                                                             int peer, int tag) {
  return post_p2p(true, const_cast<void*>(buf), bytes, peer, tag);
}

Result<std::unique_ptr<SessionRequest>> DaemonSession::irecv(void* buf, size_t bytes, int peer,
                                                             int tag) {
  return post_p2p(false, buf, bytes, peer, tag);
}

Result<std::unique_ptr<SessionRequest>> DaemonSession::post_p2p(bool send, void* buf, size_t bytes,
                                                                int peer, int tag) {
  const char* what = send ? "gw_isend" : "gw_irecv";
  // A peer on another host is the daemons' business (daemon/job_p2p_remote.h): posted alike.
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > client_->welcome().data_bytes) {
    return no_memory(
        "{}: a message of {} bytes is larger than the daemon arena's data region ({} bytes): "
        "daemon mode moves a point-to-point message whole through the arena; raise "
        "GW_DAEMON_ARENA",
        what, bytes, client_->welcome().data_bytes);
  }
  Placed placed;
  {
    auto p = client_->place(buf, bytes, send);
    if (!p.ok()) return p.status().with_context(what);
    placed = *p;
  }
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(send ? Opcode::kSend : Opcode::kRecv);
  e.root = peer;
  e.count = bytes;
  (send ? e.send_off : e.recv_off) = placed.off;
  e.spec_len = static_cast<uint32_t>(tag);
  auto seq = client_->post(e, what);
  if (!seq.ok()) {
    client_->unplace(placed);
    return seq.status();
  }
  return std::unique_ptr<SessionRequest>(
      std::make_unique<DaemonP2pRequest>(link_, *seq, send, placed, buf, bytes));
}

}  // namespace gw::capi
