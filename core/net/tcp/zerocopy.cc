#include "core/net/tcp/zerocopy.h"

#include <linux/errqueue.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <iterator>

#include "core/net/tcp/socket.h"
#include "core/net/tcp/uring_send.h"

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef SO_EE_ORIGIN_ZEROCOPY
#define SO_EE_ORIGIN_ZEROCOPY 5
#endif
#ifndef SO_EE_CODE_ZEROCOPY_COPIED
#define SO_EE_CODE_ZEROCOPY_COPIED 1
#endif

namespace gw::net::tcp {
namespace {
std::atomic<uint64_t> g_reported{0};
std::atomic<uint64_t> g_copied{0};
}  // namespace

Result<ZcMode> parse_zc_mode(const std::string& value) {
  if (value == "off" || value == "0") return ZcMode::kOff;
  if (value == "auto") return ZcMode::kAuto;
  if (value == "on" || value == "1") return ZcMode::kOn;
  if (value == "uring") {
    if (!uring_built()) {
      return invalid_arg(
          "GW_SOCKET_ZEROCOPY=uring: this build has no io_uring (configured with "
          "GW_WITH_URING=OFF, or without liburing-dev); use off, auto or on");
    }
    return ZcMode::kUring;
  }
  return invalid_arg("GW_SOCKET_ZEROCOPY='{}' is not one of off, auto, on, uring", value);
}

Status ZcTracker::note(uint32_t lo, uint32_t hi, bool copied) {
  // A range may merge several calls, and ranges may come out of order: place lo among the calls
  // still outstanding (fewer than 2^32 of them), then check it overlaps nothing reported.
  const uint64_t first = floor_ + static_cast<uint32_t>(lo - static_cast<uint32_t>(floor_));
  const uint64_t count = uint64_t{static_cast<uint32_t>(hi - lo)} + 1;
  const uint64_t end = first + count;
  auto next = ahead_.lower_bound(first);
  const bool past_issued = end > issued_;
  const bool overlaps_next = next != ahead_.end() && next->first < end;
  const bool overlaps_prev = next != ahead_.begin() && std::prev(next)->second > first;
  if (past_issued || overlaps_next || overlaps_prev) {
    return internal_error(
        "tcp zero-copy: notification for calls {}..{} covers calls not issued or already "
        "reported ({} issued, {} reported)",
        lo, hi, issued_, completed_);
  }
  uint64_t lo64 = first, hi64 = end;
  if (next != ahead_.begin() && std::prev(next)->second == first) {
    lo64 = std::prev(next)->first;
    ahead_.erase(std::prev(next));
  }
  if (next != ahead_.end() && next->first == end) {
    hi64 = next->second;
    ahead_.erase(next);
  }
  if (lo64 == floor_) {
    floor_ = hi64;
  } else {
    ahead_.emplace(lo64, hi64);
  }
  completed_ += count;
  g_reported.fetch_add(count, std::memory_order_relaxed);
  if (copied) {
    copied_ += count;
    g_copied.fetch_add(count, std::memory_order_relaxed);
  }
  return ok_status();
}

uint64_t zerocopy_reported() { return g_reported.load(std::memory_order_relaxed); }
uint64_t zerocopy_copied() { return g_copied.load(std::memory_order_relaxed); }

bool enable_zerocopy(int fd) {
  int one = 1;
  return setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof(one)) == 0;
}

Status drain_zerocopy(int fd, ZcTracker* t, const std::string& peer) {
  while (true) {
    alignas(cmsghdr) char control[256];
    msghdr msg{};
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = recvmsg(fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return ok_status();
      return socket_error("send to", peer, errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      const bool recverr = (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
                           (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR);
      if (!recverr || c->cmsg_len < CMSG_LEN(sizeof(sock_extended_err))) continue;
      sock_extended_err ee;
      std::memcpy(&ee, CMSG_DATA(c), sizeof(ee));
      if (ee.ee_origin != SO_EE_ORIGIN_ZEROCOPY) {
        if (ee.ee_errno != 0) return socket_error("send to", peer, static_cast<int>(ee.ee_errno));
        continue;
      }
      GW_RETURN_IF_ERROR(
          t->note(ee.ee_info, ee.ee_data, (ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED) != 0));
    }
  }
}

}  // namespace gw::net::tcp
