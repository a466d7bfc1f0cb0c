#include "daemon/job_p2p_remote.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "core/log.h"
#include "core/sys/time.h"
#include "daemon/ring.h"

namespace gw::daemon {

namespace {
// The communicator's "message truncated" (collectives/p2p.h): a receive smaller than its message.
bool truncated(const Status& s) { return s.truncated(); }
// The most a header may announce: far beyond any arena (GW_DAEMON_MAX_ARENA), a guard only.
constexpr uint64_t kMaxXhostBytes = 1ull << 40;
}  // namespace

RemoteP2p::RemoteP2p(Options o, P2pBoard* board)
    : o_(std::move(o)), board_(board), world_(static_cast<int32_t>(o_.host_of_rank.size())) {
  int32_t hosts = 0;
  for (int32_t h : o_.host_of_rank) hosts = std::max(hosts, h + 1);
  down_.assign(static_cast<size_t>(hosts), ok_status());
  linked_.assign(static_cast<size_t>(hosts), false);
  bye_to_.assign(static_cast<size_t>(hosts), false);
  next_payload_tag_.assign(static_cast<size_t>(hosts), kXhostDeviceTagFirst);
}

RemoteP2p::~RemoteP2p() { shutdown(); }

std::shared_ptr<coll::P2PRequest> RemoteP2p::arm(std::shared_ptr<coll::P2PRequest> r) const {
  // Its end wakes the job thread straight from whichever thread moved the engine (its progress
  // thread, the job thread's own spin, the waker): no look by the waker in between.
  r->notify_on_done(o_.wake_fd);
  return r;
}

Status RemoteP2p::start() {
  // Header receives only: this daemon's handles are in the store from now on, so a daemon that
  // sends here later connects at once; no connection is made while the job sends nothing across.
  for (int32_t h = 0; h < static_cast<int32_t>(down_.size()); ++h) {
    if (h != o_.host) (void)post_header(h);
  }
  waker_ = std::thread([this] { waker_loop(); });
  publish();
  for (const Status& s : down_) {
    if (!s.ok()) return s;
  }
  return ok_status();
}

void RemoteP2p::touch() {
  if (said_hello_ || said_bye_) return;
  said_hello_ = true;
  // The hellos, at the job's first send or receive that may cross hosts: the connections with
  // every other daemon exist from then on, so one going is seen at once (its pending receives
  // end with kPeer, not at the deadline). Jobs without cross-host point-to-point never connect.
  for (int32_t h = 0; h < static_cast<int32_t>(down_.size()); ++h) {
    if (h == o_.host || !down_[static_cast<size_t>(h)].ok()) continue;
    if (send_control(h, Kind::kHello, kXhostHello, 0) != nullptr) {
      linked_[static_cast<size_t>(h)] = true;
    }
  }
  publish();
}

RemoteP2p::Op* RemoteP2p::send_control(int32_t host, Kind kind, uint16_t flags, int32_t src) {
  XhostHeader h;
  h.flags = flags;
  h.src = src;
  return send_header(host, kind, h);
}

RemoteP2p::Op* RemoteP2p::send_header(int32_t host, Kind kind, const XhostHeader& h) {
  Op& op = ops_.emplace_back();
  op.kind = kind;
  op.host = host;
  op.h = h;
  const auto hdr = encode_xhost_header(op.h);
  op.hdr.assign(hdr.begin(), hdr.end());
  auto q = o_.comm->isend(op.hdr.data(), op.hdr.size(), host, kXhostTag);
  if (!q.ok()) {
    ops_.pop_back();
    host_down(host, q.status());
    return nullptr;
  }
  op.req = arm(*q);
  return &op;
}

void RemoteP2p::say_goodbye(int32_t rank, int64_t wait_ms) {
  if (said_bye_) return;
  said_bye_ = true;
  std::vector<std::shared_ptr<coll::P2PRequest>> sent;
  std::vector<int32_t> told;
  for (int32_t h = 0; h < static_cast<int32_t>(down_.size()); ++h) {
    // Only where the pair's connections exist: a job without cross-host point-to-point connects
    // to nobody for its goodbye (its daemons see the end at their next collective). A daemon
    // whose goodbye came first was answered then (on_header).
    const size_t i = static_cast<size_t>(h);
    if (h == o_.host || !down_[i].ok() || !linked_[i] || bye_to_[i]) continue;
    if (Op* op = send_control(h, Kind::kBye, kXhostBye, rank); op != nullptr) {
      bye_to_[i] = true;
      sent.push_back(op->req);
      told.push_back(h);
    }
  }
  // An eager send is done once the communicator handed its frame to the transport; the abort or
  // destruction that follows flushes such frames (collectives/p2p.h).
  const sys::Deadline deadline = sys::deadline_after_ms(wait_ms);
  for (const auto& r : sent) {
    const int64_t left = sys::ms_until(deadline);
    if (left > 0) (void)r->wait(left);
  }
  // Then each one's answer (its goodbye: on_header makes that host down, as any end of its
  // stream does). Its last header: whatever it sent before, such as a hello that crossed this
  // goodbye while its connection here was still being made, is here now, so the close of this
  // side's connections cannot break an op of it (a warning there), nor the close of its own
  // find one of this side's pending here.
  auto unanswered = [&] {
    for (int32_t h : told) {
      if (down_[static_cast<size_t>(h)].ok()) return h;
    }
    return int32_t{-1};
  };
  for (int32_t h = unanswered(); h >= 0 && sys::ms_until(deadline) > 0; h = unanswered()) {
    std::shared_ptr<coll::P2PRequest> header;
    for (const Op& op : ops_) {
      if (op.kind == Kind::kHeader && op.host == h && op.req && !op.req->done()) header = op.req;
    }
    const int64_t slice = std::min<int64_t>(sys::ms_until(deadline), 10);
    if (header) {
      (void)header->wait(slice);  // moves the engine meanwhile
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));  // its header is done: take it
    }
    progress();
  }
  publish();
}

