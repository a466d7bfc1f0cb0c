#include "core/net/tcp_config.h"

namespace gw::net::tcp_config {

using config::Type;

constinit const config::Row kSocketIfname{
    "GW_SOCKET_IFNAME", Type::String, "", "NCCL_SOCKET_IFNAME",
    "interface(s) for tcp: name prefix list, ^ to exclude, = for exact (NCCL syntax); empty: the "
    "one routing to the store's host, never docker*, veth*, or loopback unless the store is "
    "there"};
constinit const config::Row kSocketNsocks{
    "GW_SOCKET_NSOCKS", Type::Int, "0", "",
    "TCP sockets striped per connection (1-16; 0 = auto: 4 on links of 25 Gb/s and more, else 1)"};
constinit const config::Row kSocketNthreads{
    "GW_SOCKET_NTHREADS", Type::Int, "0", "",
    "I/O worker threads per TCP comm (1-16; socket s -> thread s % N; -1 = none; 0 = auto: "
    "none, except 1 in the NCCL plugin on hosts with 8+ CPUs)"};
constinit const config::Row kSocketBufsize{
    "GW_SOCKET_BUFSIZE", Type::Size, "0", "",
    "SO_SNDBUF/SO_RCVBUF of each TCP socket (0 keeps the kernel's autotuning)"};
constinit const config::Row kSocketChunk{
    "GW_SOCKET_CHUNK", Type::Size, "256K", "",
    "bytes per stripe unit when a message is split across a connection's sockets"};

constinit const config::Row kSocketZerocopy{
    "GW_SOCKET_ZEROCOPY", Type::String, "off", "",
    "zero-copy sends of messages of GW_SOCKET_ZEROCOPY_MIN bytes or more: off; auto "
    "(MSG_ZEROCOPY until the kernel reports it copied anyway, as for loopback and same-host "
    "peers); on (MSG_ZEROCOPY always); uring (io_uring SEND_ZC; copying sends where io_uring is "
    "unavailable; refused by builds without GW_WITH_URING)"};
constinit const config::Row kSocketZerocopyMin{
    "GW_SOCKET_ZEROCOPY_MIN", Type::Size, "256K", "",
    "smallest message sent zero-copy when GW_SOCKET_ZEROCOPY is auto, on or uring"};

constinit const config::Row kSocketBusyPoll{
    "GW_SOCKET_BUSY_POLL", Type::Int, "0", "",
    "microseconds each TCP socket busy-polls its device queue when a receive finds it empty "
    "(SO_BUSY_POLL + SO_PREFER_BUSY_POLL; 0 = off, 1-1000000): lower latency where packets "
    "arrive through a NAPI context (a NIC queue, a veth with XDP), none over loopback; above "
    "net.core.busy_read it needs CAP_NET_ADMIN, else a warning and no busy polling"};

const config::RowSet& rows() {
  static const config::RowSet set(
      "tcp", {&kSocketIfname, &kSocketNsocks, &kSocketNthreads, &kSocketBufsize, &kSocketChunk,
              &kSocketZerocopy, &kSocketZerocopyMin, &kSocketBusyPoll});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::net::tcp_config
