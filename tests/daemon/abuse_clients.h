// Raw clients of gradwired's trainers' socket for the abuse and flood tests (issue 33): dialing
// through a full backlog, a hello and its welcome, and abusers that stay silent or trickle a frame
// one byte every 100 ms until the daemon drops them.
#pragma once

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/sys/unix_socket.h"
#include "daemon/protocol.h"
#include "tests/daemon/raw_client.h"

namespace gw::daemon {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Dials until the daemon's backlog has room (a flood fills it), for at most 5 s.
inline Result<sys::Fd> dial_retrying(const std::string& path) {
  const auto until = Clock::now() + 5s;
  for (;;) {
    auto fd = test::dial(path);
    if (fd.ok() || Clock::now() > until) return fd;
    std::this_thread::sleep_for(2ms);
  }
}

// Sends `h` and reads the daemon's welcome (its status carried); the connection stays in *keep.
inline Result<Welcome> say_hello(const std::string& path, const Hello& h, sys::Fd* keep) {
  GW_ASSIGN_OR_RETURN(*keep, dial_retrying(path));
  std::vector<sys::Fd> fds;
  return test::exchange_hello(keep->get(), frame_message(encode_hello(h)), &fds);
}

// A connection that says nothing (silent) or trickles a frame one byte every 100 ms.
struct Abuser {
  sys::Fd sock;
  bool trickle = false;
  Clock::time_point since;
  Clock::time_point dropped{};
  Clock::time_point next_byte{};
};

// Opens `silent` + `trickling` abusers on `path`.
inline std::vector<Abuser> open_abusers(const std::string& path, int silent, int trickling) {
  std::vector<Abuser> out;
  for (int i = 0; i < silent + trickling; ++i) {
    auto fd = dial_retrying(path);
    if (!fd.ok()) {
      ADD_FAILURE() << "abuser " << i << ": " << fd.status().message();
      break;
    }
    Abuser a;
    a.sock = std::move(*fd);
    a.trickle = i >= silent;
    a.since = Clock::now();
    a.next_byte = a.since;
    out.push_back(std::move(a));
  }
  return out;
}

// Drives the abusers until each is dropped (the daemon closed it) or `limit` passes: the tricklers
// send a frame claiming `claimed` bytes, one byte each 100 ms.
inline void drive(std::vector<Abuser>& abusers, uint32_t claimed, std::chrono::milliseconds limit) {
  uint8_t header[4];
  std::memcpy(header, &claimed, 4);
  const auto until = Clock::now() + limit;
  for (;;) {
    size_t live = 0;
    const auto now = Clock::now();
    for (Abuser& a : abusers) {
      if (a.dropped != Clock::time_point{}) continue;
      uint8_t b[256];
      ssize_t n = 0;
      while ((n = ::recv(a.sock.get(), b, sizeof(b), MSG_DONTWAIT)) > 0) {
      }
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        a.dropped = now;
        continue;
      }
      ++live;
      if (a.trickle && now >= a.next_byte) {
        const size_t k = static_cast<size_t>((now - a.since) / 100ms);
        const uint8_t byte = k < 4 ? header[k] : 'x';
        (void)::send(a.sock.get(), &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        a.next_byte = now + 100ms;
      }
    }
    if (live == 0 || Clock::now() > until) return;
    std::this_thread::sleep_for(10ms);
  }
}

}  // namespace gw::daemon
