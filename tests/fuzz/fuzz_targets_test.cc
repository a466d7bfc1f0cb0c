// Runs every fuzz target of fuzz_targets.h in the normal suite (g++, no libFuzzer): the
// checked-in seeds (corpus/<target>/), the seeds the targets make themselves, then mutations of
// them and random bytes. GW_FUZZ_INPUTS scales the number of mutated inputs (default 1,
// per-target counts below); GW_FUZZ_WRITE_SEEDS=1 writes the targets' own seeds into corpus/
// (how the checked-in corpus was made).
#include "tests/fuzz/fuzz_targets.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "core/config_file.h"
#include "tests/fuzz/corpus_io.h"

namespace gw::fuzz {
namespace {

std::vector<uint8_t> mutate(const std::vector<std::vector<uint8_t>>& pool, std::mt19937_64& rng) {
  std::vector<uint8_t> v = pool[rng() % pool.size()];
  switch (rng() % 7) {
    case 0:  // bit flips
      for (int k = 0, n = 1 + rng() % 4; k < n && !v.empty(); ++k)
        v[rng() % v.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
      break;
    case 1:  // truncation
      v.resize(rng() % (v.size() + 1));
      break;
    case 2:  // bytes overwritten with interesting values
      for (int k = 0, n = 1 + rng() % 4; k < n && !v.empty(); ++k) {
        static const uint8_t kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, 0xfe, 0x40, 0x10};
        v[rng() % v.size()] = kInteresting[rng() % sizeof(kInteresting)];
      }
      break;
    case 3:  // extension with garbage
      for (int k = 0, n = rng() % 64; k < n; ++k) v.push_back(static_cast<uint8_t>(rng()));
      break;
    case 4: {  // splice with another seed
      const auto& w = pool[rng() % pool.size()];
      size_t cut = v.empty() ? 0 : rng() % v.size();
      size_t from = w.empty() ? 0 : rng() % w.size();
      v.resize(cut);
      v.insert(v.end(), w.begin() + static_cast<ptrdiff_t>(from), w.end());
      break;
    }
    case 5:  // pure random bytes (the first byte, often a mode, kept)
      v.resize(rng() % 600);
      for (size_t i = v.empty() ? 0 : 1; i < v.size(); ++i) v[i] = static_cast<uint8_t>(rng());
      break;
    default:  // replay unchanged
      break;
  }
  return v;
}

bool name_uses_sockets(const std::string& name) {
  return name == "store_server_frames" || name == "tcp_wire" || name == "shm_handshake" ||
         name == "shm_connector" || name == "shm_ring" || name == "verbs_wire";
}

// Mutated inputs per target: the ones that open sockets cost about a millisecond each.
int inputs_for(const std::string& name) {
  int base = name_uses_sockets(name) ? 1500 : 5000;
  if (const char* s = std::getenv("GW_FUZZ_INPUTS")) base = base * std::max(1, std::atoi(s));
  return base;
}

// Runs one input; with GW_FUZZ_LAST=path each input is first written there, so the one that
// crashed the driver can be made a seed.
int run_one(const Target& t, const uint8_t* data, size_t size) {
  if (const char* last = std::getenv("GW_FUZZ_LAST")) {
    std::ofstream out(last, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  return t.run(data, size);
}

class FuzzTargets : public ::testing::TestWithParam<Target> {};

TEST_P(FuzzTargets, SeedsMutationsAndRandomInputsKeepEveryProperty) {
  const Target& t = GetParam();
  std::vector<std::vector<uint8_t>> own = t.seeds();
  ASSERT_FALSE(own.empty()) << t.name;
  maybe_write_seeds(t.name, own);
  std::vector<std::vector<uint8_t>> pool = read_corpus(t.name);
  EXPECT_FALSE(pool.empty()) << "no checked-in corpus for " << t.name;
  pool.insert(pool.end(), own.begin(), own.end());
  for (const auto& seed : pool) ASSERT_EQ(run_one(t, seed.data(), seed.size()), 0);
  // A peer's bytes land at any alignment: the decoders also get every seed at an odd address
  // (UBSan in the debug build reports a misaligned load; found by libFuzzer in codec_payload).
  const bool sockets = name_uses_sockets(t.name);
  if (!sockets) {
    for (const auto& seed : pool) {
      std::vector<uint8_t> odd(seed.size() + 1);
      std::copy(seed.begin(), seed.end(), odd.begin() + 1);
      ASSERT_EQ(run_one(t, odd.data() + 1, seed.size()), 0);
    }
  }
  std::mt19937_64 rng(0x5eed ^ std::hash<std::string>()(t.name));
  const int n = inputs_for(t.name);
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> v = mutate(pool, rng);
    if (!sockets && (i & 1) != 0) v.insert(v.begin(), 0);  // every other input at an odd address
    const size_t skip = !sockets && (i & 1) != 0 ? 1 : 0;
    ASSERT_EQ(run_one(t, v.data() + skip, v.size() - skip), 0);
  }
  // The inputs got past the first checks.
  const std::string name = t.name;
  auto reached = [](const char* what) {
    EXPECT_GT(counter(what), 0u) << what;
    std::printf("  %s: %llu\n", what, static_cast<unsigned long long>(counter(what)));
  };
  if (name == "store_server_frames") {
    reached("store.authenticated");
    reached("store.decoded");
  } else if (name == "tcp_wire") {
    reached("tcp.challenged");
    reached("tcp.message");
    reached("tcp.connector_refused_answer");
  } else if (name == "plugin_daemon_handle") {
    reached("plugin.daemon_handle_ok");
    reached("plugin.daemon_handle_store");  // the listener's store address (cross-host leg)
    reached("plugin.daemon_handle_refused");
  } else if (name == "shm_handshake") {
    reached("shm.challenged");
  } else if (name == "shm_connector") {
    reached("shm.connector_challenged");
    reached("shm.connector_proved");
    reached("shm.connector_connected");
  } else if (name == "shm_ring") {
    reached("shm.ring_published");
    reached("shm.ring_delivered");
  } else if (name == "verbs_wire") {
    reached("verbs.handle_accepted");
    reached("verbs.listener_replied");
    reached("verbs.connector_refused_answer");
  } else if (name == "pool_announcement") {
    reached("pool.announcement_parsed");
  } else if (name == "af_xdp_eal_args") {
    reached("af_xdp.vdev");
    reached("af_xdp.queue_name");
  } else if (name == "shm_direct_calls") {
    reached("direct.calls_decoded");
    reached("direct.refs_accepted");
    reached("direct.all_shared");
  } else if (name == "kv_frames") {
    reached("kv.decoded");
    reached("kv.applied");
    reached("kv.decoded_push");            // an encoded push went through a codec's decode
    reached("kv.decoded_push_converted");  // ... into a key's float16 (or other non-f32) dtype
  } else if (name == "codec_payload") {
    reached("codec.decoded");
    reached("codec.refused");
  } else if (name == "daemon_hello") {
    reached("daemon.hello_accepted");
    reached("daemon.hello_refused");
  } else if (name == "daemon_control_request") {
    reached("daemon.control_accepted");
    reached("daemon.control_refused");
  } else if (name == "daemon_import") {
    reached("daemon.import_accepted");
    reached("daemon.import_refused");
    reached("daemon.device_collective");
  } else if (name == "daemon_p2p") {
    reached("daemon.p2p_send");
    reached("daemon.p2p_recv");
    reached("daemon.p2p_refused");
  } else if (name == "daemon_p2p_xhost") {
    reached("daemon.xhost_accepted");
    reached("daemon.xhost_inline");
    reached("daemon.xhost_refused");
  } else if (name == "daemon_control_trace") {
    reached("trace.request_accepted");
    reached("trace.request_refused");
    reached("trace.answer_accepted");
    reached("trace.answer_refused");
  } else if (name == "metrics_http_request") {
    reached("http.complete");
    reached("http.incomplete");
    reached("http.bad");
  }
}

// Found by config_toml under UBSan: toml++ 3.3 reaches __builtin_unreachable on some non-ASCII
// characters outside strings; the loader refuses them first (and keeps them in strings and
// comments, where toml++ handles them).
TEST(FuzzRegressions, ConfigNonAsciiOutsideStringsIsRefusedInsideIsKept) {
  for (std::string_view bad :
       {std::string_view("\xef\xbb\x81W"), std::string_view("a = 1 \xc3\xa9\n"),
        std::string_view("\xc2\xa1"
                         "a = 1\n"),
        std::string_view("a = \"\xc3\xa9\"\n"),
        std::string_view("s =0\"\"\"\xcb\xa9\n\xef\xbb\x81\"\"\"\n"),
        // CI, config_toml under UBSan: U+FB9F after a backslash in a multi-line string.
        std::string_view("\"\"\"\\\xef\xae\x9f\\"), std::string_view("s = \"\xe3\x80\x81\"\n")}) {
    auto f = config::ConfigFile::parse(bad, "t.toml");
    ASSERT_EQ(f->errors().size(), 1u) << bad;
    EXPECT_TRUE(f->errors()[0].find("non-ASCII") != std::string::npos ||
                f->errors()[0].find("not supported") != std::string::npos)
        << f->errors()[0];
    EXPECT_TRUE(f->entries().empty());
  }
  // Those code points are fine in comments (toml++ reads spaces there): U+0416, U+3001.
  for (std::string_view good :
       {std::string_view("# \xd0\x96\na = 1\n"),
        std::string_view("a = 'x' # \xe3\x80\x81\xd0\x96 \xe3\x80\x82\n")}) {
    auto f = config::ConfigFile::parse(good, "t.toml");
    EXPECT_TRUE(f->errors().empty()) << f->errors()[0];
    EXPECT_EQ(f->entries().size(), 1u) << good;
  }
  // Other UTF-8 (here U+65E5, U+20AC) is fine in strings and comments.
  auto ok = config::ConfigFile::parse(
      "\xef\xbb\xbf# \xe6\x97\xa5 \xe2\x82\xac\na = \"\xe6\x97\xa5\"\nb = '\xe2\x82\xac'\n"
      "c = \"\"\"x\n\xe6\x97\xa5\"\"\"\nd = \"q\\\"\xe2\x82\xac\"\n",
      "t.toml");
  EXPECT_TRUE(ok->errors().empty()) << ok->errors()[0];
  ASSERT_NE(ok->find("a"), nullptr);
  EXPECT_EQ(ok->find("a")->text, "\xe6\x97\xa5");
  EXPECT_NE(ok->find("d"), nullptr);
}

// Every code point of the Basic Multilingual Plane, where toml++ 3.3 tests it for whitespace (after
// a backslash in a multi-line string, in a comment, in a string), is either refused by the loader,
// blanked (in a comment) or safe for toml++: in the ASan+UBSan build, where reaching
// __builtin_unreachable aborts, this checks toml_whitespace_test_is_undefined against toml++
// itself.
TEST(FuzzRegressions, ConfigEveryCodePointTomlMayTestIsRefusedOrSafe) {
  auto utf8 = [](char32_t cp) {
    std::string s;
    if (cp < 0x800) {
      s += static_cast<char>(0xC0 | (cp >> 6));
    } else {
      s += static_cast<char>(0xE0 | (cp >> 12));
      s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    }
    s += static_cast<char>(0x80 | (cp & 0x3F));
    return s;
  };
  int refused = 0;
  for (char32_t cp = 0x80; cp <= 0xFFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    const std::string c = utf8(cp);
    for (const std::string& text :
         {"s = \"\"\"\\" + c + "\"\"\"\n", "# " + c + "\n", "s = \"" + c + "\"\n"}) {
      auto f = config::ConfigFile::parse(text, "t.toml");
      if (text[0] == '#') {
        EXPECT_TRUE(f->errors().empty()) << std::hex << static_cast<uint32_t>(cp);
      } else if (config::toml_whitespace_test_is_undefined(cp)) {
        ASSERT_EQ(f->errors().size(), 1u) << std::hex << static_cast<uint32_t>(cp);
        EXPECT_NE(f->errors()[0].find("not supported"), std::string::npos) << f->errors()[0];
        ++refused;
      }
    }
  }
  // Blocks 0, 11 and 63 less their one space each: 1017 + 1017 + 985 code points, in the two
  // texts where they are not in a comment.
  EXPECT_EQ(refused, 2 * (1017 + 1017 + 985));
}

// Found in review (issue 33): tables 100,000 levels deep overflowed the stack (the recursive
// flatten, toml++'s recursive destruction); they are refused past ConfigFile::kMaxDepth before
// toml++ builds them, as is text over ConfigFile::kMaxBytes.
TEST(FuzzRegressions, ConfigTablesDeeperThanTheCapAndHugeTextAreRefused) {
  std::string deep = "[";
  for (int i = 0; i < 100000; ++i) deep += i ? ".a" : "a";
  deep += "]\nx = 1\n";
  for (const std::string& text : {deep, deep.substr(1, deep.size() - 9) + " = 1\n",
                                  std::string(config::ConfigFile::kMaxBytes + 1, '#')}) {
    EXPECT_EQ(config_toml(reinterpret_cast<const uint8_t*>(text.data()), text.size()), 0);
    auto f = config::ConfigFile::parse(text, "t.toml");
    EXPECT_TRUE(f->entries().empty());
    ASSERT_EQ(f->errors().size(), 1u);
    EXPECT_TRUE(f->errors()[0].find("nested more than") != std::string::npos ||
                f->errors()[0].find("more than a settings file may hold") != std::string::npos)
        << f->errors()[0];
  }
}

// Found by config_toml in the ASan build: a table header not starting like a key fails an
// assertion inside toml++ 3.3; the loader refuses it first. Arrays of arrays are not headers.
TEST(FuzzRegressions, ConfigMalformedTableHeaderIsRefused) {
  for (std::string_view bad :
       {"[[[x]]]\n", "[[ [x]]\n", "[.x]\n", " [ .x]\n", "[#]\n", "[[=]]\n", "a = 1\n[*]\n"}) {
    auto f = config::ConfigFile::parse(bad, "t.toml");
    ASSERT_EQ(f->errors().size(), 1u) << bad;
    EXPECT_NE(f->errors()[0].find("table header"), std::string::npos) << f->errors()[0];
  }
  auto ok = config::ConfigFile::parse(
      "a = [\n  [1, 2],\n  [3],\n]\n[x]\ny = 1\n[[ 'q' ]]\nz = 2\n[\"s\".t]\nu = 3\n", "t.toml");
  EXPECT_TRUE(ok->errors().empty()) << ok->errors()[0];
  EXPECT_NE(ok->find("x_y"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(All, FuzzTargets, ::testing::ValuesIn(targets()),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace gw::fuzz
