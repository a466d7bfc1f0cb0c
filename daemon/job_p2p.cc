#include "daemon/job_p2p.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "core/log.h"
#include "daemon/daemon_config.h"
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

void P2pBoard::submit(size_t member, const Request& r, const P2pDevice& dev) {
  const int32_t me = rank_of_[member];
  const bool remote_peer = r.root >= 0 && member_of(r.root) < 0;
  if (dev.mr != nullptr && (!remote_peer || link_ == nullptr)) {
    complete_(member, r.seq,
              Status(Code::kUnsupported,
                     fmt::format("point-to-point: a device buffer goes to or comes from a named "
                                 "rank on another host only (rank {})",
                                 r.root)),
              nullptr);
    return;
  }
  if (r.opcode == Opcode::kSend) {
    const int32_t to = member_of(r.root);
    if (to < 0 && link_ != nullptr) {
      const Status why = link_->reachable(r.root);
      if (why.ok()) {
        link_->forward(member, r, dev);
      } else {
        complete_(member, r.seq, why, nullptr);
      }
      return;
    }
    if (to < 0) {
      const int32_t h = static_cast<size_t>(r.root) < host_of_rank_.size()
                            ? host_of_rank_[static_cast<size_t>(r.root)]
                            : -1;
      complete_(member, r.seq,
                Status(Code::kUnsupported,
                       fmt::format("point-to-point: rank {} is on host {}, not on this daemon's "
                                   "host {}, and this board has no link to the other hosts",
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
    s.src = me;
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
  rv.dev = dev;
  if (rv.source >= 0 && member_of(rv.source) < 0 && link_ == nullptr) {
    complete_(member, r.seq,
              Status(Code::kUnsupported,
                     fmt::format("point-to-point: rank {} is not on this daemon's host {}, and "
                                 "this board has no link to the other hosts",
                                 rv.source, host_)),
              nullptr);
    return;
  }
  if (link_ != nullptr && (rv.source < 0 || member_of(rv.source) < 0)) link_->touch();
  auto& waiting = unexpected_[member];
  for (auto it = waiting.begin(); it != waiting.end(); ++it) {
    if ((rv.source == -1 || rv.source == it->src) && it->tag == rv.tag) {
      Send s = std::move(*it);
      waiting.erase(it);
      if (s.remote) {
        take_remote(s, rv);
      } else {
        deliver(s, rv);
      }
      return;
    }
  }
  if (rv.source >= 0) {
    const int32_t from = member_of(rv.source);
    const Status why = from >= 0 ? gone_[static_cast<size_t>(from)] : link_->reachable(rv.source);
    if (!why.ok()) {
      complete_(member, r.seq, why, nullptr);
      return;
    }
  }
  posted_[member].push_back(rv);
}

void P2pBoard::deliver(Send& s, const Recv& r) {
  const int32_t from = s.src;
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
  // Its own receives and the messages waiting for it: the others' sends to it end, and so do
  // those of other hosts whose bytes still wait at their sender (device messages).
  std::deque<Send> waiting = std::move(unexpected_[member]);
  unexpected_[member].clear();
  for (const Send& x : waiting) {
    if (!x.done && x.member != member) complete_(x.member, x.seq, gone_[member], nullptr);
  }
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
  refuse_held(waiting, peer_error("rank {} is gone: it left before receiving the message", rank));
}

void P2pBoard::refuse_held(const std::deque<Send>& q, const Status& why) {
  if (link_ == nullptr) return;
  for (const Send& x : q) {
    if (x.remote && x.remote->device && !x.remote->claimed) link_->refuse_device(*x.remote, why);
  }
}

void P2pBoard::fail_all(const Status& s) {
  std::deque<Send> held;
  for (auto& q : unexpected_) {
    for (Send& x : q) {
      if (!x.done) complete_(x.member, x.seq, s, nullptr);
      if (x.remote && x.remote->device) held.push_back(std::move(x));
    }
    q.clear();
  }
  for (auto& q : posted_) {
    for (const Recv& x : q) complete_(x.member, x.seq, s, nullptr);
    q.clear();
  }
  refuse_held(held, s);
}

// ---- messages of other hosts ----

bool P2pBoard::take_posted(size_t dst, int32_t src, int32_t tag, Recv* out) {
  auto& posted = posted_[dst];
  for (auto it = posted.begin(); it != posted.end(); ++it) {
    if ((it->source == -1 || it->source == src) && it->tag == tag) {
      *out = *it;
      posted.erase(it);
      return true;
    }
  }
  return false;
}

void P2pBoard::add_remote(size_t dst, int32_t src, int32_t tag, std::shared_ptr<P2pRemoteMsg> msg) {
  Send s;
  s.member = static_cast<size_t>(-1);
  s.src = src;
  s.tag = tag;
  s.bytes = msg->bytes.size();
  s.done = true;  // its sender's daemon completed it
  s.remote = std::move(msg);
  unexpected_[dst].push_back(std::move(s));
}

void P2pBoard::take_remote(Send& s, const Recv& r) {
  P2pRemoteMsg& m = *s.remote;
  if (!m.device && r.dev.mr != nullptr && !m.bytes.empty()) {
    // A host buffer's message, which this daemon holds in CPU memory: never written into a
    // device buffer through the CPU. It is consumed (per-tag order holds) and the receive fails.
    complete_(r.member, r.seq,
              Status(Code::kUnsupported,
                     fmt::format("point-to-point: rank {} sent {} bytes from a host buffer (tag "
                                 "{}); a device receive takes device messages only",
                                 m.src, m.bytes.size(), m.tag)),
              nullptr);
    return;
  }
  m.claimed = true;
  m.member = r.member;
  m.seq = r.seq;
  m.off = r.off;
  m.cap = r.cap;
  m.dev = r.dev;
  if (m.device) {
    link_->claim_device(s.remote);
    return;
  }
  if (m.landed) landed(m);
}

void P2pBoard::landed(P2pRemoteMsg& m) {
  m.landed = true;
  if (!m.claimed) return;
  m.claimed = false;
  const uint64_t n = m.bytes.size();
  if (!m.failed.ok()) {
    complete_(m.member, m.seq, m.failed, nullptr);
  } else if (n > m.cap) {
    complete_(m.member, m.seq,
              truncated_error("point-to-point: message truncated: rank {} sent {} bytes, the "
                              "receive holds {} (tag {}; from another host)",
                              m.src, n, m.cap, m.tag),
              nullptr);
  } else {
    if (n > 0 && data_[m.member] != nullptr)
      std::memcpy(data_[m.member] + m.off, m.bytes.data(), n);
    const P2pDone got{n, m.src};
    complete_(m.member, m.seq, ok_status(), &got);
  }
}

void P2pBoard::fail_receives_from(const std::function<bool(int32_t)>& pred, const Status& s) {
  for (auto& q : posted_) {
    for (auto it = q.begin(); it != q.end();) {
      if (it->source >= 0 && pred(it->source)) {
        complete_(it->member, it->seq, s, nullptr);
        it = q.erase(it);
      } else {
        ++it;
      }
    }
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
  if (!comm || host_of_rank.empty() || first.num_hosts < 2) return;
  RemoteP2p::Options o;
  o.comm = comm.get();
  o.host = first.host_index;
  o.host_of_rank = host_of_rank;
  o.unexpected_max = static_cast<uint64_t>(
      std::max<int64_t>(0, config::get_int(daemon_config::kP2pUnexpectedMax)));
  o.wake_fd = wake.get();
  o.job_mu = &p2p_mu;
  o.in_collective = &in_collective;
  o.keep = [this](size_t m) -> std::shared_ptr<void> {
    return m < members.size() ? members[m] : nullptr;
  };
  remote = std::make_unique<RemoteP2p>(std::move(o), p2p.get());
  p2p->set_link(remote.get());
  const Status s = remote->start();
  if (!s.ok()) GW_LOG_WARN("gradwired: point-to-point across hosts: {}", s.message());
}

}  // namespace gw::daemon
