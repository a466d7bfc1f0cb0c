// The gradwire DPDK wire format: Ethernet / IPv4 / UDP / a 72-byte gradwire header / payload.
// docs/wire-dpdk.md is the reference; this file is its code. Pure byte logic (no DPDK), so the
// encoder and the decoder are unit-tested and fuzzed without a port.
//
// Thread-safety: every function here is reentrant.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace gw::dpdk {

using MacAddr = std::array<uint8_t, 6>;

inline constexpr uint32_t kMagic = 0x47574450;  // "GWDP"
// 2: ts, advertised window, eager, spurious reports; 3: HMAC challenge-response handshake.
inline constexpr uint8_t kVersion = 3;
inline constexpr size_t kEthLen = 14;
inline constexpr size_t kIpLen = 20;
inline constexpr size_t kUdpLen = 8;
inline constexpr size_t kGwLen = 72;
inline constexpr size_t kHeadersLen = kEthLen + kIpLen + kUdpLen + kGwLen;  // 114
inline constexpr size_t kMaxToken = 256;                                    // job token limit
// Handshake payloads (core/net/handshake.h: 32-byte challenges and HMAC-SHA256 proofs).
inline constexpr size_t kHelloPayload = 32;      // HELLO: the connector's challenge
inline constexpr size_t kChallengePayload = 64;  // CHALLENGE: listener's challenge + its proof
inline constexpr size_t kProofPayload = 32;      // PROOF: the connector's proof
inline constexpr size_t kMaxSackBits = 2048;     // ACK payload carries at most this many bits

enum class FrameType : uint8_t {
  kHello = 1,      // connector -> listener: its challenge; tag = its rank, msg = listener's rank
  kHelloAck = 2,   // listener -> connector: connection accepted
  kHelloNak = 3,   // listener -> connector: refused (proof, rank, or no handshake: kFlagRestart)
  kData = 4,       // sender -> receiver (reliable): bytes [offset, offset+len) of message `msg`
  kCts = 5,        // receiver -> sender (reliable): receive `msg` posted, capacity, tag
  kAck = 6,        // either way: cumulative ack + SACK bitmap; also the heartbeat
  kClose = 7,      // either way: the connection is gone
  kMsgErr = 8,     // sender -> receiver (reliable): message `msg` failed (code in `flags`)
  kChallenge = 9,  // listener -> connector: its challenge and its proof of the token
  kProof = 10,     // connector -> listener: its proof of the token
};
inline constexpr uint8_t kMaxFrameType = 10;

// Flags (16 bits).
inline constexpr uint16_t kFlagLast = 1;          // DATA: last fragment of the message
inline constexpr uint16_t kFlagRetx = 2;          // any reliable frame: a retransmission
inline constexpr uint16_t kFlagEager = 4;         // DATA: sent before the receive's CTS
inline constexpr uint16_t kFlagErrTrunc = 0x100;  // MSG_ERR: send larger than the receive
inline constexpr uint16_t kFlagErrTag = 0x200;    // MSG_ERR: tag mismatch
inline constexpr uint16_t kFlagRestart = 0x400;   // HELLO_NAK: no handshake pending, HELLO again

inline bool is_reliable(FrameType t) {
  return t == FrameType::kData || t == FrameType::kCts || t == FrameType::kMsgErr;
}

// The gradwire header, host byte order here, network byte order on the wire.
struct GwHeader {
  FrameType type = FrameType::kAck;
  uint16_t flags = 0;
  uint32_t dst_conn = 0;
  uint32_t src_conn = 0;
  uint64_t session = 0;
  uint32_t seq = 0;  // reliable frames: packet sequence number of this direction
  uint32_t ack = 0;  // every frame: all seq < ack of the other direction were received
  uint32_t msg = 0;  // DATA/CTS/MSG_ERR: message number on the connection
  int32_t tag = 0;
  uint64_t msg_len = 0;  // DATA: total message bytes; CTS: receive capacity
  uint64_t offset = 0;   // DATA: byte offset of this fragment
  uint16_t payload_len = 0;
  uint16_t sack_bits = 0;  // ACK: number of SACK bits in the payload
  uint32_t window = 0;     // free receive window in packets
  uint32_t token_tag = 0;  // 32-bit hash of the job token
  // Timestamp (us, wrapping; 0 = none): reliable frames carry the sender's clock, ACKs echo the
  // clock of the first frame they acknowledge, so every ACK is an unambiguous RTT sample.
  uint32_t ts = 0;
};

// L2-L4 addressing of one endpoint.
struct Endpoint {
  MacAddr mac{};
  uint32_t ip = 0;  // host byte order
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
};

struct Frame {
  Endpoint src;
  Endpoint dst;
  GwHeader hdr;
  const uint8_t* payload = nullptr;
  size_t payload_len = 0;
};

// Why a frame was dropped by the decoder (kOk when it was not).
enum class DecodeError : uint8_t {
  kOk = 0,
  kTruncated,   // shorter than the headers or than the lengths it declares
  kNotIpv4,     // ethertype or IP version
  kIpOptions,   // IHL != 5 (we never send options)
  kIpFragment,  // IP fragments are never sent by us
  kNotUdp,
  kIpChecksum,
  kUdpLength,
  kUdpChecksum,
  kBadMagic,
  kBadVersion,
  kBadType,
  kBadPayloadLen,
  kCount
};
const char* decode_error_name(DecodeError e);

// Decodes and validates a frame in place: bounds, lengths, IPv4 header checksum, UDP checksum
// (unless `l4_checksum_verified`, set when the port validated it in hardware), magic, version,
// type and payload length. On kOk, `out` points into `data`.
DecodeError decode_frame(const uint8_t* data, size_t len, bool l4_checksum_verified, Frame* out);
// A frame in two segments: `data` holds exactly the kHeadersLen bytes of headers, `tail` the
// rest (the payload); the same checks, the checksum across both. tail_len 0 = decode_frame.
DecodeError decode_frame_split(const uint8_t* data, size_t head_len, const uint8_t* tail,
                               size_t tail_len, bool l4_checksum_verified, Frame* out);

// The same frame for a frame whose payload, a separate segment, is not copied: only the
// kHeadersLen bytes of headers go into `buf` (the checksum still covers `payload`). Returns
// kHeadersLen, or 0 when it does not fit.
size_t encode_headers(uint8_t* buf, size_t cap, const Endpoint& src, const Endpoint& dst,
                      GwHeader hdr, const void* payload, size_t len, uint16_t ip_id,
                      bool offload_l4 = false);

// Writes headers + payload into `buf` (capacity `cap`) and fills both checksums in software
// (unless `offload_l4`: then the UDP checksum holds the pseudo-header sum for the port to finish).
// Returns the frame length, or 0 when it does not fit. hdr.payload_len is set from `len`.
size_t encode_frame(uint8_t* buf, size_t cap, const Endpoint& src, const Endpoint& dst,
                    GwHeader hdr, const void* payload, size_t len, uint16_t ip_id,
                    bool offload_l4 = false);

// Internet checksum helpers (RFC 1071), exposed for tests.
uint32_t cksum_partial(const void* data, size_t len, uint32_t sum);
uint16_t cksum_fold(uint32_t sum);

// FNV-1a of the job token; carried in every frame so frames of another job are dropped early.
uint32_t token_tag(const std::string& token);

// 32-bit sequence arithmetic with wrap-around.
inline bool seq_lt(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) < 0; }
inline bool seq_le(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) <= 0; }

std::string format_ip(uint32_t ip);
std::string format_mac(const MacAddr& mac);

}  // namespace gw::dpdk
