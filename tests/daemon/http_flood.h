// A flood against an HTTP listener on 127.0.0.1 (issue 33 item 5), shared by the MetricsServer's
// unit test and gradwired's integration test: idle connections that never send, slowloris senders
// that trickle header lines every 100 ms, both reopened as soon as the server drops them (as an
// attacker would), and a timed GET beside them.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace gw::testing {

// A non-blocking connect to 127.0.0.1:port (-1 when no socket could be made).
inline int dial_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  return fd;
}

struct TimedGet {
  bool answered = false;  // a whole answer came before the limit
  double ms = 0;          // from connect to the server's close
  std::string text;       // the answer, status line included
};

// GET `path` with a limit of `limit_ms` on the whole exchange; the request leaves `send_after_ms`
// after the connect (a scraper slow to write, or a loaded host's late thread).
inline TimedGet timed_get(int port, const std::string& path, int limit_ms, int send_after_ms = 0) {
  TimedGet out;
  const auto t0 = std::chrono::steady_clock::now();
  const auto elapsed_ms = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  const int fd = dial_loopback(port);
  if (fd < 0) return out;
  if (send_after_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(send_after_ms));
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nAccept: */*\r\n\r\n";
  size_t sent = 0;
  for (;;) {
    const int left = limit_ms - static_cast<int>(elapsed_ms());
    if (left <= 0) break;
    pollfd p{fd, static_cast<short>(sent < req.size() ? POLLOUT : POLLIN), 0};
    if (::poll(&p, 1, left) <= 0) continue;
    if (sent < req.size()) {
      const ssize_t n = ::send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno != EAGAIN) break;
      if (n > 0) sent += static_cast<size_t>(n);
      continue;
    }
    char buf[8192];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      out.text.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      out.answered = !out.text.empty();
      break;
    } else if (errno != EAGAIN) {
      break;
    }
  }
  out.ms = elapsed_ms();
  ::close(fd);
  return out;
}

// `idle` silent and `slow` trickling connections to 127.0.0.1:port, each reopened when dropped,
// driven by a thread of their own until destroyed.
class HttpFlood {
 public:
  HttpFlood(int port, int idle, int slow) : port_(port) {
    rlimit r{};
    if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
      r.rlim_cur = r.rlim_max;
      (void)::setrlimit(RLIMIT_NOFILE, &r);
    }
    for (int i = 0; i < idle + slow; ++i) conns_.push_back({dial_loopback(port), i >= idle, 0});
    thread_ = std::thread([this] { drive(); });
  }
  ~HttpFlood() {
    stop_ = true;
    thread_.join();
    for (const Conn& c : conns_) ::close(c.fd);
  }
  // Connections the server dropped so far (each was reopened).
  uint64_t dropped() const { return dropped_.load(); }
  // Connections open now (or being opened).
  size_t open() const { return conns_.size(); }

 private:
  struct Conn {
    int fd;
    bool slow;
    int lines;  // header lines trickled so far
  };
  void drive() {
    auto next_trickle = std::chrono::steady_clock::now();
    while (!stop_) {
      const auto now = std::chrono::steady_clock::now();
      const bool trickle = now >= next_trickle;
      if (trickle) next_trickle = now + std::chrono::milliseconds(100);
      for (Conn& c : conns_) {
        char b[512];
        const ssize_t n = c.fd < 0 ? 0 : ::recv(c.fd, b, sizeof(b), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)) {
          if (c.fd >= 0) ::close(c.fd);
          c.fd = dial_loopback(port_);
          c.lines = 0;
          dropped_.fetch_add(1);
          continue;
        }
        if (c.slow && trickle) {
          const std::string line = c.lines == 0 ? "GET /metrics HTTP/1.1\r\n"
                                                : "X-Slow-" + std::to_string(c.lines) + ": 1\r\n";
          if (::send(c.fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT) > 0) ++c.lines;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  int port_;
  std::vector<Conn> conns_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> dropped_{0};
  std::thread thread_;
};

}  // namespace gw::testing
