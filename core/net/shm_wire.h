// The shm backend's wire structs and the ring segment's layout (docs/wire-shm.md). Internal to
// core/net/shm_transport.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <utility>

#include "core/net/handshake.h"
#include "core/net/transport.h"
#include "core/sys/memfd_region.h"

namespace gw::net::shm {

using sys::MemfdRegion;

inline constexpr uint16_t kVersion = 2;
inline constexpr size_t kHostIdSize = 64;
inline constexpr size_t kSockNameSize = 32;
inline constexpr uint32_t kRingMagic = 0x47575231;       // "GWR1"
inline constexpr int64_t kRetryNs = 10 * 1000 * 1000;    // between connect() attempts
inline constexpr int64_t kLivenessNs = 1 * 1000 * 1000;  // between peer liveness checks

// All wire structs are little-endian, fixed size (docs/wire-shm.md).
struct HandleWire {
  char magic[4];  // "GWS1"
  uint16_t version;
  uint16_t reserved;
  uint64_t nonce;
  int32_t rank;
  uint32_t reserved2;
  char sock_name[kSockNameSize];  // abstract AF_UNIX name, NUL-padded
  char host_id[kHostIdSize];      // NUL-padded
};
static_assert(sizeof(HandleWire) == 120 && sizeof(HandleWire) <= kHandleSize);

// Connector -> listener, first packet.
struct Hello {
  char magic[4];  // "GWSI"
  uint32_t reserved;
  uint64_t nonce;         // from the handle
  int32_t rank;           // the connector's
  int32_t listener_rank;  // the listener's, as the handle says
  handshake::Nonce challenge;
};
static_assert(sizeof(Hello) == 56);

// Listener -> connector: its challenge and its proof (a refusal is a Reply with kRefuse).
struct Challenge {
  char magic[4];  // "GWSC"
  uint32_t reserved;
  handshake::Nonce challenge;
  handshake::Mac proof;
};
static_assert(sizeof(Challenge) == 72);

// Connector -> listener: its proof. The listener answers with a Reply.
struct Proof {
  char magic[4];  // "GWSP"
  uint32_t reserved;
  handshake::Mac proof;
};
static_assert(sizeof(Proof) == 40);

inline handshake::Transcript transcript(const Hello& h) {
  handshake::Transcript t;
  t.protocol = "shm";
  t.handle_nonce = h.nonce;
  t.connector_rank = h.rank;
  t.listener_rank = h.listener_rank;
  t.connector_challenge = h.challenge;
  return t;
}

struct Reply {
  char magic[4];  // "GWSR"
  uint8_t answer;
  uint8_t reserved[3];
  uint32_t nslots;
  uint32_t reserved2;
  uint64_t slot_size;
  uint64_t total_size;
};
static_assert(sizeof(Reply) == 32);

// The control block at offset 0 of the segment. Counters only grow; slot = count % nslots.
struct RingCtrl {
  uint32_t magic;
  uint32_t nslots;
  uint64_t slot_size;
  alignas(64) std::atomic<uint64_t> head;        // slots published by the sender
  alignas(64) std::atomic<uint64_t> tail;        // slots released by the receiver
  alignas(64) std::atomic<uint32_t> error_code;  // receiver's verdict on error_seq (0 = none)
  uint64_t error_seq;
  std::atomic<uint32_t> cma_state;  // shm_cma.h CmaState
  uint32_t reserved;
  uint64_t cma_probe;  // kCmaOffered: where the sender's mapping has `magic`
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);
static_assert(sizeof(RingCtrl) == 256);

struct SlotHeader {
  uint64_t msg_seq;   // message number on this connection
  uint64_t msg_size;  // bytes of the whole message
  uint64_t offset;    // where this slot's bytes go in the message
  uint32_t len;       // bytes in this slot
  int32_t tag;
};
static_assert(sizeof(SlotHeader) == 32);

inline size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

struct Geometry {
  uint32_t nslots = 0;
  uint64_t slot_size = 0;
  size_t headers_offset() const { return sizeof(RingCtrl); }
  size_t data_offset() const {
    return round_up(sizeof(RingCtrl) + nslots * sizeof(SlotHeader), 4096);
  }
  size_t slot_stride() const { return round_up(slot_size, 64); }
  size_t total() const { return data_offset() + nslots * slot_stride(); }
};

// One mapping of a ring segment.
class Ring {
 public:
  Ring(MemfdRegion region, Geometry g)
      : region_(std::move(region)), base_(static_cast<char*>(region_.data())), g_(g) {}
  Ring(Ring&& o) noexcept
      : region_(std::move(o.region_)), base_(std::exchange(o.base_, nullptr)), g_(o.g_) {}
  Ring& operator=(Ring&&) = delete;
  // The segment's descriptor is needed only until it has been passed to the peer.
  void close_fd() { region_.close_fd(); }
  RingCtrl* ctrl() const { return reinterpret_cast<RingCtrl*>(base_); }
  SlotHeader* header(uint64_t slot) const {
    return reinterpret_cast<SlotHeader*>(base_ + g_.headers_offset()) + slot;
  }
  char* data(uint64_t slot) const { return base_ + g_.data_offset() + slot * g_.slot_stride(); }
  const Geometry& geometry() const { return g_; }

 private:
  MemfdRegion region_;
  char* base_ = nullptr;
  Geometry g_;
};

}  // namespace gw::net::shm
