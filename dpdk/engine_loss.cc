// Engine (dpdk/engine.h): loss recovery. Per-connection timers (heartbeat, dead peer, RTO with
// backoff, tail loss probe), acknowledgements sent (cumulative + SACK) and received (RACK-style
// time-based fast retransmission, spurious-retransmission tolerance) and the RTT estimate.
#include <algorithm>
#include <cmath>

#include "dpdk/engine_internal.h"

namespace gw::dpdk {

namespace {

// A timeout retransmits only the oldest timed-out packet, then backs off: a peer that was only
// descheduled must not be answered with a window of duplicates (32 per firing before: under
// 1% loss on a loaded host, a third of all retransmissions of a 16 MiB transfer were those).
// The retransmission's ACK tells RACK which of the others were really lost.
// RACK's reordering window: a quarter of the smallest RTT, at least this (plus the tolerance).
constexpr int64_t kReoMinNs = 10000;
// Reordering tolerance: least step per spurious fast retransmission (else half an RTT), ceiling.
constexpr int64_t kToleranceStepNs = 20000;
constexpr int64_t kToleranceMaxNs = 2000000;
// Shortest silence before a tail loss probe (the probe timeout is two smoothed RTTs). It covers
// the receiver's ACK delay (engine.cc: at most 50 us), so a probe is rarely spurious; when it
// is, it costs one frame.
constexpr int64_t kProbeMinNs = 50000;
// Longest interval between two scans of a connection's window for timed-out packets.
constexpr int64_t kTimerScanNs = 250000;

}  // namespace

void Engine::timers(Conn& c, int64_t now) {
  if (c.state == Conn::State::kConnecting) {
    if (c.sender && now - c.last_hello_ns >= config_.hello_interval_ms * 1000000 &&
        now < c.deadline_ns && !c.refused) {
      send_hello(c, now);
    }
    return;
  }
  if (c.state != Conn::State::kOpen) return;
  if (now - c.last_rx_ns > c.peer_timeout_ns) {
    fail_conn(c, peer_error("{}: no frame from the peer for {} ms (host dead or unreachable)",
                            c.name(), (now - c.last_rx_ns) / 1000000));
    return;
  }
  // Retransmission on timeout: RTO from the measured RTT (Jacobson, floored), doubled per
  // timeout without progress (reset by any new acknowledgement). One timed-out packet goes out
  // per firing; RACK recovers the rest once acknowledgements flow again.
  // Tail loss probe: when nothing was sent or acknowledged for two RTTs (at least 50 us) and
  // packets are outstanding, the newest unacknowledged one is resent once. If the tail of a
  // message was lost, no later packet's SACK can reveal it; the probe's ACK (with SACK) does,
  // long before the RTO would.
  // RACK: an unacknowledged packet sent before one that was delivered is resent once it has
  // waited an RTT and the reordering window (the check is due at rack_check_ns).
  if (c.rack_check_ns != 0 && now >= c.rack_check_ns) rack_detect(c, now);
  if (c.state != Conn::State::kOpen) return;
  if (!c.probed && !c.inflight.empty() &&
      now - c.last_progress_ns >=
          std::max<int64_t>(static_cast<int64_t>(2 * c.srtt_us * 1000), kProbeMinNs)) {
    for (auto it = c.inflight.rbegin(); it != c.inflight.rend(); ++it) {
      if (it->acked || it->tx_count == 0) continue;
      ++stats_.tail_probes;
      send_pkt(c, *it, true);
      it->rack_retx = false;
      break;
    }
    c.probed = true;
  }
  // The scan over the window runs only when the earliest deadline may have come (and at least
  // every kTimerScanNs, since the RTO may shrink): not on every pass of a busy loop.
  const int64_t rto = (c.rto_ns + c.tolerance_ns) << std::min(c.backoff, 6);
  if (now >= c.timer_check_ns) {
    int resent = 0;
    int64_t next = now + kTimerScanNs;
    for (TxPkt& p : c.inflight) {
      if (p.acked || p.tx_count == 0) continue;
      if (now - p.sent_ns < rto) {
        next = std::min(next, p.sent_ns + rto);
        continue;
      }
      if (p.tx_count > config_.max_retx) {
        fail_conn(c, peer_error("{}: packet {} not acknowledged after {} transmissions", c.name(),
                                p.seq, p.tx_count));
        return;
      }
      ++stats_.timeout_retransmits;
      send_pkt(c, p, true);
      p.rack_retx = false;
      ++resent;
      next = now + std::min<int64_t>(rto * 2, kTimerScanNs);
      break;
    }
    if (resent > 0) ++c.backoff;
    c.timer_check_ns = next;
  }
  if (now - c.last_tx_ns >= config_.heartbeat_ms * 1000000) send_ack(c);
}

void Engine::send_ack(Conn& c) {
  GwHeader h;
  h.type = FrameType::kAck;
  h.dst_conn = c.peer_id;
  h.src_conn = c.id;
  h.session = c.session;
  h.ack = c.rcv_next;
  h.window = advertised_window();
  h.token_tag = c.token_tag;
  uint8_t sack[kMaxSackBits / 8] = {};
  uint32_t nbits = 0;
  if (seq_lt(c.rcv_next + 1, c.rcv_high)) {
    nbits = std::min<uint32_t>(c.rcv_high - c.rcv_next - 1, kMaxSackBits);
    for (uint32_t i = 0; i < nbits; ++i) {
      if (c.rcv_bits[(c.rcv_next + 1 + i) % kRcvWindow]) sack[i / 8] |= (1u << (i % 8));
    }
  }
  h.sack_bits = static_cast<uint16_t>(nbits);
  h.seq = c.spurious_rx;  // ACKs are not sequenced: the field reports spurious retransmissions
  h.ts = c.ts_recent;
  c.ts_recent = 0;
  send_ctl(c.peer, h, sack, (nbits + 7) / 8);
  ++stats_.acks_tx;
  c.last_tx_ns = sys::now_ns();
  c.ack_due = false;
  c.ack_now = false;
  c.ack_soon = false;
  c.rx_since_ack = 0;
}

// A reliable frame to the peer (a reply's data, a CTS, a retransmission) carries the cumulative
// ACK in its header, and the peer takes it from any frame (on_ack). When that is all an ACK due
// would say (no gap for a SACK, and nothing that asked for one at once: a gap, a retransmission, a
// sender at a quarter of our window), the ACK frame is not sent: in a ping-pong each message's ACK
// rides on the reply and its CTS, two frames fewer per message, and over a copy-mode PMD every
// frame costs its sender microseconds. The RTT then comes from the ACKs that are still sent
// (bulk transfers, gaps, the delay timer, heartbeats): the timestamp of a frame acknowledged
// this way is not echoed (the next ACK due echoes a frame after it).
void Engine::ack_carried(Conn& c) {
  if (!c.ack_due || c.ack_now || seq_lt(c.rcv_next, c.rcv_high)) return;
  c.ack_due = false;
  c.ack_soon = false;
  c.rx_since_ack = 0;
  ++stats_.acks_carried;
}

void Engine::rtt_sample(Conn& c, double sample) {
  {
    if (c.srtt_us == 0) {
      c.srtt_us = sample;
      c.rttvar_us = sample / 2;
      c.min_rtt_us = sample;
    } else {
      c.rttvar_us = 0.75 * c.rttvar_us + 0.25 * std::fabs(c.srtt_us - sample);
      c.srtt_us = 0.875 * c.srtt_us + 0.125 * sample;
      c.min_rtt_us = std::min(c.min_rtt_us, sample);
    }
    c.rto_ns = std::max<int64_t>(config_.rto_min_us * 1000,
                                 static_cast<int64_t>((c.srtt_us + 4 * c.rttvar_us) * 1000));
    stats_.srtt_us = c.srtt_us;
    stats_.rttvar_us = c.rttvar_us;
    stats_.rto_us = static_cast<double>(c.rto_ns) / 1000;
  }
}

void Engine::acked(Conn& c, TxPkt& p) {
  if (p.acked) return;
  p.acked = true;
  if (p.sent_ns > c.rack_sent_ns) {
    const int64_t rtt = sys::now_ns() - p.sent_ns;
    // A retransmission acknowledged sooner than the smallest RTT was delivered as its original:
    // its send time says nothing about the packets sent before it.
    if (p.tx_count == 1 || rtt >= static_cast<int64_t>(c.min_rtt_us * 1000)) {
      c.rack_sent_ns = p.sent_ns;
      c.rack_rtt_ns = rtt;
    }
  }
  if (p.rack_retx) {
    // A fast retransmission acknowledged sooner than half the smallest RTT after it went out:
    // the ACK was for the original, which was only late (reordered, or a stalled host). Widen
    // the reordering window (linear and capped: a retransmission too many costs one frame, a
    // window too wide delays every real recovery by as much).
    const int64_t since = sys::now_ns() - p.sent_ns;
    if (since < static_cast<int64_t>(c.min_rtt_us * 500)) {
      const int64_t step =
          std::max<int64_t>(static_cast<int64_t>(c.srtt_us * 500), kToleranceStepNs);
      c.tolerance_ns = std::min<int64_t>(c.tolerance_ns + step, kToleranceMaxNs);
      c.acks_since_spurious = 0;
      stats_.tolerance_us = static_cast<double>(c.tolerance_ns) / 1000;
    }
  }
  // Karn: only unambiguous samples, and only when the peer does not echo timestamps (those also
  // measure the packets Karn has to skip: the delayed ones that caused a retransmission).
  if (p.tx_count == 1 && !c.peer_echoes_ts) {
    rtt_sample(c, static_cast<double>(sys::now_ns() - p.sent_ns) / 1000.0);
  }
  if (p.req != nullptr) {
    SendReq& r = *p.req;
    if (r.unacked > 0) --r.unacked;
    if (r.emitted && r.unacked == 0 && !r.done && (!r.eager || r.cts_ok)) r.done = true;
  }
}

void Engine::on_ack(Conn& c, const Frame& f) {
  const uint32_t a = f.hdr.ack;
  if (seq_lt(c.snd_next, a)) {
    ++stats_.bad_ack;  // acknowledges what we never sent
    return;
  }
  if (!c.inflight.empty() && seq_lt(c.snd_una, a)) {
    c.backoff = 0;
    c.last_progress_ns = sys::now_ns();
    c.probed = false;
  }
  while (!c.inflight.empty() && seq_lt(c.snd_una, a)) {
    acked(c, c.inflight.front());
    c.inflight.pop_front();
    ++c.snd_una;
  }
  if (c.inflight.empty()) c.snd_una = c.snd_next;
  if (f.hdr.type != FrameType::kAck) return;
  ++stats_.acks_rx;
  if (f.hdr.seq != c.peer_spurious) {
    const uint32_t n = f.hdr.seq - c.peer_spurious;
    c.peer_spurious = f.hdr.seq;
    if (n < 0x80000000u) {
      stats_.spurious_retransmits += n;
      // Counted only: the duplicates of a probe or a timeout mostly follow lost ACKs (1% loss
      // loses ACKs too) and say nothing about reordering. Widening the tolerance on them (as
      // before) held it at its 2 ms ceiling under plain 1% loss, and every recovery waited it
      // out. The tolerance grows in acked() instead, on fast retransmissions shown spurious.
    }
  } else if (c.tolerance_ns > 0 && ++c.acks_since_spurious >= 64) {
    c.tolerance_ns = c.tolerance_ns * 3 / 4;  // the path calmed down
    c.acks_since_spurious = 0;
  }
  stats_.tolerance_us = static_cast<double>(c.tolerance_ns) / 1000;
  if (f.hdr.ts != 0) {
    const uint32_t d = wire_ts(sys::now_ns()) - f.hdr.ts;
    if (d < 60000000u) {  // a sane sample (< 60 s); anything else is a forged or stale echo
      c.peer_echoes_ts = true;
      rtt_sample(c, static_cast<double>(d));
    }
  }
  if (a != c.snd_una) return;  // stale ack
  for (uint32_t i = 0; i < f.hdr.sack_bits; ++i) {
    if (!(f.payload[i / 8] & (1u << (i % 8)))) continue;
    const uint32_t idx = i + 1;  // seq a + 1 + i
    if (idx >= c.inflight.size()) break;
    if (!c.inflight[idx].acked) {
      c.backoff = 0;
      c.last_progress_ns = sys::now_ns();
      c.probed = false;
    }
    acked(c, c.inflight[idx]);
  }
  rack_detect(c, sys::now_ns());
}

// RACK-style loss detection (time, not duplicate counts): a packet is lost when a packet sent
// after it was delivered and it has waited that packet's RTT plus a reordering window (a quarter
// of the smallest RTT, widened by the spurious-retransmission tolerance). With no reordering
// that is about when the ACK showing the later packet arrives: the smoothed RTT instead (first
// try) waited out the queueing delay of a whole window again. It catches what a three-duplicate
// rule cannot: a hole among the last frames of a message, and a lost retransmission (resent
// packets carry their new send time, so they are judged against packets sent after them).
void Engine::rack_detect(Conn& c, int64_t now) {
  c.rack_check_ns = 0;
  if (c.rack_sent_ns == 0 || c.inflight.empty()) return;
  const int64_t wait = c.rack_rtt_ns +
                       std::max<int64_t>(static_cast<int64_t>(c.min_rtt_us * 250), kReoMinNs) +
                       c.tolerance_ns;
  int64_t next = 0;
  for (TxPkt& p : c.inflight) {
    if (p.acked || p.tx_count == 0 || p.sent_ns >= c.rack_sent_ns) continue;
    const int64_t due = p.sent_ns + wait;
    if (now < due) {
      next = next == 0 ? due : std::min(next, due);
      continue;
    }
    if (p.tx_count > config_.max_retx) {
      fail_conn(c, peer_error("{}: packet {} not acknowledged after {} transmissions", c.name(),
                              p.seq, p.tx_count));
      return;
    }
    ++stats_.fast_retransmits;
    send_pkt(c, p, true);
    p.rack_retx = true;
  }
  c.rack_check_ns = next;
}

}  // namespace gw::dpdk
