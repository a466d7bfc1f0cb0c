// Point-to-point between trainers of different hosts in daemon mode (docs/wire-daemon.md,
// "Point-to-point across hosts"): the link of a job's P2pBoard to the job's other daemons, over
// the daemons' communicator's own point-to-point (collectives/p2p.h), on one reserved tag.
//
// - A send to a rank of host B: this daemon sends B's daemon a 32-byte header (p2p_xhost_wire.h)
//   and then the payload straight from the sender's arena (no copy here); a payload of at most
//   kXhostInlineBytes (4 KiB) is copied behind the header instead and goes in the same daemon
//   message, so that a small message costs one send here and one hand-off there. The trainer's send
//   completes once the daemons' send did: at most 16 KiB (the communicator's eager size) once it
//   is on the wire, more once B's daemon took the bytes (into the receiving trainer's arena or its
//   unexpected buffer). Like a buffered send, it does not wait for the receiving trainer.
// - From every other host a header receive stays posted (per source host, so that the payload
//   receive, posted before the next header receive, takes the bytes that follow the header). On a
//   header: a matching receive posted on the board (same rules: per (sender, receiver, tag)
//   order, receives in posting order, GW_ANY_SOURCE) gets the payload straight into its arena
//   (an inline one is copied there from the header's receive, and completes at once);
//   a receive smaller than the message fails naming both sizes, and the bytes are refused to the
//   sending daemon (a zero-byte receive), so a send over 16 KiB fails as in direct mode's
//   rendezvous; an eager one has completed already. Without a matching receive the payload lands
//   in an unexpected buffer, which later receives take in arrival order. The unexpected buffers of
//   the job hold at most GW_DAEMON_P2P_UNEXPECTED_MAX bytes: beyond it the job's point-to-point
//   fails (every pending send and receive, and every later one across hosts) with an error naming
//   the cap; the refused message's bytes are not taken.
// - Faults: an op with host B that fails (B's daemon gone, the job's communicator aborted because
//   a trainer left or a collective failed) makes B unreachable: receives pending naming B's ranks
//   and later sends to them end with kPeer; a stop completes everything pending at once.
// - A usual end: when the job ends on this daemon because a trainer left on purpose, say_goodbye()
//   sends a goodbye (kXhostBye) to every daemon it exchanged headers with, before the job's
//   communicator goes. The goodbye is the last header on the pair's stream, after every message
//   sent before it: B's daemon then makes this host unreachable as above (its messages already
//   there stay receivable), posts no more header receives from it (so the connections' close
//   that follows finds nothing pending: no warning), and peer_left() tells its job, which ends
//   there too (docs/wire-daemon.md, "Point-to-point across hosts"). B's daemon answers at once
//   with a goodbye of its own (unless it sent one already), the last header of its stream, and
//   this daemon waits for that answer (bounded) before its connections close: whatever B sent
//   before it (a hello or a message that crossed this goodbye, B's connection to here still
//   being made) is here first, so neither daemon's close finds the other's op pending.
//
// Job thread only (under Options::job_mu). Every op's request writes the job's wake eventfd when
// it ends (P2PRequest::notify_on_done), from whichever thread moved the engine, so the job thread
// sleeps in its own poll() without periodic looks and calls progress() when woken; while it spins
// it also moves the engine itself (poke). A waker thread moves the engine meanwhile: it sleeps on
// one pending request (the engine's progress thread looks at a receive nobody waits on only every
// millisecond, collectives/p2p.h) and looks at the others between waits; while the job thread runs
// a collective, it calls progress() itself (try_lock on job_mu), else signals the eventfd.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/p2p.h"
#include "daemon/job_p2p.h"
#include "daemon/p2p_xhost_wire.h"

namespace gw::daemon {

class RemoteP2p : public P2pRemoteLink {
 public:
  struct Options {
    coll::Communicator* comm = nullptr;  // the daemons' (rank = host index)
    int32_t host = 0;
    std::vector<int32_t> host_of_rank;
    uint64_t unexpected_max = 0;  // GW_DAEMON_P2P_UNEXPECTED_MAX
    int wake_fd = -1;             // the job's wake eventfd
    // Holds member m's arena mapped while an op points into it (the Trainer).
    std::function<std::shared_ptr<void>(size_t)> keep;
    // The job thread holds *job_mu but while it runs a collective (*in_collective set): the
    // waker then moves the ops itself (try_lock), so that a message that comes meanwhile is
    // taken (a cross-host send completes once this daemon has it, whatever its trainers do).
    std::mutex* job_mu = nullptr;
    const std::atomic<bool>* in_collective = nullptr;
  };
  RemoteP2p(Options o, P2pBoard* board);
  ~RemoteP2p() override;  // joins the waker; call after the communicator ended its ops

