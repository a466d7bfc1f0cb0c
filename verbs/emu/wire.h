// The emulated wire between two NICs of the verbs emulator (verbs/emu/emu_verbs.h): one TCP
// connection per requester QP to the responder's NIC, carrying fixed-size requests (an RDMA
// WRITE's payload follows its header) and responses (a READ response's data follows it). Both
// ends are this code, so the structs travel in host byte order; PSNs are 24 bits, as in the IBA.
#pragma once

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>

namespace gw::verbs::emu {

constexpr uint32_t kMagic = 0x47574551;  // "GWEQ"

enum Op : uint8_t { kOpWrite = 1, kOpWriteImm = 2, kOpRead = 3 };
// kReadResp is followed by the read's `length` bytes; kNakInvReq answers a READ to a QP that
// takes none (max_dest_rd_atomic 0).
enum Resp : uint8_t { kAck = 1, kNakRnr = 2, kNakAccess = 3, kReadResp = 4, kNakInvReq = 5 };

// Requests and responses on the emulated wire (host byte order: both ends are this code).
struct WireRequest {
  uint32_t magic;
  uint8_t op;
  uint8_t pad[3];
  uint32_t dest_qpn;
  uint32_t psn;
  uint32_t imm;  // as the poster gave it (network order by convention)
  uint32_t rkey;
  uint64_t remote_addr;
  uint64_t length;
};
static_assert(sizeof(WireRequest) == 40);

struct WireResponse {
  uint32_t magic;
  uint8_t type;
  uint8_t rnr_timer;  // the responder's min_rnr_timer, for an RNR NAK
  uint16_t pad;
  uint32_t psn;
  uint32_t length;  // kReadResp: the data bytes that follow
};
static_assert(sizeof(WireResponse) == 16);

// a - b for 24-bit PSNs, in -2^23 .. 2^23-1: negative when a is before b.
inline int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(((a - b) & 0xffffff) << 8) >> 8;
}

// IB local ACK timeout: 4.096 us x 2^timeout; 0 means wait forever.
inline int64_t ack_timeout_ns(uint8_t timeout) {
  if (timeout == 0) return INT64_MAX / 4;
  return static_cast<int64_t>(4096.0 *
                              static_cast<double>(uint64_t{1} << std::min<int>(timeout, 31)));
}

// The IBA's RNR NAK timer encoding (5 bits) in microseconds; 0 encodes 655.36 ms.
inline int64_t rnr_delay_ns(uint8_t code) {
  static const double kUs[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                 160,    240,   320,   480,    640,    960,    1280,   1920,
                                 2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                 40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return static_cast<int64_t>(kUs[code & 31] * 1000);
}

}  // namespace gw::verbs::emu
