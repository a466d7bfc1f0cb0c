// The dlopen'd driver table and the codec entry points' argument checks: on a host without a
// GPU every call must end in a clear kUnsupported, never a crash.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gpudirect/cuda_driver.h"
#include "gpudirect/gpu_codecs.h"

namespace gw::cuda {
namespace {

TEST(CudaDriver, MissingLibraryIsUnsupported) {
  auto d = load_driver("libcuda-gradwire-test-absent.so.1");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kUnsupported);
  EXPECT_NE(
      d.status().message().find("no CUDA driver: libcuda-gradwire-test-absent.so.1 not found"),
      std::string::npos)
      << d.status().message();
}

TEST(CudaDriver, LibraryWithoutTheSymbolsIsUnsupported) {
  auto d = load_driver("libm.so.6");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), Code::kUnsupported);
  EXPECT_NE(d.status().message().find("libm.so.6 lacks cuInit"), std::string::npos)
      << d.status().message();
}

TEST(CudaDriver, EmptyNameIsInvalid) {
  EXPECT_EQ(load_driver("").status().code(), Code::kInvalidArg);
  EXPECT_EQ(load_driver(nullptr).status().code(), Code::kInvalidArg);
}

TEST(CudaDriver, ProcessTableIsCachedAndNeverCrashes) {
  auto a = driver();
  auto b = driver();
  ASSERT_EQ(a.ok(), b.ok());
  if (a.ok()) {
    EXPECT_EQ(*a, *b);
    EXPECT_GT((*a)->version, 0);
  } else {
    EXPECT_EQ(a.status().code(), Code::kUnsupported);
    EXPECT_EQ(a.status().message(), b.status().message());
    EXPECT_TRUE(a.status().message().find("CUDA") != std::string::npos) << a.status().message();
  }
}

TEST(CudaDriver, HostPointersAreNotDevicePointers) {
  int on_stack = 0;
  std::vector<float> on_heap(16);
  EXPECT_FALSE(is_device_pointer(&on_stack));
  EXPECT_FALSE(is_device_pointer(on_heap.data()));
  EXPECT_FALSE(is_device_pointer(nullptr));
}

// Plausible, aligned, non-overlapping addresses that are never dereferenced on the host.
struct FakeBuffers {
  alignas(16) float in[64];
  alignas(16) float res[64];
  alignas(16) uint16_t out[64];
  alignas(16) float acc[64];
  alignas(16) unsigned char enc[64 * 2];
};

TEST(GpuCodecs, WithoutDriverEveryEntryPointIsUnsupported) {
  if (driver().ok()) GTEST_SKIP() << "a CUDA driver is present: covered by the GPU tests";
  FakeBuffers b;
  const std::vector<Status> all = {
      codecs_available(),
      encode_cast16(b.in, b.res, 64, b.out, false, nullptr),
      encode_cast16(b.in, nullptr, 64, b.out, true, nullptr),
      decode_cast16(b.out, 64, b.acc, false, true, nullptr),
      decode_cast16(b.out, 64, b.acc, true, false, nullptr),
      sign_encode(b.in, b.res, 64, 64, b.enc, nullptr),
      sign_decode(b.enc, 64, 64, b.acc, true, nullptr),
  };
  for (const Status& st : all) {
    EXPECT_EQ(st.code(), Code::kUnsupported) << st.to_string();
    // Either message tells the user what is missing.
    const bool says = st.message().find("no CUDA driver") != std::string::npos ||
                      st.message().find("no CUDA device") != std::string::npos ||
                      st.message().find("no usable CUDA driver") != std::string::npos ||
                      st.message().find("built without CUDA kernels") != std::string::npos;
    EXPECT_TRUE(says) << st.message();
  }
}