void RemoteP2p::shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  if (waker_.joinable()) waker_.join();
}

Status RemoteP2p::reachable(int32_t rank) const {
  if (!failed_.ok()) return failed_;
  if (rank < 0 || rank >= world_) return invalid_arg("point-to-point: no rank {}", rank);
  return down_[static_cast<size_t>(o_.host_of_rank[static_cast<size_t>(rank)])];
}

Status RemoteP2p::post_header(int32_t host) {
  if (!down_[static_cast<size_t>(host)].ok()) return down_[static_cast<size_t>(host)];
  Op& op = ops_.emplace_back();
  op.kind = Kind::kHeader;
  op.host = host;
  op.hdr.resize(kXhostHeaderBytes + kXhostInlineBytes);  // a header, or one with its payload
  auto q = o_.comm->irecv(op.hdr.data(), op.hdr.size(), host, kXhostTag);
  if (!q.ok()) {
    ops_.pop_back();
    host_down(host, q.status());
    return down_[static_cast<size_t>(host)];
  }
  op.req = arm(*q);
  return ok_status();
}

void RemoteP2p::post_drain(int32_t host, uint64_t bytes, int tag) {
  if (bytes == 0) return;
  // A receive of no bytes: the communicator refuses the message (an eager one is dropped, a
  // larger one's sender fails "truncated"), and nothing of it is held here.
  Op& op = ops_.emplace_back();
  op.kind = Kind::kDrain;
  op.host = host;
  auto q = o_.comm->irecv(nullptr, 0, host, tag);
  if (!q.ok()) {
    ops_.pop_back();
    host_down(host, q.status());
    return;
  }
  op.req = arm(*q);
}

