// Engine (dpdk/engine.h): the send side. Flow control (the window), the pump that turns posted
// sends into frames (eager or after their CTS, fragmented to the MTU), frame encoding with
// zero-copy segments, the TX batch with fault injection, and waiting for the port to release
// zero-copy frames.
#include <algorithm>
#include <cstring>
#include <thread>

#include "core/net/transport.h"
#include "dpdk/engine_internal.h"

namespace gw::dpdk {

uint32_t Engine::window_of(const Conn& c) const {
  uint32_t w;
  if (config_.window > 0) {
    w = static_cast<uint32_t>(config_.window);
  } else {
    // Bandwidth-delay product, doubled so loss recovery does not stall the pipe. The delay is
    // the smallest RTT seen, not the smoothed one: frames queued behind a window inflate the
    // smoothed RTT, which widened the window, which queued more (srtt reached 1.5 ms on the
    // in-memory switch under 1% loss, and every probe and RACK deadline waited that long).
    double rtt_us = std::max(c.min_rtt_us > 0 ? c.min_rtt_us : c.srtt_us, 100.0);
    double bdp_bytes = config_.link_gbps * 1e9 / 8 * rtt_us * 1e-6;
    double pkts = 2 * bdp_bytes / static_cast<double>(payload_max_);
    w = static_cast<uint32_t>(std::clamp(pkts, 32.0, static_cast<double>(config_.max_window)));
  }
  if (c.peer_window > 0) w = std::min(w, c.peer_window);
  return std::min(w, kRcvWindow - 1);
}

uint32_t Engine::advertised_window() const {
  // What our RX ring absorbs while this process is off the CPU, shared with the other direction.
  return static_cast<uint32_t>(
      std::clamp<size_t>(port_->rx_ring_size() / 2, 16, static_cast<size_t>(kRcvWindow - 1)));
}

bool Engine::emit_reliable(Conn& c, TxPkt pkt) {
  if (c.snd_next - c.snd_una >= window_of(c)) return false;
  pkt.seq = c.snd_next++;
  c.inflight.push_back(pkt);
  send_pkt(c, c.inflight.back(), false);
  c.last_progress_ns = c.inflight.back().sent_ns;
  c.probed = false;
  return true;
}

void Engine::pump(Conn& c) {
  if (c.state != Conn::State::kOpen) return;
  while (!c.ctl_pending.empty()) {
    if (!emit_reliable(c, c.ctl_pending.front())) return;
    c.ctl_pending.pop_front();
  }
  if (!c.sender) return;
  for (auto& rp : c.sends) {
    SendReq& r = *rp;
    if (r.emitted || r.done) continue;
    auto cts = c.cts.find(r.msg);
    if (cts == c.cts.end()) {
      // A message that fits one frame goes at once (eager); larger ones wait for the receive
      // to be posted (rendezvous), and so do all messages after them, to keep frames in order.
      if (!config_.eager || r.size > payload_max_ || r.next_off != 0) return;
      TxPkt p;
      p.type = FrameType::kData;
      p.flags = kFlagLast | kFlagEager;
      p.msg = r.msg;
      p.tag = r.tag;
      p.msg_len = r.size;
      p.len = static_cast<uint32_t>(r.size);
      p.src = r.data;
      p.req = &r;
      if (!emit_reliable(c, p)) return;
      ++stats_.eager_sends;
      r.eager = true;
      r.unacked = 1;
      r.next_off = r.size;
      r.emitted = true;
      continue;
    }
    if (r.next_off == 0 && r.unacked == 0) {
      const bool trunc = r.size > cts->second.cap;
      const bool tag_bad = cts->second.tag != net::kAnyTag && cts->second.tag != r.tag;
      if (trunc || tag_bad) {
        TxPkt e;
        e.type = FrameType::kMsgErr;
        e.flags = trunc ? kFlagErrTrunc : kFlagErrTag;
        e.msg = r.msg;
        e.tag = r.tag;
        e.msg_len = r.size;
        if (c.snd_next - c.snd_una >= window_of(c)) return;
        emit_reliable(c, e);
        r.emitted = true;
        r.done = true;
        r.err = trunc ? truncated_error(
                            "send to {}: message truncated: {} bytes sent, receive posted "
                            "{} bytes",
                            c.name(), r.size, cts->second.cap)
                      : internal_error(
                            "send to {}: tag mismatch: sent tag {}, receive posted "
                            "tag {}",
                            c.name(), r.tag, cts->second.tag);
        c.cts.erase(cts);
        continue;
      }
    }
    while (!r.emitted) {
      TxPkt p;
      p.type = FrameType::kData;
      p.msg = r.msg;
      p.tag = r.tag;
      p.msg_len = r.size;
      p.offset = r.next_off;
      p.len = static_cast<uint32_t>(std::min<uint64_t>(payload_max_, r.size - r.next_off));
      p.src = r.data + r.next_off;
      p.req = &r;
      if (r.next_off + p.len == r.size) p.flags = kFlagLast;
      if (!emit_reliable(c, p)) return;
      ++r.unacked;
      r.next_off += p.len;
      if (r.next_off == r.size) {
        r.emitted = true;
        c.cts.erase(cts);
      }
    }
  }
}

void Engine::send_pkt(Conn& c, TxPkt& p, bool retx) {
  GwHeader h;
  h.type = p.type;
  h.flags = static_cast<uint16_t>(p.flags | (retx ? kFlagRetx : 0));
  h.dst_conn = c.peer_id;
  h.src_conn = c.id;
  h.session = c.session;
  h.seq = p.seq;
  h.ack = c.rcv_next;
  h.msg = p.msg;
  h.tag = p.tag;
  h.msg_len = p.msg_len;
  h.offset = p.offset;
  h.window = advertised_window();
  h.token_tag = c.token_tag;
  FrameBuf b;
  p.sent_ns = sys::now_ns();
  h.ts = wire_ts(p.sent_ns);
  ++p.tx_count;
  if (retx) ++stats_.retransmits;
  if (!port_->alloc(&b)) {
    ++stats_.pool_empty;  // counts as a loss; the timer resends it
    return;
  }
  // Zero copy: a data fragment of a send from registered memory goes as headers + the user's
  // bytes in place (a retransmission attaches them again). The request's, the region's and the
  // connection's counters follow the frame until the port releases it.
  bool zc = false;
  if (p.type == FrameType::kData && p.req != nullptr && p.req->zc && p.len > 0) {
    b.len = encode_headers(b.data, b.cap, local_, c.peer, h, p.src, p.len, ip_id_, offload_);
    TxRef* refs[3] = {p.req->zc.get(), c.zc.get(), p.req->region.get()};
    zc = b.len != 0 && port_->attach_external(&b, p.src, p.len, refs, p.req->region ? 3 : 2);
    if (zc) {
      ++ip_id_;
      ++stats_.zc_frames_tx;
      stats_.zc_bytes_tx += p.len;
    } else {
      ++stats_.zc_fallbacks;
    }
  }
  if (!zc) {
    b.len = encode_frame(b.data, b.cap, local_, c.peer, h, p.src, p.len, ip_id_++, offload_);
  }
  if (b.len == 0) {
    port_->free(b);
    return;
  }
  if (p.type == FrameType::kData) ++stats_.data_frames_tx;
  c.last_tx_ns = p.sent_ns;
  ack_carried(c);
  queue_tx(b);
}

void Engine::send_simple(Conn& c, FrameType type, const void* payload, size_t len) {
  GwHeader h;
  h.type = type;
  h.dst_conn = c.peer_id;
  h.src_conn = c.id;
  h.session = c.session;
  h.ack = c.rcv_next;
  h.token_tag = c.token_tag;
  send_ctl(c.peer, h, payload, len);
}

void Engine::send_ctl(const Endpoint& dst, GwHeader hdr, const void* payload, size_t len) {
  FrameBuf b;
  if (!port_->alloc(&b)) {
    ++stats_.pool_empty;
    return;
  }
  b.len = encode_frame(b.data, b.cap, local_, dst, hdr, payload, len, ip_id_++, offload_);
  if (b.len == 0) {
    port_->free(b);
    return;
  }
  queue_tx(b);
}

void Engine::queue_tx(FrameBuf b) {
  if (faults_.enabled()) {
    switch (faults_.decide()) {
      case FaultAction::kDrop:
        ++stats_.injected_drops;
        port_->free(b);
        return;
      case FaultAction::kDup: {
        FrameBuf d;
        if (port_->alloc(&d) && d.cap >= b.len + b.len2) {
          // A zero-copy frame is duplicated as one copied segment (same bytes, same checksum).
          std::memcpy(d.data, b.data, b.len);
          if (b.len2 > 0) std::memcpy(d.data + b.len, b.data2, b.len2);
          d.len = b.len + b.len2;
          tx_batch_.push_back(d);
          ++stats_.injected_dups;
        } else if (d.data) {
          port_->free(d);
        }
        break;
      }
      case FaultAction::kHold:
        ++stats_.injected_holds;
        held_.push_back(Held{b, faults_.hold_distance(), sys::now_ns()});
        return;
      case FaultAction::kPass:
        break;
    }
    // Frames held back go out after `countdown` later frames: that is the reordering.
    for (size_t i = 0; i < held_.size();) {
      if (--held_[i].countdown <= 0) {
        tx_batch_.push_back(b);
        b = held_[i].buf;
        held_.erase(held_.begin() + static_cast<long>(i));
      } else {
        ++i;
      }
    }
  }
  tx_batch_.push_back(b);
  if (tx_batch_.size() >= static_cast<size_t>(config_.burst)) flush_tx();
}

void Engine::release_held(bool all) {
  if (held_.empty()) return;
  const int64_t now = sys::now_ns();
  for (size_t i = 0; i < held_.size();) {
    if (all || now - held_[i].since_ns > 200000) {
      tx_batch_.push_back(held_[i].buf);
      held_.erase(held_.begin() + static_cast<long>(i));
    } else {
      ++i;
    }
  }
}

void Engine::flush_tx() {
  size_t off = 0;
  int spins = 0;
  while (off < tx_batch_.size()) {
    for (size_t i = off; i < tx_batch_.size(); ++i) {
      stats_.tx_bytes += tx_batch_[i].len + tx_batch_[i].len2;
    }
    size_t n = port_->tx_burst(tx_batch_.data() + off, tx_batch_.size() - off);
    for (size_t i = off + n; i < tx_batch_.size(); ++i) {
      stats_.tx_bytes -= tx_batch_[i].len + tx_batch_[i].len2;
    }
    stats_.tx_frames += n;
    off += n;
    if (n == 0 && ++spins > 64) break;
  }
  for (size_t i = off; i < tx_batch_.size(); ++i) {
    ++stats_.tx_ring_full;  // lost; retransmission recovers it
    port_->free(tx_batch_[i]);
  }
  tx_batch_.clear();
}

Status Engine::wait_released(TxRef* ref, int64_t timeout_ms, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu_);
  return wait_released_locked(ref, timeout_ms, what);
}

Status Engine::wait_released_locked(TxRef* ref, int64_t timeout_ms, const std::string& what) {
  if (ref == nullptr || ref->frames() <= 0) return ok_status();
  const int64_t deadline = sys::now_ns() + std::max<int64_t>(timeout_ms, 0) * 1000000;
  while (true) {
    // Our own RX loop frees what a loopback port (net_ring) hands back; the PMD frees what it
    // finished sending.
    progress_locked();
    port_->tx_cleanup();
    if (ref->frames() <= 0) return ok_status();
    if (sys::now_ns() >= deadline) {
      return timeout_error("{}: {} zero-copy frame(s) still held by port {} after {} ms", what,
                           ref->frames(), port_->name(), timeout_ms);
    }
    std::this_thread::yield();
  }
}

}  // namespace gw::dpdk
