#include "core/net/tcp_transport.h"

#include <arpa/inet.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "core/config.h"
#include "core/log.h"
#include "core/net/comm_adapter.h"
#include "core/net/handshake.h"
#include "core/net/request.h"
#include "core/net/socket_util.h"
#include "core/net/tcp_config.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"

namespace gw::net {

StripeRange tcp_stripe(size_t size, int nsocks, size_t unit, int index) {
  size_t n = static_cast<size_t>(std::max(nsocks, 1));
  size_t part = std::max(unit, (size + n - 1) / n);
  size_t begin = std::min(size, part * static_cast<size_t>(index));
  size_t end = std::min(size, begin + part);
  return {begin, end};
}

namespace {

using handshake::kAccept;
using handshake::kRefuse;
using sys::Fd;
using sys::now_ns;
using sys::set_nonblocking;

constexpr uint16_t kVersion = 2;
constexpr uint32_t kHeaderMagic = 0x47574d31;   // "GWM1"
constexpr uint32_t kNoticeMagic = 0x47574e31;   // "GWN1"
constexpr int64_t kRetryNs = 20 * 1000 * 1000;  // between connect() attempts on ECONNREFUSED

// All wire structs are little-endian, fixed size, no implicit padding (docs/wire-tcp.md).
struct HandleWire {
  char magic[4];  // "GWT1"
  uint16_t version;
  uint16_t nsocks;
  uint16_t family;   // AF_INET or AF_INET6
  uint16_t port_be;  // network byte order
  uint32_t scope_id;
  uint8_t addr[16];
  uint64_t nonce;
  int32_t rank;
  uint32_t reserved;
};
static_assert(sizeof(HandleWire) == 48 && sizeof(HandleWire) <= kHandleSize);

// Connector -> listener, first message of every socket.
struct Hello {
  char magic[4];  // "GWH2"
  uint16_t sock_index;
  uint16_t nsocks;
  uint64_t nonce;  // from the handle
  uint64_t conn_id;
  int32_t rank;           // the connector's
  int32_t listener_rank;  // the listener's, as the handle says
  handshake::Nonce challenge;
};
static_assert(sizeof(Hello) == 64);

// Listener -> connector after a hello it does not refuse outright (a refusal is kRefuse alone).
struct Challenge {
  uint8_t answer;  // kChallenge
  uint8_t reserved[7];
  handshake::Nonce challenge;
  handshake::Mac proof;  // the listener's
};
static_assert(sizeof(Challenge) == 72);

// Connector -> listener: the connector's proof. The listener answers kAccept or kRefuse.
struct Proof {
  handshake::Mac proof;
};
static_assert(sizeof(Proof) == 32);

struct MsgHeader {
  uint32_t magic;
  int32_t tag;
  uint64_t size;
};
static_assert(sizeof(MsgHeader) == 16);

struct Notice {
  uint32_t magic;
  uint32_t code;  // gw::Code of the receiver's failure
  uint64_t seq;   // message number (0-based, per connection)
};
static_assert(sizeof(Notice) == 16);

handshake::Transcript transcript(const Hello& h) {
  handshake::Transcript t;
  t.protocol = "tcp";
  t.handle_nonce = h.nonce;
  t.conn_id = h.conn_id;
  t.index = h.sock_index;
  t.connector_rank = h.rank;
  t.listener_rank = h.listener_rank;
  t.connector_challenge = h.challenge;
  return t;
}

struct TcpConfig {
  int nsocks = 4;
  int64_t bufsize = 0;
  size_t chunk = 0;
  int threads = 0;  // I/O worker threads per comm; 0 = the caller's thread
};

bool is_peer_errno(int err) {
  switch (err) {
    case ECONNRESET:
    case EPIPE:
    case ENOTCONN:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case ENETUNREACH:
    case ECONNABORTED:
    case ECONNREFUSED:
      return true;
    default:
      return false;
  }
}

Status socket_error(std::string_view what, const std::string& peer, int err) {
  if (is_peer_errno(err)) {
    char buf[128];
    return peer_error("{} {}: {}", what, peer, strerror_r(err, buf, sizeof(buf)));
  }
  return system_error(fmt::format("{} {}", what, peer), err);
}

Status configure_socket(int fd, int64_t bufsize) {
  GW_RETURN_IF_ERROR(set_nonblocking(fd));
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return system_error("setsockopt(TCP_NODELAY)", errno);
  }
  if (bufsize > 0) {
    int size = static_cast<int>(std::min<int64_t>(bufsize, 1 << 30));
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size)) != 0) {
      return system_error("setsockopt(SO_SNDBUF/SO_RCVBUF)", errno);
    }
  }
  return ok_status();
}