void RemoteP2p::forward(size_t member, const Request& r, const P2pDevice& dev) {
  touch();
  const int32_t host = o_.host_of_rank[static_cast<size_t>(r.root)];
  Op& op = ops_.emplace_back();
  op.kind = Kind::kSend;
  op.host = host;
  op.member = member;
  op.seq = r.seq;
  op.keep = o_.keep(member);
  // A device buffer's bytes go by rendezvous on a tag of their own (p2p_xhost_wire.h), moved by
  // the NIC from the registration; 0 bytes are a plain header.
  const bool device = dev.mr != nullptr && r.send_bytes > 0;
  // A small payload rides behind its header: one send, one frame at the other daemon.
  const bool inline_payload = !device && r.send_bytes > 0 && r.send_bytes <= kXhostInlineBytes;
  op.h = XhostHeader{device           ? kXhostDevice
                     : inline_payload ? kXhostInline
                                      : uint16_t{0},
                     board_->rank_of(member), r.root, r.tag, r.send_bytes};
  if (device) {
    int32_t& next = next_payload_tag_[static_cast<size_t>(host)];
    op.h.payload_tag = next;
    next = next == 0x7fffffff ? kXhostDeviceTagFirst : next + 1;
  }
  const auto hdr = encode_xhost_header(op.h);
  op.hdr.assign(hdr.begin(), hdr.end());
  if (inline_payload) {
    const uint8_t* from = board_->data(member) + r.send_off;
    op.hdr.insert(op.hdr.end(), from, from + r.send_bytes);
  }
  auto q = o_.comm->isend(op.hdr.data(), op.hdr.size(), host, kXhostTag);
  Status s = q.status();
  if (q.ok()) {
    op.req = arm(*q);
    if (device) {
      // Straight from the device buffer, by the NIC: done once the receiving daemon took it.
      op.dev_keep = dev.keep;  // registered until the communicator is done with the send
      auto p = o_.comm->isend_registered(dev.at, r.send_bytes, host, op.h.payload_tag, dev.mr);
      s = p.status();
      if (p.ok()) op.payload = arm(*p);
    } else if (r.send_bytes > 0 && !inline_payload) {
      // Straight from the sender's arena: it stays mapped (op.keep) until the op ends.
      auto p = o_.comm->isend(board_->data(member) + r.send_off, r.send_bytes, host, kXhostTag);
      s = p.status();
      if (p.ok()) op.payload = arm(*p);
    }
  }
  if (!s.ok()) {
    const Status why =
        peer_error("point-to-point: send to rank {} on host {}: {}", r.root, host, s.message());
    board_->complete(member, r.seq, why, nullptr);
    op.completed = true;
    host_down(host, s);  // a header without its payload: the pair's stream is broken
    if (!op.req) ops_.pop_back();
  }
}

bool RemoteP2p::done(const Op& op) const {
  return (!op.req || op.req->done()) && (!op.payload || op.payload->done());
}

