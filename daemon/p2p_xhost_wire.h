// The header of a point-to-point message that crosses hosts in daemon mode (docs/wire-daemon.md,
// "Point-to-point across hosts"): the sender's daemon sends it to the receiver's daemon over the
// job's daemon communicator, on tag kXhostTag, followed on the same tag by the payload (none for
// 0 bytes), or with the payload in the same daemon message (kXhostInline). 32 bytes,
// little-endian:
//   u32 magic 'GWXP'  u16 version (4)  u16 flags  i32 src rank  i32 dst rank  i32 user tag
//   u32 payload tag (kXhostDevice, kXhostRefuse; else 0)  u64 bytes
// flags 0: a message of 0 or more than kXhostInlineBytes bytes, its payload the next message;
// kXhostInline: a message of 1 to kXhostInlineBytes bytes, its payload right after these 32 bytes
// in the same daemon message (one send, one frame, one hand-off at the receiver); kXhostHello: the
// first header each daemon sends each other at the job's first send or receive that may cross hosts
// (src, dst, tag and bytes 0, no payload), so that the daemons' connections exist both ways from
// then on and a daemon that goes is seen at once; kXhostBye: the last header a daemon sends each
// daemon it exchanged headers with, when its job ends because a trainer left on purpose (src: that
// trainer's rank; dst, tag and bytes 0, no payload), and the answer to one (the same src): nothing
// more comes from it, and its connections close next without a failure; kXhostRefuse (version 3): a
// device message's receiving daemon refuses it because no receive will take it (its receiving
// trainer left, or the job's point-to-point there failed): src the receiving rank, dst the sender,
// bytes and payload tag the message's, tag why (kXhostRefuseGone, kXhostRefuseFailed); sent just
// before the rendezvous is refused with a receive of 0 bytes, so that the sending daemon fails the
// send naming the reason rather than "truncated". decode_xhost_header refuses anything else (a
// daemon of another version, a rank outside the job, a negative tag, more bytes than the receiving
// daemon takes) with kPeer naming the field.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

#include "core/status.h"

