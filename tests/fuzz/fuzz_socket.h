// Loopback sockets for the fuzz targets that play one side of a transport's set-up over TCP
// (tcp_fuzz.cc, verbs_fuzz.cc): a raw connector dialling the transport's listener, and a fake
// listener answering the transport's connector with the input. `who` ("tcp fuzz", "verbs fuzz")
// prefixes what check() reports.
#pragma once

#include <netinet/in.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/net/transport.h"
#include "core/sys/fd.h"
#include "core/sys/time.h"

namespace gw::fuzz {

// This side's sockets close with a reset (SO_LINGER 0), so a connection it ends first leaves no
// TIME_WAIT: thousands of inputs a second held the loopback's ephemeral ports for a minute each,
// and after about 40 s the transport's listen (port 0) once found none left. Where this side
// half-closes to give the other its EOF and the other closes first, TIME_WAIT remains; that
// halved the count, and 200 s ran clean.
void close_with_reset(int fd);

// A non-blocking connection to 127.0.0.1 at `port_be` (network byte order), connected within 2 s
// (aborts otherwise); it closes with a reset.
sys::Fd dial_loopback(uint16_t port_be, const char* who);

// Sends what the socket takes before `until`; partial sends are fine (the peer may stop).
void send_some(int fd, const uint8_t* p, size_t n, sys::Deadline until);

// The transport's listener; a failure (the loopback out of ports, say) is said, then aborts.
std::unique_ptr<net::Listener> listen_or_abort(net::Transport& t, net::Handle* h, const char* who);

// The handle's bytes as the backend's handle struct `Wire` (tcp::HandleWire, verbs::HandleWire).
template <typename Wire>
Wire wire_of(const net::Handle& h) {
  Wire w;
  std::memcpy(&w, h.bytes.data(), sizeof(w));
  return w;
}

// A listener of `t` that expects rank 1 as its peer, and a raw loopback connection to the port
// its handle names (`Wire` has port_be): the connector side of modes that feed a listener.
template <typename Wire>
struct RawConnection {
  Wire wire;
  std::unique_ptr<net::Listener> listener;
  sys::Fd sock;
};
template <typename Wire>
RawConnection<Wire> connect_raw(net::Transport& t, const char* who) {
  net::Handle h;
  RawConnection<Wire> c;
  c.listener = listen_or_abort(t, &h, who);
  c.listener->expect_peer(1);
  c.wire = wire_of<Wire>(h);
  c.sock = dial_loopback(c.wire.port_be, who);
  return c;
}

// A fake listener on 127.0.0.1 at a port of the kernel's choice; *bound gets its address.
sys::Fd fake_listener(sockaddr_in* bound, const char* who);

// Drives `connector` (which dialled `listener_fd`) for up to 1 s: accepts its connection, waits
// for its first `hello_size` bytes, answers with `reply` and half-closes. The connector must
// fail (counted as `refused_counter` when it had the reply) and never report a connection, nor
// outlive the second (aborts otherwise).
void answer_connector(net::Connector& connector, int listener_fd, size_t hello_size,
                      const std::vector<uint8_t>& reply, int64_t reply_ms,
                      const std::string& refused_counter, const char* who);

}  // namespace gw::fuzz
