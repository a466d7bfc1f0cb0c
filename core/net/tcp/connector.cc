// The tcp connector: connects every socket of a connection (retrying what may pass; a listener
// that refuses for kListenerGoneMs is gone) and runs the connector's half of the handshake
// (docs/wire-tcp.md).
#include "core/net/tcp/connector.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "core/net/handshake.h"
#include "core/net/socket_util.h"
#include "core/net/tcp/comm_core.h"
#include "core/net/tcp/socket.h"
#include "core/sys/time.h"

namespace gw::net::tcp {
namespace {

using handshake::kAccept;
using handshake::kRefuse;
using sys::Fd;
using sys::now_ns;

class TcpConnector final : public Connector {
 public:
  TcpConnector(const HandleWire& handle, sockaddr_storage addr, TcpConfig config,
               const TransportOptions& options)
      : addr_(addr),
        config_(config),
        deadline_(sys::deadline_after_ms(options.timeout_ms)),
        timeout_ms_(options.timeout_ms),
        peer_(handshake::peer_label(handle.rank, "tcp",
                                    format_sockaddr(reinterpret_cast<const sockaddr*>(&addr)))) {
    config_.nsocks = handle.nsocks;
    socks_.resize(handle.nsocks);
    hello_ = Hello{};
    handshake::put_magic(hello_.magic, "GWH2");
    hello_.nsocks = handle.nsocks;
    hello_.nonce = handle.nonce;
    hello_.conn_id = random_u64();
    hello_.rank = options.rank;
    hello_.listener_rank = handle.rank;
    token_ = options.job_token;
  }

  Result<std::unique_ptr<SendComm>> poll() override {
    if (!error_.ok()) return error_;
    if (returned_) return invalid_arg("poll: the connection to {} was already returned", peer_);
    bool all_done = true;
    for (size_t i = 0; i < socks_.size(); ++i) {
      Status s = advance(socks_[i], static_cast<uint16_t>(i));
      if (!s.ok()) {
        error_ = s;
        return error_;
      }
      all_done &= socks_[i].phase == Phase::kDone;
    }
    if (all_done) {
      std::vector<Fd> fds;
      for (Sock& s : socks_) fds.push_back(std::move(s.fd));
      returned_ = true;
      Result<std::unique_ptr<SendComm>> comm = make_send_comm(std::move(fds), config_, peer_);
      if (!comm.ok()) error_ = comm.status();
      return comm;
    }
    if (sys::expired(deadline_)) {
      error_ = handshake::connect_timeout_error(peer_, timeout_ms_, last_problem_);
      socks_.clear();
      return error_;
    }
    return std::unique_ptr<SendComm>();
  }

 private:
  enum class Phase { kIdle, kConnecting, kHello, kChallenge, kProof, kAck, kDone };
  struct Sock {
    Fd fd;
    Phase phase = Phase::kIdle;
    size_t sent = 0;  // bytes of the current phase's message moved
    int64_t retry_at_ns = 0;
    int64_t refused_since_ns = 0;  // the first of the refusals in a row, 0: none
    Hello hello{};                 // this socket's hello (its own index and challenge)
    Challenge challenge{};
    Proof proof{};
  };

  // Moves handshake bytes: true when all are done, false for "not yet".
  Result<bool> move(Sock& s, void* buf, size_t size, bool sending) {
    while (s.sent < size) {
      char* p = static_cast<char*>(buf) + s.sent;
      ssize_t n = sending ? send(s.fd.get(), p, size - s.sent, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : recv(s.fd.get(), p, size - s.sent, MSG_DONTWAIT);
      if (n == 0 && !sending) return handshake::closed_by_listener_error(peer_);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
        return socket_error("handshake with", peer_, errno);
      }
      s.sent += static_cast<size_t>(n);
      // A refusal is one byte followed by close: report it as soon as it is seen.
      if (!sending && s.phase == Phase::kChallenge && s.sent >= 1 &&
          s.challenge.answer == kRefuse) {
        return handshake::refused_error(peer_);
      }
    }
    s.sent = 0;
    return true;
  }

