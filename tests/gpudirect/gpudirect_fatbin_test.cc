// The fatbin embedded at build time: present, well formed, SASS for sm_80 and sm_90 and PTX for
// compute_90; and parse_fatbin refuses malformed images.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gpudirect/fatbin.h"
#include "tests/support/shell_run.h"

namespace gw::cuda {
namespace {

#if GW_GPUDIRECT_HAVE_KERNELS
constexpr bool kHaveKernels = true;
#else
constexpr bool kHaveKernels = false;
#endif

TEST(Fatbin, EmbeddedExactlyWhenBuiltWithNvcc) { EXPECT_EQ(!codec_fatbin().empty(), kHaveKernels); }

TEST(Fatbin, CarriesSm80Sm90AndPtx) {
  if (!kHaveKernels) GTEST_SKIP() << "built without nvcc";
  const auto image = codec_fatbin();
  uint32_t magic;
  std::memcpy(&magic, image.data(), 4);
  EXPECT_EQ(magic, 0xBA55ED50u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(image.data()) % 8, 0u);  // cuModuleLoadData wants 8
  auto entries = parse_fatbin(image);
  ASSERT_TRUE(entries.ok()) << entries.status().to_string();
  bool sm80 = false, sm90 = false, ptx90 = false;
  for (const auto& e : *entries) {
    if (e.kind == FatbinEntry::kElf) {
      EXPECT_TRUE(e.compressed || e.elf_magic) << "sm_" << e.arch;
      sm80 |= e.arch == 80;
      sm90 |= e.arch == 90;
    } else {
      ptx90 |= e.arch == 90;
    }
  }
  EXPECT_TRUE(sm80);
  EXPECT_TRUE(sm90);
  EXPECT_TRUE(ptx90);
}

TEST(Fatbin, CuobjdumpListsTheArchitectures) {
  if (!kHaveKernels) GTEST_SKIP() << "built without nvcc";
  const std::string tool = GW_CUOBJDUMP;
  if (tool.empty() || tool.find("NOTFOUND") != std::string::npos) {
    GTEST_SKIP() << "cuobjdump not installed (the header walk above covers the architectures)";
  }
  char path[] = "/tmp/gw_fatbin_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  const auto image = codec_fatbin();
  ASSERT_EQ(write(fd, image.data(), image.size()), static_cast<ssize_t>(image.size()));
  close(fd);
  const gw::testing::ShellRun r = gw::testing::run_shell(tool + " --list-elf " + path);
  unlink(path);
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("sm_80"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("sm_90"), std::string::npos) << r.out;
}

std::vector<unsigned char> header(uint32_t magic, uint16_t version, uint16_t hsize, uint64_t body) {
  std::vector<unsigned char> v(16);
  std::memcpy(v.data(), &magic, 4);
  std::memcpy(v.data() + 4, &version, 2);
  std::memcpy(v.data() + 6, &hsize, 2);
  std::memcpy(v.data() + 8, &body, 8);
  return v;
}

void append_entry(std::vector<unsigned char>* v, uint16_t kind, uint32_t ehdr, uint64_t size,
                  uint32_t arch, size_t actual_payload) {
  std::vector<unsigned char> e(ehdr < 32 ? 32 : ehdr, 0);
  std::memcpy(e.data(), &kind, 2);
  std::memcpy(e.data() + 4, &ehdr, 4);
  std::memcpy(e.data() + 8, &size, 8);
  std::memcpy(e.data() + 28, &arch, 4);
  v->insert(v->end(), e.begin(), e.end());
  v->insert(v->end(), actual_payload, 0x7f);
}

TEST(Fatbin, ParserRefusesMalformedImages) {
  auto bad = [](const std::vector<unsigned char>& img) {
    return parse_fatbin(img).status().code() == Code::kInvalidArg;
  };
  EXPECT_TRUE(bad({}));
  EXPECT_TRUE(bad({0x50, 0xED, 0x55}));
  EXPECT_TRUE(bad(header(0xDEADBEEF, 1, 16, 0)));
  EXPECT_TRUE(bad(header(0xBA55ED50, 2, 16, 0)));
  EXPECT_TRUE(bad(header(0xBA55ED50, 1, 16, 0)));         // no entries
  EXPECT_TRUE(bad(header(0xBA55ED50, 1, 16, 1u << 20)));  // body past the end
  EXPECT_TRUE(bad(header(0xBA55ED50, 1, 8, 0)));          // header too small
  {
    auto v = header(0xBA55ED50, 1, 16, 32 + 1000);  // entry claims more payload than exists
    append_entry(&v, 2, 32, 1000, 90, 10);
    EXPECT_TRUE(bad(v));
  }
  {
    auto v = header(0xBA55ED50, 1, 16, 32 + 8);  // entry header size past the end
    append_entry(&v, 2, 4000, 8, 90, 8);
    EXPECT_TRUE(bad(v));
  }
  {
    auto v = header(0xBA55ED50, 1, 16, 32 + 8);  // unknown kind
    append_entry(&v, 7, 32, 8, 90, 8);
    EXPECT_TRUE(bad(v));
  }
  {
    auto v = header(0xBA55ED50, 1, 16, 32 + 8 + 10);  // trailing bytes shorter than an entry
    append_entry(&v, 2, 32, 8, 90, 8);
    v.insert(v.end(), 10, 0);
    EXPECT_TRUE(bad(v));
  }
  {
    auto v = header(0xBA55ED50, 1, 16, 2 * (32 + 8));  // a good one, to show the others fail
    append_entry(&v, 2, 32, 8, 80, 8);
    append_entry(&v, 1, 32, 8, 90, 8);
    auto ok = parse_fatbin(v);
    ASSERT_TRUE(ok.ok()) << ok.status().to_string();
    ASSERT_EQ(ok->size(), 2u);
    EXPECT_EQ((*ok)[0].arch, 80u);
    EXPECT_EQ((*ok)[1].kind, FatbinEntry::kPtx);
  }
}

}  // namespace
}  // namespace gw::cuda
