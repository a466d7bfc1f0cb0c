// A loopback TCP port for a test to hand to the rank that binds it a moment later (a store, a
// server). One implementation for every test that needs one.
//
// A port the kernel numbers (bind to port 0) is released before the rank binds it, and in that
// moment any listener of a test running beside this one (ctest -j2) may be numbered the same. So
// the port comes from below the kernel's ephemeral range (net.ipv4.ip_local_port_range, which
// the kernel numbers from), where no such socket lands: 10000-19999 when that range starts at
// 20000 or above (Debian's starts at 32768), and each process starts at its own place (a hash of
// its pid), and moves on at each call, so tests running side by side seldom meet. A candidate is
// checked by binding it (SO_REUSEADDR, as the store binds). Otherwise, the kernel's choice.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>

namespace gw::testing {

namespace port_detail {

// Binds 127.0.0.1:port (0: the kernel's choice); returns the port bound, or 0.
inline int try_bind(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t len = sizeof(a);
  int got = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    got = ntohs(a.sin_port);
  }
  close(fd);
  return got;
}

inline int ephemeral_low() {
  int low = 0, high = 0;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    if (std::fscanf(f, "%d %d", &low, &high) != 2) low = 0;
    std::fclose(f);
  }
  return low;
}

}  // namespace port_detail

inline int free_port() {
  constexpr int kFirst = 10000, kCount = 10000;
  static const bool below_ephemeral = port_detail::ephemeral_low() >= kFirst + kCount;
  // The start is a hash of the pid: ctest starts tests side by side with nearly consecutive pids,
  // and starts by pid alone put them tens of ports apart, inside the sweep of a test that takes a
  // port per round (CapiLeakTest: 1,100).
  static std::atomic<unsigned> next{(static_cast<unsigned>(getpid()) * 2654435761u) % kCount};
  if (below_ephemeral) {
    for (int tries = 0; tries < 64; ++tries) {
      const int port = kFirst + static_cast<int>(next.fetch_add(1) % kCount);
      if (port_detail::try_bind(port) == port) return port;
    }
  }
  return port_detail::try_bind(0);
}

}  // namespace gw::testing
