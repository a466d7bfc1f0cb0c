// The GPU codec kernels against the CPU ones, bit for bit (see gpu_codecs.h for the two
// documented exceptions), on random data with NaN / inf / denormals / -0, odd sizes and
// unaligned pointers. Skipped, with the reason, where there is no CUDA driver or device; the
// same cases run in gw-gpu-check (perf/gpu/run_gpu_check.sh) on a GPU host. One test per kernel
// loops over every case (one CUDA initialisation per kernel instead of one per case).
#include <gtest/gtest.h>

#include "gpudirect/gpu_codecs.h"
#include "perf/gpu/gpu_check.h"

namespace gw::cuda::check {
namespace {

class GpuCodecKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Status st = codecs_available(); !st.ok()) GTEST_SKIP() << st.to_string();
  }
  static void run_all(const std::vector<Case>& cases, Status (*check)(const Case&)) {
    ASSERT_FALSE(cases.empty());
    for (const Case& c : cases) {
      const Status st = check(c);
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
  }
};

TEST_F(GpuCodecKernels, CastEncodeMatchesCpu) { run_all(cast_cases(), cast_encode); }
TEST_F(GpuCodecKernels, CastDecodeMatchesCpu) { run_all(cast_cases(), cast_decode); }
TEST_F(GpuCodecKernels, SignEncodeMatchesCpu) { run_all(sign_cases(), sign_encode); }
TEST_F(GpuCodecKernels, SignDecodeMatchesCpu) { run_all(sign_cases(), sign_decode); }

TEST(GpuCheckCases, CoverOddSizesMisalignmentAndEveryVariant) {
  bool odd = false, mis = false, bf16 = false, ef = false, regs_chunk = false, any_chunk = false;
  for (const Case& c : cast_cases()) {
    odd |= c.n % 4 != 0;
    mis |= c.misalign != 0;
    bf16 |= c.bf16;
    ef |= c.ef;
  }
  for (const Case& c : sign_cases()) {
    regs_chunk |= c.chunk == 2048;
    any_chunk |= c.chunk % 1024 != 0;
  }
  EXPECT_TRUE(odd && mis && bf16 && ef && regs_chunk && any_chunk);
}

}  // namespace
}  // namespace gw::cuda::check
