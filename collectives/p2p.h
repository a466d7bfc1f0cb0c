// Point-to-point messages of one communicator (gw_send / gw_recv): tagged sends and receives
// between any two ranks, on connections of their own (store keys p2p/<src>/<dst>/<chan>), so
// they never meet the collectives' FIFO matching and may interleave with collectives freely.
//
// Protocol, per ordered pair of ranks: a control connection (channel 0) and a data connection
// (channel 1) each way, set up lazily: a rank's engine starts on its first point-to-point call,
// listens for every peer at once, and connects to a peer when it first sends to it or has to
// answer one of its rendezvous messages (replies travel back on that connection). A rank that
// only receives eager messages from a peer never connects back to it.
// - The sender posts an RTS frame (tag, bytes, id) on its control connection; messages of at
//   most kEagerBytes travel inside it (eager), larger ones follow a CTS (rendezvous), and so does
//   a device buffer's of any size (isend's `mr`: the engine never touches it through the CPU).
// - The receiver matches each RTS, in arrival order, against its posted receives in posting order
//   (source or kAnySource, equal tag); an RTS without a match waits in the unexpected list, which
//   a later receive searches first (in arrival order), so messages of one sender with one tag are
//   received in the order they were sent, eager and rendezvous alike (one control connection).
// - Eager (standard mode): the send completes once its RTS, the payload copied into it, is handed
//   to the transport; nothing comes back. A receive smaller than the message fails alone
//   ("message truncated"). A send to oneself is copied and completes at once.
// - Rendezvous (synchronous): on a match, a message larger than the receive fails the receive and
//   sends NAK (the send then fails too, "message truncated"); else CTS, and its bytes follow on
//   the data connection in CTS order, chunked and pipelined; the receiver ACKs the last chunk and
//   the send completes on that ACK (once its last chunk is sent). A send to oneself waits for
//   its receive.
// - Destruction first posts the queued control frames (eager RTSs that completed, replies),
//   bounded by kFlushMs, so a rank that sends and destroys at once still delivers. A peer's eager
//   messages that arrived before its connections broke stay receivable.
// One progress thread per engine moves everything; every op has the communicator's deadline. A
// transport error or an op that times out after it reached the wire closes that peer's
// connections and fails every op with that peer; abort and destruction fail every op at once.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "collectives/communicator.h"
#include "collectives/connection_pool.h"
#include "collectives/group.h"
#include "core/net/transport.h"
#include "core/status.h"

namespace gw::coll {

inline constexpr int kAnySource = -1;

// How a waiting caller reaches the engine that runs its request (p2p.cc); outlives the engine.
struct P2PDriver;

// An operation started by PointToPoint::isend / irecv; may outlive the engine (it then reports
// kAborted if the engine ended before it did).
class P2PRequest {
 public:
  // Waits up to timeout_ms (-1: until the op ends, which its deadline bounds). kTimeout when it
  // is still running. The waiting thread first moves the engine itself (progress, as the
  // engine's thread would, while that thread stands aside), so that a blocking send or receive
  // costs no thread hand-off: it spins on its own request (GW_SPIN_US, then yields and polls as
  // the progress thread does) instead of sleeping until the progress thread wakes it.
  Status wait(int64_t timeout_ms);
  // Sets *done; when done, returns the op's final status. Not done yet: first moves the engine
  // once in this thread (one non-blocking pass, as a waiting caller's, skipped while another
  // thread moves it), so that a caller polling with test alone costs no thread hand-off either.
  Status test(bool* done);
  // Once done with OK: the bytes received (or sent) and the source rank (receives).
  size_t bytes() const;
  int source() const;

  // Used by the engine: false when it was done already.
  bool finish(Status s, size_t bytes, int source);
  // Used by the engine: the driver a waiting caller moves the engine through.
  void set_driver(std::shared_ptr<P2PDriver> d) { driver_ = std::move(d); }
  bool done() const { return done_flag_.load(std::memory_order_acquire); }
  // An eventfd the op's end writes (1) once done() is true: its owner sleeps in poll() on it
  // instead of on the request (daemon/job_p2p_remote.h). Set right after isend/irecv returned
  // the request; an op that ended before is seen by the owner's next look at done(). The fd
  // must stay open while the engine may end the op (until the engine is destroyed).
  void notify_on_done(int fd) { notify_fd_.store(fd, std::memory_order_seq_cst); }

