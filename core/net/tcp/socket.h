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
// Non-blocking, TCP_NODELAY, and SO_SNDBUF/SO_RCVBUF = bufsize when bufsize > 0.
Status configure_socket(int fd, int64_t bufsize);
socklen_t sockaddr_len(const sockaddr_storage& addr);
// /sys/class/net/<ifname>/speed in Mb/s; 0 when unknown.
int read_link_speed(const std::string& ifname);

}  // namespace gw::net::tcp
