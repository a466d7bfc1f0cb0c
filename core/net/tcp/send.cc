// The sending direction of a tcp connection: the message header and the striped parts out, the
// receiver's notices (truncation, tag mismatch) and close in on socket 0.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <mutex>

#include "core/log.h"
#include "core/net/comm_adapter.h"
#include "core/net/tcp/comm_core.h"
#include "core/net/tcp/socket.h"
#include "core/net/tcp/uring_send.h"
#include "core/net/tcp/wire.h"
#include "core/net/tcp/zerocopy.h"
#include "core/net/tcp_transport.h"

namespace gw::net::tcp {
namespace {

using sys::Fd;

// One direction of a connection; its SendCommAdapter forwards the SendComm interface to it.
class TcpSendCore final : public TcpCommCore {
 public:
  TcpSendCore(std::vector<Fd> socks, const TcpConfig& config, std::string peer)
      : TcpCommCore(std::move(socks), config.chunk, std::move(peer)),
        zc_{config.zerocopy, config.zerocopy_min},
        zc_socks_(socks_.size()) {
    for (size_t i = 0; i < socks_.size(); ++i) {
      if (zc_.mode == ZcMode::kUring) {
        // io_uring unavailable (said once at INFO) or no ring for this socket: copying sends.
        if (!uring_usable()) break;
        auto ring = UringSender::create(socks_[i].get(), peer_);
        if (ring.ok()) {
          zc_socks_[i].ring = std::move(*ring);
        } else {
          GW_LOG_DEBUG("tcp: send to {}: {}: copying sends", peer_, ring.status().to_string());
        }
        continue;
      }
      zc_socks_[i].usable = zc_.mode != ZcMode::kOff && enable_zerocopy(socks_[i].get());
    }
  }
  ~TcpSendCore() override { stop_workers(); }

  bool wait_fds(std::vector<pollfd>* fds) const {
    if (threaded()) return wait_fds_threaded(fds);
    // Sockets with bytes left to write wait for room; socket 0 also reports notices and close.
    for (size_t i = 0; i < socks_.size(); ++i) {
      short events = i == 0 ? POLLIN : 0;
      if (reqs_.active(pos_[i].seq) != nullptr) {
        if (zc_socks_[i].uring_waiting) {
          fds->push_back(pollfd{zc_socks_[i].ring->ring_fd(), POLLIN, 0});  // its completions
        } else {
          events |= zc_socks_[i].waiting ? POLLERR : POLLOUT;
        }
      }
      if (events != 0) fds->push_back(pollfd{socks_[i].get(), events, 0});
    }
    return true;
  }

  Result<Request*> isend(const void* data, size_t size, int tag, MemRegion* mr) {
    GW_RETURN_IF_ERROR(check_buffer("isend", data, size, tag, false, mr));
    return post([&](TcpRequest* r) {
      r->data = static_cast<char*>(const_cast<void*>(data));
      r->size = size;
      r->msg_size = size;
      r->tag = tag;
    });
  }

  Status test(Request* request, bool* done, size_t* size) { return test_impl(request, done, size); }

 private:
  Result<bool> part_io(int i, TcpRequest& r, SockPos& p) override {
    ZcSock& z = zc_socks_[i];
    if (z.ring && r.size >= zc_.min) return uring_part(i, r, p);
    z.waiting = false;
    GW_ASSIGN_OR_RETURN(bool queued, queue_part(i, r, p, z.usable && r.size >= zc_.min));
    if (z.tracker.idle()) return queued;
    if (!queued) {
      GW_RETURN_IF_ERROR(collect(i));  // keeps the error queue short; auto learns of copies
      return false;
    }
    // Every byte is queued, but the kernel may still read the user's pages: the part is done
    // only once each zero-copy call on this socket has been reported.
    GW_RETURN_IF_ERROR(collect(i));
    z.waiting = !z.tracker.idle();
    return !z.waiting;
  }

