// Daemon mode of the NCCL plugin (GW_DAEMON set: an address "unix:PATH", or "auto"): the plugin's
// connections go through the host's gradwired instead of the in-process transports.
//
// DaemonTransport is a net::Transport (core/net/transport.h), so NetPlugin and PluginComm run on
// it unchanged (request slots, buffer checks, timeline). Each connection is a client of the
// daemon (daemon/client.h: the hello, the shared arena, its submission and completion rings),
// exactly the C ABI's daemon client: the listener side and the connector side each join the
// daemon as one of the two trainers of a job of their own, keyed by the job token (GW_JOB_TOKEN)
// and the handle's nonce (plugin/daemon_handle.h), and their isend/irecv are the daemon's
// point-to-point submissions (since protocol version 7, docs/wire-daemon.md "Point-to-point";
// daemon/job_p2p.h matches them: per tag in order, a receive larger than the message reports the
// message's size, a smaller one fails with "message truncated"). test() polls the completion ring
// (no socket round trip). Host buffers are copied into the process's arena and out of it; NCCL's
// buffers in the arena are a later step. Device buffers: regMrDmaBuf lends the dma-buf to the
// daemon, which registers it with the NIC of the job's link to the peer's host (protocol version
// 8, docs/wire-daemon.md "Device buffers as dma-bufs"); isend/irecv of a buffer in such a region
// is one daemon message naming the region (no staging, no chunks: the daemons' NICs move it), and
// iflush of one asks the receiving daemon to flush its NIC's writes. regMr of device memory
// without a dma-buf is refused.
//
// Pipelining (docs/nccl-plugin.md "Daemon mode"): a message of at least C = 4 MiB (kChunkBytes in
// daemon_comm.h; both ends must cut alike, a constant) goes as several daemon messages on its
// tag, so that the copy into the arena, the daemon's move and the copy out overlap:
// - Chunks: the first exactly C bytes: the message's first C-8 bytes, then its size (8 bytes,
//   little endian); then the rest in chunks of C, the last one shorter when it comes out so. A
//   message of at most C-1 bytes is one daemon message, as before (its size is the message's).
// - Sender: isend stages and submits the first chunk; every later call on the comm (NCCL's proxy
//   polls test) stages and submits more while fewer than kSendsAhead (4) chunks after a first are
//   in flight on the comm and the arena has room (a full arena is "not yet", never an error).
//   A message's chunks go after every chunk of the sends posted before it on its tag.
// - Receiver: the first receive takes min(C, buffer) bytes. Fewer than C arrived: that is the
//   whole message. C arrived: the size says how many chunks follow, and exactly those receives
//   are posted (at most kReceivesAhead, 8, ahead: more than the sender, so a chunk finds its
//   receive posted), each chunk copied out to the caller's buffer while the later ones move. So no
//   receive is ever posted past a message's end (it would take the next message's chunk); a
//   message's first receive waits until every receive of the message before it on its tag is
//   posted.
// - Truncation is direct mode's: a message larger than the receive buffer fails the receive
//   (kInvalidArg, "message truncated"), at its first chunk (the daemon's size check, or the size
//   it carries; then a 0-byte receive refuses the next chunk, so that the sender fails too, as in
//   direct mode). The rest of the message may remain in the daemon, so the comm is ended with that
//   error (every later call on it fails, as direct mode's connection ends). Any failed receive,
//   and a failed send of C bytes or more, end their comm so; a shorter send that fails fails
//   alone, as before.
// - Every request's chunks leave the arena when their completion is read, when the request fails,
//   and when the comm closes (its client and arena go with it).
//
// Connect: the connector joins, then sends a 0-byte message that completes only once the job has
// both its trainers (the daemon starts a job when its last trainer joins); until then poll()
// returns nullptr, and after timeout_ms it fails with kTimeout ("no process of this job accepted
// on the handle"): a process of another job (another GW_JOB_TOKEN) computes another key and never
// meets the listener. Accept: the listener's side joins on its first accept() and receives that
// message.
//
// Across hosts: the listening process hosts a small store (core/store.h TcpStore, requiring the
// job token) on an ephemeral port of the interface GW_SOCKET_IFNAME / NCCL_SOCKET_IFNAME picks (one
// per transport, started at the first listen) and puts its host:port in the handle. A connector
// whose host (the handle's host hash) is another announces itself there (a counter under a key of
// the connection) and joins its daemon as rank 0, host 0 of a two-host job whose daemons meet in
// that store; the listener, which joined as for a connector of its host, looks for the
// announcement every 2 ms while accept() is polled, then leaves that job and joins as rank 1, host
// 1. The messages then go daemon to daemon (docs/wire-daemon.md "Point-to-point across hosts") over
// the transport the daemons agree. A process of another job is refused by the store (it does not
// prove the job token), so it never meets the listener either.
//
// Faults: a peer process that dies leaves its job in the daemon, which ends the survivor's
// requests with kPeer (drop_member); a daemon that dies closes every client's socket, which test()
// notices within a millisecond of polling (Client::check_alive), and every later call fails. Across
// hosts, the remote process's or daemon's end closes the daemons' connection, which fails the
// pending requests with kPeer ("point-to-point with host N's daemon ended").
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/net/transport.h"
#include "core/status.h"

namespace gw::plugin {

// GW_DAEMON as the plugin sees it: "" (direct mode), or "unix:PATH". "auto": the daemon at
// GW_DAEMON_SOCKET when its control socket answers, else "" (direct mode). *note says which.
Result<std::string> plugin_daemon_address(std::string* note);

struct DaemonNetOptions {
  std::string address;  // "unix:PATH"
  std::string job_token;
  int64_t timeout_ms = 30000;
  uint64_t arena_bytes = 0;  // GW_DAEMON_ARENA
};

// A transport whose comms go through gradwired at options.address; properties() are `nic`'s
// (what NCCL's topology sees), which it keeps only for them.
Result<std::unique_ptr<net::Transport>> make_daemon_transport(const DaemonNetOptions& options,
                                                              const net::Properties& nic);

}  // namespace gw::plugin
