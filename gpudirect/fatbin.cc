#include "gpudirect/fatbin.h"

#include <cstring>

namespace gw::cuda {

namespace {

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);  // little-endian, as the fatbin is
  return v;
}

}  // namespace

Result<std::vector<FatbinEntry>> parse_fatbin(std::span<const unsigned char> image) {
  constexpr uint32_t kMagic = 0xBA55ED50u;
  constexpr size_t kHeader = 16, kEntryMin = 32;
  if (image.size() < kHeader)
    return invalid_arg("fatbin: {} bytes, shorter than its header", image.size());
  const unsigned char* p = image.data();
  if (load<uint32_t>(p) != kMagic) {
    return invalid_arg("fatbin: bad magic 0x{:08x} (want 0x{:08x})", load<uint32_t>(p), kMagic);
  }
  const uint16_t version = load<uint16_t>(p + 4);
  const uint16_t header = load<uint16_t>(p + 6);
  const uint64_t body = load<uint64_t>(p + 8);
  if (version != 1) return invalid_arg("fatbin: unknown version {}", version);
  if (header < kHeader || header > image.size() || body > image.size() - header) {
    return invalid_arg("fatbin: header {} + body {} bytes exceed the image ({} bytes)", header,
                       body, image.size());
  }
  std::vector<FatbinEntry> out;
  size_t off = header;
  const size_t end = header + body;
  while (off < end) {
    if (end - off < kEntryMin) return invalid_arg("fatbin: truncated entry at offset {}", off);
    const unsigned char* e = p + off;
    FatbinEntry ent;
    ent.kind = load<uint16_t>(e);
    const uint32_t ehdr = load<uint32_t>(e + 4);
    ent.size = load<uint64_t>(e + 8);
    ent.compressed = load<uint32_t>(e + 16) != 0;
    ent.arch = load<uint32_t>(e + 28);
    if (ent.kind != FatbinEntry::kPtx && ent.kind != FatbinEntry::kElf) {
      return invalid_arg("fatbin: entry at offset {} has unknown kind {}", off, ent.kind);
    }
    if (ehdr < kEntryMin || ehdr > end - off || ent.size > end - off - ehdr) {
      return invalid_arg("fatbin: entry at offset {} (header {}, payload {}) overruns the body",
                         off, ehdr, ent.size);
    }
    ent.elf_magic = !ent.compressed && ent.size >= 4 &&
                    std::memcmp(e + ehdr,
                                "\x7f"
                                "ELF",
                                4) == 0;
    out.push_back(ent);
    off += ehdr + ent.size;
  }
  if (out.empty()) return invalid_arg("fatbin: no entries");
  return out;
}

}  // namespace gw::cuda