bool RemoteP2p::finish(Op& op) {
  if (!done(op)) return false;
  bool d = false;
  Status st = op.req ? op.req->test(&d) : ok_status();
  if (st.ok() && op.payload) st = op.payload->test(&d);
  switch (op.kind) {
    case Kind::kHeader:
      if (st.ok()) {
        on_header(op);
      } else if (st.code() == Code::kTimeout) {
        (void)post_header(op.host);  // nothing came within the deadline: wait on
      } else {
        host_down(op.host, st);
      }
      return true;
    case Kind::kSend: {
      if (!op.completed) {
        op.completed = true;
        if (st.ok()) {
          const P2pDone sent{op.h.bytes, op.h.src};
          board_->complete(op.member, op.seq, ok_status(), &sent);
        } else if (truncated(st)) {
          board_->complete(
              op.member, op.seq,
              // A completion's message holds 111 characters: the knob's name comes early.
              truncated_error("message truncated (or GW_DAEMON_P2P_UNEXPECTED_MAX passed): rank {} "
                              "did not take {} bytes, tag {}",
                              op.h.dst, op.h.bytes, op.h.tag),
              nullptr);
        } else if (st.code() == Code::kTimeout) {
          board_->complete(op.member, op.seq,
                           st.with_context(fmt::format("point-to-point: send to rank {} on host {}",
                                                       op.h.dst, op.host)),
                           nullptr);
        } else {
          board_->complete(op.member, op.seq,
                           peer_error("point-to-point: send to rank {} on host {}: {}", op.h.dst,
                                      op.host, st.message()),
                           nullptr);
        }
      }
      if (!st.ok() && !truncated(st) && st.code() != Code::kTimeout) host_down(op.host, st);
      return true;
    }
    case Kind::kPayloadArena:
      if (!op.completed) {
        if (st.ok()) {
          const P2pDone got{op.h.bytes, op.h.src};
          board_->complete(op.member, op.seq, ok_status(), &got);
        } else {
          board_->complete(op.member, op.seq,
                           peer_error("point-to-point: receive of {} bytes from rank {} (host "
                                      "{}): {}",
                                      op.h.bytes, op.h.src, op.host, st.message()),
                           nullptr);
        }
      }
      if (!st.ok()) host_down(op.host, st);
      return true;
    case Kind::kPayloadBuffer:
      if (!st.ok()) {
        op.msg->failed =
            peer_error("point-to-point: message of {} bytes from rank {} (host {}): {}", op.h.bytes,
                       op.h.src, op.host, st.message());
      }
      board_->landed(*op.msg);
      if (!st.ok()) host_down(op.host, st);
      return true;
    case Kind::kHello:
    case Kind::kBye:
    case Kind::kRefuse:
      if (!st.ok()) host_down(op.host, st);
      return true;
    case Kind::kDrain:
      // Refused on purpose (truncated); anything else broke the pair's stream.
      if (!st.ok() && !truncated(st)) host_down(op.host, st);
      return true;
  }
  return true;
}

