#include "kv/io.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/net/socket_util.h"

namespace gw::kv {

namespace {

constexpr int kPollSliceMs = 50;  // how often a read checks its stop flag

void tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

Status split_addr(const std::string& addr, std::string* host, std::string* port) {
  const size_t colon = addr.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == addr.size()) {
    return invalid_arg("kv server address '{}' is not host:port", addr);
  }
  *host = addr.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = addr.substr(colon + 1);
  return ok_status();
}

}  // namespace

Result<sys::Fd> listen_any(int* port) {
  sys::Fd fd(socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  bool v6 = fd.valid();
  if (!v6) fd.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) return system_error("kv server socket()", errno);
  int one = 1, zero = 0;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_storage ss{};
  socklen_t len;
  if (v6) {
    setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    a->sin6_family = AF_INET6;
    a->sin6_addr = in6addr_any;
    len = sizeof(sockaddr_in6);
  } else {
    auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_ANY);
    len = sizeof(sockaddr_in);
  }
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return system_error("kv server bind()", errno);
  }
  if (listen(fd.get(), 256) != 0) return system_error("kv server listen()", errno);
  len = sizeof(ss);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return system_error("kv server getsockname()", errno);
  }
  *port = v6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
             : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

std::string advertised_address(const std::string& route_host, int port) {
  if (!route_host.empty() && route_host != "localhost" && route_host.rfind("127.", 0) != 0 &&
      route_host != "::1") {
    auto src = net::route_source(route_host);
    if (src.ok()) {
      char buf[INET6_ADDRSTRLEN] = {};
      if (src->ss_family == AF_INET) {
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&*src)->sin_addr, buf, sizeof(buf));
        return fmt::format("{}:{}", buf, port);
      }
      if (src->ss_family == AF_INET6) {
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&*src)->sin6_addr, buf, sizeof(buf));
        return fmt::format("[{}]:{}", buf, port);
      }
    }
  }
  return fmt::format("127.0.0.1:{}", port);
}

Result<sys::Fd> connect_to(const std::string& addr, sys::Deadline deadline) {
  std::string host, port;
  GW_RETURN_IF_ERROR(split_addr(addr, &host, &port));
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0 || res == nullptr) {
    return invalid_arg("kv server address '{}': {}", addr, gai_strerror(rc));
  }
  sockaddr_storage ss{};
  const socklen_t len = res->ai_addrlen;
  std::memcpy(&ss, res->ai_addr, len);
  const int family = res->ai_family;
  freeaddrinfo(res);
  int last_err = 0;
  do {
    sys::Fd fd(socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return system_error("kv socket()", errno);
    if (connect(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0 && errno != EINPROGRESS) {
      last_err = errno;
    } else {
      pollfd p{fd.get(), POLLOUT, 0};
      const int n = poll(&p, 1, sys::ms_until(deadline));
      int err = 0;
      socklen_t el = sizeof(err);
      if (n == 1 && getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0) {
        tune(fd.get());
        return fd;
      }
      last_err = n == 0 ? ETIMEDOUT : (err != 0 ? err : errno);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (!sys::expired(deadline));
  return timeout_error("kv: cannot connect to server {}: {}", addr, std::strerror(last_err));
}

Result<sys::Fd> accept_one(int listen_fd, int wait_ms) {
  pollfd p{listen_fd, POLLIN, 0};
  if (poll(&p, 1, wait_ms) <= 0) return sys::Fd();
  sys::Fd fd(accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (!fd.valid()) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return sys::Fd();
    if (errno == EMFILE || errno == ENFILE) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      return sys::Fd();
    }
    return system_error("kv server accept()", errno);
  }
  tune(fd.get());
  return fd;
}

Status write_frame(int fd, const Header& h, const void* payload, sys::Deadline deadline) {
  uint8_t head[kHeaderBytes];
  encode_header(h, head);
  iovec iov[2] = {{head, kHeaderBytes}, {const_cast<void*>(payload), payload ? h.payload : 0u}};
  int idx = 0;
  while (idx < 2) {
    if (iov[idx].iov_len == 0) {
      ++idx;
      continue;
    }
    msghdr m{};
    m.msg_iov = iov + idx;
    m.msg_iovlen = 2 - idx;
    const ssize_t n = sendmsg(fd, &m, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, sys::ms_until(deadline)) == 0 && sys::expired(deadline)) {
          return timeout_error("kv: sending a {} frame: deadline passed", type_name(h.type));
        }
        continue;
      }
      return peer_error("kv: sending a {} frame: {}", type_name(h.type), std::strerror(errno));
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0 && idx < 2) {
      const size_t take = std::min(left, iov[idx].iov_len);
      iov[idx].iov_base = static_cast<uint8_t*>(iov[idx].iov_base) + take;
      iov[idx].iov_len -= take;
      left -= take;
      if (iov[idx].iov_len == 0) ++idx;
    }
  }
  return ok_status();
}

Status read_exact(int fd, void* buf, size_t n, sys::Deadline deadline,
                  const std::atomic<bool>* stop, bool eof_ok, int stop_fd) {
  auto* p = static_cast<uint8_t*>(buf);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      if (eof_ok && got == 0) return aborted_error("kv: connection closed");
      return peer_error("kv: connection closed by the peer");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return peer_error("kv: connection failed: {}", std::strerror(errno));
    }
    if (stop != nullptr && stop->load(std::memory_order_acquire)) {
      return aborted_error("kv: stopped");
    }
    if (sys::expired(deadline)) return timeout_error("kv: reading a frame: deadline passed");
    pollfd pf[2] = {{fd, POLLIN, 0}, {stop_fd, POLLIN, 0}};
    if (stop_fd < 0) {
      // A stop flag is looked at every slice; without one, only data or the deadline end it.
      poll(pf, 1,
           stop != nullptr ? std::min(kPollSliceMs, sys::ms_until(deadline))
                           : sys::ms_until(deadline));
      continue;
    }
    if (poll(pf, 2, sys::ms_until(deadline)) > 0 && (pf[1].revents & POLLIN) != 0) {
      return aborted_error("kv: stopped");
    }
  }
  return ok_status();
}

Status read_header(int fd, Header* h, sys::Deadline deadline, const std::atomic<bool>* stop,
                   int stop_fd) {
  uint8_t head[kHeaderBytes];
  GW_RETURN_IF_ERROR(read_exact(fd, head, kHeaderBytes, deadline, stop, true, stop_fd));
  return decode_header(head, h);
}

}  // namespace gw::kv
