// Runs the DPDK decoder fuzz target over a corpus of real frames, their mutations and random
// bytes (so it runs in CI with g++), and checks that malformed, truncated, wrong-token and
// replayed frames are dropped and counted.
#include "tests/fuzz/dpdk_decoder_fuzz.h"

#include <gtest/gtest.h>

#include <random>

#include "tests/fuzz/corpus_io.h"

namespace gw::dpdk::fuzz {
namespace {

TEST(DpdkDecoderFuzz, CorpusOfMutatedRealFramesNeverCrashesOrCorrupts) {
  Fixture& fx = Fixture::get();
  ASSERT_GT(fx.seeds.size(), 8u);
  std::mt19937_64 rng(12345);
  const uint64_t before = fx.a->stats().rx_frames;
  int inputs = 0;
  while (inputs < 30000) {
    for (const auto& seed : fx.seeds) {
      std::vector<uint8_t> v = seed;
      switch (rng() % 6) {
        case 0:  // bit flips
          for (int k = 0, n = 1 + rng() % 4; k < n && !v.empty(); ++k)
            v[rng() % v.size()] ^= 1u << (rng() % 8);
          break;
        case 1:  // truncation
          v.resize(rng() % (v.size() + 1));
          break;
        case 2:  // a random header field overwritten (past the UDP header: the gradwire header)
          for (int k = 0; k < 4 && v.size() > 42; ++k)
            v[42 + rng() % std::min<size_t>(v.size() - 42, 72)] = uint8_t(rng());
          break;
        case 3:  // extension with garbage
          for (int k = 0, n = rng() % 64; k < n; ++k) v.push_back(uint8_t(rng()));
          break;
        case 4:  // pure random bytes
          v.assign(rng() % 2000, 0);
          for (auto& b : v) b = uint8_t(rng());
          break;
        default:  // replay unchanged
          break;
      }
      ASSERT_EQ(LLVMFuzzerTestOneInput(v.data(), v.size()), 0);
      ++inputs;
    }
  }
  EXPECT_TRUE(fx.guards_intact());
  const EngineStats s = fx.a->stats();
  EXPECT_GE(s.rx_frames - before, static_cast<uint64_t>(inputs));
  EXPECT_GT(s.decode_drops_total(), 0u);
  EXPECT_GT(s.duplicates, 0u);  // replayed reliable frames
}

TEST(DpdkDecoderFuzz, EachKindOfBadFrameIsDroppedAndCounted) {
  Fixture& fx = Fixture::get();
  // Find a DATA frame from b to a in the corpus.
  std::vector<uint8_t> data_frame;
  for (const auto& f : fx.seeds) {
    Frame fr;
    if (decode_frame(f.data(), f.size(), false, &fr) == DecodeError::kOk &&
        fr.hdr.type == FrameType::kData && fr.payload_len > 0) {
      data_frame = f;
      break;
    }
  }
  ASSERT_FALSE(data_frame.empty());
  auto s0 = fx.a->stats();
  // Replayed: already delivered.
  fx.a->inject_rx(data_frame.data(), data_frame.size());
  auto s1 = fx.a->stats();
  EXPECT_EQ(s1.duplicates, s0.duplicates + 1);
  // Truncated.
  fx.a->inject_rx(data_frame.data(), 60);
  auto s2 = fx.a->stats();
  EXPECT_EQ(s2.decode_drops[int(DecodeError::kTruncated)],
            s1.decode_drops[int(DecodeError::kTruncated)] + 1);
  // Corrupted payload: UDP checksum.
  auto bad = data_frame;
  bad.back() ^= 0xff;
  fx.a->inject_rx(bad.data(), bad.size());
  auto s3 = fx.a->stats();
  EXPECT_EQ(s3.decode_drops[int(DecodeError::kUdpChecksum)],
            s2.decode_drops[int(DecodeError::kUdpChecksum)] + 1);
  // Wrong token (the 32-bit token tag at gradwire-header offset 64), checksums fixed.
  auto wt = data_frame;
  wt[kEthLen + kIpLen + kUdpLen + 64] ^= 0x01;
  fix_checksums(wt);
  fx.a->inject_rx(wt.data(), wt.size());
  auto s4 = fx.a->stats();
  EXPECT_EQ(s4.wrong_token, s3.wrong_token + 1);
  // Wrong session (offset 16): a frame of another connection incarnation.
  auto ws = data_frame;
  ws[kEthLen + kIpLen + kUdpLen + 16] ^= 0x80;
  fix_checksums(ws);
  fx.a->inject_rx(ws.data(), ws.size());
  auto s5 = fx.a->stats();
  EXPECT_EQ(s5.wrong_session, s4.wrong_session + 1);
  // Unknown connection (offset 8).
  auto uc = data_frame;
  uc[kEthLen + kIpLen + kUdpLen + 8] ^= 0x40;
  fix_checksums(uc);
  fx.a->inject_rx(uc.data(), uc.size());
  EXPECT_EQ(fx.a->stats().unknown_conn, s5.unknown_conn + 1);
  EXPECT_TRUE(fx.guards_intact());
}

// scripts/fuzz.sh starts libFuzzer from the checked-in corpus: frames of one fixture run (their
// handshake nonces differ from any later run's, so they exercise the decoder up to the session
// check; mutations reach further).
TEST(DpdkDecoderFuzz, CheckedInCorpusNeverCrashesOrCorrupts) {
  Fixture& fx = Fixture::get();
  ::gw::fuzz::maybe_write_seeds("dpdk_decoder", fx.seeds);
  const auto corpus = ::gw::fuzz::read_corpus("dpdk_decoder");
  ASSERT_GT(corpus.size(), 8u) << "tests/fuzz/corpus/dpdk_decoder is missing";
  const uint64_t before = fx.a->stats().rx_frames;
  for (const auto& f : corpus) ASSERT_EQ(LLVMFuzzerTestOneInput(f.data(), f.size()), 0);
  EXPECT_GT(fx.a->stats().rx_frames, before);
  EXPECT_TRUE(fx.guards_intact());
}

}  // namespace
}  // namespace gw::dpdk::fuzz