void RemoteP2p::on_header(Op& op) {
  const int32_t host = op.host;
  auto decoded = decode_xhost_header(op.hdr.data(), op.req->bytes(), world_, kMaxXhostBytes);
  Status bad = decoded.status();
  int32_t dst = -1;
  if (bad.ok()) {
    dst = board_->member_of(decoded->dst);
    if (decoded->flags == kXhostHello || decoded->flags == kXhostBye) {
      dst = 0;
    } else if (o_.host_of_rank[static_cast<size_t>(decoded->src)] != host || dst < 0) {
      bad = peer_error("rank {} -> rank {}: not from that host or not to this one", decoded->src,
                       decoded->dst);
    }
  }
  if (!bad.ok()) {
    GW_LOG_WARN("gradwired: host {}'s daemon sent a bad point-to-point header: {}", host,
                bad.message());
    host_down(host, bad.with_context(fmt::format("host {}'s daemon", host)));
    return;
  }
  const XhostHeader h = *decoded;
  const size_t member = static_cast<size_t>(dst);
  // An inline payload came with the header (nothing follows it on the stream: none to refuse).
  const bool inline_payload = h.flags == kXhostInline;
  const uint8_t* inline_bytes = op.hdr.data() + kXhostHeaderBytes;
  auto drain = [&] {
    if (!inline_payload) post_drain(host, h.bytes);
  };
  linked_[static_cast<size_t>(host)] = true;
  if (h.flags == kXhostHello) {
    (void)post_header(host);
    return;
  }
  if (h.flags == kXhostRefuse) {
    // h.dst's device send h.payload_tag: nobody there will take it (its rendezvous is refused
    // right behind this header). The send ends with the reason, not as a truncation.
    for (Op& s : ops_) {
      if (s.kind == Kind::kSend && s.host == host && s.h.flags == kXhostDevice &&
          s.h.payload_tag == h.payload_tag && s.h.src == h.dst && !s.completed) {
        s.completed = true;
        board_->complete(
            s.member, s.seq,
            h.tag == kXhostRefuseGone
                ? peer_error("point-to-point: receiver gone: rank {} (host {}) did not take {} "
                             "bytes, tag {}",
                             h.src, host, s.h.bytes, s.h.tag)
                : peer_error("point-to-point: refused by host {}: point-to-point failed there "
                             "({} bytes to rank {}, tag {})",
                             host, s.h.bytes, h.src, s.h.tag),
            nullptr);
        break;
      }
    }
    (void)post_header(host);
    return;
  }
  if (h.flags == kXhostBye) {
    // Its last header: no receive stays posted for that host (its connections close next, and
    // must find nothing pending here), and its ranks are unreachable from now on. Answered with
    // this daemon's goodbye, the last header of this side's stream (unless one went already:
    // the goodbyes crossed), which that daemon waits for before its connections close
    // (say_goodbye): what this side sent it before, a hello that crossed its goodbye included,
    // gets there first. Flushed before this job's communicator goes (flush_replies).
    if (!bye_to_[static_cast<size_t>(host)]) {
      if (Op* answer = send_control(host, Kind::kBye, kXhostBye, h.src); answer != nullptr) {
        bye_to_[static_cast<size_t>(host)] = true;
        replies_.push_back(answer->req);
      }
    }
    const Status why =
        peer_error("rank {} left the job on purpose (host {}'s job ended)", h.src, host);
    if (peer_left_.ok()) {
      peer_left_ = why;
      peer_left_rank_ = h.src;
    }
    host_down(host, why);
    return;
  }
  P2pBoard::Recv rv;
  if (h.flags == kXhostDevice) {
    // Its payload waits at the sender on its own tag: the next header is received at once.
    if (!failed_.ok() || board_->data(member) == nullptr) {
      // Nobody to take it: the sender fails now, saying why (failed_, or the receiver left).
      refuse(host, h, !failed_.ok() ? failed_ : peer_error("rank {} left the job", h.dst));
    } else if (board_->take_posted(member, h.src, h.tag, &rv)) {
      fetch_device(host, h, rv.member, rv.seq, rv.off, rv.cap, rv.dev);
    } else {
      // Held as unexpected without its bytes (none counted against the cap): the receive that
      // takes it fetches them (claim_device).
      auto msg = std::make_shared<P2pRemoteMsg>(0, used_);
      msg->src = h.src;
      msg->tag = h.tag;
      msg->device = true;
      msg->dst = h.dst;
      msg->size = h.bytes;
      msg->host = host;
      msg->payload_tag = h.payload_tag;
      board_->add_remote(member, h.src, h.tag, msg);
    }
    (void)post_header(host);
    return;
  }
  if (!failed_.ok() || board_->data(member) == nullptr) {
    drain();  // nobody to take it
  } else if (board_->take_posted(member, h.src, h.tag, &rv)) {
    if (rv.dev.mr != nullptr && h.bytes > 0) {
      // A host buffer's bytes (inline, or on the shared tag): never written into a device
      // buffer through the CPU.
      board_->complete(rv.member, rv.seq,
                       Status(Code::kUnsupported,
                              fmt::format("point-to-point: rank {} sent {} bytes from a host "
                                          "buffer (tag {}); a device receive takes device "
                                          "messages only",
                                          h.src, h.bytes, h.tag)),
                       nullptr);
      drain();
      (void)post_header(host);
      return;
    }
    if (h.bytes > rv.cap) {
      board_->complete(
          rv.member, rv.seq,
          truncated_error("point-to-point: message truncated: rank {} sent {} bytes, the "
                          "receive holds {} (tag {}; from host {})",
                          h.src, h.bytes, rv.cap, h.tag, host),
          nullptr);
      drain();
    } else if (h.bytes == 0) {
      const P2pDone got{0, h.src};
      board_->complete(rv.member, rv.seq, ok_status(), &got);
    } else if (inline_payload) {
      std::memcpy(board_->data(rv.member) + rv.off, inline_bytes, h.bytes);
      const P2pDone got{h.bytes, h.src};
      board_->complete(rv.member, rv.seq, ok_status(), &got);
    } else {
      Op& p = ops_.emplace_back();
      p.kind = Kind::kPayloadArena;
      p.host = host;
      p.member = rv.member;
      p.seq = rv.seq;
      p.h = h;
      p.keep = o_.keep(rv.member);
      auto q = o_.comm->irecv(board_->data(rv.member) + rv.off, h.bytes, host, kXhostTag);
      if (q.ok()) {
        p.req = arm(*q);
      } else {
        board_->complete(rv.member, rv.seq, peer_error("point-to-point: {}", q.status().message()),
                         nullptr);
        ops_.pop_back();
        host_down(host, q.status());
        return;
      }
    }
  } else if (*used_ + h.bytes > o_.unexpected_max) {
    const uint64_t used = *used_;
    drain();
    GW_LOG_WARN(
        "gradwired: a message of {} bytes from rank {} (host {}) to rank {} with tag {} found no "
        "receive posted, and the job's unexpected messages here hold {} bytes already: more than "
        "GW_DAEMON_P2P_UNEXPECTED_MAX ({} bytes); post receives earlier or raise it",
        h.bytes, h.src, host, h.dst, h.tag, used, o_.unexpected_max);
    fail_p2p(
        no_memory("cross-host p2p failed: over GW_DAEMON_P2P_UNEXPECTED_MAX ({} B), {} B more "
                  "from rank {}",
                  o_.unexpected_max, h.bytes, h.src));
  } else {
    auto msg = std::make_shared<P2pRemoteMsg>(h.bytes, used_);
    msg->src = h.src;
    msg->tag = h.tag;
    board_->add_remote(member, h.src, h.tag, msg);
    if (h.bytes == 0 || inline_payload) {
      if (inline_payload) std::memcpy(msg->bytes.data(), inline_bytes, h.bytes);
      board_->landed(*msg);
    } else {
      Op& p = ops_.emplace_back();
      p.kind = Kind::kPayloadBuffer;
      p.host = host;
      p.h = h;
      p.msg = msg;
      auto q = o_.comm->irecv(msg->bytes.data(), h.bytes, host, kXhostTag);
      if (q.ok()) {
        p.req = arm(*q);
      } else {
        msg->failed = peer_error("point-to-point: {}", q.status().message());
        board_->landed(*msg);
        ops_.pop_back();
        host_down(host, q.status());
        return;
      }
    }
  }
  // After the payload's receive: it takes the bytes that follow this header.
  (void)post_header(host);
}

