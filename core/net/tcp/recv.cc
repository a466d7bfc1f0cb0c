// The receiving direction of a tcp connection: socket 0's message header, then every socket's
// part of the message; a truncated or mismatched message is reported back to the sender.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>

#include "core/net/comm_adapter.h"
#include "core/net/tcp/comm_core.h"
#include "core/net/tcp/socket.h"
#include "core/net/tcp/wire.h"
#include "core/net/tcp_transport.h"

namespace gw::net::tcp {
namespace {

using sys::Fd;

// One direction of a connection; its RecvCommAdapter forwards the RecvComm interface to it.
class TcpRecvCore final : public TcpCommCore {
 public:
  TcpRecvCore(std::vector<Fd> socks, size_t chunk, std::string peer)
      : TcpCommCore(std::move(socks), chunk, std::move(peer)) {}
  ~TcpRecvCore() override { stop_workers(); }

  bool wait_fds(std::vector<pollfd>* fds) const {
    if (threaded()) return wait_fds_threaded(fds);
    drained_ = false;
    // Bytes read ahead into the stash are no event for poll(): while a receive could take them,
    // the caller spins (its next test finds them).
    if (stash_end_ > stash_beg_ && reqs_.active(pos_[0].seq) != nullptr) return false;
    // A socket is worth waiting on while a posted receive still expects bytes from it; sockets
    // other than 0 only once socket 0 has delivered the message's header (their part follows
    // from its size).
    for (size_t i = 0; i < socks_.size(); ++i) {
      short events = events_locked(static_cast<int>(i));
      if (events != 0) fds->push_back(pollfd{socks_[i].get(), events, 0});
    }
    return true;
  }

  // Unthreaded, the bytes are read by test() only: a receive posted right after the previous
  // one completed would find the socket empty (one recvfrom per message for nothing).
  Result<Request*> irecv(void* data, size_t size, int tag, MemRegion* mr) {
    GW_RETURN_IF_ERROR(check_buffer("irecv", data, size, tag, true, mr));
    return post(
        [&](TcpRequest* r) {
          r->data = static_cast<char*>(data);
          r->size = size;
          r->tag = tag;
        },
        /*start=*/false);
  }

  Status test(Request* request, bool* done, size_t* size) { return test_impl(request, done, size); }

 private:
  // Tells the sender why its message failed (best effort: the sender also sees the comm die).
  void send_notice(Code code, uint64_t seq) {
    Notice notice{kNoticeMagic, static_cast<uint32_t>(code), seq};
    (void)!send(socks_[0].get(), &notice, sizeof(notice), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Unthreaded: socket 0's bytes come through the stash, one recv for a message's header and
  // (for a small message) its payload, and whatever follows it. Returns false when the stash
  // still holds fewer than `want` bytes and the kernel has none now.
  Result<bool> stash_fill(size_t want) {
    if (stash_end_ - stash_beg_ >= want) return true;
    if (!stash_) stash_ = std::make_unique<char[]>(kStashBytes);
    if (stash_beg_ > 0) {  // compact: the next message's first bytes go to the front
      std::memmove(stash_.get(), stash_.get() + stash_beg_, stash_end_ - stash_beg_);
      stash_end_ -= stash_beg_;
      stash_beg_ = 0;
    }
    // The kernel emptied its queue on the last short read: the test right after it (a receive
    // re-posted and tested at once) skips the system call; the next one reads, and so does one
    // after a wait_fds (which clears the mark: poll() tells the kernel's state then).
    if (drained_) {
      drained_ = false;
      return false;
    }
    while (true) {
      const size_t space = kStashBytes - stash_end_;
      ssize_t got = recv(socks_[0].get(), stash_.get() + stash_end_, space, MSG_DONTWAIT);
      if (got == 0) return peer_error("recv from {}: connection closed by peer", peer_);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return socket_error("recv from", peer_, errno);
      }
      stash_end_ += static_cast<size_t>(got);
      drained_ = static_cast<size_t>(got) < space;
      return stash_end_ - stash_beg_ >= want;
    }
  }

  // Reads socket 0's header of request r; false when it is not complete yet.
  Result<bool> read_header(TcpRequest& r) {
    if (!threaded()) {
      GW_ASSIGN_OR_RETURN(bool have, stash_fill(sizeof(hdr_)));
      if (!have) return false;
      std::memcpy(&hdr_, stash_.get() + stash_beg_, sizeof(hdr_));
      stash_beg_ += sizeof(hdr_);
      hdr_got_ = sizeof(hdr_);
    }
    while (hdr_got_ < sizeof(hdr_)) {
      ssize_t got = recv(socks_[0].get(), reinterpret_cast<char*>(&hdr_) + hdr_got_,
                         sizeof(hdr_) - hdr_got_, MSG_DONTWAIT);
      if (got == 0) return peer_error("recv from {}: connection closed by peer", peer_);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return socket_error("recv from", peer_, errno);
      }
      hdr_got_ += static_cast<size_t>(got);
    }
    hdr_got_ = 0;
    if (hdr_.magic != kHeaderMagic) {
      return internal_error("recv from {}: corrupt message header (magic {:#x})", peer_,
                            hdr_.magic);
    }
    if (r.tag != kAnyTag && hdr_.tag != r.tag) {
      send_notice(Code::kInternal, r.seq);
      return internal_error(
          "recv from {}: tag mismatch: receive #{} expects tag {}, message has tag {}", peer_,
          r.seq, r.tag, hdr_.tag);
    }
    if (hdr_.size > r.size) {
      send_notice(Code::kInvalidArg, r.seq);
      return truncated_error(
          "recv from {}: message truncated: message #{} has {} bytes, the receive only {}", peer_,
          r.seq, hdr_.size, r.size);
    }
    r.msg_size = hdr_.size;
    r.header_known = true;
    return true;
  }

