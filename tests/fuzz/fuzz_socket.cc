#include "tests/fuzz/fuzz_socket.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

// check() with `what` prefixed by the target's name.
void check_that(bool ok, const char* who, const char* what) {
  if (ok) return;
  const std::string msg = std::string(who) + ": " + what;
  check(false, msg.c_str());
}

}  // namespace

void close_with_reset(int fd) {
  const linger off{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));
}

sys::Fd dial_loopback(uint16_t port_be, const char* who) {
  sys::Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  close_with_reset(fd.get());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = port_be;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a));
  check_that(rc == 0 || errno == EINPROGRESS, who, "dial");
  pollfd p{fd.get(), POLLOUT, 0};
  check_that(::poll(&p, 1, 2000) == 1, who, "dial completes");
  return fd;
}

void send_some(int fd, const uint8_t* p, size_t n, sys::Deadline until) {
  size_t off = 0;
  while (off < n && !sys::expired(until)) {
    ssize_t k = send(fd, p + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      off += static_cast<size_t>(k);
    } else if (k < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd pf{fd, POLLOUT, 0};
      ::poll(&pf, 1, 1);
    } else {
      return;
    }
  }
}

std::unique_ptr<net::Listener> listen_or_abort(net::Transport& t, net::Handle* h, const char* who) {
  auto l = t.listen(h);
  if (!l.ok()) std::fprintf(stderr, "%s: listen: %s\n", who, l.status().to_string().c_str());
  check_that(l.ok(), who, "listen");
  return std::move(*l);
}

sys::Fd fake_listener(sockaddr_in* bound, const char* who) {
  sys::Fd lfd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  *bound = sockaddr_in{};
  bound->sin_family = AF_INET;
  bound->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check_that(bind(lfd.get(), reinterpret_cast<sockaddr*>(bound), sizeof(*bound)) == 0, who, "bind");
  check_that(listen(lfd.get(), 4) == 0, who, "listen");
  socklen_t len = sizeof(*bound);
  getsockname(lfd.get(), reinterpret_cast<sockaddr*>(bound), &len);
  return lfd;
}

void answer_connector(net::Connector& connector, int listener_fd, size_t hello_size,
                      const std::vector<uint8_t>& reply, int64_t reply_ms,
                      const std::string& refused_counter, const char* who) {
  sys::Fd peer;
  bool answered = false;
  std::vector<uint8_t> hello(hello_size);
  const sys::Deadline until = sys::deadline_after_ms(1000);  // the connector's own is 200 ms
  while (!sys::expired(until)) {
    auto r = connector.poll();
    if (!r.ok()) {  // refused, as it must be
      if (answered) ++counter(refused_counter);
      return;
    }
    check_that(*r == nullptr, who, "connected to a listener that proved nothing");
    if (!peer.valid()) {
      peer.reset(accept4(listener_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (peer.valid()) close_with_reset(peer.get());
    }
    if (peer.valid() && !answered) {
      if (recv(peer.get(), hello.data(), hello.size(), MSG_PEEK | MSG_DONTWAIT) ==
          static_cast<ssize_t>(hello.size())) {
        (void)!recv(peer.get(), hello.data(), hello.size(), MSG_DONTWAIT);
        send_some(peer.get(), reply.data(), reply.size(), sys::deadline_after_ms(reply_ms));
        ::shutdown(peer.get(), SHUT_WR);
        answered = true;
      }
    }
  }
  check_that(false, who, "the connector outlived its deadline");
}

}  // namespace gw::fuzz
