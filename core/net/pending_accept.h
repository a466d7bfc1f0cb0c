// PendingAccept: the one policy of the tcp, shm and verbs listeners for connections whose
// handshake is not finished yet (the "pending" ones), so that a flood of connections cannot starve
// the handshakes a collective needs.
//
// - accept_burst() accepts at most handshake::kAcceptBurst connections per call, so the held
//   handshakes progress between bursts.
// - At GW_LISTEN_MAX_PENDING held handshakes (handshake::max_pending()), or out of descriptors,
//   a held handshake past its grace period (sys::kEvictGraceMs) that has not spoken makes way
//   (else the oldest past it). While every one is in its grace period, newcomers wait in the
//   listen backlog, so a peer whose hello comes a little after its connect is not pushed out by
//   the flood behind it.
// - Out of descriptors with none held, the waiting connection is shed with the spare descriptor
//   and accepting pauses (sys::AcceptShedder).
// - Drops are logged once a second at most (handshake::DropLog).
// A collective never fails for it: the handshakes it needs finish, or its connector retries
// until its deadline.
//
// Pending (the listener's handshake state) must be movable and have `std::string addr` (the
// peer, for warnings; empty when there is none worth naming), `bool silent() const` (true
// while it has not sent a byte) and `int64_t accepted_ns` (set here: when it was accepted).
// Thread-compatible: one per listener, used by its accept().
#pragma once

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/net/handshake.h"
#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"

namespace gw::net {

template <typename Pending>
class PendingAccept {
 public:
  // `proto` names the listener in warnings ("tcp" -> "tcp accept: ...").
  explicit PendingAccept(std::string_view proto) : proto_(proto) {}

  // The held handshakes, oldest first. The listener advances them and erases finished ones.
  std::vector<Pending>& held() { return held_; }
  const std::vector<Pending>& held() const { return held_; }
  sys::AcceptShedder& shedder() { return shedder_; }

  // Accepts connections of `listen_fd` (non-blocking) under the policy above; `now` is
  // sys::now_ns(). admit(sys::Fd fd, const sockaddr_storage& addr) makes the Pending of a new
  // connection, or std::nullopt to close it at once. Returns an accept4 error other than
  // "nothing waiting", "interrupted", "aborted" and "out of descriptors" as kSystem (the
  // listener decides whether that fails its caller); every other case is OK.
  template <typename Admit>
  Status accept_burst(int listen_fd, int64_t now, Admit&& admit) {
    if (shedder_.paused(now)) return ok_status();
    for (int burst = 0; burst < handshake::kAcceptBurst;) {
      // Every place in its grace period: the newcomers wait in the backlog.
      if (held_.size() >= max_pending_ && !past_grace(held_.front(), now)) return ok_status();
      sockaddr_storage addr{};
      socklen_t len = sizeof(addr);
      int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&addr), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int err = errno;
        if (err == EINTR || err == ECONNABORTED) continue;
        if (err == EAGAIN || err == EWOULDBLOCK) return ok_status();
        if (err == EMFILE || err == ENFILE) {
          ++burst;
          if (drop_one(now, "out of file descriptors")) continue;
          GW_LOG_WARN("{} accept: {}; shedding a connection", proto_,
                      system_error("out of file descriptors", err).message());
          shedder_.shed(listen_fd, now);
          return ok_status();
        }
        return system_error(fmt::format("{} accept", proto_), err);
      }
      ++burst;
      sys::Fd owned(fd);
      if (held_.size() >= max_pending_) {
        (void)drop_one(now, fmt::format("{} handshakes pending", held_.size()));  // checked above
      }
      std::optional<Pending> p = admit(std::move(owned), addr);
      if (p) {
        p->accepted_ns = now;
        held_.push_back(std::move(*p));
      }
    }
    return ok_status();
  }

 private:
  static bool past_grace(const Pending& p, int64_t now) {
    return now - p.accepted_ns >= sys::kEvictGraceMs * 1000000;
  }

  // Drops one held handshake past its grace period: the oldest that has not spoken, else the
  // oldest. False when every one is in its grace period (held_ is in accept order: those past it
  // are a prefix).
  bool drop_one(int64_t now, std::string_view why) {
    const auto young = std::find_if(held_.begin(), held_.end(),
                                    [now](const Pending& p) { return !past_grace(p, now); });
    if (young == held_.begin()) return false;
    auto it = std::find_if(held_.begin(), young, [](const Pending& p) { return p.silent(); });
    if (it == young) it = held_.begin();
    uint64_t skipped = 0;
    if (drop_log_.should_log(sys::now_ns(), &skipped)) {
      const std::string who =
          it->addr.empty() ? std::string("a handshake") : "the handshake of " + it->addr;
      GW_LOG_WARN("{} accept: {}; dropping {} ({} more dropped since the last warning)", proto_,
                  why, who, skipped);
    }
    held_.erase(it);
    return true;
  }

  std::string proto_;
  std::vector<Pending> held_;
  const size_t max_pending_ = handshake::max_pending();  // GW_LISTEN_MAX_PENDING
  sys::AcceptShedder shedder_;
  handshake::DropLog drop_log_;
};

}  // namespace gw::net
