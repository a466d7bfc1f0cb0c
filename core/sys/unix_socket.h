// Unix-domain sockets with descriptor passing (SCM_RIGHTS): the local channel between the
// processes of one host (the shm transport's handshake; later the daemon and its clients).
//
// Contract of every call here:
// - Sockets are created O_NONBLOCK | O_CLOEXEC; received descriptors arrive O_CLOEXEC.
// - Calls that wait take a Deadline and poll() until it passes; a deadline in the past makes the
//   call one non-blocking attempt. A deadline that passes is kTimeout; a closed or reset peer is
//   kPeer; another failed system call is kSystem with its errno text. `what` names the
//   operation and the peer in those messages.
// - Descriptors sent are only lent: the caller still owns (and closes) them; the peer gets its
//   own duplicates. Descriptors received are owned by the caller as Fd.
// - Thread-compatible: no shared state; one socket is used by one thread at a time.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"

namespace gw::sys {

// The most descriptors one message carries.
inline constexpr size_t kMaxPassedFds = 16;

// A unix socket address: a path in the filesystem, or a name in Linux's abstract namespace
// (no file; it vanishes with the last socket bound to it).
class UnixAddress {
 public:
  // Fails with kInvalidArg when the name is empty or longer than sun_path allows.
  static Result<UnixAddress> abstract(std::string_view name);
  static Result<UnixAddress> path(std::string_view path);

  const sockaddr* addr() const { return reinterpret_cast<const sockaddr*>(&addr_); }
  socklen_t len() const { return len_; }
  // "@name" for abstract names, the path otherwise.
  std::string to_string() const;

 private:
  UnixAddress() = default;
  sockaddr_un addr_{};
  socklen_t len_ = 0;
};

// A connected pair (`type`: SOCK_STREAM or SOCK_SEQPACKET), both ends non-blocking.
Result<std::pair<Fd, Fd>> unix_socket_pair(int type);

// A socket bound to `address` and listening. A path that exists already is an error (kSystem,
// EADDRINUSE); the caller removes stale files it knows to be its own.
Result<Fd> listen_unix(const UnixAddress& address, int type, int backlog);

// One accept4(): the connected socket, or an empty Fd when no connection is pending. Never
// blocks.
Result<Fd> accept_unix(int listen_fd);

// One connection attempt, never blocks. A listener that is absent or full (ECONNREFUSED,
// ENOENT, EAGAIN) is kPeer, worth retrying later; other failures are kSystem. *no_listener (when
// given) says whether it was absent (no socket file, or refused: a file nothing listens on), not
// only busy, so a caller that knows the listener should be there already can stop at once.
Result<Fd> connect_unix(const UnixAddress& address, int type, bool* no_listener = nullptr);

// The peer's process, user and group ids (SO_PEERCRED) as of connect().
Result<ucred> peer_credentials(int sock);

// The peer's supplementary groups as of its connect or listen (SO_PEERGROUPS, Linux 4.13);
// nullopt where the kernel cannot say.
std::optional<std::vector<gid_t>> peer_groups(int sock);

// Sends `size` bytes and lends the descriptors in `fds` (at most kMaxPassedFds) to the peer.
// On a stream socket the descriptors travel with the first byte and the rest follows; on a
// SOCK_SEQPACKET socket the message goes as one record. Returns once every byte is sent.
Status send_with_fds(int sock, const void* data, size_t size, std::span<const int> fds,
                     Deadline deadline, std::string_view what);

// Receives into `data` (capacity `size`) one record (SOCK_SEQPACKET; longer records are cut
// to `size`) or what has arrived (stream), and appends the descriptors that came with it to
// *fds. Returns the bytes received; 0 means the peer closed the connection in order. A message
// with more descriptors than kMaxPassedFds is refused (kPeer): the extra ones were closed by the
// kernel.
Result<size_t> recv_with_fds(int sock, void* data, size_t size, std::vector<Fd>* fds,
                             Deadline deadline, std::string_view what);

}  // namespace gw::sys
