// FramePort: the narrow interface between the reliable protocol (Engine) and whatever moves
// Ethernet frames: a DPDK ethdev (DpdkPort) or an in-memory switch (MemSwitch, for tests that run
// several "hosts" in one process without DPDK). Burst-shaped, like rte_eth_rx/tx_burst.
//
// Ownership: a FrameBuf obtained from alloc() or rx_burst() belongs to the caller until it is
// passed to tx_burst() (which takes the ones it sends) or free().
// Thread-safety: one thread at a time per port (the engine serialises), except MemSwitch, which
// may be used by several ports' engines at once.
#pragma once

#include <atomic>
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
  // A second segment: on TX the user's payload attached by attach_external (not copied); on RX
  // the payload when the port delivered the frame as headers + payload segments (data/len then
  // hold exactly the kHeadersLen bytes of headers). Null/0 for one-segment frames.
  const uint8_t* data2 = nullptr;
  size_t len2 = 0;
  void* opaque = nullptr;       // the port's handle (an rte_mbuf*)
  bool l4_checksum_ok = false;  // RX: the port verified the UDP checksum
};

// Counts the frames that still reference some user memory (zero-copy TX) for one owner: a send
// request, a registered region, a connection. Intrusive and shared: the owner holds one
// reference (TxRefHandle), every frame one more, so whichever lets go last frees it; a port may
// release a frame from any thread.
class TxRef {
 public:
  static TxRef* make() { return new TxRef(); }
  void hold() { holders_.fetch_add(1, std::memory_order_relaxed); }
  void unhold() {
    if (holders_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }
  void frame_attached() {
    hold();
    frames_.fetch_add(1, std::memory_order_relaxed);
    attached_.fetch_add(1, std::memory_order_relaxed);
  }
  void frame_released() {
    frames_.fetch_sub(1, std::memory_order_release);
    unhold();
  }
  // Frames attached and not yet released by the port.
  int64_t frames() const { return frames_.load(std::memory_order_acquire); }
  // Frames ever attached (zero-copy frames sent for this owner).
  uint64_t attached() const { return attached_.load(std::memory_order_relaxed); }

 private:
  TxRef() = default;
  std::atomic<int64_t> holders_{1};
  std::atomic<int64_t> frames_{0};
  std::atomic<uint64_t> attached_{0};
};

// The owner's reference to a TxRef (move-only).
class TxRefHandle {
 public:
  TxRefHandle() = default;
  explicit TxRefHandle(TxRef* r) : r_(r) {}
  static TxRefHandle make() { return TxRefHandle(TxRef::make()); }
  TxRefHandle(TxRefHandle&& o) noexcept : r_(o.r_) { o.r_ = nullptr; }
  TxRefHandle& operator=(TxRefHandle&& o) noexcept {
    if (this != &o) {
      reset();
      r_ = o.r_;
      o.r_ = nullptr;
    }
    return *this;
  }
  TxRefHandle(const TxRefHandle&) = delete;
  TxRefHandle& operator=(const TxRefHandle&) = delete;
  ~TxRefHandle() { reset(); }
  // Another owner's reference to the same counter.
  TxRefHandle share() const {
    if (r_ != nullptr) r_->hold();
    return TxRefHandle(r_);
  }
  void reset() {
    if (r_ != nullptr) r_->unhold();
    r_ = nullptr;
  }
  TxRef* get() const { return r_; }
  explicit operator bool() const { return r_ != nullptr; }

 private:
  TxRef* r_ = nullptr;
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

  // Zero-copy transmit: whether attach_external may be used (decided when the port opened, from
  // the PMD and GW_DPDK_ZERO_COPY; see docs/dpdk.md).
  virtual bool zero_copy() const { return false; }
  // Makes `len` bytes at `data` (user memory, not copied) the frame's second segment, after the
  // headers already in buf->data. Every counter in refs[0..n) is told frame_attached now and
  // frame_released when the port lets go of the segment (after tx_burst, possibly on another
  // thread, or in free()). The memory must stay valid and unchanged until then. False (nothing
  // attached) when the port cannot: the caller copies instead.
  virtual bool attach_external(FrameBuf* /*buf*/, const uint8_t* /*data*/, size_t /*len*/,
                               TxRef* const* /*refs*/, int /*n*/) {
    return false;
  }
  // Whether the link is up (true where the port cannot tell). The engine calls it about every
  // 100 ms from its progress loop; a port whose link is down may try to bring it up there
  // (net_memif's client connects again to a server that was not listening yet, or came back).
  virtual bool check_link() { return true; }
  // Asks the PMD to free the mbufs of frames it has finished sending (so zero-copy segments are
  // released without waiting for more traffic). Best effort.
  virtual void tx_cleanup() {}
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
  // Decides per frame whether the switch forwards it (false: dropped, as a lossy link would),
  // after the tap has seen it. Tests use it to lose chosen frames deterministically.
  void set_filter(std::function<bool(const uint8_t*, size_t)> filter);

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
  std::function<bool(const uint8_t*, size_t)> filter_;
};

}  // namespace gw::dpdk
