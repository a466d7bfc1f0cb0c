// Engine: the reliable protocol of the DPDK backend over one FramePort (docs/wire-dpdk.md).
//
// One engine per port; every connection of the process that uses that port is multiplexed on it
// by connection id. It implements the whole transport contract of core/net/transport.h:
// handshake with the job token, per-direction sequence numbers, a window sized to the
// bandwidth-delay product, cumulative + selective acknowledgements, retransmission on timeout
// and on gap, fragmentation to the port MTU, rendezvous (a receive posts a CTS; data is placed
// straight into the receive buffer at its offset), heartbeats and dead-peer detection.
//
// Thread-safety: every public call is safe from any thread (one internal mutex). Progress is made
// by the calls themselves (test/accept/poll drive the RX/TX loop) and by a background thread that
// wakes every progress_interval_us so acknowledgements and heartbeats flow while the application
// is busy elsewhere. No call blocks beyond the mutex.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "dpdk/fault_injector.h"
#include "dpdk/frame_port.h"
#include "dpdk/wire.h"

namespace gw::dpdk {

struct EngineConfig {
  uint32_t ip = 0;                  // this endpoint's IPv4 address (host order)
  uint16_t udp_port = 47000;        // UDP port of every connection of this engine
  size_t mtu = 9000;                // L3 MTU wanted; clamped to the port's
  int window = 0;                   // packets in flight per connection; 0 = from the BDP
  int max_window = 1024;            // upper bound of the automatic window
  double link_gbps = 10;            // for the BDP window
  int64_t rto_min_us = 1000;        // retransmission timeout floor
  int64_t heartbeat_ms = 100;       // an idle connection sends an ACK this often
  int64_t peer_timeout_ms = 10000;  // silence after which a peer is dead (also capped per comm)
  int64_t hello_interval_ms = 20;   // handshake retransmission
  // Listener side: handshakes that sent their CHALLENGE and wait for the connector's PROOF are
  // capped (the oldest is dropped first) and dropped after this long.
  int max_pending_handshakes = 64;
  int64_t handshake_timeout_ms = 10000;
  int max_retx = 64;                   // a packet retransmitted this often kills the connection
  int burst = 32;                      // RX/TX burst size
  bool eager = true;                   // one-frame messages go before their CTS
  int64_t progress_interval_us = 500;  // background progress period; 0 = no thread
  // Zero-copy TX (where the port allows it, FramePort::zero_copy): a send from registered
  // memory of at least this many bytes sends its fragments as external segments instead of
  // copying them into mbufs; 0 = sends of more than one frame. A one-frame message comes from
  // cache and its copy costs less than the extra mbuf and the release bookkeeping (measured:
  // docs/dpdk.md, `dpdk_testbed_host zc-bench`).
  size_t zero_copy_min = 0;
  FaultConfig faults;
};

struct EngineStats {
  uint64_t rx_frames = 0, tx_frames = 0, rx_bytes = 0, tx_bytes = 0;
  uint64_t data_frames_tx = 0, data_frames_rx = 0;
  uint64_t retransmits = 0, fast_retransmits = 0, timeout_retransmits = 0;
  uint64_t acks_tx = 0, acks_rx = 0;
  uint64_t decode_drops[static_cast<int>(DecodeError::kCount)] = {};
  uint64_t not_for_us = 0, unknown_conn = 0, wrong_session = 0, wrong_token = 0;
  uint64_t duplicates = 0, out_of_window = 0, stale_msg = 0, bad_ack = 0;
  uint64_t hello_refused = 0, tx_ring_full = 0, pool_empty = 0;
  // Handshakes refused for their rank, and pending handshakes dropped (cap or deadline).
  uint64_t wrong_rank = 0, handshakes_dropped = 0;
  uint64_t injected_drops = 0, injected_dups = 0, injected_holds = 0;
  // Progress loop: passes, passes that received nothing, acks sent because the sender's window
  // looked full (prompt), acks coalesced away.
  uint64_t polls = 0, idle_polls = 0, acks_prompt = 0;
  // ACKs not sent because a frame going the other way carried the same cumulative ACK (a reply,
  // a CTS) with no gap to report (Engine::ack_carried).
  uint64_t acks_carried = 0;
  uint64_t yields = 0;  // test() calls that found nothing and yielded the CPU
  // One-frame messages sent before their CTS, and eager frames refused (too many waiting).
  uint64_t eager_sends = 0, early_full = 0;
  uint64_t tail_probes = 0;  // retransmissions of the newest packet after a silence
  // Retransmissions the peer reported as duplicates, and the delay tolerance they raised (us).
  uint64_t spurious_retransmits = 0;
  double tolerance_us = 0;
  // The latest RTT estimate of any connection (us), and its retransmission timeout.
  double srtt_us = 0, rttvar_us = 0, rto_us = 0;
  // Zero-copy TX: data frames sent with the payload as an external segment (and their payload
  // bytes), fragments that fell back to a copy (no mbuf for the segment), and frames received
  // as headers + payload segments (the payload read in place, not linearised).
  uint64_t zc_frames_tx = 0, zc_bytes_tx = 0, zc_fallbacks = 0, rx_split_frames = 0;
  FramePort::Drops port;  // the port's own losses (rte_eth_stats)
  uint64_t decode_drops_total() const {
    uint64_t s = 0;
    for (uint64_t v : decode_drops) s += v;
    return s;
  }
};

// Every counter of `s` on one line ("tx 12 rx 10 ... out_of_window 0"): dpdk_testbed_host prints
// it, and an engine logs its own at debug level when it shuts down (GW_LOG_LEVEL=debug).
std::string describe(const EngineStats& s);

struct ConnectTarget {
  Endpoint ep;
  uint32_t listener_id = 0;
  int32_t listener_rank = -1;  // the listener's rank (-1: none), covered by the proofs
};

class Engine {
 public:
  static Result<std::shared_ptr<Engine>> create(std::unique_ptr<FramePort> port,
                                                const EngineConfig& config);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Endpoint local() const { return local_; }
  size_t payload_max() const { return payload_max_; }
  const EngineConfig& config() const { return config_; }
  std::string port_name() const;
  EngineStats stats() const;

