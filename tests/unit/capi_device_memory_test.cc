// The plain collectives refuse CUDA device memory (GW_ERR_UNSUPPORTED naming the call and the
// argument) when the process has the CUDA driver loaded; managed memory and host memory pass, and
// gw_allreduce_compressed still takes device memory. There is no GPU here: the driver is
// tests/support/fake_cuda_driver.c (soname libcuda.so.1), loaded before the first gradwire call as
// a framework would load the real one, with the test marking which ranges are "device memory".
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/fake_cuda.h"

namespace {

const gw::testing::FakeCuda& fake() { return gw::testing::fake_cuda(GW_FAKE_CUDA_PATH); }

class DeviceMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(fake().mark, nullptr) << "cannot load " << GW_FAKE_CUDA_PATH << ": " << dlerror();
    fake().clear();
    gw_config_t cfg = GW_CONFIG_INIT;
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.timeout_ms = 20000;
    ASSERT_EQ(gw_comm_init(&comm_, &cfg), GW_OK) << gw_last_error();
  }
  void TearDown() override {
    fake().clear();
    if (comm_ != nullptr) {
      EXPECT_EQ(gw_comm_destroy(comm_), GW_OK) << gw_last_error();
    }
  }
  // Expects GW_ERR_UNSUPPORTED whose message names `call` and `arg` as device memory.
  static void expect_refused(gw_status_t s, const std::string& call, const std::string& arg) {
    EXPECT_EQ(s, GW_ERR_UNSUPPORTED) << call << ": " << gw_last_error();
    const std::string m = gw_last_error();
    EXPECT_EQ(m.rfind(call + ": argument " + arg + " is CUDA device memory", 0), 0u) << m;
  }
  gw_comm_t comm_ = nullptr;
};

TEST_F(DeviceMemoryTest, PlainCollectivesRefuseDeviceMemoryNamingTheCall) {
  std::vector<float> dev(8, 1.0f);
  std::vector<float> host(8, 0.0f);
  fake().mark(dev.data(), dev.size() * sizeof(float), 0);
  const size_t n = 4;

  expect_refused(gw_allreduce(comm_, dev.data(), host.data(), n, GW_FLOAT32, GW_SUM),
                 "gw_allreduce", "sendbuf");
  expect_refused(gw_allreduce(comm_, host.data(), dev.data(), n, GW_FLOAT32, GW_SUM),
                 "gw_allreduce", "recvbuf");
  expect_refused(gw_allreduce(comm_, dev.data(), dev.data(), n, GW_FLOAT32, GW_SUM), "gw_allreduce",
                 "sendbuf");
  expect_refused(gw_broadcast(comm_, dev.data(), n, GW_FLOAT32, 0), "gw_broadcast", "buf");
  expect_refused(gw_allgather(comm_, dev.data(), host.data(), n, GW_FLOAT32), "gw_allgather",
                 "sendbuf");
  expect_refused(gw_allgather(comm_, host.data(), dev.data(), n, GW_FLOAT32), "gw_allgather",
                 "recvbuf");
  expect_refused(gw_reduce_scatter(comm_, dev.data(), host.data(), n, GW_FLOAT32, GW_SUM),
                 "gw_reduce_scatter", "sendbuf");
  expect_refused(gw_reduce_scatter(comm_, host.data(), dev.data(), n, GW_FLOAT32, GW_SUM),
                 "gw_reduce_scatter", "recvbuf");
  expect_refused(gw_alltoall(comm_, dev.data(), host.data(), n, GW_FLOAT32), "gw_alltoall",
                 "sendbuf");
  expect_refused(gw_alltoall(comm_, host.data(), dev.data(), n, GW_FLOAT32), "gw_alltoall",
                 "recvbuf");
  gw_request_t req = nullptr;
  expect_refused(gw_iallreduce(comm_, dev.data(), host.data(), n, GW_FLOAT32, GW_SUM, &req),
                 "gw_iallreduce", "sendbuf");
  EXPECT_EQ(req, nullptr);
  // Nothing was written into the host buffer by a refused call.
  EXPECT_EQ(host, std::vector<float>(8, 0.0f));
  // The communicator is still usable afterwards.
  EXPECT_EQ(gw_allreduce(comm_, host.data(), host.data(), n, GW_FLOAT32, GW_SUM), GW_OK)
      << gw_last_error();
}

TEST_F(DeviceMemoryTest, HostAndManagedMemoryPassWithOneQueryPerBuffer) {
  std::vector<float> managed(4, 2.0f);
  std::vector<float> host(4, 0.0f);
  fake().mark(managed.data(), managed.size() * sizeof(float), 1);
  EXPECT_EQ(gw_allreduce(comm_, managed.data(), host.data(), 4, GW_FLOAT32, GW_SUM), GW_OK)
      << gw_last_error();
  EXPECT_EQ(host, managed);

  const long before = fake().queries();
  EXPECT_EQ(gw_allreduce(comm_, host.data(), host.data(), 4, GW_FLOAT32, GW_SUM), GW_OK);
  EXPECT_EQ(fake().queries() - before, 1) << "in place: one attribute query";
  const long before2 = fake().queries();
  std::vector<float> out(4);
  EXPECT_EQ(gw_allreduce(comm_, host.data(), out.data(), 4, GW_FLOAT32, GW_SUM), GW_OK);
  EXPECT_EQ(fake().queries() - before2, 2) << "two host buffers: one query each";
}

TEST_F(DeviceMemoryTest, CompressedAllreduceStillTakesDeviceMemory) {
  std::vector<float> dev(4, 1.0f);
  fake().mark(dev.data(), dev.size() * sizeof(float), 0);
  // The fake driver cannot run kernels, so the call fails further on; what matters is that it
  // went to the GPU path instead of being refused as the plain collectives are.
  const gw_status_t s =
      gw_allreduce_compressed(comm_, dev.data(), dev.size(), GW_FLOAT32, "fp16", "t");
  const std::string m = gw_last_error();
  EXPECT_EQ(m.find("host memory only"), std::string::npos) << m;
  EXPECT_NE(s, GW_OK) << "the fake driver runs no kernels: the GPU path must have been taken";
}

}  // namespace