socklen_t sockaddr_len(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

struct TcpRequest : Request {
  uint64_t seq = 0;
  RequestState state = RequestState::kFree;
  char* data = nullptr;
  size_t size = 0;  // send: message size; receive: capacity
  int tag = 0;
  bool header_known = false;
  size_t msg_size = 0;  // bytes of the message (known to the receiver once its header arrived)
};

// Worker threads wait in poll() at most this long, so a stop or failure they were not woken for
// is still seen promptly.
constexpr int kWorkerPollMs = 50;
// test() on a failed comm waits at most this long for workers to leave the user's buffers.
constexpr int64_t kQuiesceMs = 2000;

void signal_fd(int fd) {
  uint64_t one = 1;
  (void)!write(fd, &one, sizeof(one));  // EAGAIN only when the counter is saturated: still ready
}

void drain_fd(int fd) {
  uint64_t count = 0;
  (void)!read(fd, &count, sizeof(count));
}

// What both comm directions share: sockets, request table, sticky error, registrations, and the
// optional worker threads.
//
// Unthreaded (nthreads_ == 0): the caller's isend/irecv/test move bytes; no locks.
// Threaded: worker t owns sockets s with s % nthreads_ == t and is the only thread touching
// them and pos_[s] outside mu_. mu_ guards reqs_, error_, every pos_[s].seq and the wake-up
// state. A worker copies a request under mu_, moves bytes without it (busy_ counts those moves),
// and publishes its progress under mu_ again. The caller only posts and checks completion.
class TcpCommCore {
 protected:
  struct SockPos {
    uint64_t seq = 0;    // message this socket works on
    size_t off = 0;      // bytes of its part done
    size_t hdr_off = 0;  // socket 0: header bytes done
  };

  TcpCommCore(std::vector<Fd> socks, size_t chunk, std::string peer)
      : socks_(std::move(socks)), chunk_(chunk), peer_(std::move(peer)), pos_(socks_.size()) {}

 public:
  virtual ~TcpCommCore() = default;

  // Starts min(threads, nsocks) workers; 0 keeps all I/O on the caller's thread.
  Status start(int threads) { return start_workers(threads); }
  Result<MemRegion*> reg_mr(void* data, size_t size, MemType type) {
    return mrs_.reg(data, size, type, "tcp");
  }
  Status dereg_mr(MemRegion* mr) { return mrs_.dereg(mr); }
  std::string peer_name() const { return peer_; }

 protected:
  // Moves bytes of request r on socket s from p onwards without blocking: true when the socket
  // has finished its part of r, false when the kernel has no room/data now. Errors are returned,
  // not recorded. In threaded mode r is the worker's copy of the request.
  virtual Result<bool> part_io(int s, TcpRequest& r, SockPos& p) = 0;
  // Threaded mode, mu_ held: poll() events worth waiting for on socket s (0 = none).
  virtual short events_locked(int s) const = 0;
  // Threaded mode, mu_ held, after part_io on a copy: folds what the copy learned into the real
  // request; true when other workers may now have work (the receiver learned a header).
  virtual bool publish_locked(int s, const TcpRequest& copy, TcpRequest& real) { return false; }
  // Threaded mode, socket 0's worker, once per round: reads what the peer sends back.
  virtual Status socket0_extra() { return ok_status(); }

  Status fail(Status status) {
    if (error_.ok()) error_ = std::move(status);
    return error_;
  }

  // Marks requests complete up to the slowest socket: requests finish in posting order.
  void complete() {
    uint64_t done = UINT64_MAX;
    for (const SockPos& p : pos_) done = std::min(done, p.seq);
    reqs_.complete_through(done);
  }

  bool threaded() const { return nthreads_ > 0; }

  Status start_workers(int threads) {
    const int n = std::min<int>(threads, static_cast<int>(socks_.size()));
    if (n <= 0) return ok_status();
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) return system_error("tcp: eventfd", errno);
    done_fd_.reset(fd);
    for (int t = 0; t < n; ++t) {
      fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
      if (fd < 0) return system_error("tcp: eventfd", errno);
      wake_.emplace_back(fd);
    }
    sleeping_.assign(static_cast<size_t>(n), 0);
    rounds_.assign(static_cast<size_t>(n), 0);
    nthreads_ = n;
    try {
      for (int t = 0; t < n; ++t) workers_.emplace_back([this, t] { worker_main(t); });
    } catch (const std::system_error& e) {
      stop_workers();
      return system_error(fmt::format("tcp: starting I/O thread for {}", peer_), e.code().value());
    }
    return ok_status();
  }

  // Derived destructors call this first: afterwards no thread touches the comm or user buffers.
  // Bounded: workers are woken and never block for longer than one non-blocking syscall.
  void stop_workers() {
    if (workers_.empty()) return;
    halt_.store(true);
    for (const Fd& w : wake_) signal_fd(w.get());
    for (std::thread& w : workers_) w.join();
    workers_.clear();
  }

  // Threaded-mode post: under mu_, a slot filled by `fill`, then the sleeping workers woken.
  template <typename Fill>
  Result<Request*> post_threaded(Fill&& fill) {
    uint32_t wake = 0;
    TcpRequest* r = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_.ok()) return error_;
      r = reqs_.post();
      if (r == nullptr) return static_cast<Request*>(nullptr);
      fill(r);
      wake = sleepers_locked(-1);
    }
    wake_workers(wake);
    return static_cast<Request*>(r);
  }

  template <typename Progress>
  Status test_impl(Request* request, bool* done, size_t* size, Progress&& progress) {
    if (!threaded()) {
      return test_request(reqs_, error_, peer_, request, done, size,
                          std::forward<Progress>(progress));
    }
    std::unique_lock<std::mutex> lock(mu_);
    // A failed request is handed back to the caller, who may free its buffer: first wait until
    // no worker is still inside a send/recv on some buffer (they stop at once after a failure).
    if (!error_.ok()) {
      quiesce_cv_.wait_for(lock, std::chrono::milliseconds(kQuiesceMs),
                           [this] { return busy_ == 0; });
    }
    Status s = test_request(reqs_, error_, peer_, request, done, size, [] { return ok_status(); });
    if (s.ok() && done != nullptr && *done) --unreported_;
    return s;
  }

  // Threaded mode: one eventfd the workers signal when a request completes or the comm fails.
  // It is ready at once when a completion has not been collected by test() yet.
  bool wait_fds_threaded(std::vector<pollfd>* fds) const {
    std::lock_guard<std::mutex> lock(mu_);
    drain_fd(done_fd_.get());
    if (!error_.ok() || unreported_ > 0) {
      signal_fd(done_fd_.get());
    } else if (reqs_.idle()) {
      return true;  // nothing outstanding: nothing to wait for
    } else {
      done_armed_ = true;
    }
    fds->push_back(pollfd{done_fd_.get(), POLLIN, 0});
    return true;
  }

  std::vector<Fd> socks_;
  size_t chunk_;
  std::string peer_;
  std::vector<SockPos> pos_;
  RequestTable<TcpRequest> reqs_;
  Status error_;
  HostMrRegistry mrs_;
  // Set when workers must stop moving bytes (failure or close); checked between syscalls.
  std::atomic<bool> halt_{false};
  // Worker 0 saw the peer close socket 0 and reports it after the other workers' next round
  // (written by worker 0 under mu_; read by the workers under mu_).
  bool close_pending_ = false;

 private:
  // mu_ held: marks the comm failed (first error wins) and tells everyone.
  void fail_locked(Status status) {
    (void)fail(std::move(status));
    halt_.store(true);
    if (done_armed_) {
      done_armed_ = false;
      signal_fd(done_fd_.get());
    }
  }

  // mu_ held: the workers (except `self`) asleep in poll(), as a bit mask; they count as awake
  // from now on.
  uint32_t sleepers_locked(int self) {
    uint32_t mask = 0;
    for (int t = 0; t < nthreads_; ++t) {
      if (t != self && sleeping_[t] != 0) {
        sleeping_[t] = 0;
        mask |= 1u << t;
      }
    }
    return mask;
  }

  void wake_workers(uint32_t mask) {
    for (int t = 0; mask != 0; ++t, mask >>= 1) {
      if ((mask & 1u) != 0) signal_fd(wake_[t].get());
    }
  }

  // mu_ held: request completion from the sockets' positions; wakes a waiter in wait_fds.
  void complete_locked() {
    const uint64_t before = reqs_.done_seq();
    complete();
    if (reqs_.done_seq() != before) {
      unreported_ += reqs_.done_seq() - before;
      if (done_armed_) {
        done_armed_ = false;
        signal_fd(done_fd_.get());
      }
    }
  }

  // Socket s's share of one round: every message it can finish or advance without blocking.
  Status run_socket(int t, int s) {
    SockPos& p = pos_[s];
    while (true) {
      TcpRequest copy;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (halt_.load()) return ok_status();
        TcpRequest* r = reqs_.active(p.seq);
        if (r == nullptr) return ok_status();
        copy = *r;
        ++busy_;
      }
      Result<bool> finished = part_io(s, copy, p);
      uint32_t wake = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        --busy_;
        if (!finished.ok()) {
          fail_locked(finished.status());
        } else {
          TcpRequest* r = reqs_.active(p.seq);
          if (r != nullptr && !halt_.load() && publish_locked(s, copy, *r)) {
            wake = sleepers_locked(t);
          }
          if (*finished) {
            p = SockPos{p.seq + 1};
            complete_locked();
          }
        }
        if (halt_.load()) {
          wake = sleepers_locked(t);
          if (busy_ == 0) quiesce_cv_.notify_all();
        }
      }
      wake_workers(wake);
      if (!finished.ok()) return finished.status();
      if (!*finished) return ok_status();
    }
  }

  // Worker 0 (it owns socket 0), after its sockets' round: what the peer sent back. A notice
  // fails the comm at once. A close (EOF, reset) fails it only after every other worker has
  // finished a round since: the unthreaded pass moves every socket's bytes before it reads
  // socket 0, so a request whose bytes were all handed to the kernel completes before the
  // close is reported; this keeps that order (bounded: the others are woken for those rounds).
  // False when the comm failed.
  bool socket0_round() {
    uint32_t wake = 0;
    bool failed = false;
    if (!close_pending_) {
      Status extra = socket0_extra();
      if (!extra.ok()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (extra.code() == Code::kPeer) {
          close_pending_ = true;
          close_error_ = std::move(extra);
          close_at_ = rounds_;
          wake = sleepers_locked(0);
        } else {
          fail_locked(std::move(extra));
          failed = true;
        }
      }
    }
    if (close_pending_ && !failed) {
      std::lock_guard<std::mutex> lock(mu_);
      // Two rounds: the first may have begun before the close (or the last post) was seen.
      bool all = true;
      for (int t = 1; t < nthreads_; ++t) all &= rounds_[t] >= close_at_[t] + 2;
      if (all) {
        fail_locked(close_error_);
        failed = true;
      } else {
        wake |= sleepers_locked(0);
      }
    }
    if (failed) {
      std::lock_guard<std::mutex> lock(mu_);
      wake = sleepers_locked(0);
      if (busy_ == 0) quiesce_cv_.notify_all();
    }
    wake_workers(wake);
    return !failed;
  }

  void worker_main(int t) {
    std::vector<pollfd> fds;
    const int n = static_cast<int>(socks_.size());
    while (!halt_.load()) {
      for (int s = t; s < n && !halt_.load(); s += nthreads_) {
        if (!run_socket(t, s).ok()) return;
      }
      if (t == 0 && !socket0_round()) return;
      // Sleep until a socket is ready, a post or another worker wakes us, or the timeout.
      fds.clear();
      fds.push_back(pollfd{wake_[t].get(), POLLIN, 0});
      uint32_t wake = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (halt_.load()) return;
        ++rounds_[t];
        // Worker 0 waits for this round before it reports a close (socket0_round).
        if (close_pending_ && t != 0 && sleeping_[0] != 0) {
          sleeping_[0] = 0;
          wake = 1;
        }
        for (int s = t; s < n; s += nthreads_) {
          short events = events_locked(s);
          if (events != 0) fds.push_back(pollfd{socks_[s].get(), events, 0});
        }
        sleeping_[t] = 1;
      }
      wake_workers(wake);
      if (::poll(fds.data(), fds.size(), kWorkerPollMs) > 0 && (fds[0].revents & POLLIN) != 0) {
        drain_fd(wake_[t].get());
      }
    }
  }

  int nthreads_ = 0;  // 0: caller's thread
  std::vector<std::thread> workers_;
  std::vector<Fd> wake_;  // one eventfd per worker
  Fd done_fd_;            // see wait_fds_threaded

 protected:
  mutable std::mutex mu_;

 private:
  std::condition_variable quiesce_cv_;  // busy_ dropped to 0 after a failure
  int busy_ = 0;                        // workers inside part_io
  std::vector<char> sleeping_;          // per worker: asleep in poll() (mu_)
  std::vector<uint64_t> rounds_;        // per worker: rounds finished (mu_)
  std::vector<uint64_t> close_at_;      // rounds_ when worker 0 saw the close (mu_)
  Status close_error_;                  // that close (mu_)
  mutable bool done_armed_ = false;     // a caller waits on done_fd_ (mu_)
  uint64_t unreported_ = 0;             // completed requests test() has not returned yet (mu_)
};

