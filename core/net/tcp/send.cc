// The sending direction of a tcp connection: the message header and the striped parts out, the
// receiver's notices (truncation, tag mismatch) and close in on socket 0.
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "core/net/comm_adapter.h"
#include "core/net/tcp/comm_core.h"
#include "core/net/tcp/socket.h"
#include "core/net/tcp/wire.h"
#include "core/net/tcp_transport.h"

namespace gw::net::tcp {
namespace {

using sys::Fd;

// One direction of a connection; its SendCommAdapter forwards the SendComm interface to it.
class TcpSendCore final : public TcpCommCore {
 public:
  TcpSendCore(std::vector<Fd> socks, size_t chunk, std::string peer)
      : TcpCommCore(std::move(socks), chunk, std::move(peer)) {}
  ~TcpSendCore() override { stop_workers(); }

  bool wait_fds(std::vector<pollfd>* fds) const {
    if (threaded()) return wait_fds_threaded(fds);
    // Sockets with bytes left to write wait for room; socket 0 also reports notices and close.
    for (size_t i = 0; i < socks_.size(); ++i) {
      short events = i == 0 ? POLLIN : 0;
      if (reqs_.active(pos_[i].seq) != nullptr) events |= POLLOUT;
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
      if (p.off < part) iov[count++] = {r.data + range.begin + p.off, part - p.off};
      if (count == 0) return true;
      msghdr msg{};
      msg.msg_iov = iov;
      msg.msg_iovlen = count;
      ssize_t sent = sendmsg(socks_[i].get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return socket_error("send to", peer_, errno);
      }
      size_t left = static_cast<size_t>(sent);
      if (need_header) {
        size_t h = std::min(left, sizeof(hdr) - p.hdr_off);
        p.hdr_off += h;
        left -= h;
      }
      p.off += left;
      if ((i != 0 || p.hdr_off == sizeof(hdr)) && p.off == part) return true;
      return false;  // the socket buffer is full
    }
    return false;
  }

  short events_locked(int s) const override {
    // Room to write while this socket has a part to send; socket 0 also hears notices and close
    // while any request is outstanding (an idle comm learns of them on its next request).
    short events = reqs_.active(pos_[s].seq) != nullptr ? POLLOUT : 0;
    if (s == 0 && !reqs_.idle() && !close_pending_) events |= POLLIN;
    return events;
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
      if (got == 0) return peer_error("send to {}: connection closed by peer", peer_);
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

  Notice notice_{};
  size_t notice_got_ = 0;
};

}  // namespace

Result<std::unique_ptr<SendComm>> make_send_comm(std::vector<Fd> socks, size_t chunk,
                                                 std::string peer, int threads) {
  auto comm =
      std::make_unique<SendCommAdapter<TcpSendCore>>(std::move(socks), chunk, std::move(peer));
  GW_RETURN_IF_ERROR(comm->core().start(threads));
  return std::unique_ptr<SendComm>(std::move(comm));
}

}  // namespace gw::net::tcp
