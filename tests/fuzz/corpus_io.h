// The checked-in seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/), shared by the
// gtest drivers: scripts/fuzz.sh starts each libFuzzer binary from a copy of its directory.
// GW_FUZZ_WRITE_SEEDS=1 makes a driver write its target's own seeds there (how they were made).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace gw::fuzz {

inline std::filesystem::path corpus_dir(const std::string& target) {
  return std::filesystem::path(GW_SOURCE_DIR) / "tests" / "fuzz" / "corpus" / target;
}

// Every file of the target's corpus, in no particular order.
inline std::vector<std::vector<uint8_t>> read_corpus(const std::string& target) {
  std::vector<std::vector<uint8_t>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(corpus_dir(target), ec)) {
    std::ifstream in(e.path(), std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

// With GW_FUZZ_WRITE_SEEDS set, writes `seeds` as seed-0, seed-1... of the target's corpus.
inline void maybe_write_seeds(const std::string& target,
                              const std::vector<std::vector<uint8_t>>& seeds) {
  if (std::getenv("GW_FUZZ_WRITE_SEEDS") == nullptr) return;
  std::filesystem::create_directories(corpus_dir(target));
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream out(corpus_dir(target) / ("seed-" + std::to_string(i)), std::ios::binary);
    out.write(reinterpret_cast<const char*>(seeds[i].data()),
              static_cast<std::streamsize>(seeds[i].size()));
  }
}

}  // namespace gw::fuzz