void RemoteP2p::fetch_device(int32_t host, const XhostHeader& h, size_t member, uint64_t seq,
                             uint64_t off, uint64_t cap, const P2pDevice& dev) {
  if (h.bytes > cap) {
    // As for a host message: the receive fails naming both sizes, and the refused rendezvous
    // fails the sender ("truncated").
    board_->complete(member, seq,
                     truncated_error("point-to-point: message truncated: rank {} sent {} bytes, "
                                     "the receive holds {} (tag {}; from host {})",
                                     h.src, h.bytes, cap, h.tag, host),
                     nullptr);
    post_drain(host, h.bytes, h.payload_tag);
    return;
  }
  if (!down_[static_cast<size_t>(host)].ok()) {
    board_->complete(member, seq, down_[static_cast<size_t>(host)], nullptr);
    return;
  }
  if (dev.mr == nullptr && board_->data(member) == nullptr) {
    refuse(host, h, peer_error("rank {} left the job", h.dst));  // it left meanwhile
    return;
  }
  Op& p = ops_.emplace_back();
  p.kind = Kind::kPayloadArena;
  p.host = host;
  p.member = member;
  p.seq = seq;
  p.h = h;
  p.keep = o_.keep(member);
  p.dev_keep = dev.keep;  // registered until the communicator is done with the receive
  // Into the device buffer by the NIC, or (a host receive) into the arena.
  auto q = dev.mr != nullptr
               ? o_.comm->irecv_registered(dev.at, h.bytes, host, h.payload_tag, dev.mr)
               : o_.comm->irecv(board_->data(member) + off, h.bytes, host, h.payload_tag);
  if (!q.ok()) {
    board_->complete(member, seq, peer_error("point-to-point: {}", q.status().message()), nullptr);
    ops_.pop_back();
    host_down(host, q.status());
    return;
  }
  p.req = arm(*q);
}

