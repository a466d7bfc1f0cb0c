// FramePort: the narrow interface between the reliable protocol (Engine) and whatever moves
// Ethernet frames: a DPDK ethdev (DpdkPort) or an in-memory switch (MemSwitch, for tests that run
// several "hosts" in one process without DPDK). Burst-shaped, like rte_eth_rx/tx_burst.
//
// Ownership: a FrameBuf obtained from alloc() or rx_burst() belongs to the caller until it is
// passed to tx_burst() (which takes the ones it sends) or free().
// Thread-safety: one thread at a time per port (the engine serialises), except MemSwitch, which
// may be used by several ports' engines at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dpdk/wire.h"

namespace gw::dpdk {

struct FrameBuf {
  uint8_t* data = nullptr;
  size_t len = 0;
  size_t cap = 0;
  void* opaque = nullptr;       // the port's handle (an rte_mbuf*)
  bool l4_checksum_ok = false;  // RX: the port verified the UDP checksum
};

class FramePort {
 public:
  virtual ~FramePort() = default;
  virtual MacAddr mac() const = 0;
  // Largest IPv4 packet (L3 MTU) this port carries.
  virtual size_t mtu() const = 0;
  // Whether the port completes UDP checksums on transmit (else software does).
  virtual bool tx_l4_offload() const { return false; }
  virtual std::string name() const = 0;
  // A buffer of at least mtu() + 14 bytes, or false when the pool is empty.
  virtual bool alloc(FrameBuf* buf) = 0;
  virtual void free(FrameBuf& buf) = 0;
  // Sends up to n frames; returns how many were taken (the rest still belong to the caller).
  virtual size_t tx_burst(FrameBuf* bufs, size_t n) = 0;
  virtual size_t rx_burst(FrameBuf* bufs, size_t n) = 0;
  // Frames the port itself lost (RX ring full, no mbuf, TX errors): losses the protocol never
  // sees as frames. Zero where the port cannot tell.
  struct Drops {
    uint64_t rx_missed = 0, rx_errors = 0, rx_nombuf = 0, tx_errors = 0;
    // PMD calls that took longer than 1 ms (a PMD that blocks, or a descheduled thread).
    uint64_t slow_rx = 0, slow_tx = 0, max_rx_us = 0, max_tx_us = 0;
  };
  virtual Drops drops() const { return {}; }
  // RX descriptors of the port: the most frames a peer should have in flight to us at once.
  virtual size_t rx_ring_size() const { return 4096; }
};

// An in-memory Ethernet switch: ports attached to it deliver frames by destination MAC
// (a frame to the sender's own MAC loops back). Used by unit tests and the fuzz driver.
class MemSwitch : public std::enable_shared_from_this<MemSwitch> {
 public:
  // A port with this MAC and MTU; `queue_limit` frames may wait in its RX queue (tail drop).
  std::unique_ptr<FramePort> attach(const MacAddr& mac, size_t mtu = 9000,
                                    size_t queue_limit = 4096);
  // Delivers a copy of the frame; false when the destination is unknown or full.
  bool deliver(const uint8_t* data, size_t len);
  void detach(const MacAddr& mac);
  uint64_t delivered() const;
  // Sees every frame the switch forwards (tests record frames to replay or mutate them).
  void set_tap(std::function<void(const uint8_t*, size_t)> tap);

 private:
  friend class MemPort;
  struct Queue {
    std::deque<std::vector<uint8_t>> frames;
    size_t limit = 0;
  };
  bool pop(const MacAddr& mac, std::vector<uint8_t>* out);
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Queue> queues_;
  uint64_t delivered_ = 0;
  std::function<void(const uint8_t*, size_t)> tap_;
};

}  // namespace gw::dpdk
