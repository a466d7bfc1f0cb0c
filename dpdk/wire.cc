#include "dpdk/wire.h"

#include <fmt/format.h>
#include <immintrin.h>

#include <algorithm>
#include <cstring>

namespace gw::dpdk {

namespace {

inline void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v >> 8);
  p[1] = static_cast<uint8_t>(v);
}
inline void put32(uint8_t* p, uint32_t v) {
  put16(p, static_cast<uint16_t>(v >> 16));
  put16(p + 2, static_cast<uint16_t>(v));
}
inline void put64(uint8_t* p, uint64_t v) {
  put32(p, static_cast<uint32_t>(v >> 32));
  put32(p + 4, static_cast<uint32_t>(v));
}
inline uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>((p[0] << 8) | p[1]); }
inline uint32_t get32(const uint8_t* p) {
  return (static_cast<uint32_t>(get16(p)) << 16) | get16(p + 2);
}
inline uint64_t get64(const uint8_t* p) {
  return (static_cast<uint64_t>(get32(p)) << 32) | get32(p + 4);
}

constexpr uint16_t kEtherIpv4 = 0x0800;
constexpr uint8_t kProtoUdp = 17;

// Sum of the pseudo header (RFC 768) as memory words in network order.
uint32_t pseudo_sum(uint32_t src_ip, uint32_t dst_ip, uint16_t udp_len) {
  uint8_t ph[12];
  put32(ph, src_ip);
  put32(ph + 4, dst_ip);
  ph[8] = 0;
  ph[9] = kProtoUdp;
  put16(ph + 10, udp_len);
  return cksum_partial(ph, sizeof(ph), 0);
}

// The checksum's sum of 16-bit words, taken 32 bits at a time: each 8-byte word adds its two
// 32-bit halves to a 64-bit accumulator (2^16 = 1 modulo 0xffff, so the fold at the end gives the
// same ones'-complement sum; a frame is far too short for the accumulator to wrap).
// AVX2: 64 bytes a step into 64-bit lanes, about 1.7 times the scalar loop's speed (the
// checksum is the engine's own largest cost per frame: gradwire-micro's dpdk_frame/checksum).
__attribute__((target("avx2"))) uint64_t sum32_avx2(const uint8_t* p, size_t len) {
  const __m256i low = _mm256_set1_epi64x(0xffffffff);
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (; len >= 64; len -= 64, p += 64) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32));
    a0 = _mm256_add_epi64(a0, _mm256_and_si256(x, low));
    a1 = _mm256_add_epi64(a1, _mm256_srli_epi64(x, 32));
    a0 = _mm256_add_epi64(a0, _mm256_and_si256(y, low));
    a1 = _mm256_add_epi64(a1, _mm256_srli_epi64(y, 32));
  }
  if (len >= 32) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    a0 = _mm256_add_epi64(a0, _mm256_and_si256(x, low));
    a1 = _mm256_add_epi64(a1, _mm256_srli_epi64(x, 32));
  }
  const __m256i a = _mm256_add_epi64(a0, a1);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

bool have_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

}  // namespace

uint32_t cksum_partial(const void* data, size_t len, uint32_t sum) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint64_t acc = sum;
  if (len >= 64 && have_avx2()) {
    const size_t n = len & ~size_t{31};
    acc += sum32_avx2(p, n);
    p += n;
    len -= n;
  }
  while (len >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    acc += (v & 0xffffffffu) + (v >> 32);
    p += 8;
    len -= 8;
  }
  while (len >= 2) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    acc += v;
    p += 2;
    len -= 2;
  }
  if (len == 1) {
    uint16_t v = 0;
    std::memcpy(&v, p, 1);  // the odd byte is the first byte of a zero-padded word
    acc += v;
  }
  acc = (acc & 0xffffffffu) + (acc >> 32);
  acc = (acc & 0xffffffffu) + (acc >> 32);
  return static_cast<uint32_t>(acc);
}

uint16_t cksum_fold(uint32_t sum) {
  sum = (sum & 0xffff) + (sum >> 16);
  sum = (sum & 0xffff) + (sum >> 16);
  return static_cast<uint16_t>(sum);
}

uint32_t token_tag(const std::string& token) {
  uint32_t h = 2166136261u;
  for (unsigned char c : token) {
    h ^= c;
    h *= 16777619u;
  }
  return h;
}

const char* decode_error_name(DecodeError e) {
  switch (e) {
    case DecodeError::kOk:
      return "ok";
    case DecodeError::kTruncated:
      return "truncated";
    case DecodeError::kNotIpv4:
      return "not_ipv4";
    case DecodeError::kIpOptions:
      return "ip_options";
    case DecodeError::kIpFragment:
      return "ip_fragment";
    case DecodeError::kNotUdp:
      return "not_udp";
    case DecodeError::kIpChecksum:
      return "ip_checksum";
    case DecodeError::kUdpLength:
      return "udp_length";
    case DecodeError::kUdpChecksum:
      return "udp_checksum";
    case DecodeError::kBadMagic:
      return "bad_magic";
    case DecodeError::kBadVersion:
      return "bad_version";
    case DecodeError::kBadType:
      return "bad_type";
    case DecodeError::kBadPayloadLen:
      return "bad_payload_len";
    case DecodeError::kCount:
      break;
  }
  return "?";
}

