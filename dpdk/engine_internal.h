// The Engine's internals (dpdk/engine.h), shared by its parts and by nothing else:
//   engine.cc          construction, the progress thread, the request API, one progress pass
//   engine_connect.cc  listeners, connections and the handshake
//   engine_tx.cc       window, pump (sends into frames), frame encoding, TX batch, zero copy
//   engine_rx.cc       frame dispatch, sequence tracking and reassembly
//   engine_loss.cc     timers, retransmission, acknowledgements and the RTT estimate
// Every member here is guarded by Engine::mu_.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/net/handshake.h"
#include "core/sys/time.h"
#include "dpdk/engine.h"

namespace gw::dpdk {

// The wire timestamp: microseconds, wrapping at 2^32, never 0 (0 means "none").
inline uint32_t wire_ts(int64_t ns) {
  const uint32_t us = static_cast<uint32_t>(ns / 1000);
  return us == 0 ? 1 : us;
}

// Receive-side sequence tracking window (bits); bounds the send window too.
inline constexpr uint32_t kRcvWindow = 4096;
// An ACK due waits at most this long (the first pass after its deadline sends it:
// Engine::progress_locked).
inline constexpr int64_t kAckDelayNs = 50000;
// A CTS waits at most this long for its ACK: the ACK rides on the sender's next data frame when
// one follows soon (Engine::ack_carried), and half the delay leaves the peer's tail-loss probe
// (at least 50 us, engine_loss.cc) time to see it.
inline constexpr int64_t kCtsAckDelayNs = kAckDelayNs / 2;

struct Engine::SendReq {
  uint32_t msg = 0;
  const uint8_t* data = nullptr;
  size_t size = 0;
  int tag = 0;
  uint64_t next_off = 0;
  bool emitted = false;  // every fragment has been sent once
  uint32_t unacked = 0;
  // Eager: a one-frame message sent before its CTS; it completes when the frame is acknowledged
  // and the CTS has shown that the receive matches (size and tag), as a rendezvous send would.
  bool eager = false;
  bool cts_ok = false;
  bool done = false;
  Status err;
  // Zero copy: this send's frames still held by the port (the send completes only when none
  // is), and the registered region's counter (held so a retransmission can count on it).
  TxRefHandle zc;
  TxRefHandle region;
  int64_t release_deadline_ns = 0;  // 0: not waiting for the port yet
};

struct Engine::RecvReq {
  uint32_t msg = 0;
  uint8_t* data = nullptr;
  size_t cap = 0;
  int tag = 0;
  uint64_t got = 0;
  uint64_t total = 0;
  bool done = false;
  Status err;
};

struct Engine::TxPkt {
  uint32_t seq = 0;
  FrameType type = FrameType::kData;
  uint16_t flags = 0;
  uint32_t msg = 0;
  int32_t tag = 0;
  uint64_t msg_len = 0;
  uint64_t offset = 0;
  uint32_t len = 0;
  const uint8_t* src = nullptr;
  // The frame's own copy of its payload (src points into it), once its send failed and the
  // caller's buffer is the caller's again (Engine::test_locked).
  std::shared_ptr<const std::vector<uint8_t>> owned;
  SendReq* req = nullptr;
  int64_t sent_ns = 0;
  int tx_count = 0;
  bool acked = false;
  bool rack_retx = false;  // the last transmission was a RACK (fast) retransmission
};

struct Engine::Listener {
  uint32_t id = 0;
  std::string token;
  uint32_t token_tag = 0;
  int32_t rank = -1;           // this side's rank (-1: not checked)
  int32_t expected_peer = -1;  // the only rank that may connect (-1: any)
  std::deque<uint32_t> ready;
};

// A handshake the listener answered with its CHALLENGE, waiting for the connector's PROOF.
struct Engine::Pending {
  uint32_t listener = 0;
  Endpoint peer;
  uint32_t peer_conn = 0;
  uint64_t session = 0;
  int32_t rank = -1, listener_rank = -1;
  net::handshake::Nonce cc{}, cl{};
  net::handshake::Mac listener_proof{};
  int64_t deadline_ns = 0;
};

struct Engine::Conn {
  enum class State { kConnecting, kOpen, kDead };
  uint32_t id = 0;
  uint32_t peer_id = 0;
  uint64_t session = 0;
  Endpoint peer;
  bool sender = false;
  State state = State::kConnecting;
  uint32_t token_tag = 0;
  std::string token;  // connector: keys its proof (never sent)
  uint32_t listener = 0;
  std::string label;
  int32_t rank = -1;           // connector: our rank, sent in HELLO's tag field
  int32_t listener_rank = -1;  // connector: the listener's rank from the handle
  // Handshake. Connector: its challenge, and once the listener proved the token, its own proof
  // (PROOF is then retransmitted instead of HELLO). Listener side: the proof it accepted (a
  // retransmitted PROOF whose HELLO_ACK was lost is answered again).
  net::handshake::Nonce cc{};
  bool proved = false;
  net::handshake::Mac proof{};
  int64_t deadline_ns = 0;
  int64_t last_hello_ns = 0;
  bool refused = false;
  Status error;
  int64_t peer_timeout_ns = 0;
  // reliability, our direction
  uint32_t snd_una = 0, snd_next = 0;
  std::deque<TxPkt> inflight;     // seq snd_una .. snd_next-1
  std::deque<TxPkt> ctl_pending;  // reliable control frames waiting for window
  uint32_t high_sacked = 0;
  bool any_sacked = false;
  double srtt_us = 0, rttvar_us = 0;
  int64_t rto_ns = 0;
  // reliability, the peer's direction
  uint32_t rcv_next = 0;
  uint32_t rcv_high = 0;  // one past the highest seq received
  std::vector<uint8_t> rcv_bits = std::vector<uint8_t>(kRcvWindow, 0);
  bool ack_due = false;
  bool ack_now = false;  // acknowledge at the end of this pass
  // The end of a message or a control frame came: acknowledge in the next pass, after the
  // application had its turn (Engine::progress_locked), or at the end of a background pass.
  bool ack_soon = false;
  uint64_t ack_soon_pass = 0;  // the pass that saw it
  uint32_t rx_since_ack = 0;   // reliable frames received since our last ACK
  // An ACK due goes by then: kAckDelayNs after the first unacknowledged frame, kCtsAckDelayNs
  // after a CTS if that is sooner (Engine::on_reliable).
  int64_t ack_deadline_ns = 0;
  uint32_t peer_window = 0;     // the peer's advertised receive window (0: not heard yet)
  uint32_t ts_recent = 0;       // timestamp of the first frame our next ACK acknowledges
  bool peer_echoes_ts = false;  // the peer's ACKs echo timestamps: RTT comes from those
  // Spurious retransmissions: the receiver counts retransmitted frames it already had (sent in
  // its ACKs' seq field); each increase widens the delay the sender tolerates before it
  // declares a packet lost (the path reorders or stalls: veth backlogs on a busy 2-vCPU host).
  uint32_t spurious_rx = 0;    // receiver: retransmissions that were duplicates
  uint32_t peer_spurious = 0;  // sender: the last count the peer reported
  int64_t tolerance_ns = 0;    // sender: reordering allowance of fast (and timeout) retransmission
  uint32_t acks_since_spurious = 0;
  double min_rtt_us = 0;  // sender: the smallest RTT sample (spurious fast retransmits)
  // RACK (time-based loss detection, engine_loss.cc): the latest transmission time among the
  // packets delivered, and when the next unacknowledged packet sent before it times out.
  int64_t rack_sent_ns = 0;
  int64_t rack_rtt_ns = 0;     // the RTT of that packet's delivery
  int64_t rack_check_ns = 0;   // 0: nothing pending
  int backoff = 0;             // retransmission-timeout doublings since the last progress
  int64_t timer_check_ns = 0;  // no retransmission timeout can fire before this
  // Tail loss probe: the last new send or acknowledgement progress, and whether the probe for
  // the current silence went out.
  int64_t last_progress_ns = 0;
  bool probed = false;
  int64_t last_rx_ns = 0, last_tx_ns = 0;
  // messages
  uint32_t next_msg = 0;
  std::deque<std::unique_ptr<SendReq>> sends;
  std::deque<std::unique_ptr<RecvReq>> recvs;
  struct Cts {
    uint64_t cap;
    int32_t tag;
  };
  std::unordered_map<uint32_t, Cts> cts;
  // Receiver: eager messages that arrived before their receive was posted (at most
  // kMaxRequests; more are not accepted, so the sender retransmits them later).
  struct Early {
    uint64_t len;
    int32_t tag;
    std::vector<uint8_t> payload;
  };
  std::unordered_map<uint32_t, Early> early;
  // Zero-copy frames of this connection still held by the port (close waits for them).
  TxRefHandle zc = TxRefHandle::make();

  std::string name() const {
    return fmt::format("{}dpdk {}:{} conn {}->{}", label.empty() ? "" : label + " via ",
                       format_ip(peer.ip), peer.port, id, peer_id);
  }
};

}  // namespace gw::dpdk
