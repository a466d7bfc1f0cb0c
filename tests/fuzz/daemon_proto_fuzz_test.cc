// Runs the daemon protocol fuzz target (daemon_proto_fuzz.cc) over valid inputs, their mutations
// and random bytes, so CI exercises it with g++; the target aborts on any broken invariant.
#include "tests/fuzz/daemon_proto_fuzz.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "daemon/protocol.h"
#include "tests/fuzz/corpus_io.h"

namespace gw::daemon::fuzz {
namespace {

TEST(DaemonProtoFuzz, SeedsAreAcceptedUnchanged) {
  const Counts before = counts();
  for (const auto& s : seeds()) ASSERT_EQ(LLVMFuzzerTestOneInput(s.data(), s.size()), 0);
  const Counts after = counts();
  EXPECT_GT(after.accepted, before.accepted);
  EXPECT_EQ(after.refused, before.refused) << "a valid seed was refused";
}

// What libFuzzer found on 2026-11-30 (scripts/fuzz.sh in CI): the decoder accepts a send into
// dma-buf registration 1 at an offset past the data region, and a flush of [0, +2^43) of
// registration 1 (ranges in a registration, which the job checks against its size); the target's
// own check had held both to the data region and aborted.
TEST(DaemonProtoFuzz, RangesInADmabufRegistrationAreNotHeldToTheDataRegion) {
  for (Opcode op : {Opcode::kSend, Opcode::kFlushDmabuf}) {
    SqEntry e{};
    e.seq = 1;
    e.opcode = static_cast<uint16_t>(op);
    if (op == Opcode::kSend) {
      e.key_len = 1;  // registration 1, to peer rank 0
      e.send_off = uint64_t{1} << 38;
    } else {
      e.spec_len = 1;  // registration 1
      e.count = uint64_t{1} << 43;
    }
    // A submission, a data region of 1 byte, 1 rank, each entry's own sequence.
    std::vector<uint8_t> in{kSubmission, 0, 0, 0};
    const auto* b = reinterpret_cast<const uint8_t*>(&e);
    in.insert(in.end(), b, b + sizeof(e));
    const Counts before = counts();
    ASSERT_EQ(LLVMFuzzerTestOneInput(in.data(), in.size()), 0);
    EXPECT_EQ(counts().accepted, before.accepted + 1) << opcode_name(op) << " was refused";
  }
}

// scripts/fuzz.sh starts libFuzzer from the checked-in corpus: the seeds above, encoded once.
TEST(DaemonProtoFuzz, CheckedInCorpusIsAcceptedUnchanged) {
  ::gw::fuzz::maybe_write_seeds("daemon_proto", seeds());
  const auto corpus = ::gw::fuzz::read_corpus("daemon_proto");
  ASSERT_GE(corpus.size(), seeds().size()) << "tests/fuzz/corpus/daemon_proto is missing seeds";
  const Counts before = counts();
  for (const auto& s : corpus) ASSERT_EQ(LLVMFuzzerTestOneInput(s.data(), s.size()), 0);
  EXPECT_EQ(counts().refused, before.refused) << "a checked-in seed was refused";
}

TEST(DaemonProtoFuzz, MutationsAndRandomBytesNeverCrash) {
  const auto corpus = seeds();
  std::mt19937_64 rng(20261126);
  const Counts before = counts();
  for (int round = 0; round < 4000; ++round) {
    for (const auto& seed : corpus) {
      std::vector<uint8_t> v = seed;
      switch (rng() % 5) {
        case 0:
          for (int k = 0, n = 1 + rng() % 4; k < n && v.size() > 1; ++k)
            v[1 + rng() % (v.size() - 1)] ^= uint8_t(1u << (rng() % 8));
          break;
        case 1:
          v.resize(1 + rng() % v.size());
          break;
        case 2:
          for (int k = 0, n = rng() % 64; k < n; ++k) v.push_back(uint8_t(rng()));
          break;
        case 3:
          v.assign(1 + rng() % 600, 0);
          for (auto& b : v) b = uint8_t(rng());
          v[0] = seed[0];
          break;
        default:  // a field overwritten with an extreme value
          if (v.size() > 9) {
            const size_t at = 1 + rng() % (v.size() - 8);
            const uint64_t extreme[] = {0, ~0ull, 1ull << 63, 0x7fffffff, 0x80000000};
            std::memcpy(&v[at], &extreme[rng() % 5], 8);
          }
          break;
      }
      ASSERT_EQ(LLVMFuzzerTestOneInput(v.data(), v.size()), 0);
    }
  }
  const Counts after = counts();
  EXPECT_GT(after.refused, before.refused);
  EXPECT_GT(after.accepted, before.accepted);
}

}  // namespace
}  // namespace gw::daemon::fuzz
