// Engine (dpdk/engine.h): the receive side. Frame dispatch (to the handshake, or to a
// connection), sequence tracking of reliable frames, and reassembly: data placed at its offset
// in the posted receive, eager messages held until their receive comes, CTS and MSG_ERR.
#include <algorithm>
#include <cstring>

#include "core/net/transport.h"
#include "dpdk/engine_internal.h"

namespace gw::dpdk {

void Engine::inject_rx(const uint8_t* data, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  FrameBuf b;
  b.data = const_cast<uint8_t*>(data);
  b.len = len;
  handle_frame(b);
  flush_tx();
}

void Engine::set_frame_tap(std::function<void(const Frame&)> tap) {
  std::lock_guard<std::mutex> lock(mu_);
  frame_tap_ = std::move(tap);
}

void Engine::handle_frame(const FrameBuf& b) {
  ++stats_.rx_frames;
  stats_.rx_bytes += b.len + b.len2;
  if (b.len2 > 0) ++stats_.rx_split_frames;
  Frame f;
  DecodeError e = decode_frame_split(b.data, b.len, b.data2, b.len2, b.l4_checksum_ok, &f);
  if (e != DecodeError::kOk) {
    ++stats_.decode_drops[static_cast<int>(e)];
    return;
  }
  if (frame_tap_) frame_tap_(f);
  if (f.dst.ip != local_.ip || f.dst.port != local_.port ||
      (f.dst.mac != local_.mac && f.dst.mac != MacAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})) {
    ++stats_.not_for_us;
    return;
  }
  if (f.hdr.type == FrameType::kHello) {
    handle_hello(f);
    return;
  }
  if (f.hdr.type == FrameType::kProof) {
    handle_proof(f);
    return;
  }
  Conn* c = find(f.hdr.dst_conn);
  if (c == nullptr) {
    if (f.hdr.type == FrameType::kClose) {
      // A connector that gave up before accept(): forget what its handshake created.
      for (auto& [lid, l] : listeners_) {
        for (auto it = l->ready.begin(); it != l->ready.end(); ++it) {
          Conn* a = find(*it);
          if (a && a->peer_id == f.hdr.src_conn && a->session == f.hdr.session) {
            conns_.erase(*it);
            l->ready.erase(it);
            return;
          }
        }
      }
    }
    ++stats_.unknown_conn;
    // A reliable frame for a connection we no longer have: tell the peer, at most every 10 ms.
    if (is_reliable(f.hdr.type)) {
      int64_t now = sys::now_ns();
      if (now - last_rst_ns_ > 10000000) {
        last_rst_ns_ = now;
        GwHeader h;
        h.type = FrameType::kClose;
        h.dst_conn = f.hdr.src_conn;
        h.src_conn = f.hdr.dst_conn;
        h.session = f.hdr.session;
        h.token_tag = f.hdr.token_tag;
        send_ctl(f.src, h, nullptr, 0);
      }
    }
    return;
  }
  if (f.hdr.token_tag != c->token_tag) {
    ++stats_.wrong_token;
    return;
  }
  if (f.hdr.session != c->session || !(f.src == c->peer) ||
      (c->state != Conn::State::kConnecting && f.hdr.src_conn != c->peer_id)) {
    ++stats_.wrong_session;
    return;
  }
  handle_conn_frame(*c, f);
}

void Engine::handle_conn_frame(Conn& c, const Frame& f) {
  const int64_t now = sys::now_ns();
  switch (f.hdr.type) {
    case FrameType::kHelloAck:
    case FrameType::kHelloNak:
    case FrameType::kChallenge:
      on_handshake_reply(c, f, now);  // engine_connect.cc
      return;
    default:
      break;
  }
  if (c.state != Conn::State::kOpen) return;
  c.last_rx_ns = now;
  if (f.hdr.window > 0) c.peer_window = f.hdr.window;
  if (f.hdr.type == FrameType::kClose) {
    // The CLOSE carries the peer's cumulative ack like every frame: what it received before it
    // went completes here (its ACK may have been lost), and only what it never got fails.
    on_ack(c, f);
    fail_conn(c, peer_error("{}: the peer closed the connection", c.name()));
    return;
  }
  on_ack(c, f);
  if (is_reliable(f.hdr.type)) on_reliable(c, f);
}