void RemoteP2p::claim_device(std::shared_ptr<P2pRemoteMsg> msg) {
  msg->claimed = false;
  XhostHeader h;
  h.flags = kXhostDevice;
  h.src = msg->src;
  h.tag = msg->tag;
  h.bytes = msg->size;
  h.payload_tag = msg->payload_tag;
  h.dst = board_->rank_of(msg->member);
  fetch_device(msg->host, h, msg->member, msg->seq, msg->off, msg->cap, msg->dev);
  publish();
}

void RemoteP2p::refuse_device(const P2pRemoteMsg& msg, const Status& why) {
  XhostHeader h;
  h.flags = kXhostDevice;
  h.src = msg.src;
  h.tag = msg.tag;
  h.bytes = msg.size;
  h.payload_tag = msg.payload_tag;
  h.dst = msg.dst;
  refuse(msg.host, h, why);
  publish();
}

void RemoteP2p::refuse(int32_t host, const XhostHeader& h, const Status& why) {
  if (!down_[static_cast<size_t>(host)].ok()) return;  // its connections are gone: so is the send
  GW_LOG_INFO(
      "gradwired: refusing a device message of {} bytes from rank {} (host {}) to rank {}, tag "
      "{}: {}",
      h.bytes, h.src, host, h.dst, h.tag, why.message());
  // The refusal first, then the rendezvous's: the sending daemon takes the header (on the pair's
  // control stream, ahead of the refusal's reply) before its send ends, and names the reason
  // (the receiver left, or this daemon's point-to-point for the job failed: failed_).
  XhostHeader r;
  r.flags = kXhostRefuse;
  r.src = h.dst;
  r.dst = h.src;
  r.tag = failed_.ok() ? kXhostRefuseGone : kXhostRefuseFailed;
  r.bytes = h.bytes;
  r.payload_tag = h.payload_tag;
  Op* op = send_header(host, Kind::kRefuse, r);
  if (op == nullptr) return;  // the host is down now
  replies_.push_back(op->req);
  post_drain(host, h.bytes, h.payload_tag);
}

void RemoteP2p::flush_replies(int64_t wait_ms) {
  // An eager send is done once the communicator handed its frame to the transport; the abort
  // that follows flushes such frames (collectives/p2p.h), and the refusals of the rendezvous
  // (replies) with them.
  const sys::Deadline deadline = sys::deadline_after_ms(wait_ms);
  for (const auto& r : replies_) {
    const int64_t left = sys::ms_until(deadline);
    if (left > 0 && !r->done()) (void)r->wait(left);
  }
  replies_.clear();
  publish();
}

bool RemoteP2p::refused_late(const Op& op) const {
  if (op.kind != Kind::kSend || op.completed || op.h.flags != kXhostDevice || !op.payload ||
      !done(op)) {
    return false;
  }
  bool d = false;
  return truncated(op.payload->test(&d));
}

void RemoteP2p::host_down(int32_t host, const Status& why) {
  Status& d = down_[static_cast<size_t>(host)];
  if (!d.ok()) return;
  d = peer_error("point-to-point with host {}'s daemon ended: {}", host, why.message());
  GW_LOG_INFO("gradwired: {}", d.message());
  board_->fail_receives_from(
      [&](int32_t rank) { return o_.host_of_rank[static_cast<size_t>(rank)] == host; }, d);
}

