#include "core/net/tcp/comm_core.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <system_error>

namespace gw::net::tcp {
namespace {

using sys::Fd;

// Worker threads wait in poll() at most this long, so a stop or failure they were not woken for
// is still seen promptly.
constexpr int kWorkerPollMs = 50;

void signal_fd(int fd) {
  uint64_t one = 1;
  (void)!write(fd, &one, sizeof(one));  // EAGAIN only when the counter is saturated: still ready
}

void drain_fd(int fd) {
  uint64_t count = 0;
  (void)!read(fd, &count, sizeof(count));
}
}  // namespace

void TcpCommCore::complete() {
  uint64_t done = UINT64_MAX;
  for (const SockPos& p : pos_) done = std::min(done, p.seq);
  reqs_.complete_through(done);
}

Status TcpCommCore::progress() {
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
  Status extra = progress_extra();
  return extra.ok() ? extra : fail(std::move(extra));
}

Status TcpCommCore::start_workers(int threads) {
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

void TcpCommCore::stop_workers() {
  if (workers_.empty()) return;
  halt_.store(true);
  for (const Fd& w : wake_) signal_fd(w.get());
  for (std::thread& w : workers_) w.join();
  workers_.clear();
}

Status TcpCommCore::test_threaded(Request* request, bool* done, size_t* size) {
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

bool TcpCommCore::wait_fds_threaded(std::vector<pollfd>* fds) const {
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

void TcpCommCore::fail_locked(Status status) {
  (void)fail(std::move(status));
  halt_.store(true);
  if (done_armed_) {
    done_armed_ = false;
    signal_fd(done_fd_.get());
  }
}

uint32_t TcpCommCore::sleepers_locked(int self) {
  uint32_t mask = 0;
  for (int t = 0; t < nthreads_; ++t) {
    if (t != self && sleeping_[t] != 0) {
      sleeping_[t] = 0;
      mask |= 1u << t;
    }
  }
  return mask;
}

void TcpCommCore::wake_workers(uint32_t mask) {
  for (int t = 0; mask != 0; ++t, mask >>= 1) {
    if ((mask & 1u) != 0) signal_fd(wake_[t].get());
  }
}

void TcpCommCore::complete_locked() {
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

Status TcpCommCore::run_socket(int t, int s) {
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
bool TcpCommCore::socket0_round() {
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

void TcpCommCore::worker_main(int t) {
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
        const int extra = extra_fd_locked(s);
        if (extra >= 0) fds.push_back(pollfd{extra, POLLIN, 0});
      }
      sleeping_[t] = 1;
    }
    wake_workers(wake);
    if (::poll(fds.data(), fds.size(), kWorkerPollMs) > 0 && (fds[0].revents & POLLIN) != 0) {
      drain_fd(wake_[t].get());
    }
  }
}

}  // namespace gw::net::tcp
