#include "daemon/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <vector>

#include "core/log.h"
#include "core/sys/time.h"
#include "daemon/http_request.h"

namespace gw::daemon {

struct MetricsServer::Conn {
  sys::Fd fd;
  sys::Deadline deadline;
  sys::Deadline evictable;  // its grace period's end: no newcomer evicts it before
  std::string in;           // the request so far
  std::string out;          // the answer, once the request is whole
  size_t sent = 0;
  bool answering = false;
};

namespace {

std::string answer(int code, const char* reason, const std::string& type, const std::string& body,
                   bool head) {
  std::string out =
      "HTTP/1.1 " + std::to_string(code) + " " + reason + "\r\nContent-Type: " + type +
      "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (!head) out += body;
  return out;
}

// Reads what `c` has sent; once its request is whole (or bad), prepares the answer. False when
// the connection is over (closed by the client, an error).
bool on_readable(MetricsServer::Conn& c, const MetricsServer::BodyFn& body,
                 std::atomic<uint64_t>& malformed) {
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      if (c.answering) continue;  // what follows the request is ignored (Connection: close)
      c.in.append(buf, static_cast<size_t>(n));
      if (c.in.size() > HttpRequest::kMaxBytes + sizeof(buf)) break;  // judged below
      continue;
    }
    if (n == 0) return c.answering;  // a half-close after the request still gets its answer
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    return false;
  }
  if (c.answering) return true;
  const HttpRequest r = parse_http_request(c.in);
  if (r.state == HttpRequest::State::kIncomplete) return true;
  c.answering = true;
  c.in.clear();
  c.in.shrink_to_fit();
  const std::string kText = "text/plain; charset=utf-8";
  if (r.state == HttpRequest::State::kBad) {
    malformed.fetch_add(1, std::memory_order_relaxed);
    c.out = r.too_large
                ? answer(431, "Request Header Fields Too Large", kText, "too large\n", false)
                : answer(400, "Bad Request", kText, "bad request\n", false);
  } else if (r.method != "GET" && r.method != "HEAD") {
    c.out = answer(405, "Method Not Allowed", kText, "GET /metrics only\n", false);
  } else if (r.path != "/metrics") {
    c.out = answer(404, "Not Found", kText, "gradwired serves /metrics only\n", r.method == "HEAD");
  } else {
    try {  // the scrape fails, not the daemon (an allocation in the serializer, say)
      c.out =
          answer(200, "OK", "text/plain; version=0.0.4; charset=utf-8", body(), r.method == "HEAD");
    } catch (const std::exception& e) {
      c.out = answer(500, "Internal Server Error", kText, std::string(e.what()) + "\n", false);
    }
  }
  return true;
}

// Writes what the socket takes of `c`'s answer. True when all of it went.
bool write_some(MetricsServer::Conn& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return false;  // EAGAIN: later; an error: the deadline or the next poll ends it
  }
  return true;
}

std::string format_address(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
    port = ntohs(a->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
  ::inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
  port = ntohs(a->sin_port);
  return std::string(host) + ":" + std::to_string(port);
}

}  // namespace

Result<std::pair<std::string, uint16_t>> split_metrics_address(const std::string& address) {
  std::string host, port;
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    port = address;
  } else {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (!host.empty() && host.front() == '[') {
      if (host.size() < 3 || host.back() != ']') {
        return invalid_arg("--metrics {}: an IPv6 host goes in brackets: [::1]:PORT", address);
      }
      host = host.substr(1, host.size() - 2);
    } else if (host.find(':') != std::string::npos) {
      return invalid_arg("--metrics {}: an IPv6 host goes in brackets: [::1]:PORT", address);
    }
  }
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) > 65535) {
    return invalid_arg("--metrics {}: want PORT or HOST:PORT with a port of 0..65535", address);
  }
  // No host: loopback only. Scrapers on other hosts need it named (0.0.0.0 for all).
  if (host.empty()) host = "127.0.0.1";
  return std::make_pair(host, static_cast<uint16_t>(std::stoi(port)));
}

Result<std::unique_ptr<MetricsServer>> MetricsServer::start(const MetricsServerOptions& options,
                                                            BodyFn body) {
  GW_ASSIGN_OR_RETURN(auto hp, split_metrics_address(options.address));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(hp.second);
  const int gai = ::getaddrinfo(hp.first.c_str(), port.c_str(), &hints, &res);
  if (gai != 0 || res == nullptr) {
    return invalid_arg("--metrics {}: '{}' is not an address of this host: {}", options.address,
                       hp.first, ::gai_strerror(gai));
  }
  sys::Fd listener;
  std::string why;
  for (addrinfo* ai = res; ai != nullptr && listener.get() < 0; ai = ai->ai_next) {
    sys::Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (fd.get() < 0) {
      why = std::string("socket: ") + std::strerror(errno);
      continue;
    }
    const int one = 1;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      const int err = errno;
      why = err == EADDRINUSE
                ? "the port is in use by another process (another gradwired? `ss -ltnp` names "
                  "it): stop it or give --metrics another port"
            : err == EADDRNOTAVAIL
                ? "not an address of this host (`ip -br addr` lists them; 0.0.0.0 for all)"
                : std::string("bind: ") + std::strerror(err);
      continue;
    }
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      why = std::string("listen: ") + std::strerror(errno);
      continue;
    }
    listener = std::move(fd);
  }
  ::freeaddrinfo(res);
  if (listener.get() < 0) return invalid_arg("gradwired: --metrics {}: {}", options.address, why);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return system_error("getsockname (--metrics)", errno);
  }
  sys::Fd wake(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (wake.get() < 0) return system_error("eventfd (--metrics)", errno);
  return std::unique_ptr<MetricsServer>(new MetricsServer(
      options, std::move(body), std::move(listener), std::move(wake), format_address(ss)));
}

