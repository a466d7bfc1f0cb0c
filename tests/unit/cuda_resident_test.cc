// resident_driver() runs on every collective call (the device-memory refusal of capi/): it must
// not search the library path each time while no CUDA driver is loaded (it did: 7 failed opens
// and ld.so.cache mapped and unmapped per call, about 20 us, most of a 4 KiB shm allreduce), and
// it must still see a driver that a framework loads after the first calls.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include "gpudirect/cuda_driver.h"
#include "tests/support/fake_cuda.h"

namespace gw::cuda {
namespace {

TEST(ResidentDriver, NoSearchPerCallUntilSomethingIsLoadedThenTheLateDriverIsSeen) {
  if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) {
    dlclose(h);
    GTEST_SKIP() << "a CUDA driver is already loaded in this process";
  }
  float x[4] = {0, 0, 0, 0};
  EXPECT_EQ(resident_memory_kind(x), MemoryKind::kHost);
  const int64_t before = resident_driver_searches();
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(resident_memory_kind(x), MemoryKind::kHost);
  EXPECT_EQ(resident_driver_searches(), before);

  // The stand-in driver (soname libcuda.so.1) loaded now, as a framework loads CUDA late.
  const testing::FakeCuda& f = testing::fake_cuda(GW_FAKE_CUDA_PATH);
  ASSERT_NE(f.mark, nullptr) << dlerror();
  f.mark(x, sizeof(x), 0);
  EXPECT_EQ(resident_memory_kind(x), MemoryKind::kDevice);
  EXPECT_EQ(resident_driver_searches(), before + 1);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(resident_memory_kind(x), MemoryKind::kDevice);
  EXPECT_EQ(resident_driver_searches(), before + 1);  // cached from then on
  f.clear();
  EXPECT_EQ(resident_memory_kind(x), MemoryKind::kHost);
}

}  // namespace
}  // namespace gw::cuda
