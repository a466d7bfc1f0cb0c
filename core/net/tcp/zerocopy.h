// MSG_ZEROCOPY sends of the tcp backend (docs/wire-tcp.md, "Zero-copy sends"). The kernel numbers
// each sendmsg(MSG_ZEROCOPY) that queued bytes 0, 1, 2, ... per socket and later reports finished
// ranges [lo, hi] on the socket's error queue; the pages of such a call may be changed only once
// its number has been reported. Internal to core/net/tcp/.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "core/status.h"

namespace gw::net::tcp {

// GW_SOCKET_ZEROCOPY: off; auto (zero-copy until the kernel reports it copied anyway, as it does
// for loopback and same-host veth peers); on (zero-copy even when the kernel copies: tests);
// uring (io_uring SEND_ZC, uring_send.h; copying sends where io_uring is unavailable).
enum class ZcMode { kOff, kAuto, kOn, kUring };

// Parses the row's value; an unknown word is an error naming the row, and so is `uring` in a
// build without io_uring.
Result<ZcMode> parse_zc_mode(const std::string& value);

// One socket's zero-copy accounting. Single-threaded: the socket's owner calls it.
class ZcTracker {
 public:
  // `calls` more sendmsg(MSG_ZEROCOPY) calls queued at least one byte: they hold the next numbers.
  void on_sent(uint64_t calls = 1) { issued_ += calls; }
  // Every call numbered so far has been reported: no page of the user's is still referenced.
  bool idle() const { return completed_ == issued_; }
  // Folds one notification in: numbers lo..hi (inclusive, 32-bit, wrapping) are done; `copied`
  // when the kernel copied their bytes after all. Ranges may arrive in any order (the kernel frees
  // a retransmitted skb late and reports its call after later ones). A range that covers numbers
  // not issued or already reported is an error (the accounting would otherwise release buffers
  // early).
  Status note(uint32_t lo, uint32_t hi, bool copied);
  uint64_t issued() const { return issued_; }
  uint64_t completed() const { return completed_; }
  uint64_t copied() const { return copied_; }

 private:
  uint64_t issued_ = 0;     // calls numbered (the kernel's counter is the low 32 bits)
  uint64_t completed_ = 0;  // calls reported, in any order
  uint64_t copied_ = 0;     // reported calls whose bytes the kernel copied
  uint64_t floor_ = 0;      // every call below this number has been reported
  // Reported ranges above floor_, [first, second) in 64-bit numbering, disjoint and not touching.
  std::map<uint64_t, uint64_t> ahead_;
};

// SO_ZEROCOPY on fd; false when the kernel refuses it (the socket keeps copying).
bool enable_zerocopy(int fd);

// Reads every notification waiting on fd's error queue into t without blocking. An error queued
// by the socket itself (not a notification) is returned as the send's error.
Status drain_zerocopy(int fd, ZcTracker* t, const std::string& peer);

// Zero-copy calls of this process the kernel has reported done, and those it reported copied
// (tests and perf check which path ran).
uint64_t zerocopy_reported();
uint64_t zerocopy_copied();

}  // namespace gw::net::tcp
