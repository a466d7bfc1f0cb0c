// Socket helpers of the tcp backend: errno classification, socket options, address sizes.
// Internal to core/net/tcp/.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace gw::net::tcp {

// Errors that mean the peer (or the path to it) is gone: kPeer rather than kSystem.
bool is_peer_errno(int err);
// `what peer: errno text`, as kPeer for is_peer_errno errors and kSystem otherwise.
Status socket_error(std::string_view what, const std::string& peer, int err);
// Non-blocking, TCP_NODELAY, SO_SNDBUF/SO_RCVBUF = bufsize when bufsize > 0, and busy polling
// of busy_poll_us microseconds when it is > 0 (set_busy_poll). Accepted sockets inherit both
// from their listening socket.
Status configure_socket(int fd, int64_t bufsize, int busy_poll_us = 0);
// SO_BUSY_POLL = us on fd, and SO_PREFER_BUSY_POLL where the kernel has it (5.11+): a receive
// that finds the socket empty polls the device queue (NAPI context) its packets arrive on for up
// to `us` microseconds instead of waiting for that queue's interrupt; a non-blocking receive
// polls it once. Helps only where packets arrive through a NAPI context: a NIC's queue, or a veth
// with XDP attached; loopback has none. Fails with the kernel's errno: EPERM above
// net.core.busy_read without CAP_NET_ADMIN, ENOPROTOOPT without CONFIG_NET_RX_BUSY_POLL.
Status set_busy_poll(int fd, int us);
// Whether this process may busy-poll its sockets for `us` microseconds: set_busy_poll on a
// socket of its own, then closed.
Status probe_busy_poll(int us);
socklen_t sockaddr_len(const sockaddr_storage& addr);
// net.core.busy_read (the busy polling every socket starts with), as text; "?" when unreadable.
std::string read_busy_read();
// /sys/class/net/<ifname>/speed in Mb/s; 0 when unknown.
int read_link_speed(const std::string& ifname);

}  // namespace gw::net::tcp
