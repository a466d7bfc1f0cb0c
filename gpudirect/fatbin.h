// The CUDA fatbin of codec_kernels.cu, embedded in the library at build time, and a reader of
// its table of contents (for tests and gw-gpu-check: which architectures it carries).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace gw::cuda {

// The embedded fatbin; empty when gradwire was built without nvcc (GW_WITH_CUDA off).
std::span<const unsigned char> codec_fatbin();

struct FatbinEntry {
  enum Kind : uint16_t { kPtx = 1, kElf = 2 };
  uint16_t kind = 0;
  uint32_t arch = 0;        // 80 for sm_80 / compute_80
  uint64_t size = 0;        // payload bytes as stored
  bool compressed = false;  // payload compressed by fatbinary (nvcc compresses the PTX)
  bool elf_magic = false;   // an uncompressed payload that starts with \x7fELF
};

// Reads the fatbin container: header (magic 0xBA55ED50, version 1, header size, body size), then
// entries of (kind u16, version u16, header size u32, payload size u64, compressed size u32, ...,
// arch u32 at offset 28). Every field is bounds-checked; a malformed image is kInvalidArg.
Result<std::vector<FatbinEntry>> parse_fatbin(std::span<const unsigned char> image);

}  // namespace gw::cuda