  // Listener side. Returns the listener id. `rank` (-1: none) is this side's rank: a HELLO
  // that names another listener rank is refused.
  uint32_t listen(const std::string& token, int rank = -1);
  // Only a connector stating this rank completes a handshake with `listener` (-1: any).
  void expect_peer(uint32_t listener, int rank);
  void close_listener(uint32_t listener);
  // A connection that completed the handshake, or 0.
  Result<uint32_t> accept(uint32_t listener);

  // Connector side: starts the handshake; connect_poll says when it is done.
  // `rank` (-1: none) travels in the HELLO so the accepting side can check and name this peer;
  // the handshake proves the token both ways (docs/wire-dpdk.md, core/net/handshake.h).
  uint32_t connect(const ConnectTarget& target, const std::string& token, int64_t timeout_ms,
                   std::string label, int rank = -1);
  Result<bool> connect_poll(uint32_t conn);

  // Data. Request handles are opaque; nullptr means "no free slot now".
  // `region` (may be null): the counter of the registered region that holds `data`. Only such a
  // send may go zero copy; its frames are then counted on `region` too (dereg waits for them),
  // and the send completes only once the port has released every frame of it.
  Result<void*> isend(uint32_t conn, const void* data, size_t size, int tag,
                      TxRef* region = nullptr);
  Result<void*> irecv(uint32_t conn, void* data, size_t size, int tag);
  Status test(uint32_t conn, void* request, bool* done, size_t* size);
  // Tells the peer and forgets the connection (requests in flight are abandoned).
  void close_conn(uint32_t conn);
  std::string peer_name(uint32_t conn) const;
  // Sets the dead-peer timeout of one connection (the transport caps it by its timeout_ms).
  void set_peer_timeout(uint32_t conn, int64_t ms);

  // One pass of the RX/TX loop (tests call it to step the protocol).
  void progress();
  // Drives progress until no frame counted on `ref` is held by the port any more, or until
  // `timeout_ms` passes (kTimeout naming `what` and the frames still held).
  Status wait_released(TxRef* ref, int64_t timeout_ms, const std::string& what);
  bool zero_copy() const { return port_->zero_copy(); }
  // Tests: sees every frame that decoded (under the engine's lock; payload in place).
  void set_frame_tap(std::function<void(const Frame&)> tap);
  // Processes one received frame as if the port had delivered it (the fuzz driver uses it).
  void inject_rx(const uint8_t* data, size_t len);

