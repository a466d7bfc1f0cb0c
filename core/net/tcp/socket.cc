#include "core/net/tcp/socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/sys/fd.h"

namespace gw::net::tcp {

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
  return ok_status();
}

socklen_t sockaddr_len(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

int read_link_speed(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  int speed = 0;
  if (!(in >> speed) || speed < 0) return 0;
  return speed;
}

}  // namespace gw::net::tcp
