#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "dpdk/fault_injector.h"
#include "dpdk/wire.h"

namespace gw::dpdk {
namespace {

Endpoint ep(uint8_t last, uint32_t ip, uint16_t port) {
  Endpoint e;
  e.mac = {0x02, 0, 0, 0, 0, last};
  e.ip = ip;
  e.port = port;
  return e;
}

std::vector<uint8_t> make(const GwHeader& h, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> buf(kHeadersLen + payload.size() + 16);
  size_t n = encode_frame(buf.data(), buf.size(), ep(1, 0x0a000001, 47000),
                          ep(2, 0x0a000002, 47001), h, payload.data(), payload.size(), 7);
  buf.resize(n);
  return buf;
}

TEST(DpdkWire, RoundTripEveryField) {
  GwHeader h;
  h.type = FrameType::kData;
  h.flags = kFlagLast;
  h.dst_conn = 0x11223344;
  h.src_conn = 0x55667788;
  h.session = 0x0123456789abcdefull;
  h.seq = 0xfffffffe;
  h.ack = 17;
  h.msg = 99;
  h.tag = -5;
  h.msg_len = 1000;
  h.offset = 997;
  h.window = 256;
  h.token_tag = token_tag("secret");
  h.ts = 0xfedcba98;
  std::vector<uint8_t> payload = {1, 2, 3};  // odd length exercises the checksum padding
  auto buf = make(h, payload);
  ASSERT_EQ(buf.size(), kHeadersLen + 3);
  Frame f;
  ASSERT_EQ(decode_frame(buf.data(), buf.size(), false, &f), DecodeError::kOk);
  EXPECT_EQ(f.hdr.type, FrameType::kData);
  EXPECT_EQ(f.hdr.flags, kFlagLast);
  EXPECT_EQ(f.hdr.dst_conn, 0x11223344u);
  EXPECT_EQ(f.hdr.src_conn, 0x55667788u);
  EXPECT_EQ(f.hdr.session, 0x0123456789abcdefull);
  EXPECT_EQ(f.hdr.seq, 0xfffffffeu);
  EXPECT_EQ(f.hdr.ack, 17u);
  EXPECT_EQ(f.hdr.msg, 99u);
  EXPECT_EQ(f.hdr.tag, -5);
  EXPECT_EQ(f.hdr.msg_len, 1000u);
  EXPECT_EQ(f.hdr.offset, 997u);
  EXPECT_EQ(f.hdr.window, 256u);
  EXPECT_EQ(f.hdr.token_tag, token_tag("secret"));
  EXPECT_EQ(f.hdr.ts, 0xfedcba98u);
  EXPECT_EQ(f.src, ep(1, 0x0a000001, 47000));
  EXPECT_EQ(f.dst, ep(2, 0x0a000002, 47001));
  ASSERT_EQ(f.payload_len, 3u);
  EXPECT_EQ(std::memcmp(f.payload, payload.data(), 3), 0);
}

TEST(DpdkWire, ChecksumsMatchKnownVectors) {
  // RFC 1071 example words: 0x0001 0xf203 0xf4f5 0xf6f7 -> sum 0xddf2 (byte order independent).
  const uint8_t d[] = {0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7};
  uint16_t folded = cksum_fold(cksum_partial(d, sizeof(d), 0));
  uint8_t out[2];
  std::memcpy(out, &folded, 2);
  EXPECT_EQ(out[0], 0xdd);
  EXPECT_EQ(out[1], 0xf2);
  // The same sum split at an even boundary.
  EXPECT_EQ(cksum_fold(cksum_partial(d + 4, 4, cksum_partial(d, 4, 0))), folded);
}

// The checksum's fast paths (64 bytes a step with AVX2, 8 with the scalar loop) against the
// definition, one 16-bit word at a time: every length from 0 to 320 and frame sizes up to 9000,
// at every alignment of 0-7, from several starting sums, words of all ones included (the folds'
// carries).
TEST(DpdkWire, TheChecksumEqualsItsDefinitionAtEveryLengthAndAlignment) {
  auto reference = [](const uint8_t* p, size_t len, uint32_t sum) {
    uint64_t acc = sum;
    for (size_t i = 0; i + 1 < len; i += 2) {
      uint16_t w;
      std::memcpy(&w, p + i, 2);
      acc += w;
    }
    if (len % 2 == 1) acc += p[len - 1];  // the odd byte, zero-padded (little-endian memory)
    while (acc >> 16) acc = (acc & 0xffff) + (acc >> 16);
    return static_cast<uint16_t>(acc);
  };
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(9000 + 8);
  std::vector<size_t> lengths;
  for (size_t n = 0; n <= 320; ++n) lengths.push_back(n);
  for (size_t n : {1023, 1024, 1500, 3384, 3385, 4096, 8886, 9000}) lengths.push_back(n);
  for (int fill = 0; fill < 2; ++fill) {
    for (auto& b : buf) b = fill == 0 ? static_cast<uint8_t>(rng()) : 0xff;
    for (size_t n : lengths) {
      for (size_t align = 0; align < 8; ++align) {
        for (uint32_t start : {0u, 0xffffu, 0x12345678u, 0xffffffffu}) {
          const uint8_t* p = buf.data() + align;
          ASSERT_EQ(cksum_fold(cksum_partial(p, n, start)), reference(p, n, start))
              << n << " bytes at alignment " << align << " from " << start << ", fill " << fill;
        }
      }
    }
  }
}

TEST(DpdkWire, EveryCorruptedByteIsDetectedOrHarmless) {
  GwHeader h;
  h.type = FrameType::kData;
  h.msg_len = 64;
  std::vector<uint8_t> payload(64);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  const auto good = make(h, payload);
  int detected = 0;
  for (size_t i = kEthLen; i < good.size(); ++i) {  // MAC bytes are not checksummed
    auto bad = good;
    bad[i] ^= 0x5a;
    Frame f;
    if (decode_frame(bad.data(), bad.size(), false, &f) != DecodeError::kOk) ++detected;
  }
  // A single flipped byte always breaks the IPv4 or the UDP checksum.
  EXPECT_EQ(detected, static_cast<int>(good.size() - kEthLen));
}

TEST(DpdkWire, MalformedFramesAreRejectedWithReasons) {
  GwHeader h;
  h.type = FrameType::kAck;
  auto good = make(h, {});
  Frame f;
  EXPECT_EQ(decode_frame(good.data(), good.size(), false, &f), DecodeError::kOk);
  EXPECT_EQ(decode_frame(good.data(), good.size() - 1, false, &f), DecodeError::kTruncated);
  EXPECT_EQ(decode_frame(nullptr, 0, false, &f), DecodeError::kTruncated);
  auto v = good;
  v[12] = 0x86;  // IPv6 ethertype
  EXPECT_EQ(decode_frame(v.data(), v.size(), false, &f), DecodeError::kNotIpv4);
  v = good;
  v[kEthLen + 9] = 6;  // TCP
  EXPECT_EQ(decode_frame(v.data(), v.size(), false, &f), DecodeError::kNotUdp);
  v = good;
  v[kEthLen + kIpLen + 6] = 0;  // UDP checksum "none" is refused
  v[kEthLen + kIpLen + 7] = 0;
  EXPECT_EQ(decode_frame(v.data(), v.size(), false, &f), DecodeError::kUdpChecksum);
  // Wrong magic with a recomputed checksum still fails on the magic.
  GwHeader d;
  d.type = FrameType::kData;
  d.msg_len = 4;
  d.offset = 2;
  auto frag = make(d, {1, 2, 3});  // offset 2 + 3 bytes > msg_len 4
  EXPECT_EQ(decode_frame(frag.data(), frag.size(), false, &f), DecodeError::kBadPayloadLen);
  GwHeader a;
  a.type = FrameType::kAck;
  a.sack_bits = 64;  // declares 8 bytes of SACK but carries 2
  auto ack = make(a, {0xff, 0xff});
  EXPECT_EQ(decode_frame(ack.data(), ack.size(), false, &f), DecodeError::kBadPayloadLen);
}

TEST(DpdkWire, EncodeRefusesWhatDoesNotFit) {
  std::vector<uint8_t> buf(kHeadersLen + 10);
  GwHeader h;
  std::vector<uint8_t> payload(11);
  EXPECT_EQ(
      encode_frame(buf.data(), buf.size(), ep(1, 1, 1), ep(2, 2, 2), h, payload.data(), 11, 0), 0u);
  EXPECT_EQ(
      encode_frame(buf.data(), buf.size(), ep(1, 1, 1), ep(2, 2, 2), h, payload.data(), 10, 0),
      buf.size());
}

// Zero copy: headers in one segment, the payload in another. The headers carry the checksum of
// the whole frame, so the two segments laid end to end are exactly the one-segment frame, and
// the split decoder checks the checksum across the boundary.
TEST(DpdkWire, SplitFrameEqualsTheContiguousOneAndItsChecksumSpansBothSegments) {
  GwHeader h;
  h.type = FrameType::kData;
  h.msg_len = 5000;
  h.offset = 1000;
  for (size_t len : {size_t{1}, size_t{2}, size_t{999}, size_t{4000}}) {
    std::vector<uint8_t> payload(len);
    std::mt19937 rng(static_cast<uint32_t>(len));
    for (auto& b : payload) b = static_cast<uint8_t>(rng());
    const std::vector<uint8_t> whole = make(h, payload);
    std::vector<uint8_t> head(kHeadersLen + 8);
    ASSERT_EQ(encode_headers(head.data(), head.size(), ep(1, 0x0a000001, 47000),
                             ep(2, 0x0a000002, 47001), h, payload.data(), len, 7),
              kHeadersLen);
    head.resize(kHeadersLen);
    std::vector<uint8_t> joined = head;
    joined.insert(joined.end(), payload.begin(), payload.end());
    EXPECT_EQ(joined, whole) << len;
    Frame f;
    ASSERT_EQ(decode_frame_split(head.data(), head.size(), payload.data(), len, false, &f),
              DecodeError::kOk);
    EXPECT_EQ(f.payload, payload.data());  // read in place
    EXPECT_EQ(f.payload_len, len);
    // A corrupted payload byte, or a corrupted header byte, is caught across the split.
    payload[len / 2] ^= 0x40;
    EXPECT_EQ(decode_frame_split(head.data(), head.size(), payload.data(), len, false, &f),
              DecodeError::kUdpChecksum);
    payload[len / 2] ^= 0x40;
    head[kHeadersLen - 3] ^= 0x01;
    EXPECT_EQ(decode_frame_split(head.data(), head.size(), payload.data(), len, false, &f),
              DecodeError::kUdpChecksum);
    head[kHeadersLen - 3] ^= 0x01;
    // A tail shorter than the lengths declare is truncated; a first segment other than exactly
    // the headers cannot be split.
    EXPECT_EQ(decode_frame_split(head.data(), head.size(), payload.data(), len - 1, false, &f),
              DecodeError::kTruncated);
    EXPECT_EQ(
        decode_frame_split(whole.data(), kHeadersLen + 1, payload.data() + 1, len - 1, false, &f),
        len == 1 ? DecodeError::kOk : DecodeError::kTruncated);
  }
}

TEST(DpdkWire, SequenceArithmeticWraps) {
  EXPECT_TRUE(seq_lt(0xffffffffu, 0u));
  EXPECT_TRUE(seq_lt(5u, 6u));
  EXPECT_FALSE(seq_lt(6u, 6u));
  EXPECT_TRUE(seq_le(6u, 6u));
  EXPECT_FALSE(seq_lt(0u, 0xffffffffu));
}

TEST(DpdkFaultInjector, SeededAndProportional) {
  FaultConfig c;
  c.loss = 0.1;
  c.dup = 0.05;
  c.reorder = 0.05;
  c.seed = 42;
  FaultInjector a(c), b(c);
  int drops = 0, dups = 0, holds = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    FaultAction x = a.decide();
    ASSERT_EQ(x, b.decide());  // same seed, same decisions
    drops += x == FaultAction::kDrop;
    dups += x == FaultAction::kDup;
    holds += x == FaultAction::kHold;
  }
  EXPECT_NEAR(drops / double(n), 0.10, 0.01);
  EXPECT_NEAR(dups / double(n), 0.05, 0.01);
  EXPECT_NEAR(holds / double(n), 0.05, 0.01);
  FaultInjector off(FaultConfig{});
  EXPECT_FALSE(off.enabled());
  EXPECT_EQ(off.decide(), FaultAction::kPass);
}

}  // namespace
}  // namespace gw::dpdk
