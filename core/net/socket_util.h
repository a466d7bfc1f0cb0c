// Small helpers shared by the tcp and shm backends: an owning fd, deadlines, socket options,
// address formatting, interface selection (NCCL_SOCKET_IFNAME syntax) and random bytes.
//
// Everything here is thread-compatible (no shared state) and never blocks.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/status.h"

namespace gw::net {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

// Monotonic clock in nanoseconds.
int64_t now_ns();

// A point on the monotonic clock; every wait in core/net is bounded by one.
class Deadline {
 public:
  static Deadline after_ms(int64_t ms) { return Deadline(now_ns() + ms * 1000000); }
  bool expired() const { return now_ns() >= at_ns_; }
  int64_t at_ns() const { return at_ns_; }

 private:
  explicit Deadline(int64_t at_ns) : at_ns_(at_ns) {}
  int64_t at_ns_;
};

Status set_nonblocking(int fd);

// "10.0.0.2:41234" or "[fd00::2]:41234".
std::string format_sockaddr(const sockaddr* addr);

// One address of one interface, as getifaddrs() reports it.
struct Interface {
  std::string name;
  sockaddr_storage addr{};
  bool up = false;
  bool loopback = false;
};

// Every AF_INET / AF_INET6 address of every interface, in getifaddrs() order.
Result<std::vector<Interface>> list_interfaces();

// Picks one address according to an NCCL_SOCKET_IFNAME-style spec:
//   ""            first interface that is up and not loopback, else loopback;
//   "eth,ib"      names starting with any listed prefix;
//   "^docker,lo"  names starting with none of the listed prefixes;
//   "=eth0"       exact names ("^=eth0" excludes exact names).
// Only interfaces that are up count; IPv4 is preferred over IPv6 on the same interface, and
// IPv6 link-local addresses are used only when nothing else matches.
// Fails with kInvalidArg naming the spec when nothing matches.
Result<Interface> select_interface(std::string_view spec, const std::vector<Interface>& all);

// Fills `out` from getrandom(); falls back to the clock when the kernel refuses.
void fill_random(void* out, size_t size);
uint64_t random_u64();

// "rank 3" or "peer" when the rank is unknown (< 0).
std::string rank_name(int rank);

}  // namespace gw::net
