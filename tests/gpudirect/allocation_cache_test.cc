// AllocationCache (gpudirect/allocation_cache.h) over the stand-in driver
// (tests/support/fake_cuda_driver.c), whose cuMemFree hands the same address out again with a
// new buffer id: a lookup after the reuse must see the new allocation, never the cached one.
#include "gpudirect/allocation_cache.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "tests/support/fake_cuda.h"

namespace gw::cuda {
namespace {

TEST(AllocationCache, CachesByAllocationAndDropsAFreedOneWhoseAddressCameBack) {
  const testing::FakeCuda& f = testing::fake_cuda(GW_FAKE_CUDA_PATH);
  ASSERT_NE(f.mem_alloc, nullptr);
  auto d = load_driver(GW_FAKE_CUDA_PATH);
  ASSERT_TRUE(d.ok()) << d.status().to_string();
  AllocationCache cache(**d);

  unsigned long long a = 0;
  ASSERT_EQ(f.mem_alloc(&a, 1000), 0);
  const auto* p = reinterpret_cast<const uint8_t*>(static_cast<uintptr_t>(a));
  auto first = cache.resolve(p + 10, 100);
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  EXPECT_EQ(first->base, a);
  EXPECT_EQ(first->size, 1000u);
  EXPECT_EQ(first->device, 0);
  EXPECT_NE(first->buffer_id, 0u);
  auto again = cache.resolve(p, 1000);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->generation, first->generation);
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.entries(), 1u);

  // Past the allocation's end: refused, from the cache as from the driver.
  auto past = cache.resolve(p + 10, 991);
  EXPECT_EQ(past.status().code(), Code::kInvalidArg);
  EXPECT_NE(past.status().message().find("pass the end"), std::string::npos);

  // Freed, and the same address allocated again: a new allocation for the cache.
  ASSERT_EQ(f.mem_free(a), 0);
  unsigned long long b = 0;
  ASSERT_EQ(f.mem_alloc(&b, 600), 0);
  ASSERT_EQ(b, a) << "the stand-in hands the freed range out again";
  auto reused = cache.resolve(p, 600);
  ASSERT_TRUE(reused.ok()) << reused.status().to_string();
  EXPECT_NE(reused->buffer_id, first->buffer_id);
  EXPECT_NE(reused->generation, first->generation);
  EXPECT_EQ(reused->size, 600u) << "not the stale entry's 1000 bytes";
  EXPECT_EQ(cache.invalidations(), 1u);
  EXPECT_EQ(cache.resolve(p, 601).status().code(), Code::kInvalidArg);

  // A freed allocation not reused: not device memory any more.
  ASSERT_EQ(f.mem_free(b), 0);
  EXPECT_EQ(cache.resolve(p, 1).status().code(), Code::kInvalidArg);
  // Host memory and null.
  int host = 0;
  EXPECT_EQ(cache.resolve(&host, sizeof(host)).status().code(), Code::kInvalidArg);
  EXPECT_EQ(cache.resolve(nullptr, 0).status().code(), Code::kInvalidArg);
}

}  // namespace
}  // namespace gw::cuda