  // Posts the header receives from every other host and starts the waker.
  Status start();
  // The first send or receive that may cross hosts: says hello to every other daemon (once).
  void touch() override;
  void forward(size_t member, const Request& r, const P2pDevice& dev) override;
  void claim_device(std::shared_ptr<P2pRemoteMsg> msg) override;
  void refuse_device(const P2pRemoteMsg& msg, const Status& why) override;
  Status reachable(int32_t rank) const override;
  // Job thread: handles every op done since, then tells the waker what is pending now.
  void progress();
  // Completes every pending send with s; the ops stay until the communicator ends them.
  void fail_all(const Status& s);
  // The job ends here because rank `rank` left on purpose: sends a goodbye to every reachable
  // daemon it exchanged headers with (and did not answer already), and waits (up to wait_ms in
  // all) until the communicator took each, so that the abort or destruction that follows still
  // delivers it, and then until each of those daemons answered with its goodbye (or went).
  // Moves the ops meanwhile (progress()). Once per job; nothing is sent across hosts after it.
  void say_goodbye(int32_t rank, int64_t wait_ms);
  // Waits (up to wait_ms) until the communicator took the refusals (refuse_device) and the
  // answers to other daemons' goodbyes sent since the last call, so that an abort that follows
  // still delivers them.
  void flush_replies(int64_t wait_ms);
  // Not ok once another daemon said goodbye: why (kPeer, naming the rank that left on purpose).
  const Status& peer_left() const { return peer_left_; }
  // That rank (-1 before).
  int32_t peer_left_rank() const { return peer_left_rank_; }
  // Stops the waker (before the communicator goes).
  void shutdown();
  // Set by the waker when an op is done (the job thread's spin looks at it).
  bool fired() const { return fired_.load(std::memory_order_acquire); }
  // Whether any op is done (the job thread's spin looks at it: a header that lands then needs no
  // wake-up).
  bool any_done() const;
  // Job thread, while it spins: one non-blocking pass of the engine in this thread
  // (P2PRequest::test) through a pending op, then any_done(). A header or a send's end that
  // lands while the job thread spins is then seen here, not after the waker's wake-up (a thread
  // hand-off on a loaded core); skipped inside the engine while the waker is moving it.
  bool poke();
  size_t unexpected_bytes() const { return *used_; }

 private:
  enum class Kind { kHeader, kHello, kBye, kRefuse, kSend, kPayloadArena, kPayloadBuffer, kDrain };
  struct Op {
    Kind kind = Kind::kHeader;
    int32_t host = 0;  // the other daemon
    std::shared_ptr<coll::P2PRequest> req, payload;
    // A header (kHeader: room for an inline payload too; kSend: with its inline payload).
    std::vector<uint8_t> hdr;
    // kSend / kPayloadArena: the trainer's request (and its arena, held).
    size_t member = 0;
    uint64_t seq = 0;
    bool completed = false;  // the trainer's request was answered (fail_all)
    XhostHeader h;
    std::shared_ptr<void> keep;
    // A device buffer's registration (P2pDevice::keep), held until the communicator ended the op.
    std::shared_ptr<void> dev_keep;
    std::shared_ptr<P2pRemoteMsg> msg;  // kPayloadBuffer
  };
  bool done(const Op& op) const;
  std::shared_ptr<coll::P2PRequest> arm(std::shared_ptr<coll::P2PRequest> r) const;
  // Returns false when the op is still running.
  bool finish(Op& op);
  void on_header(Op& op);
  Status post_header(int32_t host);
  // A hello or goodbye header (flags, src) to `host`'s daemon, as an op: nullptr when the send
  // could not start (the host is then down).
  Op* send_control(int32_t host, Kind kind, uint16_t flags, int32_t src);
  Op* send_header(int32_t host, Kind kind, const XhostHeader& h);
  // The device message h from `host`, which no receive here will take: a refusal header
  // (kXhostRefuse) to its sender's daemon, then its rendezvous refused (a receive of 0 bytes).
  void refuse(int32_t host, const XhostHeader& h, const Status& why);
  // A device send that its receiving daemon refused (the communicator's "truncated") and whose
  // trainer is not answered yet: handled after every header that came (a refusal's reason).
  bool refused_late(const Op& op) const;
  void post_drain(int32_t host, uint64_t bytes, int tag = kXhostTag);
  // A receive (member, seq) that matched h, a device message from `host`: its payload, from
  // the rendezvous on h.payload_tag into dev (or the arena at off), or its refusal.
  void fetch_device(int32_t host, const XhostHeader& h, size_t member, uint64_t seq, uint64_t off,
                    uint64_t cap, const P2pDevice& dev);
  void host_down(int32_t host, const Status& why);
  void fail_p2p(const Status& why);
  void publish();
  void waker_loop();

  Options o_;
  P2pBoard* board_;
  int32_t world_ = 0;
  std::list<Op> ops_;
  std::vector<Status> down_;  // by host: ok while reachable
  Status failed_;             // the job's cross-host point-to-point failed (the cap)
  bool said_hello_ = false;   // touch()
  bool said_bye_ = false;     // say_goodbye()
  std::vector<bool> linked_;  // by host: a hello went there or a header came from there
  std::vector<bool> bye_to_;  // by host: a goodbye (or an answer to its goodbye) went there
  std::vector<int32_t> next_payload_tag_;  // by host: the next device message's payload tag
  // Refusals' and goodbye answers' sends, until flushed.
  std::vector<std::shared_ptr<coll::P2PRequest>> replies_;
  Status peer_left_;  // a goodbye came (the first)
  int32_t peer_left_rank_ = -1;
  std::shared_ptr<uint64_t> used_ = std::make_shared<uint64_t>(0);

  std::thread waker_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<coll::P2PRequest>> watch_;  // active ops first
  size_t watch_active_ = 0;
  uint64_t gen_ = 0;
  bool quit_ = false;
  std::atomic<bool> fired_{false};
};

}  // namespace gw::daemon