 private:
  std::shared_ptr<P2PDriver> driver_;
  std::atomic<bool> done_flag_{false};  // done_, readable without mu_ (a driver's spin)
  std::atomic<int> notify_fd_{-1};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  Status status_;
  size_t bytes_ = 0;
  int source_ = -1;
};

struct P2POptions {
  int64_t timeout_ms = 0;
  int64_t spin_us = 50;
  size_t chunk_bytes = 512 * 1024;
};

class PointToPoint {
 public:
  static constexpr size_t kEagerBytes = 16 * 1024;
  struct Impl;  // p2p_engine.h (named here for P2PDriver, which a waiting request moves)

  // `group` and `aborted` must outlive the engine.
  PointToPoint(const Group& group, PoolOptions pool, P2POptions options,
               const std::atomic<bool>* aborted);
  // Ends every pending op with kAborted and closes the connections; returns once no op can
  // write a buffer any more.
  ~PointToPoint();

  // bytes > 0 needs a buffer; peer in [0, size) (irecv: or kAnySource); tag >= 0. The buffer
  // must stay valid until the request is done.
  // `mr` (optional): the buffer is device memory registered with reg_dmabuf on the data
  // connection with `peer` for this direction (the send's, or, for a receive, the one from the
  // sender that matches: a receive from kAnySource with mr is refused). The engine never reads
  // or writes it through the CPU: its message always goes by rendezvous (an RTS without payload,
  // whatever its size), the data connection moves it with mr, in chunks as any; a device send to
  // oneself is refused (kUnsupported), and a device receive matched by an eager message (a host
  // buffer's, at most kEagerBytes) fails (kUnsupported) rather than copy it in.
  Result<std::shared_ptr<P2PRequest>> isend(const void* buf, size_t bytes, int peer, int tag,
                                            net::MemRegion* mr = nullptr);
  Result<std::shared_ptr<P2PRequest>> irecv(void* buf, size_t bytes, int peer, int tag,
                                            net::MemRegion* mr = nullptr);

  // Registers device memory given as a dma-buf (net::Comm::reg_mr_dmabuf: [offset, + bytes) of
  // `fd`, addressed as [iova, + bytes)) on the data connection with `peer`: the one to it (`send`)
  // or the one from it. Waits, until `deadline` (kTimeout naming the peer), for that connection:
  // this rank connects for a send; a receive's is the peer's to make (its first send here).
  // kUnsupported from a transport that cannot register device memory; the peer's connections'
  // failure. The region stays valid until dereg_dmabuf or the engine's end (which frees it with
  // the connection); the engine never reads or writes [iova, + bytes) through the CPU.
  // Thread-safe.
  Result<net::MemRegion*> reg_dmabuf(int peer, bool send, void* iova, size_t bytes, uint64_t offset,
                                     int fd, Deadline deadline);
  // Frees a region reg_dmabuf made with the same peer and direction. OK when the connection it
  // was made on is gone (the region went with it: the usual end when the peer finished first);
  // the transport's error for a region that is not one of that connection's.
  Status dereg_dmabuf(int peer, bool send, net::MemRegion* mr);
  // After a completed receive into [iova, + bytes) of a region reg_dmabuf registered for
  // receives from `peer`: runs the data connection's RecvComm::iflush (verbs: a read back through
  // a loopback queue pair, so the device sees every byte the NIC wrote) and waits for it until
  // `deadline`. True once flushed, false when the connection says nothing needs doing (host
  // memory, GW_IB_GDR_FLUSH=0). kInvalidArg when the connection the region was made on is gone.
  Result<bool> flush_dmabuf(int peer, void* iova, size_t bytes, net::MemRegion* mr,
                            Deadline deadline);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gw::coll
