// The tcp listener: accepts connections under the shared pending-accept policy, runs the
// listener's half of the handshake (docs/wire-tcp.md) and groups a connection's sockets.
#include "core/net/tcp/listener.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/net/handshake.h"
#include "core/net/pending_accept.h"
#include "core/net/socket_util.h"
#include "core/net/tcp/comm_core.h"
#include "core/net/tcp/socket.h"
#include "core/net/tcp/wire.h"
#include "core/sys/time.h"

namespace gw::net::tcp {
namespace {

using handshake::kAccept;
using handshake::kRefuse;
using sys::Fd;
using sys::now_ns;

class TcpListener final : public Listener {
 public:
  TcpListener(Fd fd, uint64_t nonce, TcpConfig config, TransportOptions options)
      : fd_(std::move(fd)), nonce_(nonce), config_(config), options_(std::move(options)) {}

  Result<std::unique_ptr<RecvComm>> accept() override {
    // The handshakes already held move first, so a flood of new connections cannot push out one
    // that has spoken before it was read.
    const int64_t now = now_ns();
    std::vector<Pending>& pending = accepts_.held();
    for (size_t i = 0; i < pending.size();) {
      Result<bool> keep = advance(pending[i], now);
      if (!keep.ok()) return keep.status();
      if (*keep) {
        ++i;
      } else {
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(i));
      }
    }
    GW_RETURN_IF_ERROR(accept_new(now));
    for (size_t i = 0; i < groups_.size(); ++i) {
      Group& g = groups_[i];
      if (g.count == config_.nsocks) {
        std::vector<Fd> socks = std::move(g.socks);
        std::string peer = handshake::peer_label(g.rank, "tcp", g.addr);
        groups_.erase(groups_.begin() + static_cast<ptrdiff_t>(i));
        return make_recv_comm(std::move(socks), config_.chunk, std::move(peer), config_.threads);
      }
    }
    std::erase_if(groups_, [now](const Group& g) {
      if (now < g.deadline_ns) return false;
      GW_LOG_WARN("tcp accept: dropping incomplete connection from {} ({} sockets arrived)", g.addr,
                  g.count);
      return true;
    });
    return std::unique_ptr<RecvComm>();
  }

 private:
  enum class Phase { kHello, kChallenge, kProof };
  struct Pending {
    Fd fd;
    std::string addr;
    Phase phase = Phase::kHello;
    Hello hello{};
    Challenge challenge{};
    Proof proof{};
    size_t done = 0;  // bytes of the current phase's message moved
    int64_t deadline_ns = 0;
    int64_t accepted_ns = 0;  // PendingAccept's: its grace period
    bool silent() const { return phase == Phase::kHello && done == 0; }
  };
  struct Group {
    uint64_t conn_id = 0;
    int rank = -1;
    std::string addr;
    std::vector<Fd> socks;
    int count = 0;
    int64_t deadline_ns = 0;
  };

  // New connections, under the policy of core/net/pending_accept.h.
  Status accept_new(int64_t now) {
    return accepts_.accept_burst(
        fd_.get(), now, [&](Fd fd, const sockaddr_storage& addr) -> std::optional<Pending> {
          Pending p;
          p.addr = format_sockaddr(reinterpret_cast<const sockaddr*>(&addr));
          // A silent client holds a slot until this deadline; it never stalls other handshakes.
          p.deadline_ns = now_ns() + options_.timeout_ms * 1000000;
          Status s = configure_socket(fd.get(), 0);
          if (!s.ok()) {
            GW_LOG_WARN("tcp accept from {}: {}", p.addr, s.to_string());
            return std::nullopt;
          }
          p.fd = std::move(fd);
          return p;
        });
  }

  // Moves bytes of one handshake message without blocking: true when all `size` bytes are
  // done, false for "not yet"; an error (including EOF) when the socket is finished.
  static Result<bool> move_bytes(int fd, void* buf, size_t size, size_t* done, bool sending) {
    while (*done < size) {
      char* p = static_cast<char*>(buf) + *done;
      ssize_t n = sending ? send(fd, p, size - *done, MSG_NOSIGNAL | MSG_DONTWAIT)
                          : recv(fd, p, size - *done, MSG_DONTWAIT);
      if (n == 0 && !sending) return peer_error("closed mid-handshake");
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return false;
        return system_error("handshake", errno);
      }
      *done += static_cast<size_t>(n);
    }
    return true;
  }

