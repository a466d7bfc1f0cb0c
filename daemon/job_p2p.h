// Point-to-point in gradwired (protocol version 7, docs/wire-daemon.md "Point-to-point"): the
// sends and receives of one job's trainers on this host, matched with direct mode's rules
// (gradwire.h): per (sender, receiver, tag) in the order sent, receives in the order posted,
// GW_ANY_SOURCE, self-send, a receive smaller than its message failing (both sides when the send
// waited for it), eager sends of at most kP2pEagerBytes completing once copied.
//
// The board belongs to a Job and runs on its thread only. A matched message is copied once, from
// the sender's arena (or the eager copy) straight into the receiver's arena. Both trainers must
// be of this host: a peer on another host is refused (kUnsupported) by the client before it posts
// and again here. When the job fails (a trainer left, a collective failed, the daemon stops)
// fail_all() completes every pending send and receive with the failure and forgets them; a
// trainer that leaves is dropped alone (drop_member), so no entry outlives the arena it points
// into.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "core/status.h"
#include "daemon/protocol.h"

namespace gw::daemon {

class P2pBoard {
 public:
  // Completes member `member`'s submission `seq` with a status and, on success, what it moved.
  using Complete =
      std::function<void(size_t member, uint64_t seq, const Status& s, const P2pDone* done)>;
  // rank_of: the job's rank of each member (by local rank); data: each member's data region;
  // host_of_rank: every rank's host (empty: one host); host: this daemon's host index.
  P2pBoard(std::vector<int32_t> rank_of, std::vector<uint8_t*> data,
           std::vector<int32_t> host_of_rank, int32_t host, Complete complete);

  // A decoded send or recv of member `member` (in its submission order).
  void submit(size_t member, const Request& r);
  // Member `member` left (its arena is about to go): its own requests are forgotten, the others'
  // sends to it and receives naming it end with `why` (kPeer), its eager messages stay
  // receivable, and later sends to it or receives naming it (once those are taken) end with `why`
  // at once. The others go on among themselves, as in direct mode.
  void drop_member(size_t member, const Status& why);
  // Completes everything pending with s (the daemon stops, the job ends) and forgets it.
  void fail_all(const Status& s);
  // Sends and receives pending now (gradwirectl, tests).
  size_t pending() const;

 private:
  struct Send {
    size_t member = 0;  // the sender
    uint64_t seq = 0;
    int32_t tag = 0;
    uint64_t off = 0, bytes = 0;
    bool done = false;          // eager: completed already, its bytes in `copy`
    std::vector<uint8_t> copy;  // eager only
  };
  struct Recv {
    size_t member = 0;
    uint64_t seq = 0;
    int32_t source = -1;  // -1: any
    int32_t tag = 0;
    uint64_t off = 0, cap = 0;
  };
  // Moves s into r (or fails both on truncation) and completes them.
  void deliver(Send& s, const Recv& r);
  int32_t member_of(int32_t rank) const;  // -1: not on this host

  std::vector<int32_t> rank_of_;
  std::vector<uint8_t*> data_;
  std::vector<int32_t> host_of_rank_;
  int32_t host_ = 0;
  Complete complete_;
  // By receiving member: messages not yet matched (in arrival order) and receives posted.
  std::vector<std::deque<Send>> unexpected_;
  std::vector<std::deque<Recv>> posted_;
  std::vector<Status> gone_;  // by member: ok while it is here, else why it left
};

}  // namespace gw::daemon
