// Point-to-point in gradwired (protocol version 7, docs/wire-daemon.md "Point-to-point"): the
// sends and receives of one job's trainers on this host, matched with direct mode's rules
// (gradwire.h): per (sender, receiver, tag) in the order sent, receives in the order posted,
// GW_ANY_SOURCE, self-send, a receive smaller than its message failing (both sides when the send
// waited for it), eager sends of at most kP2pEagerBytes completing once copied.
//
// The board belongs to a Job and runs on its thread only. A matched message is copied once, from
// the sender's arena (or the eager copy) straight into the receiver's arena. A peer on another
// host goes through a P2pRemoteLink (daemon/job_p2p_remote.h: the job's daemon communicator);
// without one (a board alone) it is refused with kUnsupported. Messages from other hosts join the
// same queues (Send::remote), so the matching rules hold across hosts. When the job fails (a
// trainer left, a collective failed, the daemon stops) fail_all() completes every pending send and
// receive with the failure and forgets them; a trainer that leaves is dropped alone (drop_member),
// so no entry outlives the arena it points into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "core/status.h"
#include "daemon/protocol.h"

namespace gw::net {
class MemRegion;
}

namespace gw::daemon {

// A send's or receive's device buffer (version 8: a dma-buf registration, job_dmabuf.cc): the
// region registered on the daemons' data connection with the peer's host, and the address the
// registration knows the buffer's first byte by (never mapped: only the NIC reaches it).
struct P2pDevice {
  net::MemRegion* mr = nullptr;  // null: a host buffer (the trainer's data region)
  uint8_t* at = nullptr;
  // The registration (DmabufRegistration), held by whatever holds this until the communicator is
  // done with the op: mr stays registered and `at` reserved meanwhile, whoever deregisters.
  std::shared_ptr<void> keep;
};

// A message of another host: its bytes (in the unexpected buffer) and, once a receive took it
// before they landed, that receive. `used` counts the job's unexpected bytes held (the cap).
// The unexpected buffer: left uninitialised (its payload is received or copied over it whole; a
// zero-filled vector cost a memset of every message that came before its receive).
class UnexpectedBytes {
 public:
  explicit UnexpectedBytes(uint64_t n)
      : p_(n == 0 ? nullptr : std::make_unique_for_overwrite<uint8_t[]>(n)), n_(n) {}
  uint8_t* data() { return p_.get(); }
  const uint8_t* data() const { return p_.get(); }
  uint64_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  uint8_t* begin() { return p_.get(); }
  uint8_t* end() { return p_.get() + n_; }

 private:
  std::unique_ptr<uint8_t[]> p_;
  uint64_t n_;
};

struct P2pRemoteMsg {
  P2pRemoteMsg(uint64_t n, std::shared_ptr<uint64_t> u) : bytes(n), used(std::move(u)) {
    *used += n;
  }
  ~P2pRemoteMsg() { *used -= bytes.size(); }
  UnexpectedBytes bytes;
  std::shared_ptr<uint64_t> used;
  int32_t src = 0, tag = 0;
  bool landed = false;  // the payload is in `bytes` (or failed)
  Status failed;
  bool claimed = false;  // a receive took it before it landed: the fields below
  size_t member = 0;
  uint64_t seq = 0, off = 0, cap = 0;
  P2pDevice dev;  // the receive's device buffer (mr null: its arena)
  // A device message (kXhostDevice): its payload stays with the sending daemon until a receive
  // takes it (nothing lands in `bytes`), then comes on its own tag from that host.
  bool device = false;
  uint64_t size = 0;
  int32_t host = 0, payload_tag = 0;
  int32_t dst = 0;  // the receiving rank its header named
};

// The board's way to the job's other hosts (implemented by RemoteP2p).
class P2pRemoteLink {
 public:
  virtual ~P2pRemoteLink() = default;
  // A send or receive that may cross hosts is submitted (a receive naming a rank of another
  // host, or any source): the link gets ready to see the other hosts go.
  virtual void touch() = 0;
  // Sends member's send r (to a rank of another host) on; completes it later. dev.mr: from a
  // device buffer.
  virtual void forward(size_t member, const Request& r, const P2pDevice& dev) = 0;
  // A receive (msg's claim fields) took a device message: its payload is fetched now.
  virtual void claim_device(std::shared_ptr<P2pRemoteMsg> msg) = 0;
  // A device message held for a receive that will never come (its trainer left, the job's
  // point-to-point failed): its rendezvous is refused, so that the sender fails now, with `why`.
  virtual void refuse_device(const P2pRemoteMsg& msg, const Status& why) = 0;
  // ok while ranks of `rank`'s host can be reached; else why not (pending receives end with it).
  virtual Status reachable(int32_t rank) const = 0;
};

class P2pBoard {
 public:
  // Completes member `member`'s submission `seq` with a status and, on success, what it moved.
  using Complete =
      std::function<void(size_t member, uint64_t seq, const Status& s, const P2pDone* done)>;
  // rank_of: the job's rank of each member (by local rank); data: each member's data region;
  // host_of_rank: every rank's host (empty: one host); host: this daemon's host index.
  P2pBoard(std::vector<int32_t> rank_of, std::vector<uint8_t*> data,
           std::vector<int32_t> host_of_rank, int32_t host, Complete complete);

