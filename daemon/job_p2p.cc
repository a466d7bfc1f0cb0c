#include "daemon/job_p2p.h"

#include <cstring>
#include <memory>
#include <utility>

#include "daemon/job.h"

namespace gw::daemon {

P2pBoard::P2pBoard(std::vector<int32_t> rank_of, std::vector<uint8_t*> data,
                   std::vector<int32_t> host_of_rank, int32_t host, Complete complete)
    : rank_of_(std::move(rank_of)),
      data_(std::move(data)),
      host_of_rank_(std::move(host_of_rank)),
      host_(host),
      complete_(std::move(complete)),
      unexpected_(rank_of_.size()),
      posted_(rank_of_.size()),
      gone_(rank_of_.size()) {}

int32_t P2pBoard::member_of(int32_t rank) const {
  for (size_t m = 0; m < rank_of_.size(); ++m) {
    if (rank_of_[m] == rank) return static_cast<int32_t>(m);
  }
  return -1;
}

size_t P2pBoard::pending() const {
  size_t n = 0;
  for (const auto& q : unexpected_) n += q.size();
  for (const auto& q : posted_) n += q.size();
  return n;
}

void P2pBoard::submit(size_t member, const Request& r) {
  const int32_t me = rank_of_[member];
  if (r.opcode == Opcode::kSend) {
    const int32_t to = member_of(r.root);
    if (to < 0) {
      const int32_t h = static_cast<size_t>(r.root) < host_of_rank_.size()
                            ? host_of_rank_[static_cast<size_t>(r.root)]
                            : -1;
      complete_(member, r.seq,
                Status(Code::kUnsupported,
                       fmt::format("point-to-point: rank {} is on host {}, not on this daemon's "
                                   "host {}: daemon mode carries sends and receives only "
                                   "between trainers of one host yet",
                                   r.root, h, host_)),
                nullptr);
      return;
    }
    if (!gone_[static_cast<size_t>(to)].ok()) {
      complete_(member, r.seq, gone_[static_cast<size_t>(to)], nullptr);
      return;
    }
    Send s;
    s.member = member;
    s.seq = r.seq;
    s.tag = r.tag;
    s.off = r.send_off;
    s.bytes = r.send_bytes;
    auto& posted = posted_[static_cast<size_t>(to)];
    for (auto it = posted.begin(); it != posted.end(); ++it) {
      if ((it->source == -1 || it->source == me) && it->tag == s.tag) {
        const Recv rv = *it;
        posted.erase(it);
        deliver(s, rv);
        return;
      }
    }
    if (s.bytes <= kP2pEagerBytes) {
      // Eager: the daemon keeps a copy and the sender's buffer is free at once.
      s.copy.assign(data_[member] + s.off, data_[member] + s.off + s.bytes);
      s.done = true;
      const P2pDone d{s.bytes, me};
      complete_(member, s.seq, ok_status(), &d);
    }
    unexpected_[static_cast<size_t>(to)].push_back(std::move(s));
    return;
  }
  Recv rv;
  rv.member = member;
  rv.seq = r.seq;
  rv.source = r.root;
  rv.tag = r.tag;
  rv.off = r.recv_off;
  rv.cap = r.recv_bytes;
  if (rv.source >= 0 && member_of(rv.source) < 0) {
    complete_(member, r.seq,
              Status(Code::kUnsupported,
                     fmt::format("point-to-point: rank {} is not on this daemon's host {}: daemon "
                                 "mode carries sends and receives only between trainers of one "
                                 "host yet",
                                 rv.source, host_)),
              nullptr);
    return;
  }
  auto& waiting = unexpected_[member];
  for (auto it = waiting.begin(); it != waiting.end(); ++it) {
    if ((rv.source == -1 || rv.source == rank_of_[it->member]) && it->tag == rv.tag) {
      Send s = std::move(*it);
      waiting.erase(it);
      deliver(s, rv);
      return;
    }
  }
  if (rv.source >= 0) {
    const size_t from = static_cast<size_t>(member_of(rv.source));
    if (!gone_[from].ok()) {
      complete_(member, r.seq, gone_[from], nullptr);
      return;
    }
  }
  posted_[member].push_back(rv);
}

void P2pBoard::deliver(Send& s, const Recv& r) {
  const int32_t from = rank_of_[s.member];
  const int32_t to = rank_of_[r.member];
  if (s.bytes > r.cap) {
    complete_(r.member, r.seq,
              invalid_arg("point-to-point: message truncated: rank {} sent {} bytes with tag {}, "
                          "more than the receive's {} bytes",
                          from, s.bytes, s.tag, r.cap),
              nullptr);
    if (!s.done && s.bytes <= kP2pEagerBytes) {
      // An eager send completes whatever its receive makes of it (direct mode's rule).
      const P2pDone sent{s.bytes, from};
      complete_(s.member, s.seq, ok_status(), &sent);
    } else if (!s.done) {
      complete_(s.member, s.seq,
                invalid_arg("point-to-point: message truncated: the receive for tag {} on rank "
                            "{} has {} bytes, less than the message's {}",
                            s.tag, to, r.cap, s.bytes),
                nullptr);
    }
    return;
  }
  const uint8_t* src = s.done ? s.copy.data() : data_[s.member] + s.off;
  if (s.bytes > 0) std::memmove(data_[r.member] + r.off, src, s.bytes);
  const P2pDone got{s.bytes, from};
  complete_(r.member, r.seq, ok_status(), &got);
  if (!s.done) {
    const P2pDone sent{s.bytes, from};
    complete_(s.member, s.seq, ok_status(), &sent);
  }
}

void P2pBoard::drop_member(size_t member, const Status& why) {
  if (member >= gone_.size() || !gone_[member].ok()) return;
  gone_[member] = why.ok() ? peer_error("rank {} left the job", rank_of_[member]) : why;
  const int32_t rank = rank_of_[member];
  // Its own receives and the messages waiting for it: the others' sends to it end.
  for (const Send& x : unexpected_[member]) {
    if (!x.done && x.member != member) complete_(x.member, x.seq, gone_[member], nullptr);
  }
  unexpected_[member].clear();
  posted_[member].clear();
  for (size_t m = 0; m < rank_of_.size(); ++m) {
    if (m == member) continue;
    // Its messages to the others: eager ones stay (copied), the others pointed into its arena.
    auto& q = unexpected_[m];
    for (auto it = q.begin(); it != q.end();) {
      it = (it->member == member && !it->done) ? q.erase(it) : it + 1;
    }
    // Receives naming it end, unless one of its eager messages is there for them.
    auto& r = posted_[m];
    for (auto it = r.begin(); it != r.end();) {
      if (it->source == rank) {
        complete_(it->member, it->seq, gone_[member], nullptr);
        it = r.erase(it);
      } else {
        ++it;
      }
    }
  }
  data_[member] = nullptr;
}

void P2pBoard::fail_all(const Status& s) {
  for (auto& q : unexpected_) {
    for (const Send& x : q) {
      if (!x.done) complete_(x.member, x.seq, s, nullptr);
    }
    q.clear();
  }
  for (auto& q : posted_) {
    for (const Recv& x : q) complete_(x.member, x.seq, s, nullptr);
    q.clear();
  }
}

// ---- the job's side ----

void Job::make_p2p() {
  std::vector<int32_t> rank_of;
  std::vector<uint8_t*> data;
  for (const auto& m : members) {
    rank_of.push_back(m ? m->hello.rank : -1);
    data.push_back(m ? m->data : nullptr);
  }
  p2p = std::make_unique<P2pBoard>(
      std::move(rank_of), std::move(data), host_of_rank, first.host_index,
      [this](size_t member, uint64_t seq, const Status& s, const P2pDone* d) {
        if (member >= members.size() || !members[member]) return;
        if (s.ok() && d != nullptr) {
          const CompressedDone wire = p2p_wire(*d);
          complete(*members[member], seq, s, &wire);
        } else {
          complete(*members[member], seq, s);
        }
      });
}

}  // namespace gw::daemon