void Engine::deliver_eager(Conn& c, RecvReq& r, uint64_t len, int32_t tag, const uint8_t* payload) {
  r.done = true;
  if (len > r.cap) {
    r.err = truncated_error(
        "recv from {}: message truncated: peer sent {} bytes into a {}-byte receive", c.name(), len,
        r.cap);
  } else if (r.tag != net::kAnyTag && r.tag != tag) {
    r.err = internal_error("recv from {}: tag mismatch: receive posted tag {}, peer sent tag {}",
                           c.name(), r.tag, tag);
    if (c.error.ok()) c.error = r.err;  // out of step from here on, as with MSG_ERR
  } else {
    if (len > 0) std::memcpy(r.data, payload, len);
    r.got = r.total = len;
  }
}

void Engine::on_reliable(Conn& c, const Frame& f) {
  const uint32_t s = f.hdr.seq;
  if (!c.ack_due) {
    c.ack_deadline_ns = sys::now_ns() + kAckDelayNs;
    c.ts_recent = f.hdr.ts;
  }
  c.ack_due = true;
  ++c.rx_since_ack;
  // Prompt ACKs: a gap (the sender's fast retransmission needs the SACK), a retransmission (it
  // fills a gap: the sender's window is held up behind it) and a sender about to fill the window
  // we give it, at the end of this pass; the end of a message (the send completes on it) and
  // other control frames in the next pass, after the caller's answer to them. A CTS completes
  // nothing at its sender (our data does, and its frames carry the ACK: Engine::ack_carried), so
  // its ACK waits up to kCtsAckDelayNs for the data that usually follows: a ping-pong's sender
  // gets its next CTS just after its message went, and acknowledged it in a frame of its own.
  if (s != c.rcv_next || (f.hdr.flags & kFlagRetx) || c.rx_since_ack >= advertised_window() / 4) {
    c.ack_now = true;
  } else if (f.hdr.type == FrameType::kCts) {
    c.ack_deadline_ns = std::min(c.ack_deadline_ns, sys::now_ns() + kCtsAckDelayNs);
  } else if ((f.hdr.type != FrameType::kData || (f.hdr.flags & kFlagLast)) && !c.ack_soon) {
    c.ack_soon = true;  // in the next pass (Engine::progress_locked)
    c.ack_soon_pass = pass_;
  }
  if (seq_lt(s, c.rcv_next)) {
    ++stats_.duplicates;  // replayed or retransmitted: already delivered
    if (f.hdr.flags & kFlagRetx) ++c.spurious_rx;
    return;
  }
  if (s - c.rcv_next >= kRcvWindow) {
    ++stats_.out_of_window;
    return;
  }
  uint8_t& bit = c.rcv_bits[s % kRcvWindow];
  if (bit) {
    ++stats_.duplicates;
    if (f.hdr.flags & kFlagRetx) ++c.spurious_rx;
    return;
  }
  // Validate before accepting the sequence number, so a bad frame can be resent correctly.
  switch (f.hdr.type) {
    case FrameType::kData: {
      if (c.sender) return;
      auto it = std::find_if(c.recvs.begin(), c.recvs.end(),
                             [&](const auto& r) { return r->msg == f.hdr.msg; });
      if (f.hdr.flags & kFlagEager) {
        if (f.hdr.offset != 0 || f.hdr.payload_len != f.hdr.msg_len) {
          ++stats_.stale_msg;  // an eager message is one whole frame
          break;
        }
        if (it == c.recvs.end()) {
          if (seq_lt(f.hdr.msg, c.next_msg) || c.early.count(f.hdr.msg)) {
            ++stats_.stale_msg;  // its receive came and went: not from a sane peer
            break;
          }
          if (c.early.size() >= static_cast<size_t>(net::kMaxRequests)) {
            ++stats_.early_full;
            return;  // not accepted: the sender retransmits it
          }
          c.early[f.hdr.msg] = Conn::Early{
              f.hdr.msg_len, f.hdr.tag, std::vector<uint8_t>(f.payload, f.payload + f.payload_len)};
          ++stats_.data_frames_rx;
          break;
        }
        if (!(*it)->done) deliver_eager(c, **it, f.hdr.msg_len, f.hdr.tag, f.payload);
        ++stats_.data_frames_rx;
        break;
      }
      // A frame for no posted receive, or larger than it, is not from a sane peer: its sequence
      // number is consumed (so it is not resent forever) and its payload dropped.
      if (it == c.recvs.end() || (*it)->done || f.hdr.msg_len > (*it)->cap) {
        ++stats_.stale_msg;
        break;
      }
      RecvReq& r = **it;
      ++stats_.data_frames_rx;
      if (f.payload_len > 0) std::memcpy(r.data + f.hdr.offset, f.payload, f.payload_len);
      r.got += f.payload_len;
      r.total = f.hdr.msg_len;
      if (r.got >= r.total) r.done = true;
      break;
    }
    case FrameType::kCts: {
      if (!c.sender) return;
      auto it = std::find_if(c.sends.begin(), c.sends.end(),
                             [&](const auto& r) { return r->msg == f.hdr.msg && r->eager; });
      if (it == c.sends.end()) {
        c.cts[f.hdr.msg] = Conn::Cts{f.hdr.msg_len, f.hdr.tag};
        break;
      }
      // The CTS of an eager message: the receiver judges the frame by the same rules.
      SendReq& r = **it;
      if (r.done) break;
      if (r.size > f.hdr.msg_len) {
        r.done = true;
        r.err =
            truncated_error("send to {}: message truncated: {} bytes sent, receive posted {} bytes",
                            c.name(), r.size, f.hdr.msg_len);
      } else if (f.hdr.tag != net::kAnyTag && f.hdr.tag != r.tag) {
        r.done = true;
        r.err = internal_error("send to {}: tag mismatch: sent tag {}, receive posted tag {}",
                               c.name(), r.tag, f.hdr.tag);
      } else {
        r.cts_ok = true;
        if (r.unacked == 0) r.done = true;
      }
      break;
    }
    case FrameType::kMsgErr: {
      if (c.sender) return;
      auto it = std::find_if(c.recvs.begin(), c.recvs.end(),
                             [&](const auto& r) { return r->msg == f.hdr.msg; });
      if (it != c.recvs.end() && !(*it)->done) {
        RecvReq& r = **it;
        r.done = true;
        if (f.hdr.flags & kFlagErrTrunc) {
          r.err = truncated_error(
              "recv from {}: message truncated: peer sent {} bytes into a "
              "{}-byte receive",
              c.name(), f.hdr.msg_len, r.cap);
        } else {
          r.err = internal_error(
              "recv from {}: tag mismatch: receive posted tag {}, peer sent "
              "tag {}",
              c.name(), r.tag, f.hdr.tag);
          // The streams are out of step from here on: the comm stays failed (the protocol
          // keeps running so the peer's frames are still acknowledged).
          if (c.error.ok()) c.error = r.err;
        }
      }
      break;
    }
    default:
      return;
  }
  bit = 1;
  if (seq_lt(c.rcv_high, s + 1) || c.rcv_high == c.rcv_next) c.rcv_high = s + 1;
  while (c.rcv_bits[c.rcv_next % kRcvWindow]) {
    c.rcv_bits[c.rcv_next % kRcvWindow] = 0;
    ++c.rcv_next;
  }
  if (seq_lt(c.rcv_high, c.rcv_next)) c.rcv_high = c.rcv_next;
}

}  // namespace gw::dpdk