  // A decoded send or recv of member `member` (in its submission order); dev.mr: its buffer is
  // a device buffer (r.dmabuf's registration, resolved by the job), which only a peer on another
  // host can send to or receive from (a device receive taking a host message of bytes fails
  // kUnsupported: the daemon never writes a device buffer through the CPU).
  void submit(size_t member, const Request& r, const P2pDevice& dev = {});
  // Member `member` left (its arena is about to go): its own requests are forgotten, the others'
  // sends to it and receives naming it end with `why` (kPeer), its eager messages stay
  // receivable, and later sends to it or receives naming it (once those are taken) end with `why`
  // at once; device messages of other hosts held for it are refused (the link's refuse_device),
  // so their senders fail now. The others go on among themselves, as in direct mode.
  void drop_member(size_t member, const Status& why);
  // Completes everything pending with s (the daemon stops, the job ends) and forgets it; held
  // device messages of other hosts are refused.
  void fail_all(const Status& s);
  // Sends and receives pending now (gradwirectl, tests).
  size_t pending() const;

  struct Recv {
    size_t member = 0;
    uint64_t seq = 0;
    int32_t source = -1;  // -1: any
    int32_t tag = 0;
    uint64_t off = 0, cap = 0;
    P2pDevice dev;  // mr null: into the arena
  };
  // ---- for the link to other hosts (job thread) ----
  void set_link(P2pRemoteLink* link) { link_ = link; }
  int32_t member_of(int32_t rank) const;  // -1: not on this host
  int32_t rank_of(size_t member) const { return rank_of_[member]; }
  uint8_t* data(size_t member) const { return data_[member]; }  // null once it left
  // A message from rank src (another host) to member dst arrived: the posted receive it matches
  // (taken off the board) and true, or false (then add it with add_remote).
  bool take_posted(size_t dst, int32_t src, int32_t tag, Recv* out);
  // Queues it as unexpected for dst, in arrival order.
  void add_remote(size_t dst, int32_t src, int32_t tag, std::shared_ptr<P2pRemoteMsg> msg);
  // Its payload landed (or failed): a receive that claimed it gets it now.
  void landed(P2pRemoteMsg& msg);
  // Receives posted naming a rank for which pred holds end with s (a host that is gone).
  void fail_receives_from(const std::function<bool(int32_t)>& pred, const Status& s);
  void complete(size_t member, uint64_t seq, const Status& s, const P2pDone* d) {
    complete_(member, seq, s, d);
  }

 private:
  struct Send {
    size_t member = 0;  // the sender (a message of another host: none)
    int32_t src = 0;    // its rank
    uint64_t seq = 0;
    int32_t tag = 0;
    uint64_t off = 0, bytes = 0;
    bool done = false;                     // eager (or of another host): completed already
    std::vector<uint8_t> copy;             // eager only
    std::shared_ptr<P2pRemoteMsg> remote;  // of another host
  };
  // Moves s into r (or fails both on truncation) and completes them.
  void deliver(Send& s, const Recv& r);
  // r takes a message of another host (now, or once it lands).
  void take_remote(Send& s, const Recv& r);
  // The device messages of other hosts in q, which no receive will take: refused (the link).
  void refuse_held(const std::deque<Send>& q, const Status& why);

  std::vector<int32_t> rank_of_;
  std::vector<uint8_t*> data_;
  std::vector<int32_t> host_of_rank_;
  int32_t host_ = 0;
  Complete complete_;
  P2pRemoteLink* link_ = nullptr;
  // By receiving member: messages not yet matched (in arrival order) and receives posted.
  std::vector<std::deque<Send>> unexpected_;
  std::vector<std::deque<Recv>> posted_;
  std::vector<Status> gone_;  // by member: ok while it is here, else why it left
};

}  // namespace gw::daemon