TEST(GpuCodecs, HostChecksComeFirst) {
  FakeBuffers b;
  auto code = [](const Status& st) { return st.code(); };
  // Null pointers.
  EXPECT_EQ(code(encode_cast16(nullptr, nullptr, 4, b.out, false, nullptr)), Code::kInvalidArg);
  EXPECT_EQ(code(encode_cast16(b.in, nullptr, 4, nullptr, false, nullptr)), Code::kInvalidArg);
  EXPECT_EQ(code(decode_cast16(nullptr, 4, b.acc, false, false, nullptr)), Code::kInvalidArg);
  EXPECT_EQ(code(sign_decode(b.enc, 64, 64, nullptr, false, nullptr)), Code::kInvalidArg);
  // Misaligned.
  auto* odd = reinterpret_cast<float*>(reinterpret_cast<char*>(b.in) + 2);
  const Status mis = encode_cast16(odd, nullptr, 4, b.out, false, nullptr);
  EXPECT_EQ(mis.code(), Code::kInvalidArg);
  EXPECT_NE(mis.message().find("argument in"), std::string::npos) << mis.message();
  EXPECT_NE(mis.message().find("4-byte aligned"), std::string::npos) << mis.message();
  auto* odd16 = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(b.out) + 1);
  EXPECT_EQ(code(decode_cast16(odd16, 4, b.acc, false, false, nullptr)), Code::kInvalidArg);
  // Overlap: out inside in, residual == in.
  const Status ov =
      encode_cast16(b.in, b.in + 8, 16, reinterpret_cast<uint16_t*>(b.res), false, nullptr);
  EXPECT_EQ(ov.code(), Code::kInvalidArg);
  EXPECT_NE(ov.message().find("overlap"), std::string::npos) << ov.message();
  EXPECT_EQ(
      code(encode_cast16(b.in, nullptr, 16, reinterpret_cast<uint16_t*>(b.in + 4), false, nullptr)),
      Code::kInvalidArg);
  // Bad chunks, before anything else.
  for (size_t chunk : {size_t{0}, size_t{63}, size_t{100}, size_t{2} << 20}) {
    const Status st = sign_encode(b.in, nullptr, 64, chunk, b.enc, nullptr);
    EXPECT_EQ(st.code(), Code::kInvalidArg) << chunk;
    EXPECT_NE(st.message().find("chunk"), std::string::npos) << st.message();
    EXPECT_EQ(code(sign_decode(b.enc, 64, chunk, b.acc, true, nullptr)), Code::kInvalidArg);
  }
  // A count whose byte size overflows.
  EXPECT_EQ(code(encode_cast16(b.in, nullptr, SIZE_MAX / 2, b.out, false, nullptr)),
            Code::kInvalidArg);
  // Nothing to do is fine even with null pointers.
  EXPECT_TRUE(encode_cast16(nullptr, nullptr, 0, nullptr, false, nullptr).ok());
  EXPECT_TRUE(decode_cast16(nullptr, 0, nullptr, true, true, nullptr).ok());
  EXPECT_TRUE(sign_encode(nullptr, nullptr, 0, 2048, nullptr, nullptr).ok());
  EXPECT_TRUE(sign_decode(nullptr, 0, 2048, nullptr, false, nullptr).ok());
}

TEST(GpuCodecs, HostMemoryIsRefusedWhenThereIsADevice) {
  if (!codecs_available().ok()) GTEST_SKIP() << codecs_available().to_string();
  FakeBuffers b;
  const Status st = encode_cast16(b.in, nullptr, 64, b.out, false, nullptr);
  EXPECT_EQ(st.code(), Code::kInvalidArg);
  EXPECT_NE(st.message().find("not CUDA device memory"), std::string::npos) << st.message();
}

TEST(GpuCodecs, SignEncodedSize) {
  EXPECT_EQ(sign_encoded_size(0, 2048), 0u);
  EXPECT_EQ(sign_encoded_size(1, 2048), 4u + 256u);
  EXPECT_EQ(sign_encoded_size(2048, 2048), 260u);
  EXPECT_EQ(sign_encoded_size(2049, 64), 33u * (4u + 8u));
}

TEST(GpuCodecs, ScaleToleranceGrowsWithTheChunk) {
  EXPECT_LT(sign_scale_tolerance(1), 1e-6);
  EXPECT_LT(sign_scale_tolerance(2048), 3e-4);
  EXPECT_GT(sign_scale_tolerance(2048), 2e-4);
}

}  // namespace
}  // namespace gw::cuda