  // Another attempt later; but a refusal that lasts kListenerGoneMs is an answer: the handle's
  // listener listened before its handle was published, so it is gone (handshake.h).
  Status retry_later(Sock& s, int err) {
    char buf[128];
    last_problem_ = fmt::format("last attempt: {}", strerror_r(err, buf, sizeof(buf)));
    s.fd.reset();
    s.phase = Phase::kIdle;
    const int64_t now = now_ns();
    s.retry_at_ns = now + kRetryNs;
    if (err != ECONNREFUSED) {
      s.refused_since_ns = 0;
    } else if (s.refused_since_ns == 0) {
      s.refused_since_ns = now;
    } else if (now - s.refused_since_ns >= handshake::kListenerGoneMs * 1000000) {
      return handshake::listener_gone_error(peer_, (now - s.refused_since_ns) / 1000000);
    }
    return ok_status();
  }

  Status advance(Sock& s, uint16_t index) {
    while (true) {
      switch (s.phase) {
        case Phase::kIdle: {
          if (now_ns() < s.retry_at_ns) return ok_status();
          int fd = socket(addr_.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
          if (fd < 0) return system_error("socket", errno);
          s.fd.reset(fd);
          GW_RETURN_IF_ERROR(configure_socket(fd, config_.bufsize, config_.busy_poll_us));
          if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr_), sockaddr_len(addr_)) == 0) {
            s.phase = Phase::kHello;
          } else if (errno == EINPROGRESS || errno == EINTR) {
            s.phase = Phase::kConnecting;
          } else if (is_peer_errno(errno) || errno == EAGAIN) {
            return retry_later(s, errno);
          } else {
            return socket_error("connect to", peer_, errno);
          }
          break;
        }
        case Phase::kConnecting: {
          pollfd pfd{s.fd.get(), POLLOUT, 0};
          if (::poll(&pfd, 1, 0) == 0) return ok_status();
          int err = 0;
          socklen_t len = sizeof(err);
          if (getsockopt(s.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
          if (err == 0) {
            s.phase = Phase::kHello;
          } else if (is_peer_errno(err)) {
            return retry_later(s, err);
          } else {
            return socket_error("connect to", peer_, err);
          }
          break;
        }
        case Phase::kHello: {
          if (s.sent == 0) {
            s.hello = hello_;
            s.hello.sock_index = index;
            GW_RETURN_IF_ERROR(handshake::fresh_nonce(&s.hello.challenge));
          }
          GW_ASSIGN_OR_RETURN(bool done, move(s, &s.hello, sizeof(Hello), true));
          if (!done) return ok_status();
          s.phase = Phase::kChallenge;
          break;
        }
        case Phase::kChallenge: {
          GW_ASSIGN_OR_RETURN(bool done, move(s, &s.challenge, sizeof(Challenge), false));
          if (!done) return ok_status();
          if (s.challenge.answer != handshake::kChallenge) {
            return peer_error("handshake with {}: unexpected answer {:#x}", peer_,
                              s.challenge.answer);
          }
          handshake::Transcript t = transcript(s.hello);
          t.listener_challenge = s.challenge.challenge;
          if (!handshake::verify(token_, handshake::Role::kListener, t, s.challenge.proof.data())) {
            return handshake::listener_unproven_error(peer_);
          }
          s.proof.proof = handshake::prove(token_, handshake::Role::kConnector, t);
          s.phase = Phase::kProof;
          break;
        }
        case Phase::kProof: {
          GW_ASSIGN_OR_RETURN(bool done, move(s, &s.proof, sizeof(Proof), true));
          if (!done) return ok_status();
          s.phase = Phase::kAck;
          break;
        }
        case Phase::kAck: {
          uint8_t answer = 0;
          ssize_t n = recv(s.fd.get(), &answer, 1, MSG_DONTWAIT);
          if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return ok_status();
            return socket_error("handshake with", peer_, errno);
          }
          if (n == 0) return handshake::closed_by_listener_error(peer_);
          if (answer == kRefuse) return handshake::refused_error(peer_);
          if (answer != kAccept) {
            return peer_error("handshake with {}: unexpected answer {:#x}", peer_, answer);
          }
          s.phase = Phase::kDone;
          break;
        }
        case Phase::kDone:
          return ok_status();
      }
    }
  }

  sockaddr_storage addr_;
  TcpConfig config_;
  sys::Deadline deadline_;
  int64_t timeout_ms_;
  std::string peer_;
  Hello hello_{};  // the fields every socket's hello shares
  std::string token_;
  std::vector<Sock> socks_;
  Status error_;
  std::string last_problem_;
  bool returned_ = false;
};

}  // namespace

std::unique_ptr<Connector> make_connector(const HandleWire& handle, const sockaddr_storage& addr,
                                          TcpConfig config, const TransportOptions& options) {
  return std::make_unique<TcpConnector>(handle, addr, config, options);
}

}  // namespace gw::net::tcp