MetricsServer::MetricsServer(const MetricsServerOptions& o, BodyFn body, sys::Fd listener,
                             sys::Fd wake, std::string bound)
    : options_(o),
      body_(std::move(body)),
      listener_(std::move(listener)),
      wake_(std::move(wake)),
      bound_(std::move(bound)) {
  options_.max_connections = std::max(1, options_.max_connections);
  options_.grace_ms = std::clamp<int64_t>(options_.grace_ms, 0, options_.deadline_ms);
  thread_ = std::thread([this] { run(); });
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

MetricsServerCounts MetricsServer::counts() const {
  return {served_.load(), expired_.load(), evicted_.load(), malformed_.load()};
}

// Reads and answers as far as the socket allows; false when the connection is over (answered
// whole, closed by the client, an error).
bool MetricsServer::step(Conn& c, short events) {
  if (!c.answering && !on_readable(c, body_, malformed_)) return false;
  if (!c.answering) return true;
  if (write_some(c)) {
    served_.fetch_add(1, std::memory_order_relaxed);
    (void)::shutdown(c.fd.get(), SHUT_WR);
    return false;
  }
  return (events & (POLLERR | POLLHUP)) == 0;
}

// Closes the oldest connection past its grace period still reading its request (the oldest past it
// when every one is being answered): a slowloris sender goes before a scraper's answer, and a
// connection that has not had its grace period to speak goes not at all. False when every
// connection is in its grace period.
bool MetricsServer::evict_one(std::deque<Conn>& conns, sys::Deadline now) {
  // conns are in accept order and have the same grace: those past it are a prefix.
  const auto young =
      std::find_if(conns.begin(), conns.end(), [now](const Conn& c) { return now < c.evictable; });
  if (young == conns.begin()) return false;
  auto victim = std::find_if(conns.begin(), young, [](const Conn& c) { return !c.answering; });
  if (victim == young) victim = conns.begin();
  conns.erase(victim);
  evicted_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

// Every place taken by a connection in its grace period: no newcomer can be taken now.
bool MetricsServer::full_of_young(const std::deque<Conn>& conns, sys::Deadline now) const {
  return conns.size() >= static_cast<size_t>(options_.max_connections) &&
         now < conns.front().evictable;
}

void MetricsServer::run() {
  std::deque<Conn> conns;  // oldest first: the front is the next to evict
  sys::AcceptShedder shedder;
  std::vector<pollfd> pfds;
  while (!stop_.load()) {
    // Wake at the first deadline (conns are in accept order, all with the same lifetime).
    int timeout = -1;
    if (!conns.empty()) timeout = sys::ms_until(conns.front().deadline);
    bool accepting = !shedder.paused(sys::now_ns());
    if (!accepting) timeout = timeout < 0 ? 100 : std::min(timeout, 100);
    // Full of connections in their grace period: newcomers wait in the kernel's queue until the
    // oldest's grace ends.
    if (accepting && full_of_young(conns, sys::Clock::now())) {
      accepting = false;
      const int grace_left = std::max(1, sys::ms_until(conns.front().evictable));
      timeout = timeout < 0 ? grace_left : std::min(timeout, grace_left);
    }
    pfds.clear();
    pfds.push_back({wake_.get(), POLLIN, 0});
    pfds.push_back({accepting ? listener_.get() : -1, POLLIN, 0});
    for (const Conn& c : conns) {
      pfds.push_back({c.fd.get(), static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    }
    if (::poll(pfds.data(), pfds.size(), timeout) < 0 && errno != EINTR) {
      GW_LOG_ERROR("gradwired: metrics endpoint: poll: {}", std::strerror(errno));
      return;
    }
    if (stop_.load()) break;
    // Connections first (their indices match pfds), then newcomers.
    std::vector<bool> done(conns.size(), false);
    for (size_t i = 0; i < conns.size(); ++i) {
      const short ev = pfds[i + 2].revents;
      if (ev != 0) done[i] = !step(conns[i], ev);
    }
    // Every connection's deadline, whether or not it had an event this round.
    const sys::Deadline now = sys::Clock::now();
    std::deque<Conn> kept;
    for (size_t i = 0; i < conns.size(); ++i) {
      if (done[i]) continue;
      if (now >= conns[i].deadline) {
        expired_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      kept.push_back(std::move(conns[i]));
    }
    conns.swap(kept);
    if (accepting && (pfds[1].revents & POLLIN)) {
      // A bounded batch per round, so the connections above are read between batches.
      for (int k = 0; k < 2 * options_.max_connections; ++k) {
        // Every place in its grace period (this batch's newcomers): the rest wait in the queue.
        if (full_of_young(conns, sys::Clock::now())) break;
        const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EMFILE || errno == ENFILE) {
            // One of ours makes room for the newcomer.
            if (evict_one(conns, sys::Clock::now())) continue;
            shedder.shed(listener_.get(), sys::now_ns());
          }
          break;
        }
        const sys::Deadline accepted = sys::Clock::now();
        if (conns.size() >= static_cast<size_t>(options_.max_connections)) {
          (void)evict_one(conns, accepted);  // there is one: checked before the accept
        }
        Conn c;
        c.fd = sys::Fd(fd);
        c.deadline = accepted + std::chrono::milliseconds(options_.deadline_ms);
        c.evictable = accepted + std::chrono::milliseconds(options_.grace_ms);
        // A scraper's request is usually there with its connection: answered now, before a
        // flood of newcomers can push it out.
        if (step(c, POLLIN)) conns.push_back(std::move(c));
      }
    }
  }
}

}  // namespace gw::daemon
