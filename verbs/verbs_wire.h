// What the verbs backend puts on the wire: the Handle, the set-up messages on the TCP socket,
// the clear-to-send record and the immediate's encoding (docs/verbs.md describes each).
// Little-endian, fixed size, no implicit padding.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/net/handshake.h"
#include "core/net/transport.h"

namespace gw::verbs {

inline constexpr uint16_t kWireVersion = 2;  // 1 sent the job token in clear
inline constexpr int kMaxQps = 16;
inline constexpr size_t kMaxToken = 256;
inline constexpr int kFifoDepth = 64;  // CTS slots; > kMaxRequests, so a slot is free when reused

struct HandleWire {
  char magic[4];  // "GWV1"
  uint16_t version;
  uint16_t family;   // AF_INET or AF_INET6 of the set-up socket
  uint16_t port_be;  // network byte order
  uint16_t reserved;
  uint32_t scope_id;
  uint8_t addr[16];
  uint64_t nonce;
  int32_t rank;
  uint32_t reserved2;
};
static_assert(sizeof(HandleWire) == 48 && sizeof(HandleWire) <= net::kHandleSize);

// The port a side's QPs live on.
struct PortWire {
  uint8_t gid[16];
  uint16_t lid;
  uint8_t link_layer;  // IBV_LINK_LAYER_*
  uint8_t mtu;         // ibv_mtu of the active MTU (or GW_IB_MTU)
  uint32_t gid_index;
};
static_assert(sizeof(PortWire) == 24);

struct HelloWire {  // sender -> receiver
  char magic[4];    // "GWVH"
  uint16_t version;
  uint16_t nqps;
  uint64_t nonce;
  int32_t rank;
  int32_t listener_rank;            // as the handle says
  net::handshake::Nonce challenge;  // the sender's, fresh
  PortWire port;
  uint32_t qpn[kMaxQps];
  uint64_t fifo_addr;  // the sender's CTS FIFO, written by the receiver
  uint32_t fifo_rkey;
  uint32_t reserved;
};
static_assert(sizeof(HelloWire) == 160);

struct ReplyWire {   // receiver -> sender
  char magic[4];     // "GWVR"
  uint8_t accepted;  // 1, or 0 = refused (token or nonce)
  uint8_t reserved[3];
  int32_t rank;
  uint32_t nqps;
  PortWire port;
  uint32_t qpn[kMaxQps];
  net::handshake::Nonce challenge;  // the receiver's, fresh
  net::handshake::Mac proof;        // the receiver's proof of the job token
};
static_assert(sizeof(ReplyWire) == 168);

inline constexpr uint8_t kReady = 'Y';

struct ReadyWire {            // sender -> receiver once its QPs are in RTS
  net::handshake::Mac proof;  // the sender's proof of the job token
  uint8_t ready;              // kReady
  uint8_t reserved[7];
};
static_assert(sizeof(ReadyWire) == 40);

// What both proofs cover (core/net/handshake.h): protocol "verbs".
inline net::handshake::Transcript verbs_transcript(const HelloWire& h,
                                                   const net::handshake::Nonce& receiver) {
  net::handshake::Transcript t;
  t.protocol = "verbs";
  t.handle_nonce = h.nonce;
  t.connector_rank = h.rank;
  t.listener_rank = h.listener_rank;
  t.connector_challenge = h.challenge;
  t.listener_challenge = receiver;
  return t;
}

// One clear-to-send record: the receiver's buffer for message `seq`, written into FIFO slot
// seq % kFifoDepth. seq_plus_one is the last word: the sender reads it first (acquire) and the
// rest only once it matches, relying on the write landing in address order.
struct alignas(64) CtsWire {
  uint64_t addr;
  uint64_t capacity;
  uint32_t rkey;
  int32_t tag;
  uint8_t reserved[32];
  uint64_t seq_plus_one;
};
static_assert(sizeof(CtsWire) == 64);

// The immediate of each stripe's WRITE_WITH_IMM (host order; sent in network order): the
// stripe's byte count, or, with the top bit set, the sender's verdict on the receive.
inline constexpr uint32_t kImmError = 0x80000000u;
inline constexpr uint32_t kImmTagMismatch = 1u << 28;
inline constexpr uint32_t kImmTruncated = 2u << 28;
inline constexpr uint32_t kImmTagMask = 0x0fffffffu;  // the send's tag, for the message
inline constexpr uint64_t kMaxStripe = (uint64_t{1} << 31) - 4096;

// Stripe i of a message of `size` bytes over `nqps` QPs: 128-byte aligned parts, the last ones
// possibly empty.
inline void stripe(uint64_t size, int nqps, int i, uint64_t* offset, uint64_t* length) {
  uint64_t part = (size + static_cast<uint64_t>(nqps) - 1) / static_cast<uint64_t>(nqps);
  part = (part + 127) / 128 * 128;
  uint64_t begin = part * static_cast<uint64_t>(i);
  if (begin > size) begin = size;
  uint64_t end = begin + part > size ? size : begin + part;
  *offset = begin;
  *length = end - begin;
}

}  // namespace gw::verbs
