// gradwired with CUDA device buffers (docs/daemon.md, "Device buffers"), on the stand-in CUDA
// driver (tests/support/fake_cuda_driver.c: device memory in memfds the CPU cannot touch, CUDA IPC
// across processes through /proc/<pid>/fd): trainer processes (device_trainer.cc) export their
// allocations to their daemon, which imports them, runs every collective on them by the host path
// and writes the results into their device memory; a trainer killed mid-collective fails the
// others within the deadline and its imports are released (gradwirectl's count goes back to zero,
// no mapping of them is left in the daemon); the next job passes.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/daemon/daemon_pair.h"
#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

using namespace ::gw::test::daemon_it;

// A directory holding libcuda.so.1, the stand-in driver, for LD_LIBRARY_PATH.
std::string fake_cuda_dir(const TempDir& dir) {
  const std::string lib = dir.path() + "/cuda";
  std::filesystem::create_directories(lib);
  std::error_code ec;
  std::filesystem::create_symlink(GW_FAKE_CUDA_PATH, lib + "/libcuda.so.1", ec);
  return ec ? "" : lib;
}

size_t start_device_trainer(ProcGroup& g, const DaemonPair& d, const std::string& lib, int host,
                            int rank, int world, int port, std::vector<std::string> args) {
  Env env = clean_env();
  env["GW_DAEMON"] = "unix:" + d.socket(host);
  env["GW_HOSTID"] = DaemonPair::host(host);
  env["GW_DAEMON_ARENA"] = "16M";
  env["GW_LOG_LEVEL"] = "info";
  env["LD_LIBRARY_PATH"] = lib;
  std::vector<std::string> argv = {
      DEVICE_TRAINER_PATH,   "--rank",       std::to_string(rank),      "--world",
      std::to_string(world), "--timeout-ms", std::to_string(kTimeoutMs)};
  if (world > 1) {
    argv.push_back("--store");
    argv.push_back("127.0.0.1:" + std::to_string(port));
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return g.start(argv, env);
}

// gradwirectl status --json of daemon h: its count of imported device allocations (-1: none).
int64_t imports(const DaemonPair& d, int h) {
  ProcGroup g;
  g.start({GRADWIRECTL_PATH, "status", "--json", "--socket", d.socket(h)}, clean_env());
  auto r = g.wait_all(30000);
  if (r.empty()) return -1;
  auto j = nlohmann::json::parse(r[0].output, nullptr, false);
  if (!j.is_object() || !j.contains("imports")) return -1;
  return j["imports"].get<int64_t>();
}

// Mappings of the trainers' device memory still in daemon h (the stand-in's memfds).
int device_maps(const DaemonPair& d, int h) {
  std::ifstream f("/proc/" + std::to_string(d.pid(h)) + "/maps");
  int n = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.find("gw-fake-device") != std::string::npos) ++n;
  }
  return n;
}

class DaemonDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.path().empty());
    lib_ = fake_cuda_dir(dir_);
    ASSERT_FALSE(lib_.empty());
    for (int h = 0; h < 2; ++h) d_.set_env(h, "LD_LIBRARY_PATH", lib_);
    ASSERT_TRUE(d_.start());
  }
  // Runs `world` suite trainers (host_of(rank) when two_hosts, else all on daemon A).
  void suite(int world, bool two_hosts, const std::string& count) {
    ProcGroup g;
    const int port = free_port();
    for (int r = 0; r < world; ++r) {
      start_device_trainer(g, d_, lib_, two_hosts ? DaemonPair::host_of(r) : 0, r, world, port,
                           {"suite", count});
    }
    auto results = g.wait_all(240000, true);
    ASSERT_EQ(results.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      const auto& res = results[r];
      EXPECT_TRUE(res.exited && res.exit_code == 0)
          << "rank " << r << ": " << res.describe() << "\ndaemon A:\n"
          << d_.daemon_output(0) << "\ndaemon B:\n"
          << d_.daemon_output(1);
      EXPECT_NE(res.output.find("RESULT rank=" + std::to_string(r) + " status=0"),
                std::string::npos)
          << res.describe();
      // Which path: imported (the trainer copies nothing), and the one mixed call staged.
      EXPECT_NE(res.output.find("device buffers go to gradwired by CUDA IPC"), std::string::npos)
          << res.describe();
    }
  }

  TempDir dir_;
  DaemonPair d_{dir_};
  std::string lib_;
};

TEST_F(DaemonDevice, TwoTrainersOnOneDaemonAndFourOverTwoDaemons) {
  suite(2, false, "1000");
  if (HasFailure()) return;
  suite(4, true, "333");
  if (HasFailure()) return;
  EXPECT_TRUE(d_.daemon_said(0, "device buffers imported over CUDA IPC", 1000))
      << d_.daemon_output(0);
  // Every trainer has gone: so have their imports.
  for (int h = 0; h < 2; ++h) {
    EXPECT_TRUE(eventually([&] { return imports(d_, h) == 0 && device_maps(d_, h) == 0; }, 5000))
        << "daemon " << h << ": " << imports(d_, h) << " imports, " << device_maps(d_, h)
        << " mappings";
  }
}

TEST_F(DaemonDevice, KilledTrainerFailsTheOthersAndItsImportsAreReleased) {
  ProcGroup g;
  const int port = free_port();
  const int killer = 1;
  for (int r = 0; r < 3; ++r) {
    start_device_trainer(g, d_, lib_, 0, r, 3, port, {"die", std::to_string(killer)});
  }
  ASSERT_TRUE(g.wait_for_output(killer, "DYING", 60000)) << g.output(killer);
  auto results = g.wait_all(kTimeoutMs * 4 + kSlackMs * 4);
  ASSERT_EQ(results[killer].signal, SIGKILL) << results[killer].describe();
  for (int r = 0; r < 3; ++r) {
    if (r == killer) continue;
    const auto& res = results[r];
    ASSERT_FALSE(res.timed_out) << "rank " << r << " hung: " << res.describe();
    EXPECT_EQ(res.exit_code, 10 + kGwErrPeer) << "rank " << r << ": " << res.describe();
    auto fields = parse_tagged_line(res.output, "RESULT");
    ASSERT_TRUE(fields.has_value()) << res.describe();
    EXPECT_LE(std::stod((*fields)["elapsed_ms"]), kTimeoutMs + kSlackMs) << res.describe();
  }
  EXPECT_TRUE(eventually([&] { return imports(d_, 0) == 0 && device_maps(d_, 0) == 0; }, 5000))
      << imports(d_, 0) << " imports, " << device_maps(d_, 0) << " mappings";
  // The daemon serves the next job.
  suite(2, false, "77");
}

}  // namespace
}  // namespace gw::test