  void refuse(Pending& p, std::string_view why) {
    GW_LOG_WARN("tcp accept: refused connection from {}: {}", p.addr, why);
    uint8_t refuse = kRefuse;
    (void)!send(p.fd.get(), &refuse, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  // Advances one pending handshake; false when the socket is done with (grouped or dropped).
  // The listener proves the token first (its challenge carries its proof), then checks the
  // connector's proof over the same transcript (docs/wire-tcp.md).
  Result<bool> advance(Pending& p, int64_t now) {
    while (true) {
      Result<bool> moved = true;
      switch (p.phase) {
        case Phase::kHello:
          moved = move_bytes(p.fd.get(), &p.hello, sizeof(Hello), &p.done, false);
          break;
        case Phase::kChallenge:
          moved = move_bytes(p.fd.get(), &p.challenge, sizeof(Challenge), &p.done, true);
          break;
        case Phase::kProof:
          moved = move_bytes(p.fd.get(), &p.proof, sizeof(Proof), &p.done, false);
          break;
      }
      if (!moved.ok()) return false;  // the client went away mid-handshake
      if (!*moved) {
        if (now < p.deadline_ns) return true;
        GW_LOG_WARN("tcp accept: {} did not finish its handshake within {} ms; dropped", p.addr,
                    options_.timeout_ms);
        return false;
      }
      p.done = 0;
      const Hello& h = p.hello;
      if (p.phase == Phase::kHello) {
        std::string why =
            handshake::refusal({h.magic, h.nonce, h.rank, h.listener_rank},
                               {"tcp", "GWH2", nonce_, options_.rank, expected_peer()});
        if (why.empty() && (h.nsocks != config_.nsocks || h.sock_index >= h.nsocks)) {
          why = "socket count or index out of range";
        }
        if (!why.empty()) {
          refuse(p, why);
          return false;
        }
        handshake::Transcript t = transcript(h);
        Status fresh = handshake::fresh_nonce(&t.listener_challenge);
        if (!fresh.ok()) {
          refuse(p, fresh.message());
          return false;
        }
        p.challenge = Challenge{};
        p.challenge.answer = handshake::kChallenge;
        p.challenge.challenge = t.listener_challenge;
        p.challenge.proof = handshake::prove(options_.job_token, handshake::Role::kListener, t);
        p.phase = Phase::kChallenge;
        continue;
      }
      if (p.phase == Phase::kChallenge) {
        p.phase = Phase::kProof;
        continue;
      }
      // Phase::kProof: the whole exchange is in.
      handshake::Transcript t = transcript(h);
      t.listener_challenge = p.challenge.challenge;
      if (!handshake::verify(options_.job_token, handshake::Role::kConnector, t,
                             p.proof.proof.data())) {
        refuse(p, fmt::format("{} did not prove the job token (job token mismatch)",
                              rank_name(h.rank)));
        return false;
      }
      return join_group(p, now);
    }
  }

  // An authenticated socket joins the group of its connection id.
  Result<bool> join_group(Pending& p, int64_t now) {
    const Hello& h = p.hello;
    auto it = std::find_if(groups_.begin(), groups_.end(),
                           [&](const Group& g) { return g.conn_id == h.conn_id; });
    if (it == groups_.end()) {
      Group g;
      g.conn_id = h.conn_id;
      g.rank = h.rank;
      g.socks.resize(static_cast<size_t>(config_.nsocks));
      g.deadline_ns = now + options_.timeout_ms * 1000000;
      groups_.push_back(std::move(g));
      it = groups_.end() - 1;
    }
    if (it->rank != h.rank) {
      refuse(p, fmt::format("socket {} states {} in a connection of {}", h.sock_index,
                            rank_name(h.rank), rank_name(it->rank)));
      return false;
    }
    if (it->socks[h.sock_index].valid()) {
      GW_LOG_WARN("tcp accept: duplicate socket {} from {}; dropped", h.sock_index, p.addr);
      return false;
    }
    uint8_t accept_byte = kAccept;
    if (send(p.fd.get(), &accept_byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) return false;
    if (h.sock_index == 0) it->addr = p.addr;
    it->socks[h.sock_index] = std::move(p.fd);
    ++it->count;
    return false;
  }

  Fd fd_;
  uint64_t nonce_;
  TcpConfig config_;
  TransportOptions options_;
  PendingAccept<Pending> accepts_{"tcp"};
  std::vector<Group> groups_;
};

}  // namespace

std::unique_ptr<Listener> make_listener(Fd fd, uint64_t nonce, TcpConfig config,
                                        TransportOptions options) {
  return std::make_unique<TcpListener>(std::move(fd), nonce, config, std::move(options));
}

}  // namespace gw::net::tcp