  // io_uring: socket 0's header goes first by a plain send (a stack copy), then the part by
  // SEND_ZC, one request at a time, a short send continued by the next. The part is done once
  // every byte was sent and every notification came: only then may the user reuse the buffer.
  // Until then the socket waits on its ring's fd (uring_waiting).
  Result<bool> uring_part(int i, TcpRequest& r, SockPos& p) {
    ZcSock& z = zc_socks_[i];
    UringSender& u = *z.ring;
    z.uring_waiting = false;
    const StripeRange range = tcp_stripe(r.size, static_cast<int>(socks_.size()), chunk_, i);
    const size_t part = range.end - range.begin;
    if (i == 0 && p.hdr_off < sizeof(MsgHeader)) {
      MsgHeader hdr{kHeaderMagic, r.tag, r.size};
      while (p.hdr_off < sizeof(hdr)) {
        ssize_t sent = send(socks_[0].get(), reinterpret_cast<char*>(&hdr) + p.hdr_off,
                            sizeof(hdr) - p.hdr_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) return false;  // POLLOUT
          return socket_error("send to", peer_, errno);
        }
        p.hdr_off += static_cast<size_t>(sent);
      }
    }
    while (!halt_.load(std::memory_order_relaxed)) {
      if (!u.in_flight() && p.off < part) {
        GW_RETURN_IF_ERROR(u.submit(r.data + range.begin + p.off, part - p.off));
      }
      size_t sent = 0;
      GW_ASSIGN_OR_RETURN(int seen, u.reap(&sent));
      p.off += sent;
      if (seen == 0) break;
    }
    const bool done =
        p.off == part && !u.in_flight() && (u.idle() || uring_skip_notification_wait());
    z.uring_waiting = !done;
    return done;
  }

  // Queues the bytes of r's part on socket i: true when all are queued, false when the socket
  // buffer is full. With `zc` the payload goes by MSG_ZEROCOPY; the header (a stack copy) never.
  Result<bool> queue_part(int i, TcpRequest& r, SockPos& p, bool zc) {
    const int n = static_cast<int>(socks_.size());
    StripeRange range = tcp_stripe(r.size, n, chunk_, i);
    size_t part = range.end - range.begin;
    MsgHeader hdr{kHeaderMagic, r.tag, r.size};
    while (!halt_.load(std::memory_order_relaxed)) {
      iovec iov[2];
      int count = 0;
      bool need_header = i == 0 && p.hdr_off < sizeof(hdr);
      if (need_header) {
        iov[count++] = {reinterpret_cast<char*>(&hdr) + p.hdr_off, sizeof(hdr) - p.hdr_off};
      }
      const bool zc_call = zc && !need_header && p.off < part;
      if (p.off < part && !(zc && need_header)) {
        iov[count++] = {r.data + range.begin + p.off, part - p.off};
      }
      if (count == 0) return true;
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      ssize_t sent = sendmsg(socks_[i].get(), &msg,
                             MSG_NOSIGNAL | MSG_DONTWAIT | (zc_call ? MSG_ZEROCOPY : 0));
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (zc_call && errno == ENOBUFS) {
          // Too many notifications outstanding (optmem_max): this call copies instead.
          GW_RETURN_IF_ERROR(collect(i));
          zc = false;
          continue;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return socket_error("send to", peer_, errno);
      }
      if (zc_call && sent > 0) zc_socks_[i].tracker.on_sent();
      size_t left = static_cast<size_t>(sent);
      if (need_header) {
        size_t h = std::min(left, sizeof(hdr) - p.hdr_off);
        p.hdr_off += h;
        left -= h;
      }
      p.off += left;
      if ((i != 0 || p.hdr_off == sizeof(hdr)) && p.off == part) return true;
      if (!(zc && need_header && p.hdr_off == sizeof(hdr))) return false;  // the buffer is full
    }
    return false;
  }

  // Reads socket i's zero-copy notifications; in auto mode a socket whose bytes the kernel copied
  // anyway (loopback, a same-host peer) goes back to plain sends, which are cheaper then.
  Status collect(int i) {
    ZcSock& z = zc_socks_[i];
    GW_RETURN_IF_ERROR(drain_zerocopy(socks_[i].get(), &z.tracker, peer_));
    if (zc_.mode == ZcMode::kAuto && z.tracker.copied() > 0) z.usable = false;
    return ok_status();
  }