  Result<bool> part_io(int i, TcpRequest& r, SockPos& p) override {
    if (i == 0 && !r.header_known) {
      GW_ASSIGN_OR_RETURN(bool have, read_header(r));
      if (!have) return false;
    }
    if (!r.header_known) return false;  // socket 0 has not delivered this message's header yet
    StripeRange range = tcp_stripe(r.msg_size, static_cast<int>(socks_.size()), chunk_, i);
    size_t part = range.end - range.begin;
    if (i == 0 && stash_end_ > stash_beg_ && p.off < part) {  // read ahead with the header
      const size_t n = std::min(stash_end_ - stash_beg_, part - p.off);
      std::memcpy(r.data + range.begin + p.off, stash_.get() + stash_beg_, n);
      stash_beg_ += n;
      p.off += n;
    }
    while (p.off < part && !halt_.load(std::memory_order_relaxed)) {
      ssize_t got = recv(socks_[i].get(), r.data + range.begin + p.off, part - p.off, MSG_DONTWAIT);
      if (got == 0) return peer_error("recv from {}: connection closed by peer", peer_);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return socket_error("recv from", peer_, errno);
      }
      p.off += static_cast<size_t>(got);
      if (p.off < part) return false;  // drained what the kernel had
    }
    return p.off == part;
  }

  short events_locked(int s) const override {
    const TcpRequest* r = reqs_.active(pos_[s].seq);
    return r != nullptr && (s == 0 || r->header_known) ? POLLIN : 0;
  }

  bool publish_locked(int s, const TcpRequest& copy, TcpRequest& real) override {
    if (s != 0 || !copy.header_known || real.header_known) return false;
    real.msg_size = copy.msg_size;
    real.header_known = true;
    return true;
  }

  MsgHeader hdr_{};
  size_t hdr_got_ = 0;
  // Unthreaded only (threaded, socket 0's worker reads the header alone, as before).
  static constexpr size_t kStashBytes = 4096;
  std::unique_ptr<char[]> stash_;
  size_t stash_beg_ = 0, stash_end_ = 0;  // unread bytes: [beg, end)
  mutable bool drained_ = false;          // the last recv left the kernel's queue empty
};

}  // namespace

Result<std::unique_ptr<RecvComm>> make_recv_comm(std::vector<Fd> socks, size_t chunk,
                                                 std::string peer, int threads) {
  auto comm =
      std::make_unique<RecvCommAdapter<TcpRecvCore>>(std::move(socks), chunk, std::move(peer));
  GW_RETURN_IF_ERROR(comm->core().start(threads));
  return std::unique_ptr<RecvComm>(std::move(comm));
}

}  // namespace gw::net::tcp
