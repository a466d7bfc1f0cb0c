// TcpCommCore: what both directions of a tcp connection share (sockets, request table, sticky
// error, registrations, the optional I/O worker threads and the unthreaded progress loop).
// TcpSendCore (send.cc) and TcpRecvCore (recv.cc) add how bytes move. Internal to core/net/tcp/.
#pragma once

#include <poll.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/net/request.h"
#include "core/net/tcp/wire.h"
#include "core/net/transport.h"
#include "core/status.h"
#include "core/sys/fd.h"

namespace gw::net::tcp {

struct TcpRequest : Request {
  uint64_t seq = 0;
  RequestState state = RequestState::kFree;
  char* data = nullptr;
  size_t size = 0;  // send: message size; receive: capacity
  int tag = 0;
  bool header_known = false;
  size_t msg_size = 0;  // bytes of the message (known to the receiver once its header arrived)
};

// test() on a failed comm waits at most this long for workers to leave the user's buffers.
inline constexpr int64_t kQuiesceMs = 2000;

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

  TcpCommCore(std::vector<sys::Fd> socks, size_t chunk, std::string peer)
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
  // Threaded mode, mu_ held: another fd socket s's owner polls for POLLIN (-1 = none): an
  // io_uring whose completions the socket's part waits for (send.cc).
  virtual int extra_fd_locked(int s) const { return -1; }
  // Threaded mode, mu_ held, after part_io on a copy: folds what the copy learned into the real
  // request; true when other workers may now have work (the receiver learned a header).
  virtual bool publish_locked(int s, const TcpRequest& copy, TcpRequest& real) { return false; }
  // Threaded mode, socket 0's worker, once per round: reads what the peer sends back.
  virtual Status socket0_extra() { return ok_status(); }
  // Unthreaded mode, at the end of every progress(): reads what the peer sends back (an error
  // fails the comm).
  virtual Status progress_extra() { return ok_status(); }

  Status fail(Status status) {
    if (error_.ok()) error_ = std::move(status);
    return error_;
  }

  // Marks requests complete up to the slowest socket: requests finish in posting order.
  void complete();

  bool threaded() const { return nthreads_ > 0; }

  // Unthreaded mode: every socket moves what it can of the requests in order, then the finished
  // ones complete and progress_extra() runs. Returns the comm's error, recording a new one.
  Status progress();

  Status start_workers(int threads);
  // Derived destructors call this first: afterwards no thread touches the comm or user buffers.
  // Bounded: workers are woken and never block for longer than one non-blocking syscall.
  void stop_workers();

  // Unthreaded-mode post: a slot filled by `fill`, then (start) the bytes start moving (errors
  // surface in test()); without start the first test() moves them. Threaded: under mu_, then
  // the sleeping workers are woken.
  template <typename Fill>
  Result<Request*> post(Fill&& fill, bool start = true) {
    if (threaded()) return post_threaded(std::forward<Fill>(fill));
    if (!error_.ok()) return error_;
    TcpRequest* r = reqs_.post();
    if (r == nullptr) return static_cast<Request*>(nullptr);
    fill(r);
    if (start) (void)progress();  // start moving bytes now; errors surface in test()
    return static_cast<Request*>(r);
  }

  Status test_impl(Request* request, bool* done, size_t* size) {
    if (!threaded()) {
      return test_request(reqs_, error_, peer_, request, done, size, [this] { return progress(); });
    }
    return test_threaded(request, done, size);
  }

  // Threaded mode: one eventfd the workers signal when a request completes or the comm fails.
  // It is ready at once when a completion has not been collected by test() yet.
  bool wait_fds_threaded(std::vector<pollfd>* fds) const;

  std::vector<sys::Fd> socks_;
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

  Status test_threaded(Request* request, bool* done, size_t* size);
  // mu_ held: marks the comm failed (first error wins) and tells everyone.
  void fail_locked(Status status);
  // mu_ held: the workers (except `self`) asleep in poll(), as a bit mask; they count as awake
  // from now on.
  uint32_t sleepers_locked(int self);
  void wake_workers(uint32_t mask);
  // mu_ held: request completion from the sockets' positions; wakes a waiter in wait_fds.
  void complete_locked();
  // Socket s's share of one round: every message it can finish or advance without blocking.
  Status run_socket(int t, int s);
  // Worker 0 (it owns socket 0), after its sockets' round: what the peer sent back; false when
  // the comm failed (comm_core.cc says in which order a close is reported).
  bool socket0_round();
  void worker_main(int t);

  int nthreads_ = 0;  // 0: caller's thread
  std::vector<std::thread> workers_;
  std::vector<sys::Fd> wake_;  // one eventfd per worker
  sys::Fd done_fd_;            // see wait_fds_threaded

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

// The two directions of a connection over `socks` (all authenticated, socket i at index i),
// started with `threads` I/O workers (TcpCommCore::start). send.cc and recv.cc.
Result<std::unique_ptr<SendComm>> make_send_comm(std::vector<sys::Fd> socks,
                                                 const TcpConfig& config, std::string peer);
Result<std::unique_ptr<RecvComm>> make_recv_comm(std::vector<sys::Fd> socks, size_t chunk,
                                                 std::string peer, int threads);

}  // namespace gw::net::tcp