namespace gw::daemon {

inline constexpr uint32_t kXhostMagic = 0x50585747u;  // "GWXP" as little-endian bytes
// 4: a goodbye is answered with one (a daemon of version 3 did not answer, so one of version 4
// would wait for the answer until its deadline); 3: kXhostRefuse; 2: kXhostInline (version 1
// sent every payload as a message of its own).
inline constexpr uint16_t kXhostVersion = 4;
inline constexpr size_t kXhostHeaderBytes = 32;
// The daemons' communicator carries nothing else point-to-point: one tag for header and payload,
// so a payload follows its header in the per (source, tag) order.
inline constexpr int kXhostTag = 0x6778;
inline constexpr uint16_t kXhostHello = 1;
inline constexpr uint16_t kXhostBye = 2;
inline constexpr uint16_t kXhostInline = 4;
// A device message (a dma-buf registration's bytes, of 1 byte or more): its payload is not the
// next message on kXhostTag but a rendezvous on a tag of its own, the header's u32 at 20 (the
// payload tag, kXhostDeviceTagFirst or above), which the receiving daemon takes only once a
// receive of its trainer matched the header: so a device message waits at its sender, never in
// an unexpected CPU buffer, and the headers behind it are not held up.
inline constexpr uint16_t kXhostDevice = 8;
inline constexpr int32_t kXhostDeviceTagFirst = 0x40000000;
// The refusal of a device message (from its receiving daemon: see above), its payload tag at 20.
inline constexpr uint16_t kXhostRefuse = 16;
// A refusal's tag: why no receive will take the message.
inline constexpr int32_t kXhostRefuseGone = 0;    // its receiving trainer left
inline constexpr int32_t kXhostRefuseFailed = 1;  // the job's point-to-point failed there
// The largest payload sent inline (well under the communicator's 16 KiB eager size, so such a
// message is one eager frame; a copy of this much costs less than a second send and wake-up).
inline constexpr uint64_t kXhostInlineBytes = 4096;

struct XhostHeader {
  uint16_t flags = 0;
  int32_t src = 0;
  int32_t dst = 0;
  int32_t tag = 0;
  uint64_t bytes = 0;
  int32_t payload_tag = 0;  // kXhostDevice only
};

inline std::array<uint8_t, kXhostHeaderBytes> encode_xhost_header(const XhostHeader& h) {
  std::array<uint8_t, kXhostHeaderBytes> b{};
  const uint32_t magic = kXhostMagic;
  const uint16_t version = kXhostVersion;
  std::memcpy(b.data() + 0, &magic, 4);
  std::memcpy(b.data() + 4, &version, 2);
  std::memcpy(b.data() + 6, &h.flags, 2);
  std::memcpy(b.data() + 8, &h.src, 4);
  std::memcpy(b.data() + 12, &h.dst, 4);
  std::memcpy(b.data() + 16, &h.tag, 4);
  std::memcpy(b.data() + 20, &h.payload_tag, 4);
  std::memcpy(b.data() + 24, &h.bytes, 8);
  return b;
}

// p: the n bytes of one daemon message; kXhostHeaderBytes, or that plus h.bytes for an inline
// message (its payload at p + kXhostHeaderBytes). world: the job's ranks; max_bytes: the largest
// payload the receiving daemon takes.
inline Result<XhostHeader> decode_xhost_header(const uint8_t* p, size_t n, int32_t world,
                                               uint64_t max_bytes) {
  if (n < kXhostHeaderBytes) {
    return peer_error("cross-host point-to-point header of {} bytes, not {}", n, kXhostHeaderBytes);
  }
  uint32_t magic = 0, reserved = 0;
  uint16_t version = 0;
  XhostHeader h;
  std::memcpy(&magic, p + 0, 4);
  std::memcpy(&version, p + 4, 2);
  std::memcpy(&h.flags, p + 6, 2);
  std::memcpy(&h.src, p + 8, 4);
  std::memcpy(&h.dst, p + 12, 4);
  std::memcpy(&h.tag, p + 16, 4);
  std::memcpy(&reserved, p + 20, 4);
  std::memcpy(&h.bytes, p + 24, 8);
  if (magic != kXhostMagic) return peer_error("cross-host point-to-point header: bad magic");
  if (version != kXhostVersion ||
      (h.flags != 0 && h.flags != kXhostHello && h.flags != kXhostBye && h.flags != kXhostInline &&
       h.flags != kXhostDevice && h.flags != kXhostRefuse) ||
      (h.flags != kXhostDevice && h.flags != kXhostRefuse && reserved != 0)) {
    return peer_error(
        "cross-host point-to-point header version {} (flags {}): this daemon speaks version {}",
        version, h.flags, kXhostVersion);
  }
  if (h.flags == kXhostInline && (h.bytes == 0 || h.bytes > kXhostInlineBytes)) {
    return peer_error("cross-host point-to-point inline message of {} bytes (1 to {})", h.bytes,
                      kXhostInlineBytes);
  }
  if (h.flags == kXhostDevice || h.flags == kXhostRefuse) {
    if (h.bytes == 0 || reserved < static_cast<uint32_t>(kXhostDeviceTagFirst) ||
        reserved > 0x7fffffffu) {
      return peer_error("cross-host point-to-point device message{} of {} bytes on payload tag {}",
                        h.flags == kXhostRefuse ? "'s refusal" : "", h.bytes, reserved);
    }
    h.payload_tag = static_cast<int32_t>(reserved);
  }
  if (h.flags == 0 && h.bytes > 0 && h.bytes <= kXhostInlineBytes) {
    return peer_error("cross-host point-to-point message of {} bytes not inline", h.bytes);
  }
  const size_t want = kXhostHeaderBytes + (h.flags == kXhostInline ? h.bytes : 0);
  if (n != want) {
    return peer_error("cross-host point-to-point header of {} bytes, not {}", n, want);
  }
  if (h.flags == kXhostHello && (h.src != 0 || h.dst != 0 || h.tag != 0 || h.bytes != 0)) {
    return peer_error("cross-host point-to-point hello with a message's fields");
  }
  if (h.flags == kXhostBye && (h.dst != 0 || h.tag != 0 || h.bytes != 0)) {
    return peer_error("cross-host point-to-point goodbye with a message's fields");
  }
  if (h.src < 0 || h.src >= world || h.dst < 0 || h.dst >= world) {
    return peer_error("cross-host point-to-point header: ranks {} -> {} outside the job's {}",
                      h.src, h.dst, world);
  }
  if (h.tag < 0) return peer_error("cross-host point-to-point header: tag {} < 0", h.tag);
  if (h.flags == kXhostRefuse && h.tag != kXhostRefuseGone && h.tag != kXhostRefuseFailed) {
    return peer_error("cross-host point-to-point refusal for reason {}", h.tag);
  }
  if (h.bytes > max_bytes) {
    return peer_error("cross-host point-to-point header: {} bytes, more than the {} taken", h.bytes,
                      max_bytes);
  }
  return h;
}

}  // namespace gw::daemon
