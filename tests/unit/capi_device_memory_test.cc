// In daemon mode the plain collectives refuse CUDA device memory (GW_ERR_UNSUPPORTED naming the
// call and the argument) when the process has the CUDA driver loaded; in direct mode they stage it
// (capi_device_staging_test has the collectives on device buffers). Managed memory and host memory
// pass in both, and gw_allreduce_compressed still takes device memory. There is no GPU here: the
// driver is tests/support/fake_cuda_driver.c (soname libcuda.so.1), loaded before the first
// gradwire call as a framework would load the real one, with the test marking which ranges are
// "device memory". Every test runs twice: in direct mode and in daemon mode (GW_DAEMON, a gradwired
// the suite starts), where the same refusal comes first and gw_allreduce_compressed refuses device
// memory too (CUDA IPC into the daemon is a later step).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/fake_cuda.h"
#include "tests/support/local_daemon.h"

namespace {

const gw::testing::FakeCuda& fake() { return gw::testing::fake_cuda(GW_FAKE_CUDA_PATH); }

// One gradwired for the daemon-mode half (socket in a temporary directory), for the whole run.
gw::testing::LocalDaemon& daemon() {
  static gw::testing::LocalDaemon d(GW_GRADWIRED_PATH, "gw-devmem");
  return d;
}

class DeviceMemoryTest : public ::testing::TestWithParam<bool> {
 protected:
  bool daemon_mode() const { return GetParam(); }
  void SetUp() override {
    ASSERT_NE(fake().mark, nullptr) << "cannot load " << GW_FAKE_CUDA_PATH << ": " << dlerror();
    if (daemon_mode()) {
      ASSERT_TRUE(daemon().ready()) << "gradwired did not start";
      ASSERT_TRUE(daemon().use());
    } else {
      ::unsetenv("GW_DAEMON");
    }
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
    ::unsetenv("GW_DAEMON");
  }
  // Expects GW_ERR_UNSUPPORTED whose message names `call` and `arg` as device memory.
  static void expect_refused(gw_status_t s, const std::string& call, const std::string& arg) {
    EXPECT_EQ(s, GW_ERR_UNSUPPORTED) << call << ": " << gw_last_error();
    const std::string m = gw_last_error();
    EXPECT_EQ(m.rfind(call + ": argument " + arg + " is CUDA device memory", 0), 0u) << m;
  }
  gw_comm_t comm_ = nullptr;
};

TEST_P(DeviceMemoryTest, DaemonModeTakesDeviceMemoryInThePlainCollectives) {
  if (!daemon_mode()) GTEST_SKIP() << "direct mode stages device memory (DirectModeStages...)";
  // A marked range cannot be exported over CUDA IPC (tests/daemon/daemon_device_test.cc has real
  // imports): DaemonSession stages it for the five blocking calls, the front end for the i-form.
  std::vector<float> dev(8, 1.0f);
  std::vector<float> host(8, 0.0f);
  fake().mark(dev.data(), dev.size() * sizeof(float), 0);
  const size_t n = 4;
  EXPECT_EQ(gw_allreduce(comm_, dev.data(), host.data(), n, GW_FLOAT32, GW_SUM), GW_OK)
      << gw_last_error();
  EXPECT_EQ(host[0], 1.0f);
  EXPECT_EQ(gw_broadcast(comm_, dev.data(), n, GW_FLOAT32, 0), GW_OK) << gw_last_error();
  EXPECT_EQ(gw_allgather(comm_, dev.data(), host.data() + 4, n, GW_FLOAT32), GW_OK)
      << gw_last_error();
  EXPECT_EQ(gw_reduce_scatter(comm_, host.data(), dev.data() + 4, n, GW_FLOAT32, GW_SUM), GW_OK)
      << gw_last_error();
  EXPECT_EQ(gw_alltoall(comm_, dev.data(), host.data(), n, GW_FLOAT32), GW_OK) << gw_last_error();
  gw_request_t req = nullptr;
  std::vector<float> out(n, 0.0f);
  ASSERT_EQ(gw_iallreduce(comm_, dev.data(), out.data(), n, GW_FLOAT32, GW_SUM, &req), GW_OK)
      << gw_last_error();
  EXPECT_EQ(gw_wait(req, 10000), GW_OK) << gw_last_error();
  EXPECT_EQ(out, std::vector<float>(n, 1.0f));
  // The composed calls and the queued i-forms (capi/daemon_calls.cc): staged by the front end.
  std::fill(out.begin(), out.end(), 0.0f);
  EXPECT_EQ(gw_reduce(comm_, dev.data(), out.data(), n, GW_FLOAT32, GW_SUM, 0), GW_OK)
      << gw_last_error();
  EXPECT_EQ(out, std::vector<float>(n, 1.0f));
  std::fill(out.begin(), out.end(), 0.0f);
  EXPECT_EQ(gw_gather(comm_, dev.data(), out.data(), n, GW_FLOAT32, 0), GW_OK) << gw_last_error();
  EXPECT_EQ(out, std::vector<float>(n, 1.0f));
  EXPECT_EQ(gw_scatter(comm_, host.data(), dev.data() + 4, n, GW_FLOAT32, 0), GW_OK)
      << gw_last_error();
  size_t cnt[1] = {n}, dsp[1] = {0};
  std::fill(out.begin(), out.end(), 0.0f);
  EXPECT_EQ(gw_alltoallv(comm_, dev.data(), cnt, dsp, out.data(), cnt, dsp, GW_FLOAT32), GW_OK)
      << gw_last_error();
  EXPECT_EQ(out, std::vector<float>(n, 1.0f));
  ASSERT_EQ(gw_ibroadcast(comm_, dev.data(), n, GW_FLOAT32, 0, &req), GW_OK) << gw_last_error();
  EXPECT_EQ(gw_wait(req, 10000), GW_OK) << gw_last_error();
}

TEST_P(DeviceMemoryTest, DirectModeStagesDeviceMemoryAndBothModesRegisterIt) {
  std::vector<float> dev(8, 1.0f);
  std::vector<float> host(8, 0.0f);
  fake().mark(dev.data(), dev.size() * sizeof(float), 0);
  gw_mem_handle_t h = nullptr;
  if (daemon_mode()) {  // registration is the front end's, as in direct mode
    EXPECT_EQ(gw_mem_register(comm_, dev.data(), sizeof(float) * 8, &h), GW_OK) << gw_last_error();
    EXPECT_EQ(gw_mem_deregister(comm_, h), GW_OK) << gw_last_error();
    return;
  }
  // The stand-in copies a marked (host) range as device memory: the call goes through staging.
  EXPECT_EQ(gw_allreduce(comm_, dev.data(), host.data(), 8, GW_FLOAT32, GW_SUM), GW_OK)
      << gw_last_error();
  EXPECT_EQ(host, dev);
  char path[256] = {0};
  ASSERT_EQ(gw_comm_describe(comm_, "device_memory_stats", path, sizeof(path), nullptr), GW_OK);
  EXPECT_NE(std::string(path).find("staged_ranges=1 "), std::string::npos) << path;
  EXPECT_EQ(gw_mem_register(comm_, dev.data(), sizeof(float) * 8, &h), GW_OK) << gw_last_error();
  EXPECT_EQ(gw_mem_deregister(comm_, h), GW_OK) << gw_last_error();
}

TEST_P(DeviceMemoryTest, HostAndManagedMemoryPassWithOneQueryPerBuffer) {
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

TEST_P(DeviceMemoryTest, CompressedAllreduceStillTakesDeviceMemory) {
  std::vector<float> dev(4, 1.0f);
  fake().mark(dev.data(), dev.size() * sizeof(float), 0);
  // The fake driver cannot run kernels, so the call fails further on; what matters is that it
  // went to the GPU path instead of being refused as the plain collectives are.
  const gw_status_t s =
      gw_allreduce_compressed(comm_, dev.data(), dev.size(), GW_FLOAT32, "fp16", "t");
  const std::string m = gw_last_error();
  if (daemon_mode()) {  // not yet: refused by the daemon session, saying so
    EXPECT_EQ(s, GW_ERR_UNSUPPORTED) << m;
    EXPECT_NE(m.find("not supported in daemon mode yet"), std::string::npos) << m;
    return;
  }
  EXPECT_EQ(m.find("host memory only"), std::string::npos) << m;
  EXPECT_NE(s, GW_OK) << "the fake driver runs no kernels: the GPU path must have been taken";
}

INSTANTIATE_TEST_SUITE_P(Modes, DeviceMemoryTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "Daemon" : "Direct";
                         });

}  // namespace