// One direction of a connection; TcpSendComm forwards the SendComm interface to it.
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
    auto fill = [&](TcpRequest* r) {
      r->data = static_cast<char*>(const_cast<void*>(data));
      r->size = size;
      r->msg_size = size;
      r->tag = tag;
    };
    if (threaded()) return post_threaded(fill);
    if (!error_.ok()) return error_;
    TcpRequest* r = reqs_.post();
    if (r == nullptr) return static_cast<Request*>(nullptr);
    fill(r);
    (void)progress();  // start moving bytes now; errors surface in test()
    return static_cast<Request*>(r);
  }

  Status test(Request* request, bool* done, size_t* size) {
    return test_impl(request, done, size, [this] { return progress(); });
  }

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

  Status progress() {
    if (!error_.ok()) return error_;
    const int n = static_cast<int>(socks_.size());
    for (int i = 0; i < n; ++i) {
      SockPos& p = pos_[i];
      while (TcpRequest* r = reqs_.active(p.seq)) {
        Result<bool> finished = part_io(i, *r, p);
        if (!finished.ok()) return fail(finished.status());
        if (!*finished) break;
        p = SockPos{p.seq + 1};
      }
    }
    complete();
    Status notice = read_notice();
    return notice.ok() ? notice : fail(std::move(notice));
  }

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
      return invalid_arg(
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

// One direction of a connection; TcpRecvComm forwards the RecvComm interface to it.
class TcpRecvCore final : public TcpCommCore {
 public:
  TcpRecvCore(std::vector<Fd> socks, size_t chunk, std::string peer)
      : TcpCommCore(std::move(socks), chunk, std::move(peer)) {}
  ~TcpRecvCore() override { stop_workers(); }

  bool wait_fds(std::vector<pollfd>* fds) const {
    if (threaded()) return wait_fds_threaded(fds);
    // A socket is worth waiting on while a posted receive still expects bytes from it; sockets
    // other than 0 only once socket 0 has delivered the message's header (their part follows
    // from its size).
    for (size_t i = 0; i < socks_.size(); ++i) {
      short events = events_locked(static_cast<int>(i));
      if (events != 0) fds->push_back(pollfd{socks_[i].get(), events, 0});
    }
    return true;
  }

  Result<Request*> irecv(void* data, size_t size, int tag, MemRegion* mr) {
    GW_RETURN_IF_ERROR(check_buffer("irecv", data, size, tag, true, mr));
    auto fill = [&](TcpRequest* r) {
      r->data = static_cast<char*>(data);
      r->size = size;
      r->tag = tag;
    };
    if (threaded()) return post_threaded(fill);
    if (!error_.ok()) return error_;
    TcpRequest* r = reqs_.post();
    if (r == nullptr) return static_cast<Request*>(nullptr);
    fill(r);
    (void)progress();
    return static_cast<Request*>(r);
  }

  Status test(Request* request, bool* done, size_t* size) {
    return test_impl(request, done, size, [this] { return progress(); });
  }

 private:
  // Tells the sender why its message failed (best effort: the sender also sees the comm die).
  void send_notice(Code code, uint64_t seq) {
    Notice notice{kNoticeMagic, static_cast<uint32_t>(code), seq};
    (void)!send(socks_[0].get(), &notice, sizeof(notice), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Reads socket 0's header of request r; false when it is not complete yet.
  Result<bool> read_header(TcpRequest& r) {
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
      return invalid_arg(
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

  Status progress() {
    if (!error_.ok()) return error_;
    const int n = static_cast<int>(socks_.size());
    for (int i = 0; i < n; ++i) {
      SockPos& p = pos_[i];
      while (TcpRequest* r = reqs_.active(p.seq)) {
        Result<bool> finished = part_io(i, *r, p);
        if (!finished.ok()) return fail(finished.status());
        if (!*finished) break;
        p = SockPos{p.seq + 1};
      }
    }
    complete();
    return ok_status();
  }

  MsgHeader hdr_{};
  size_t hdr_got_ = 0;
};

using TcpSendComm = SendCommAdapter<TcpSendCore>;
using TcpRecvComm = RecvCommAdapter<TcpRecvCore>;

class TcpListener final : public Listener {
 public:
  TcpListener(Fd fd, uint64_t nonce, TcpConfig config, TransportOptions options)
      : fd_(std::move(fd)), nonce_(nonce), config_(config), options_(std::move(options)) {}

  Result<std::unique_ptr<RecvComm>> accept() override {
    // The handshakes already held move first, so a flood of new connections cannot push out one
    // that has spoken before it was read.
    const int64_t now = now_ns();
    for (size_t i = 0; i < pending_.size();) {
      Result<bool> keep = advance(pending_[i], now);
      if (!keep.ok()) return keep.status();
      if (*keep) {
        ++i;
      } else {
        pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(i));
      }
    }
    GW_RETURN_IF_ERROR(accept_new(now));
    for (size_t i = 0; i < groups_.size(); ++i) {
      Group& g = groups_[i];
      if (g.count == config_.nsocks) {
        auto comm = std::make_unique<TcpRecvComm>(std::move(g.socks), config_.chunk,
                                                  handshake::peer_label(g.rank, "tcp", g.addr));
        groups_.erase(groups_.begin() + static_cast<ptrdiff_t>(i));
        GW_RETURN_IF_ERROR(comm->core().start(config_.threads));
        return std::unique_ptr<RecvComm>(std::move(comm));
      }
    }
    std::erase_if(groups_, [now](const Group& g) {
      if (now < g.deadline_ns) return false;
      GW_LOG_WARN("tcp accept: dropping incomplete connection from {} ({} sockets arrived)", g.addr,
                  g.count);
      return true;
    });
    return std::unique_ptr<RecvComm>();
  }

 private:
  enum class Phase { kHello, kChallenge, kProof };
  struct Pending {
    Fd fd;
    std::string addr;
    Phase phase = Phase::kHello;
    Hello hello{};
    Challenge challenge{};
    Proof proof{};
    size_t done = 0;  // bytes of the current phase's message moved
    int64_t deadline_ns = 0;
  };
  struct Group {
    uint64_t conn_id = 0;
    int rank = -1;
    std::string addr;
    std::vector<Fd> socks;
    int count = 0;
    int64_t deadline_ns = 0;
  };

  // Accepts up to kAcceptBurst connections. Out of descriptors, a held handshake that has not
  // spoken makes way (else the oldest); with none held, the waiting connection is shed and
  // accepting pauses (sys::AcceptShedder). A collective never fails for it: the handshakes it
  // needs finish, or its connector retries until its deadline.
  Status accept_new(int64_t now) {
    if (shedder_.paused(now)) return ok_status();
    for (int burst = 0; burst < handshake::kAcceptBurst;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = accept4(fd_.get(), reinterpret_cast<sockaddr*>(&addr), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return ok_status();
        if (err == EMFILE || err == ENFILE) {
          ++burst;
          if (!pending_.empty()) {
            drop_one_pending("out of file descriptors");
            continue;
          }
          GW_LOG_WARN("tcp accept: {}; shedding a connection",
                      system_error("out of file descriptors", err).message());
          shedder_.shed(fd_.get(), now);
          return ok_status();
        }
        return system_error("tcp accept", err);
      }
      ++burst;
      if (pending_.size() >= max_pending_) {
        drop_one_pending(fmt::format("{} handshakes pending", pending_.size()));
      }
      Pending p;
      p.fd.reset(fd);
      p.addr = format_sockaddr(reinterpret_cast<sockaddr*>(&addr));
      // A silent client holds a slot until this deadline; it never stalls other handshakes.
      p.deadline_ns = now_ns() + options_.timeout_ms * 1000000;
      Status s = configure_socket(fd, 0);
      if (!s.ok()) {
        GW_LOG_WARN("tcp accept from {}: {}", p.addr, s.to_string());
        continue;
      }
      pending_.push_back(std::move(p));
    }
    return ok_status();
  }

  // Drops one held handshake: the oldest that has not sent a byte, else the oldest.
  void drop_one_pending(std::string_view why) {
    auto it = std::find_if(pending_.begin(), pending_.end(), [](const Pending& p) {
      return p.phase == Phase::kHello && p.done == 0;
    });
    if (it == pending_.end()) it = pending_.begin();
    uint64_t skipped = 0;
    if (drop_log_.should_log(now_ns(), &skipped)) {
      GW_LOG_WARN(
          "tcp accept: {}; dropping the handshake of {} ({} more dropped since the "
          "last warning)",
          why, it->addr, skipped);
    }
    pending_.erase(it);
  }

  // Moves bytes of one handshake message without blocking: true when all `size` bytes are
  // done, false for "not yet"; an error (including EOF) when the socket is finished.
  static Result<bool> move_bytes(int fd, void* buf, size_t size, size_t* done, bool sending) {
    while (*done < size) {
      char* p = static_cast<char*>(buf) + *done;
      ssize_t n = sending ? send(fd, p, size - *done, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : recv(fd, p, size - *done, MSG_DONTWAIT);
      if (n == 0 && !sending) return peer_error("closed mid-handshake");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return system_error("handshake", errno);
      }
      *done += static_cast<size_t>(n);
    }
    return true;
  }

  void refuse(Pending& p, std::string_view why) {
    GW_LOG_WARN("tcp accept: refused connection from {}: {}", p.addr, why);
    uint8_t refuse = kRefuse;
    (void)!send(p.fd.get(), &refuse, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Advances one pending handshake; false when the socket is done with (grouped or dropped).
  // The listener proves the token first (its challenge carries its proof), then checks the
  // connector's proof over the same transcript (docs/wire-tcp.md).
  Result<bool> advance(Pending& p, int64_t now) {
    while (true) {
      Result<bool> moved = true;
      switch (p.phase) {
        case Phase::kHello:
          moved = move_bytes(p.fd.get(), &p.hello, sizeof(Hello), &p.done, false);
          break;
        case Phase::kChallenge:
          moved = move_bytes(p.fd.get(), &p.challenge, sizeof(Challenge), &p.done, true);
          break;
        case Phase::kProof:
          moved = move_bytes(p.fd.get(), &p.proof, sizeof(Proof), &p.done, false);
          break;
      }
      if (!moved.ok()) return false;  // the client went away mid-handshake
      if (!*moved) {
        if (now < p.deadline_ns) return true;
        GW_LOG_WARN("tcp accept: {} did not finish its handshake within {} ms; dropped", p.addr,
                    options_.timeout_ms);
        return false;
      }
      p.done = 0;
      const Hello& h = p.hello;
      if (p.phase == Phase::kHello) {
        std::string why =
            handshake::refusal({h.magic, h.nonce, h.rank, h.listener_rank},
                               {"tcp", "GWH2", nonce_, options_.rank, expected_peer()});
        if (why.empty() && (h.nsocks != config_.nsocks || h.sock_index >= h.nsocks)) {
          why = "socket count or index out of range";
        }
        if (!why.empty()) {
          refuse(p, why);
          return false;
        }
        handshake::Transcript t = transcript(h);
        Status fresh = handshake::fresh_nonce(&t.listener_challenge);
        if (!fresh.ok()) {
          refuse(p, fresh.message());
          return false;
        }
        p.challenge = Challenge{};
        p.challenge.answer = handshake::kChallenge;
        p.challenge.challenge = t.listener_challenge;
        p.challenge.proof = handshake::prove(options_.job_token, handshake::Role::kListener, t);
        p.phase = Phase::kChallenge;
        continue;
      }
      if (p.phase == Phase::kChallenge) {
        p.phase = Phase::kProof;
        continue;
      }
      // Phase::kProof: the whole exchange is in.
      handshake::Transcript t = transcript(h);
      t.listener_challenge = p.challenge.challenge;
      if (!handshake::verify(options_.job_token, handshake::Role::kConnector, t,
                             p.proof.proof.data())) {
        refuse(p, fmt::format("{} did not prove the job token (job token mismatch)",
                              rank_name(h.rank)));
        return false;
      }
      return join_group(p, now);
    }
  }

  // An authenticated socket joins the group of its connection id.
  Result<bool> join_group(Pending& p, int64_t now) {
    const Hello& h = p.hello;
    auto it = std::find_if(groups_.begin(), groups_.end(),
                           [&](const Group& g) { return g.conn_id == h.conn_id; });
    if (it == groups_.end()) {
      Group g;
      g.conn_id = h.conn_id;
      g.rank = h.rank;
      g.socks.resize(static_cast<size_t>(config_.nsocks));
      g.deadline_ns = now + options_.timeout_ms * 1000000;
      groups_.push_back(std::move(g));
      it = groups_.end() - 1;
    }
    if (it->rank != h.rank) {
      refuse(p, fmt::format("socket {} states {} in a connection of {}", h.sock_index,
                            rank_name(h.rank), rank_name(it->rank)));
      return false;
    }
    if (it->socks[h.sock_index].valid()) {
      GW_LOG_WARN("tcp accept: duplicate socket {} from {}; dropped", h.sock_index, p.addr);
      return false;
    }
    uint8_t accept_byte = kAccept;
    if (send(p.fd.get(), &accept_byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return false;
    if (h.sock_index == 0) it->addr = p.addr;
    it->socks[h.sock_index] = std::move(p.fd);
    ++it->count;
    return false;
  }

  Fd fd_;
  uint64_t nonce_;
  TcpConfig config_;
  TransportOptions options_;
  std::vector<Pending> pending_;
  const size_t max_pending_ = handshake::max_pending();  // GW_LISTEN_MAX_PENDING
  std::vector<Group> groups_;
  sys::AcceptShedder shedder_;
  handshake::DropLog drop_log_;
};

class TcpConnector final : public Connector {
 public:
  TcpConnector(const HandleWire& handle, sockaddr_storage addr, TcpConfig config,
               const TransportOptions& options)
      : addr_(addr),
        config_(config),
        deadline_(sys::deadline_after_ms(options.timeout_ms)),
        timeout_ms_(options.timeout_ms),
        peer_(handshake::peer_label(handle.rank, "tcp",
                                    format_sockaddr(reinterpret_cast<const sockaddr*>(&addr)))) {
    config_.nsocks = handle.nsocks;
    socks_.resize(handle.nsocks);
    hello_ = Hello{};
    handshake::put_magic(hello_.magic, "GWH2");
    hello_.nsocks = handle.nsocks;
    hello_.nonce = handle.nonce;
    hello_.conn_id = random_u64();
    hello_.rank = options.rank;
    hello_.listener_rank = handle.rank;
    token_ = options.job_token;
  }

  Result<std::unique_ptr<SendComm>> poll() override {
    if (!error_.ok()) return error_;
    if (returned_) return invalid_arg("poll: the connection to {} was already returned", peer_);
    bool all_done = true;
    for (size_t i = 0; i < socks_.size(); ++i) {
      Status s = advance(socks_[i], static_cast<uint16_t>(i));
      if (!s.ok()) {
        error_ = s;
        return error_;
      }
      all_done &= socks_[i].phase == Phase::kDone;
    }
    if (all_done) {
      std::vector<Fd> fds;
      for (Sock& s : socks_) fds.push_back(std::move(s.fd));
      returned_ = true;
      auto comm = std::make_unique<TcpSendComm>(std::move(fds), config_.chunk, peer_);
      error_ = comm->core().start(config_.threads);
      if (!error_.ok()) return error_;
      return std::unique_ptr<SendComm>(std::move(comm));
    }
    if (sys::expired(deadline_)) {
      error_ = handshake::connect_timeout_error(peer_, timeout_ms_, last_problem_);
      socks_.clear();
      return error_;
    }
    return std::unique_ptr<SendComm>();
  }

 private:
  enum class Phase { kIdle, kConnecting, kHello, kChallenge, kProof, kAck, kDone };
  struct Sock {
    Fd fd;
    Phase phase = Phase::kIdle;
    size_t sent = 0;  // bytes of the current phase's message moved
    int64_t retry_at_ns = 0;
    Hello hello{};  // this socket's hello (its own index and challenge)
    Challenge challenge{};
    Proof proof{};
  };

  // Moves handshake bytes: true when all are done, false for "not yet".
  Result<bool> move(Sock& s, void* buf, size_t size, bool sending) {
    while (s.sent < size) {
      char* p = static_cast<char*>(buf) + s.sent;
      ssize_t n = sending ? send(s.fd.get(), p, size - s.sent, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : recv(s.fd.get(), p, size - s.sent, MSG_DONTWAIT);
      if (n == 0 && !sending) return handshake::closed_by_listener_error(peer_);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
        return socket_error("handshake with", peer_, errno);
      }
      s.sent += static_cast<size_t>(n);
      // A refusal is one byte followed by close: report it as soon as it is seen.
      if (!sending && s.phase == Phase::kChallenge && s.sent >= 1 &&
          s.challenge.answer == kRefuse) {
        return handshake::refused_error(peer_);
      }
    }
    s.sent = 0;
    return true;
  }

  void retry_later(Sock& s, int err) {
    char buf[128];
    last_problem_ = fmt::format("last attempt: {}", strerror_r(err, buf, sizeof(buf)));
    s.fd.reset();
    s.phase = Phase::kIdle;
    s.retry_at_ns = now_ns() + kRetryNs;
  }

  Status advance(Sock& s, uint16_t index) {
    while (true) {
      switch (s.phase) {
        case Phase::kIdle: {
          if (now_ns() < s.retry_at_ns) return ok_status();
          int fd = socket(addr_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (fd < 0) return system_error("socket", errno);
          s.fd.reset(fd);
          GW_RETURN_IF_ERROR(configure_socket(fd, config_.bufsize));
          if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr_), sockaddr_len(addr_)) == 0) {
            s.phase = Phase::kHello;
          } else if (errno == EINPROGRESS || errno == EINTR) {
            s.phase = Phase::kConnecting;
          } else if (is_peer_errno(errno) || errno == EAGAIN) {
            retry_later(s, errno);
            return ok_status();
          } else {
            return socket_error("connect to", peer_, errno);
          }
          break;
        }
        case Phase::kConnecting: {
          pollfd pfd{s.fd.get(), POLLOUT, 0};
          if (::poll(&pfd, 1, 0) == 0) return ok_status();
          int err = 0;
          socklen_t len = sizeof(err);
          if (getsockopt(s.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          if (err == 0) {
            s.phase = Phase::kHello;
          } else if (is_peer_errno(err)) {
            retry_later(s, err);
            return ok_status();
          } else {
            return socket_error("connect to", peer_, err);
          }
          break;
        }
        case Phase::kHello: {
          if (s.sent == 0) {
            s.hello = hello_;
            s.hello.sock_index = index;
            GW_RETURN_IF_ERROR(handshake::fresh_nonce(&s.hello.challenge));
          }
          GW_ASSIGN_OR_RETURN(bool done, move(s, &s.hello, sizeof(Hello), true));
          if (!done) return ok_status();
          s.phase = Phase::kChallenge;
          break;
        }
        case Phase::kChallenge: {
          GW_ASSIGN_OR_RETURN(bool done, move(s, &s.challenge, sizeof(Challenge), false));
          if (!done) return ok_status();
          if (s.challenge.answer != handshake::kChallenge) {
            return peer_error("handshake with {}: unexpected answer {:#x}", peer_,
                              s.challenge.answer);
          }
          handshake::Transcript t = transcript(s.hello);
          t.listener_challenge = s.challenge.challenge;
          if (!handshake::verify(token_, handshake::Role::kListener, t, s.challenge.proof.data())) {
            return handshake::listener_unproven_error(peer_);
          }
          s.proof.proof = handshake::prove(token_, handshake::Role::kConnector, t);
          s.phase = Phase::kProof;
          break;
        }
        case Phase::kProof: {
          GW_ASSIGN_OR_RETURN(bool done, move(s, &s.proof, sizeof(Proof), true));
          if (!done) return ok_status();
          s.phase = Phase::kAck;
          break;
        }
        case Phase::kAck: {
          uint8_t answer = 0;
          ssize_t n = recv(s.fd.get(), &answer, 1, MSG_DONTWAIT);
          if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ok_status();
            return socket_error("handshake with", peer_, errno);
          }
          if (n == 0) return handshake::closed_by_listener_error(peer_);
          if (answer == kRefuse) return handshake::refused_error(peer_);
          if (answer != kAccept) {
            return peer_error("handshake with {}: unexpected answer {:#x}", peer_, answer);
          }
          s.phase = Phase::kDone;
          break;
        }
        case Phase::kDone:
          return ok_status();
      }
    }
  }

  sockaddr_storage addr_;
  TcpConfig config_;
  sys::Deadline deadline_;
  int64_t timeout_ms_;
  std::string peer_;
  Hello hello_{};  // the fields every socket's hello shares
  std::string token_;
  std::vector<Sock> socks_;
  Status error_;
  std::string last_problem_;
  bool returned_ = false;
};

int read_link_speed(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  int speed = 0;
  if (!(in >> speed) || speed < 0) return 0;
  return speed;
}

class TcpTransport final : public Transport {
 public:
  TcpTransport(TransportOptions options, TcpConfig config, Interface iface)
      : options_(std::move(options)), config_(config), iface_(std::move(iface)) {
    props_.name = "tcp";
    std::string ip = format_sockaddr(reinterpret_cast<const sockaddr*>(&iface_.addr));
    ip = ip.substr(0, ip.rfind(':'));  // drop the port
    props_.interfaces = fmt::format("{}:{}", iface_.name, ip);
    props_.sockets_per_conn = config_.nsocks;
    props_.io_threads = std::min(config_.threads, config_.nsocks);
    props_.speed_mbps = read_link_speed(iface_.name);
    props_.latency_us = 30;
    // Loopback and unknown links: what this path measures on a small box; else ~90% of line rate.
    props_.bandwidth_gbps =
        iface_.loopback || props_.speed_mbps == 0 ? 2.0 : props_.speed_mbps / 8000.0 * 0.9;
    props_.supports_cuda = false;
  }

  const Properties& properties() const override { return props_; }

  Result<std::unique_ptr<Listener>> listen(Handle* handle) override {
    if (handle == nullptr) return invalid_arg("tcp listen: null handle");
    int fd = socket(iface_.addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return system_error("tcp listen: socket", errno);
    Fd owned(fd);
    // Accepted sockets inherit the buffer sizes (they must be set before listen()).
    GW_RETURN_IF_ERROR(configure_socket(fd, config_.bufsize));
    sockaddr_storage addr = iface_.addr;
    if (addr.ss_family == AF_INET) {
      reinterpret_cast<sockaddr_in*>(&addr)->sin_port = 0;
    } else {
      reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port = 0;
    }
    std::string where = fmt::format("{} ({})", props_.interfaces, iface_.name);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sockaddr_len(addr)) != 0) {
      return system_error(fmt::format("tcp listen: bind {}", where), errno);
    }
    if (::listen(fd, 256) != 0) return system_error("tcp listen: listen", errno);
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return system_error("tcp listen: getsockname", errno);
    }
    HandleWire wire{};
    handshake::put_magic(wire.magic, "GWT1");
    wire.version = kVersion;
    wire.nsocks = static_cast<uint16_t>(config_.nsocks);
    wire.family = addr.ss_family;
    if (addr.ss_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
      wire.port_be = in->sin_port;
      std::memcpy(wire.addr, &in->sin_addr, 4);
    } else {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&addr);
      wire.port_be = in6->sin6_port;
      wire.scope_id = in6->sin6_scope_id;
      std::memcpy(wire.addr, &in6->sin6_addr, 16);
    }
    wire.nonce = random_u64();
    wire.rank = options_.rank;
    *handle = Handle{};
    std::memcpy(handle->bytes.data(), &wire, sizeof(wire));
    GW_LOG_DEBUG("tcp listening on {}", format_sockaddr(reinterpret_cast<sockaddr*>(&addr)));
    return std::unique_ptr<Listener>(
        std::make_unique<TcpListener>(std::move(owned), wire.nonce, config_, options_));
  }

  Result<std::unique_ptr<Connector>> connect(const Handle& handle) override {
    HandleWire wire;
    std::memcpy(&wire, handle.bytes.data(), sizeof(wire));
    GW_RETURN_IF_ERROR(handshake::check_handle("tcp", wire.magic, "GWT1", wire.version, kVersion));
    if (wire.nsocks < 1 || wire.nsocks > 16) {
      return invalid_arg("tcp connect: handle asks for {} sockets (1-16)", wire.nsocks);
    }
    sockaddr_storage addr{};
    if (wire.family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&addr);
      in->sin_family = AF_INET;
      in->sin_port = wire.port_be;
      std::memcpy(&in->sin_addr, wire.addr, 4);
    } else if (wire.family == AF_INET6) {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
      in6->sin6_family = AF_INET6;
      in6->sin6_port = wire.port_be;
      in6->sin6_scope_id = wire.scope_id;
      std::memcpy(&in6->sin6_addr, wire.addr, 16);
    } else {
      return invalid_arg("tcp connect: handle has address family {}", wire.family);
    }
    if (wire.port_be == 0) return invalid_arg("tcp connect: handle has port 0");
    return std::unique_ptr<Connector>(
        std::make_unique<TcpConnector>(wire, addr, config_, options_));
  }

 private:
  TransportOptions options_;
  TcpConfig config_;
  Interface iface_;
  Properties props_;
};

}  // namespace

Result<std::unique_ptr<Transport>> make_tcp_transport(const TransportOptions& options) {
  sys::raise_descriptor_limit();
  const config::Snapshot settings =
      options.config.empty() ? config::Snapshot::capture() : options.config;
  TcpConfig cfg;
  int64_t nsocks = settings.get_int(net::tcp_config::kSocketNsocks);
  if (nsocks < 0 || nsocks > 16) {
    return invalid_arg("GW_SOCKET_NSOCKS={} is out of range (0 = auto, 1-16)", nsocks);
  }
  int64_t threads = settings.get_int(net::tcp_config::kSocketNthreads);
  if (threads < -1 || threads > 16) {
    return invalid_arg("GW_SOCKET_NTHREADS={} is out of range (-1 = none, 0 = auto, 1-16)",
                       threads);
  }
  if (options.socket_threads < 0 || options.socket_threads > 16 || options.socket_nsocks < 0 ||
      options.socket_nsocks > 16) {
    return invalid_arg("tcp: socket_threads {} / socket_nsocks {} out of range (0-16)",
                       options.socket_threads, options.socket_nsocks);
  }
  // An explicit GW_SOCKET_NTHREADS wins; auto (0) takes the caller's policy (the Communicator
  // keeps 0, the caller's thread; the NCCL plugin chooses from the host, plugin/net_plugin.cc).
  cfg.threads =
      threads > 0 ? static_cast<int>(threads) : (threads == 0 ? options.socket_threads : 0);
  cfg.bufsize = settings.get_int(net::tcp_config::kSocketBufsize);
  if (cfg.bufsize < 0 || cfg.bufsize > (int64_t{1} << 30)) {
    return invalid_arg("GW_SOCKET_BUFSIZE={} is out of range (0-1G)", cfg.bufsize);
  }
  int64_t chunk = settings.get_int(net::tcp_config::kSocketChunk);
  if (chunk < 4096 || chunk > (int64_t{1} << 30)) {
    return invalid_arg("GW_SOCKET_CHUNK={} is out of range (4K-1G)", chunk);
  }
  cfg.chunk = static_cast<size_t>(chunk);
  GW_RETURN_IF_ERROR(handshake::check_options("tcp", options));
  GW_ASSIGN_OR_RETURN(std::vector<Interface> all, list_interfaces());
  // The interface that routes to the store's host, as NCCL follows the route to its bootstrap
  // address; without a store (or a route) the first one that is up.
  std::optional<sockaddr_storage> route;
  if (!options.route_host.empty()) {
    auto src = route_source(options.route_host);
    if (src.ok()) {
      route = *src;
    } else {
      GW_LOG_DEBUG("tcp: no route to the store's host ({}): the first interface that is up",
                   src.status().to_string());
    }
  }
  GW_ASSIGN_OR_RETURN(Interface iface,
                      select_interface(settings.get_string(net::tcp_config::kSocketIfname), all,
                                       route ? &*route : nullptr));
  // Auto: striping pays on links a single TCP stream cannot fill (>= 25 Gb/s). Elsewhere, and
  // over loopback or between ranks of one host, extra sockets only add wake-ups and cold copies
  // (docs/perf.md, "Why the defaults"). NCCL's Socket transport also defaults to one socket per
  // connection.
  int link_mbps = iface.loopback ? 0 : read_link_speed(iface.name);
  cfg.nsocks = nsocks > 0                  ? static_cast<int>(nsocks)
               : options.socket_nsocks > 0 ? options.socket_nsocks
                                           : (link_mbps >= 25000 ? 4 : 1);
  return std::unique_ptr<Transport>(std::make_unique<TcpTransport>(options, cfg, iface));
}

Backend tcp_backend() {
  Backend b;
  b.name = "tcp";
  b.summary = "TCP sockets";
  b.factory = &make_tcp_transport;
  b.auto_priority = 10;  // below shm within a host
  b.auto_within_host = true;
  b.auto_across_hosts = true;
  return b;
}

}  // namespace gw::net
