#include "core/net/tcp/socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/sys/fd.h"

namespace gw::net::tcp {

namespace {
#ifdef SO_PREFER_BUSY_POLL
constexpr int kSoPreferBusyPoll = SO_PREFER_BUSY_POLL;
#else
constexpr int kSoPreferBusyPoll = 69;  // <asm-generic/socket.h>, Linux 5.11
#endif
}  // namespace

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

Status set_busy_poll(int fd, int us) {
  if (setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &us, sizeof(us)) != 0) {
    return system_error(fmt::format("setsockopt(SO_BUSY_POLL, {} us)", us), errno);
  }
  // Prefer busy polling over the queue's interrupts while this socket polls (kernel 5.11+;
  // older kernels answer ENOPROTOOPT, which leaves plain busy polling).
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, kSoPreferBusyPoll, &one, sizeof(one)) != 0 &&
      errno != ENOPROTOOPT) {
    return system_error("setsockopt(SO_PREFER_BUSY_POLL)", errno);
  }
  return ok_status();
}

Status probe_busy_poll(int us) {
  sys::Fd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return system_error("socket", errno);
  return set_busy_poll(fd.get(), us);
}

Status configure_socket(int fd, int64_t bufsize, int busy_poll_us) {
  GW_RETURN_IF_ERROR(sys::set_nonblocking(fd));
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
  if (busy_poll_us > 0) GW_RETURN_IF_ERROR(set_busy_poll(fd, busy_poll_us));
  return ok_status();
}

socklen_t sockaddr_len(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

std::string read_busy_read() {
  std::ifstream in("/proc/sys/net/core/busy_read");
  std::string v;
  return in >> v ? v : "?";
}

int read_link_speed(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  int speed = 0;
  if (!(in >> speed) || speed < 0) return 0;
  return speed;
}

}  // namespace gw::net::tcp