 private:
  // Defined in engine_internal.h; the member functions are spread over engine*.cc by concern.
  struct Conn;
  struct SendReq;
  struct RecvReq;
  struct TxPkt;
  struct Listener;
  struct Pending;

  Engine(std::unique_ptr<FramePort> port, const EngineConfig& config);
  size_t progress_locked();       // returns the frames received
  uint64_t pass_ = 0;             // progress passes so far (ack_soon)
  bool background_pass_ = false;  // the background thread's pass (no caller to answer)
  Status test_locked(uint32_t conn, void* request, bool* done, size_t* size, bool* idle);
  void handle_frame(const FrameBuf& b);
  Status wait_released_locked(TxRef* ref, int64_t timeout_ms, const std::string& what);
  void handle_hello(const Frame& f);
  void handle_proof(const Frame& f);
  void send_hello(Conn& c, int64_t now);
  void handle_conn_frame(Conn& c, const Frame& f);
  void on_handshake_reply(Conn& c, const Frame& f, int64_t now);
  void on_ack(Conn& c, const Frame& f);
  void on_reliable(Conn& c, const Frame& f);
  void deliver_eager(Conn& c, RecvReq& r, uint64_t len, int32_t tag, const uint8_t* payload);
  void acked(Conn& c, TxPkt& p);
  void rack_detect(Conn& c, int64_t now);
  void rtt_sample(Conn& c, double us);
  void pump(Conn& c);
  void timers(Conn& c, int64_t now);  // now: the pass's clock reading (sys::now_ns())
  bool emit_reliable(Conn& c, TxPkt pkt);
  void send_pkt(Conn& c, TxPkt& p, bool retx);
  void send_ack(Conn& c);
  void ack_carried(Conn& c);
  void acks_with_answer();
  void send_ctl(const Endpoint& dst, GwHeader hdr, const void* payload, size_t len);
  void send_simple(Conn& c, FrameType type, const void* payload = nullptr, size_t len = 0);
  void fail_conn(Conn& c, Status s);
  uint32_t window_of(const Conn& c) const;
  uint32_t advertised_window() const;
  void queue_tx(FrameBuf b);
  void flush_tx();
  void release_held(bool all);
  Conn* find(uint32_t id);
  const Conn* find(uint32_t id) const;
  uint32_t new_id();

  std::unique_ptr<FramePort> port_;
  EngineConfig config_;
  Endpoint local_;
  size_t payload_max_ = 0;
  bool offload_ = false;

  mutable std::mutex mu_;
  std::unordered_map<uint32_t, std::unique_ptr<Conn>> conns_;
  std::unordered_map<uint32_t, std::unique_ptr<Listener>> listeners_;
  std::vector<Pending> pending_;  // listener side: CHALLENGE sent, PROOF awaited (oldest first)
  uint32_t next_id_ = 1;
  uint16_t ip_id_ = 0;
  uint64_t rng_state_ = 0;
  FaultInjector faults_;
  struct Held {
    FrameBuf buf;
    int countdown;
    int64_t since_ns;
  };
  std::vector<Held> held_;
  std::vector<FrameBuf> tx_batch_;
  std::vector<FrameBuf> rx_batch_;
  int64_t last_rst_ns_ = 0;
  EngineStats stats_;
  int idle_tests_ = 0;
  std::function<void(const Frame&)> frame_tap_;
  std::atomic<uint64_t> yields_{0};
  std::atomic<int64_t> last_progress_ns_{0};
  // The port's link, asked every kLinkCheckNs from the progress loop (FramePort::check_link).
  static constexpr int64_t kLinkCheckNs = 100 * 1000 * 1000;
  int64_t next_link_check_ns_ = 0;
  bool link_up_ = true;

  std::thread thread_;
  std::mutex thread_mu_;
  std::condition_variable thread_cv_;
  bool stop_ = false;
};

}  // namespace gw::dpdk
