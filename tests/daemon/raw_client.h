// A trainer of gradwired speaking the protocol by hand (daemon/protocol.h), for the daemon's tests:
// dial the socket, send a hello frame and read the welcome with its descriptors, and RawClient,
// which maps the arena and drives the rings without daemon/client.h's checks (so a test can
// overflow a ring or post garbage). Header-only: daemon_server_test and daemon_abuse_test use it.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/sys/memfd_region.h"
#include "core/sys/unix_socket.h"
#include "daemon/protocol.h"
#include "daemon/ring.h"

namespace gw::daemon::test {

// A connection to the daemon's socket at `path`.
inline Result<sys::Fd> dial(const std::string& path) {
  GW_ASSIGN_OR_RETURN(auto addr, sys::UnixAddress::path(path));
  return sys::connect_unix(addr, SOCK_STREAM);
}

// Sends `frame` (a hello, or anything a test wants the daemon to read as one) on `sock` and reads
// the daemon's welcome within 5 s; the descriptors that came with it are put in *fds. A welcome
// that refuses is returned as its status.
inline Result<Welcome> exchange_hello(int sock, const std::vector<uint8_t>& frame,
                                      std::vector<sys::Fd>* fds) {
  const auto deadline = sys::deadline_after_ms(5000);
  GW_RETURN_IF_ERROR(
      sys::send_with_fds(sock, frame.data(), frame.size(), {}, deadline, "test hello"));
  std::vector<uint8_t> in;
  uint8_t buf[2048];
  while (in.size() < kFrameHeaderBytes ||
         in.size() < kFrameHeaderBytes + *reinterpret_cast<const uint32_t*>(in.data())) {
    GW_ASSIGN_OR_RETURN(size_t n,
                        sys::recv_with_fds(sock, buf, sizeof(buf), fds, deadline, "test welcome"));
    if (n == 0) return peer_error("closed without a welcome");
    in.insert(in.end(), buf, buf + n);
  }
  GW_ASSIGN_OR_RETURN(Welcome w,
                      decode_welcome(in.data() + kFrameHeaderBytes, in.size() - kFrameHeaderBytes));
  if (w.status != 0) return Status(static_cast<Code>(w.status), w.message);
  return w;
}

// A trainer speaking the protocol by hand.
struct RawClient {
  sys::Fd sock;
  sys::MemfdRegion arena;
  sys::Fd sq, cq;
  Welcome geo;
  ArenaHeader* hdr = nullptr;
  uint8_t* data = nullptr;
  uint64_t seq = 1;
  RingProducer<SqEntry> sq_ring;
  RingConsumer<CqEntry> cq_ring;

  // Sends `frame` as is; returns the daemon's welcome (and maps the arena when accepted).
  static Result<RawClient> join_raw(const std::string& path, const std::vector<uint8_t>& frame) {
    RawClient c;
    GW_ASSIGN_OR_RETURN(c.sock, dial(path));
    std::vector<sys::Fd> fds;
    GW_ASSIGN_OR_RETURN(c.geo, exchange_hello(c.sock.get(), frame, &fds));
    if (fds.size() != 3) return peer_error("{} descriptors", fds.size());
    GW_ASSIGN_OR_RETURN(c.arena, sys::MemfdRegion::map(std::move(fds[0]), c.geo.arena_bytes));
    c.sq = std::move(fds[1]);
    c.cq = std::move(fds[2]);
    c.hdr = static_cast<ArenaHeader*>(c.arena.data());
    c.data = static_cast<uint8_t*>(c.arena.data()) + c.geo.data_offset;
    c.sq_ring = RingProducer<SqEntry>(submission_ring(c.arena.data(), c.geo, c.sq.get()));
    c.cq_ring = RingConsumer<CqEntry>(completion_ring(c.arena.data(), c.geo, c.cq.get()));
    return c;
  }

  static Result<RawClient> join(const std::string& path, const Hello& h) {
    return join_raw(path, frame_message(encode_hello(h)));
  }

  // Pushes `e` as is (no check that the ring has room: the overflow tests want that) and signals
  // the eventfd whatever the daemon's polling flag says.
  void post_raw(const SqEntry& e) {
    sq_ring.push(e);
    kick();
  }
  void kick() { ASSERT_TRUE(signal_eventfd(sq.get()).ok()); }
  uint64_t post(SqEntry e) {
    e.seq = seq++;
    post_raw(e);
    return e.seq;
  }
  // The completion of `want`, or kTimeout / kPeer (connection closed).
  Status wait(uint64_t want, int ms = 10000) {
    const auto deadline = sys::deadline_after_ms(ms);
    for (;;) {
      if (cq_ring.posted()) {
        const CqEntry c = cq_ring.front();
        cq_ring.pop();
        Status carried;
        GW_RETURN_IF_ERROR(decode_completion(c, want, &carried));
        return carried;
      }
      if (sys::expired(deadline)) return timeout_error("no completion");
      pollfd p[2] = {{cq.get(), POLLIN, 0}, {sock.get(), POLLIN, 0}};
      ::poll(p, 2, 50);
      if (p[1].revents != 0 && !cq_ring.posted()) {
        return peer_error("daemon closed the connection");
      }
      if (p[0].revents != 0) cq_ring.drain_wake();
    }
  }
  template <typename T>
  T* at(uint64_t off) {
    return reinterpret_cast<T*>(data + off);
  }
};

inline SqEntry allreduce_entry(coll::DataType t, coll::ReduceOp op, uint64_t count, uint64_t s,
                               uint64_t r) {
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(Opcode::kAllreduce);
  e.dtype = static_cast<uint8_t>(t);
  e.op = static_cast<uint8_t>(op);
  e.count = count;
  e.send_off = s;
  e.recv_off = r;
  return e;
}

}  // namespace gw::daemon::test
