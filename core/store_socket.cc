#include "core/store_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>

namespace gw::store_socket {

using sys::Fd;
using sys::ms_until;
using sys::set_nonblocking;

std::string format_addr(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

Status parse_addr(const std::string& text, bool allow_zero, std::string* host, int* port) {
  std::string h;
  std::string p;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return invalid_arg("'{}' is not host:port (IPv6 as [addr]:port)", text);
    }
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos) return invalid_arg("'{}' is not host:port (no ':')", text);
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
    if (h.find(':') != std::string::npos) {
      return invalid_arg("'{}' is not host:port (write IPv6 addresses as [addr]:port)", text);
    }
  }
  if (h.empty()) return invalid_arg("'{}' has an empty host", text);
  int v = -1;
  auto [ptr, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (p.empty() || ec != std::errc() || ptr != p.data() + p.size() || v < (allow_zero ? 0 : 1) ||
      v > 65535) {
    return invalid_arg("'{}' has a bad port '{}' (want {}..65535)", text, p, allow_zero ? 0 : 1);
  }
  *host = h;
  *port = v;
  return ok_status();
}

namespace {

Result<addrinfo*> resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  std::string service = std::to_string(port);
  const char* node = host.empty() ? nullptr : host.c_str();
  int rc = getaddrinfo(node, service.c_str(), &hints, &res);
  if (rc != 0) {
    return peer_error("cannot resolve '{}': {}", host,
                      rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
  }
  return res;
}

}  // namespace

Result<Fd> listen_tcp(const std::string& host, int port, int* bound_port, int* failed_errno) {
  int scratch = 0;
  int& err_out = failed_errno ? *failed_errno : scratch;
  err_out = 0;
  if (port < 0 || port > 65535) return invalid_arg("listen port {} outside 0..65535", port);
  std::string h = host == "0.0.0.0" ? "" : host;
  GW_ASSIGN_OR_RETURN(addrinfo * res, resolve(h, port, true));
  Status last = system_error(fmt::format("listen on {}", format_addr(host, port)), EADDRNOTAVAIL);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    // The wildcard resolves to both families; prefer IPv4 for it so "0.0.0.0" means what it says.
    if (h.empty() && ai->ai_family != AF_INET) continue;
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      err_out = errno;
      last = system_error("socket", errno);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      err_out = errno;
      last = system_error(fmt::format("bind {}", format_addr(host, port)), errno);
      continue;
    }
    if (::listen(fd.get(), 1024) != 0) {
      err_out = errno;
      last = system_error(fmt::format("listen {}", format_addr(host, port)), errno);
      continue;
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
      last = system_error("getsockname", errno);
      continue;
    }
    *bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                           : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    Status s = set_nonblocking(fd.get());
    if (!s.ok()) {
      freeaddrinfo(res);
      return s;
    }
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

namespace {

bool connected_to_itself(int fd) {
  sockaddr_storage local{}, peer{};
  socklen_t llen = sizeof(local), plen = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &llen) != 0) return false;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &plen) != 0) return false;
  return llen == plen && std::memcmp(&local, &peer, llen) == 0;
}

}  // namespace

Result<Fd> connect_tcp(const std::string& host, int port, Deadline deadline) {
  std::string where = format_addr(host, port);
  GW_ASSIGN_OR_RETURN(addrinfo * res, resolve(host, port, false));
  Status last = peer_error("connect to {}: no address", where);
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) {
      last = system_error("socket", errno);
      continue;
    }
    int rc = ::connect(fd.get(), ai->ai_addr, ai->ai_addrlen);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int n;
      do {
        n = ::poll(&p, 1, ms_until(deadline));
      } while (n < 0 && errno == EINTR);
      if (n == 0) {
        last = timeout_error("connect to {}: no answer before the deadline", where);
        continue;
      }
      socklen_t len = sizeof(err);
      if (n < 0) {
        err = errno;
      } else if (getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) {
        err = errno;
      }
    }
    if (err != 0) {
      last = peer_error("connect to {}: {}", where, strerror(err));
      continue;
    }
    if (connected_to_itself(fd.get())) {
      // TCP simultaneous open: with no listener on a local port inside the ephemeral range, a
      // retrying client can be given that very port as its own and connect to itself, which
      // also keeps the real server from binding it. Treat it as "nobody listening yet".
      last = peer_error("connect to {}: no listener yet (the socket connected to itself)", where);
      continue;
    }
    int one = 1;
    setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  return last;
}

namespace {

// Waits for `events` on fd; false with *status set when the deadline passes or poll fails.
bool wait_fd(int fd, short events, Deadline deadline, std::string_view what, Status* status) {
  for (;;) {
    pollfd p{fd, events, 0};
    int n = ::poll(&p, 1, ms_until(deadline));
    if (n > 0) return true;  // errors/hangups surface in the following send/recv
    if (n == 0) {
      *status = timeout_error("{}: deadline passed", what);
      return false;
    }
    if (errno != EINTR) {
      *status = system_error(fmt::format("{}: poll", what), errno);
      return false;
    }
  }
}

}  // namespace

Status send_all(int fd, const void* data, size_t n, Deadline deadline, std::string_view what) {
  const auto* p = static_cast<const uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::send(fd, p + done, n - done, MSG_NOSIGNAL);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      Status s;
      if (!wait_fd(fd, POLLOUT, deadline, what, &s)) return s;
      continue;
    }
    int err = k < 0 ? errno : EPIPE;
    if (err == EPIPE || err == ECONNRESET) return peer_error("{}: connection closed", what);
    return system_error(fmt::format("{}: send", what), err);
  }
  return ok_status();
}

Status recv_all(int fd, void* data, size_t n, Deadline deadline, std::string_view what) {
  auto* p = static_cast<uint8_t*>(data);
  size_t done = 0;
  while (done < n) {
    ssize_t k = ::recv(fd, p + done, n - done, 0);
    if (k > 0) {
      done += static_cast<size_t>(k);
      continue;
    }
    if (k == 0) return peer_error("{}: connection closed by the peer", what);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      Status s;
      if (!wait_fd(fd, POLLIN, deadline, what, &s)) return s;
      continue;
    }
    if (errno == ECONNRESET) return peer_error("{}: connection reset by the peer", what);
    return system_error(fmt::format("{}: recv", what), errno);
  }
  return ok_status();
}

}  // namespace gw::store_socket