namespace {

// Writes the headers of a frame whose payload (`len` bytes at `payload`) either follows them in
// `buf` (inline: copied here) or travels as a separate segment (not copied). The UDP checksum
// covers the payload either way: the 80 bytes of UDP + gradwire header are an even count, so the
// payload's partial sum continues theirs across the segment boundary.
size_t encode(uint8_t* buf, size_t cap, const Endpoint& src, const Endpoint& dst, GwHeader hdr,
              const void* payload, size_t len, uint16_t ip_id, bool offload_l4,
              bool inline_payload) {
  if (len > 0xffff || kHeadersLen + (inline_payload ? len : 0) > cap ||
      kIpLen + kUdpLen + kGwLen + len > 0xffff) {
    return 0;
  }
  hdr.payload_len = static_cast<uint16_t>(len);
  uint8_t* eth = buf;
  std::memcpy(eth, dst.mac.data(), 6);
  std::memcpy(eth + 6, src.mac.data(), 6);
  put16(eth + 12, kEtherIpv4);

  const uint16_t udp_len = static_cast<uint16_t>(kUdpLen + kGwLen + len);
  uint8_t* ip = eth + kEthLen;
  ip[0] = 0x45;
  ip[1] = 0;
  put16(ip + 2, static_cast<uint16_t>(kIpLen + udp_len));
  put16(ip + 4, ip_id);
  put16(ip + 6, 0x4000);  // DF, never fragmented: we fragment ourselves
  ip[8] = 64;
  ip[9] = kProtoUdp;
  put16(ip + 10, 0);
  put32(ip + 12, src.ip);
  put32(ip + 16, dst.ip);
  const uint16_t ipsum = static_cast<uint16_t>(~cksum_fold(cksum_partial(ip, kIpLen, 0)));
  std::memcpy(ip + 10, &ipsum, 2);

  uint8_t* udp = ip + kIpLen;
  put16(udp, src.port);
  put16(udp + 2, dst.port);
  put16(udp + 4, udp_len);
  put16(udp + 6, 0);

  uint8_t* g = udp + kUdpLen;
  put32(g, kMagic);
  g[4] = kVersion;
  g[5] = static_cast<uint8_t>(hdr.type);
  put16(g + 6, hdr.flags);
  put32(g + 8, hdr.dst_conn);
  put32(g + 12, hdr.src_conn);
  put64(g + 16, hdr.session);
  put32(g + 24, hdr.seq);
  put32(g + 28, hdr.ack);
  put32(g + 32, hdr.msg);
  put32(g + 36, static_cast<uint32_t>(hdr.tag));
  put64(g + 40, hdr.msg_len);
  put64(g + 48, hdr.offset);
  put16(g + 56, hdr.payload_len);
  put16(g + 58, hdr.sack_bits);
  put32(g + 60, hdr.window);
  put32(g + 64, hdr.token_tag);
  put32(g + 68, hdr.ts);
  if (len > 0 && inline_payload) std::memcpy(g + kGwLen, payload, len);

  uint32_t sum = pseudo_sum(src.ip, dst.ip, udp_len);
  if (offload_l4) {
    const uint16_t ph = cksum_fold(sum);  // the port adds the rest and complements
    std::memcpy(udp + 6, &ph, 2);
  } else {
    sum = cksum_partial(udp, kUdpLen + kGwLen, sum);
    if (len > 0) sum = cksum_partial(inline_payload ? g + kGwLen : payload, len, sum);
    uint16_t c = static_cast<uint16_t>(~cksum_fold(sum));
    if (c == 0) c = 0xffff;  // 0 means "no checksum" in UDP/IPv4
    std::memcpy(udp + 6, &c, 2);
  }
  return inline_payload ? kEthLen + kIpLen + udp_len : kHeadersLen;
}

}  // namespace

size_t encode_frame(uint8_t* buf, size_t cap, const Endpoint& src, const Endpoint& dst,
                    GwHeader hdr, const void* payload, size_t len, uint16_t ip_id,
                    bool offload_l4) {
  return encode(buf, cap, src, dst, hdr, payload, len, ip_id, offload_l4, true);
}

size_t encode_headers(uint8_t* buf, size_t cap, const Endpoint& src, const Endpoint& dst,
                      GwHeader hdr, const void* payload, size_t len, uint16_t ip_id,
                      bool offload_l4) {
  return encode(buf, cap, src, dst, hdr, payload, len, ip_id, offload_l4, false);
}

DecodeError decode_frame(const uint8_t* data, size_t len, bool l4_checksum_verified, Frame* out) {
  return decode_frame_split(data, len, nullptr, 0, l4_checksum_verified, out);
}

