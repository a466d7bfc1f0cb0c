#include "core/sys/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace gw::sys {
namespace {

constexpr size_t kSunPathMax = sizeof(sockaddr_un::sun_path);

bool is_peer_errno(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ECONNREFUSED;
}

std::string errno_text(int err) {
  char buf[128];
  return strerror_r(err, buf, sizeof(buf));
}

Status io_error(std::string_view what, std::string_view call, int err) {
  if (is_peer_errno(err)) return peer_error("{}: {}", what, errno_text(err));
  return system_error(fmt::format("{}: {}", what, call), err);
}

// Waits until `events` is ready on sock or the deadline passes (kTimeout).
Status wait_ready(int sock, short events, Deadline deadline, std::string_view what) {
  for (;;) {
    pollfd p{sock, events, 0};
    int n = ::poll(&p, 1, ms_until(deadline));
    if (n > 0) return ok_status();  // errors and hangups surface in the next sendmsg/recvmsg
    if (n == 0) return timeout_error("{}: deadline passed", what);
    if (errno != EINTR) return system_error(fmt::format("{}: poll", what), errno);
  }
}

}  // namespace

Result<UnixAddress> UnixAddress::abstract(std::string_view name) {
  if (name.empty() || name.size() > kSunPathMax - 1) {
    return invalid_arg("abstract unix socket name '{}' must have 1..{} bytes", name,
                       kSunPathMax - 1);
  }
  UnixAddress a;
  a.addr_.sun_family = AF_UNIX;
  a.addr_.sun_path[0] = '\0';
  std::memcpy(a.addr_.sun_path + 1, name.data(), name.size());
  a.len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

Result<UnixAddress> UnixAddress::path(std::string_view path) {
  if (path.empty() || path.size() > kSunPathMax - 1 || path.find('\0') != std::string_view::npos) {
    return invalid_arg("unix socket path '{}' must have 1..{} bytes and no NUL", path,
                       kSunPathMax - 1);
  }
  UnixAddress a;
  a.addr_.sun_family = AF_UNIX;
  std::memcpy(a.addr_.sun_path, path.data(), path.size());
  a.len_ = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  return a;
}

std::string UnixAddress::to_string() const {
  const size_t n = std::min<size_t>(len_ - offsetof(sockaddr_un, sun_path), kSunPathMax);
  if (n == 0) return std::string();
  if (addr_.sun_path[0] == '\0') {
    std::string out = "@";
    out.append(addr_.sun_path + 1, n - 1);
    return out;
  }
  return std::string(addr_.sun_path, strnlen(addr_.sun_path, n));
}

Result<std::pair<Fd, Fd>> unix_socket_pair(int type) {
  int sv[2];
  if (::socketpair(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0) {
    return system_error("socketpair(AF_UNIX)", errno);
  }
  return std::pair<Fd, Fd>(Fd(sv[0]), Fd(sv[1]));
}

Result<Fd> listen_unix(const UnixAddress& address, int type, int backlog) {
  Fd fd(::socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return system_error("unix listen: socket", errno);
  if (::bind(fd.get(), address.addr(), address.len()) != 0) {
    return system_error(fmt::format("unix listen: bind {}", address.to_string()), errno);
  }
  if (::listen(fd.get(), backlog) != 0) {
    return system_error(fmt::format("unix listen: listen {}", address.to_string()), errno);
  }
  return fd;
}

Result<Fd> accept_unix(int listen_fd) {
  for (;;) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return Fd(fd);
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Fd();
    return system_error("unix accept", errno);
  }
}

Result<Fd> connect_unix(const UnixAddress& address, int type, bool* no_listener) {
  if (no_listener != nullptr) *no_listener = false;
  Fd fd(::socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return system_error("unix connect: socket", errno);
  if (::connect(fd.get(), address.addr(), address.len()) != 0) {
    int err = errno;
    if (no_listener != nullptr) *no_listener = err == ECONNREFUSED || err == ENOENT;
    if (err == ECONNREFUSED || err == EAGAIN || err == ENOENT || err == EINTR) {
      return peer_error("connect to {}: {}", address.to_string(), errno_text(err));
    }
    return system_error(fmt::format("unix connect to {}", address.to_string()), err);
  }
  return fd;
}

Result<ucred> peer_credentials(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return system_error("getsockopt(SO_PEERCRED)", errno);
  }
  return cred;
}

std::optional<std::vector<gid_t>> peer_groups(int sock) {
  std::vector<gid_t> groups(64);
  for (int tries = 0; tries < 4; ++tries) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) break;
    groups.resize(len / sizeof(gid_t) + 1);
  }
  return std::nullopt;
}

Status send_with_fds(int sock, const void* data, size_t size, std::span<const int> fds,
                     Deadline deadline, std::string_view what) {
  if (fds.size() > kMaxPassedFds) {
    return invalid_arg("{}: {} descriptors in one message (at most {})", what, fds.size(),
                       kMaxPassedFds);
  }
  if (!fds.empty() && size == 0) {
    return invalid_arg("{}: descriptors need at least one byte to travel with", what);
  }
  const auto* bytes = static_cast<const char*>(data);
  size_t done = 0;
  bool fds_sent = fds.empty();
  while (done < size || !fds_sent) {
    iovec iov{const_cast<char*>(bytes + done), size - done};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
    if (!fds_sent) {
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* cm = CMSG_FIRSTHDR(&msg);
      cm->cmsg_level = SOL_SOCKET;
      cm->cmsg_type = SCM_RIGHTS;
      cm->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(cm), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) {
      done += static_cast<size_t>(n);
      fds_sent = true;  // a sendmsg that sent anything delivered its control message
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return io_error(what, "sendmsg", errno);
    GW_RETURN_IF_ERROR(wait_ready(sock, POLLOUT, deadline, what));
  }
  return ok_status();
}

Result<size_t> recv_with_fds(int sock, void* data, size_t size, std::vector<Fd>* fds,
                             Deadline deadline, std::string_view what) {
  for (;;) {
    iovec iov{data, size};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxPassedFds)] = {};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return io_error(what, "recvmsg", errno);
      GW_RETURN_IF_ERROR(wait_ready(sock, POLLIN, deadline, what));
      continue;
    }
    // Take ownership first, so that every descriptor that arrived is closed on every error path.
    std::vector<Fd> got;
    for (cmsghdr* cm = CMSG_FIRSTHDR(&msg); cm != nullptr; cm = CMSG_NXTHDR(&msg, cm)) {
      if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
        got.emplace_back(fd);
      }
    }
    if ((msg.msg_flags & MSG_CTRUNC) != 0) {
      return peer_error("{}: the peer sent more than {} descriptors", what, kMaxPassedFds);
    }
    for (Fd& fd : got) fds->push_back(std::move(fd));
    return static_cast<size_t>(n);
  }
}

}  // namespace gw::sys