void RemoteP2p::fail_p2p(const Status& why) {
  if (!failed_.ok()) return;
  failed_ = why;
  GW_LOG_WARN("gradwired: {}", why.message());
  fail_all(why);
  board_->fail_all(why);
}

void RemoteP2p::fail_all(const Status& s) {
  for (Op& op : ops_) {
    if ((op.kind == Kind::kSend || op.kind == Kind::kPayloadArena) && !op.completed) {
      op.completed = true;
      board_->complete(op.member, op.seq, s, nullptr);
    }
    if (op.kind == Kind::kPayloadBuffer && op.msg->claimed) {
      op.msg->claimed = false;
      board_->complete(op.msg->member, op.msg->seq, s, nullptr);
    }
  }
}

void RemoteP2p::progress() {
  // Twice: the device sends refused by their receiving daemon (refused_late) wait for the second
  // round, after every header that came, so that a refusal's reason (kXhostRefuse, which that
  // daemon sends ahead of the refusal) answers the trainer rather than a plain "truncated".
  for (const bool late : {false, true}) {
    for (bool moved = true; moved;) {
      moved = false;
      for (auto it = ops_.begin(); it != ops_.end();) {
        if ((late || !refused_late(*it)) && finish(*it)) {
          it = ops_.erase(it);
          moved = true;
        } else {
          ++it;
        }
      }
    }
  }
  publish();
}

bool RemoteP2p::any_done() const {
  for (const Op& op : ops_) {
    if (done(op)) return true;
  }
  return false;
}

bool RemoteP2p::poke() {
  for (const Op& op : ops_) {
    for (const auto& r : {op.req, op.payload}) {
      if (r && !r->done()) {
        bool d = false;
        (void)r->test(&d);  // its status is finish()'s, once done
        return any_done();
      }
    }
  }
  return false;
}

void RemoteP2p::publish() {
  std::vector<std::shared_ptr<coll::P2PRequest>> active, idle;
  for (const Op& op : ops_) {
    for (const auto& r : {op.req, op.payload}) {
      // Done ones are progress()'s already (a send's header, its payload still going).
      if (r && !r->done()) (op.kind == Kind::kHeader ? idle : active).push_back(r);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    watch_active_ = active.size();
    watch_ = std::move(active);
    watch_.insert(watch_.end(), idle.begin(), idle.end());
    ++gen_;
    fired_.store(false, std::memory_order_release);
  }
  cv_.notify_all();
}

void RemoteP2p::waker_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_) {
    if (watch_.empty() || fired_.load(std::memory_order_relaxed)) {
      cv_.wait_for(lock, std::chrono::milliseconds(100));
      continue;
    }
    const auto watch = watch_;
    const size_t active = watch_active_;
    const uint64_t gen = gen_;
    lock.unlock();
    auto any_done = [&] {
      for (const auto& r : watch) {
        if (r->done()) return true;
      }
      return false;
    };
    bool any = any_done();
    if (!any) {
      // One request is waited on (sleeping on it); the others are looked at between waits: an
      // active op (a send, a payload) every millisecond, idle header receives every 5 ms.
      const int64_t ms = watch.size() == 1 ? 100 : (active > 0 ? 1 : 5);
      (void)watch.front()->wait(ms);
      any = any_done();
    }
    if (any && o_.job_mu != nullptr && o_.in_collective->load(std::memory_order_acquire) &&
        o_.job_mu->try_lock()) {
      // The job thread runs a collective (it holds job_mu otherwise): take what came now.
      progress();  // publishes (under mu_), which starts the next round afresh
      o_.job_mu->unlock();
      lock.lock();
      continue;
    }
    lock.lock();
    if (any && gen == gen_ && !quit_) {
      fired_.store(true, std::memory_order_release);
      (void)signal_eventfd(o_.wake_fd);
    }
  }
}

}  // namespace gw::daemon