DecodeError decode_frame_split(const uint8_t* data, size_t head_len, const uint8_t* tail,
                               size_t tail_len, bool l4_checksum_verified, Frame* out) {
  if (data == nullptr || head_len < kHeadersLen) return DecodeError::kTruncated;
  // A split frame has exactly the headers in its first segment (the checksum continues across
  // the boundary only at an even UDP offset, and the payload must be one piece).
  if (tail_len > 0 && (tail == nullptr || head_len != kHeadersLen)) return DecodeError::kTruncated;
  const size_t len = head_len + tail_len;
  if (get16(data + 12) != kEtherIpv4) return DecodeError::kNotIpv4;
  const uint8_t* ip = data + kEthLen;
  if ((ip[0] >> 4) != 4) return DecodeError::kNotIpv4;
  if ((ip[0] & 0xf) != 5) return DecodeError::kIpOptions;
  if ((get16(ip + 6) & 0x3fff) != 0) return DecodeError::kIpFragment;  // MF or offset
  if (ip[9] != kProtoUdp) return DecodeError::kNotUdp;
  const size_t ip_total = get16(ip + 2);
  if (ip_total < kIpLen + kUdpLen + kGwLen || ip_total > len - kEthLen) {
    return DecodeError::kTruncated;
  }
  if (cksum_fold(cksum_partial(ip, kIpLen, 0)) != 0xffff) return DecodeError::kIpChecksum;
  const uint8_t* udp = ip + kIpLen;
  const size_t udp_len = get16(udp + 4);
  if (udp_len != ip_total - kIpLen) return DecodeError::kUdpLength;
  const uint32_t src_ip = get32(ip + 12);
  const uint32_t dst_ip = get32(ip + 16);
  uint16_t wire_sum;
  std::memcpy(&wire_sum, udp + 6, 2);
  // Our frames always carry a checksum; 0 ("none") is refused since ring/memif/veth have no FCS.
  if (wire_sum == 0) return DecodeError::kUdpChecksum;
  if (!l4_checksum_verified) {
    uint32_t sum = pseudo_sum(src_ip, dst_ip, static_cast<uint16_t>(udp_len));
    const size_t in_head = std::min(udp_len, head_len - kEthLen - kIpLen);
    sum = cksum_partial(udp, in_head, sum);
    if (udp_len > in_head) sum = cksum_partial(tail, udp_len - in_head, sum);
    if (cksum_fold(sum) != 0xffff) return DecodeError::kUdpChecksum;
  }
  const uint8_t* g = udp + kUdpLen;
  if (get32(g) != kMagic) return DecodeError::kBadMagic;
  if (g[4] != kVersion) return DecodeError::kBadVersion;
  const uint8_t type = g[5];
  if (type == 0 || type > kMaxFrameType) return DecodeError::kBadType;
  const uint16_t plen = get16(g + 56);
  if (plen != udp_len - kUdpLen - kGwLen) return DecodeError::kBadPayloadLen;
  GwHeader h;
  h.type = static_cast<FrameType>(type);
  h.flags = get16(g + 6);
  h.dst_conn = get32(g + 8);
  h.src_conn = get32(g + 12);
  h.session = get64(g + 16);
  h.seq = get32(g + 24);
  h.ack = get32(g + 28);
  h.msg = get32(g + 32);
  h.tag = static_cast<int32_t>(get32(g + 36));
  h.msg_len = get64(g + 40);
  h.offset = get64(g + 48);
  h.payload_len = plen;
  h.sack_bits = get16(g + 58);
  h.window = get32(g + 60);
  h.token_tag = get32(g + 64);
  h.ts = get32(g + 68);
  // Type-specific sanity: bounds that later code relies on.
  if (h.type == FrameType::kAck && (h.sack_bits > kMaxSackBits || (h.sack_bits + 7u) / 8u > plen)) {
    return DecodeError::kBadPayloadLen;
  }
  if ((h.type == FrameType::kHello && plen != kHelloPayload) ||
      (h.type == FrameType::kChallenge && plen != kChallengePayload) ||
      (h.type == FrameType::kProof && plen != kProofPayload)) {
    return DecodeError::kBadPayloadLen;
  }
  if (h.type == FrameType::kData && (h.offset > h.msg_len || plen > h.msg_len - h.offset)) {
    return DecodeError::kBadPayloadLen;
  }
  Frame f;
  std::memcpy(f.dst.mac.data(), data, 6);
  std::memcpy(f.src.mac.data(), data + 6, 6);
  f.src.ip = src_ip;
  f.dst.ip = dst_ip;
  f.src.port = get16(udp);
  f.dst.port = get16(udp + 2);
  f.hdr = h;
  f.payload = tail_len > 0 ? tail : g + kGwLen;
  f.payload_len = plen;
  *out = f;
  return DecodeError::kOk;
}

std::string format_ip(uint32_t ip) {
  return fmt::format("{}.{}.{}.{}", ip >> 24, (ip >> 16) & 0xff, (ip >> 8) & 0xff, ip & 0xff);
}

std::string format_mac(const MacAddr& m) {
  return fmt::format("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4],
                     m[5]);
}

}  // namespace gw::dpdk