  short events_locked(int s) const override {
    // Room to write while this socket has a part to send; socket 0 also hears notices and close
    // while any request is outstanding (an idle comm learns of them on its next request).
    // A part waiting only for zero-copy notifications listens for its error queue (POLLERR).
    short events = reqs_.active(pos_[s].seq) == nullptr ? 0
                   : zc_socks_[s].uring_waiting         ? 0  // extra_fd_locked: the ring
                   : zc_socks_[s].waiting               ? POLLERR
                                                        : POLLOUT;
    if (s == 0 && !reqs_.idle() && !close_pending_) events |= POLLIN;
    return events;
  }

  int extra_fd_locked(int s) const override {
    if (reqs_.active(pos_[s].seq) == nullptr || !zc_socks_[s].uring_waiting) return -1;
    return zc_socks_[s].ring->ring_fd();
  }

  Status socket0_extra() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reqs_.idle()) return ok_status();
    }
    return read_notice();
  }

  Status progress_extra() override { return read_notice(); }

  // The receiver reports a truncated or mismatched message, or closes, on socket 0. Returns the
  // comm's error, if any, without recording it.
  Status read_notice() {
    while (notice_got_ < sizeof(notice_)) {
      ssize_t got = recv(socks_[0].get(), reinterpret_cast<char*>(&notice_) + notice_got_,
                         sizeof(notice_) - notice_got_, MSG_DONTWAIT);
      if (got == 0) {
        GW_ASSIGN_OR_RETURN(bool defer, settle_before_close());
        if (defer) return ok_status();
        return peer_error("send to {}: connection closed by peer", peer_);
      }
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();
        return socket_error("send to", peer_, errno);
      }
      notice_got_ += static_cast<size_t>(got);
    }
    if (notice_.magic != kNoticeMagic) {
      return internal_error("send to {}: corrupt notice from the receiver", peer_);
    }
    if (notice_.code == static_cast<uint32_t>(Code::kInvalidArg)) {
      return truncated_error(
          "send to {}: message truncated: message #{} is larger than the receive posted for it",
          peer_, notice_.seq);
    }
    if (notice_.code == static_cast<uint32_t>(Code::kInternal)) {
      return internal_error("send to {}: tag mismatch: the receiver rejected message #{}", peer_,
                            notice_.seq);
    }
    return internal_error("send to {}: unknown notice code {} from the receiver", peer_,
                          notice_.code);
  }

  // The peer closed. A zero-copy part it has read waits only for notifications, which its close
  // does not cancel and which are queued by now: collect them, and true when that finished a
  // part, so its request completes before the close is reported (on the next call). Threaded,
  // worker 0 does this for socket 0; the others' workers get a round first (comm_core.cc).
  Result<bool> settle_before_close() {
    bool settled = false;
    for (size_t s = 0; s < zc_socks_.size() && !(threaded() && s > 0); ++s) {
      // io_uring: completions waiting are folded in by the next part_io (the next round).
      if (zc_socks_[s].uring_waiting && zc_socks_[s].ring->ready()) settled = true;
      if (!zc_socks_[s].waiting) continue;
      GW_RETURN_IF_ERROR(collect(static_cast<int>(s)));
      settled |= zc_socks_[s].tracker.idle();
    }
    return settled;
  }

  // Per socket, touched only by the socket's owner (the caller, or its worker thread).
  struct ZcSock {
    bool usable = false;   // SO_ZEROCOPY is on and the mode still wants it
    bool waiting = false;  // the current part is queued and waits for notifications only
    ZcTracker tracker;
    std::unique_ptr<UringSender> ring;  // GW_SOCKET_ZEROCOPY=uring where io_uring works
    bool uring_waiting = false;         // the current part waits for its ring's completions
  };
  struct ZcConfig {
    ZcMode mode;
    size_t min;  // messages of at least this many bytes go by MSG_ZEROCOPY
  };

  Notice notice_{};
  size_t notice_got_ = 0;
  const ZcConfig zc_;
  std::vector<ZcSock> zc_socks_;
};

}  // namespace

Result<std::unique_ptr<SendComm>> make_send_comm(std::vector<Fd> socks, const TcpConfig& config,
                                                 std::string peer) {
  auto comm =
      std::make_unique<SendCommAdapter<TcpSendCore>>(std::move(socks), config, std::move(peer));
  GW_RETURN_IF_ERROR(comm->core().start(config.threads));
  return std::unique_ptr<SendComm>(std::move(comm));
}

}  // namespace gw::net::tcp
