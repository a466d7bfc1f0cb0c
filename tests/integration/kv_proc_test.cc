// The parameter server's faults across real processes (GW_KV_SERVERS server processes running
// gw_kv_serve, workers through the C ABI): a killed worker fails every other worker naming it
// under bsp and is counted while the others go on under ssp, asp and sync:K; a killed server
// fails every worker naming it and its keys. Each ends within the deadline, never in a hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/gradwire.h"
#include "tests/support/exec_child.h"
#include "tests/support/free_port.h"

namespace {

using gw::testing::env_or_empty;
using gw::testing::ExecChild;
using gw::testing::register_child_case;

constexpr int kTimeoutMs = 5000;
constexpr uint64_t kKey = 11;
constexpr size_t kCount = 1000;  // 4 partitions of 1 KiB over the servers

bool exists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}
void touch(const std::string& path) { std::ofstream(path) << "1"; }
bool wait_for(const std::string& path, int ms) {
  for (int i = 0; i < ms / 10; ++i) {
    if (exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// A worker: init, one clock, "ready", then (unless it is the victim, which dies at "go") clocks
// until an error or 5 clocks; writes "code\nlost\nmessage" to result.<rank>.
int worker_main() {
  const int rank = std::atoi(env_or_empty("GW_TEST_KV_RANK").c_str());
  const int world = std::atoi(env_or_empty("GW_TEST_KV_WORLD").c_str());
  const int victim = std::atoi(env_or_empty("GW_TEST_KV_VICTIM").c_str());
  const std::string dir = env_or_empty("GW_TEST_KV_DIR");
  const std::string store = env_or_empty("GW_TEST_KV_STORE");
  gw_config_t c = GW_CONFIG_INIT;
  c.rank = rank;
  c.world_size = world;
  c.store_addr = store.c_str();
  c.transport = "tcp";
  gw_comm_t comm = nullptr;
  if (gw_comm_init(&comm, &c) != GW_OK) return 20;
  gw_kv_config_t cfg = GW_KV_CONFIG_INIT;
  cfg.mode = static_cast<gw_kv_mode_t>(std::atoi(env_or_empty("GW_TEST_KV_MODE").c_str()));
  cfg.partition_bytes = 1024;
  cfg.staleness = 1;  // ssp:1
  cfg.sync_k = 2;     // sync:2
  gw_kv_t kv = nullptr;
  if (gw_kv_create(comm, &cfg, &kv) != GW_OK) {
    std::fprintf(stderr, "create: %s\n", gw_last_error());
    return 21;
  }
  std::vector<float> v(kCount, 1.f), out(kCount);
  if (gw_kv_init(kv, kKey, v.data(), kCount, GW_FLOAT32) != GW_OK) return 22;
  if (gw_kv_pushpull(kv, kKey, v.data(), out.data(), kCount, GW_FLOAT32, 0) != GW_OK) return 23;
  if (gw_kv_clock(kv) != GW_OK) return 24;
  touch(dir + "/ready." + std::to_string(rank));
  if (!wait_for(dir + "/go", 30000)) return 25;
  if (rank == victim) raise(SIGKILL);
  if (cfg.mode != GW_KV_BSP && !wait_for(dir + "/dead", 30000)) return 26;
  gw_status_t st = GW_OK;
  std::string msg;
  gw_kv_stats_t stats{sizeof(gw_kv_stats_t), 0, 0, 0, 0};
  for (int step = 0; step < 50 && st == GW_OK; ++step) {
    st = gw_kv_pushpull(kv, kKey, v.data(), out.data(), kCount, GW_FLOAT32, 0);
    if (st == GW_OK) st = gw_kv_clock(kv);
    if (st != GW_OK) msg = gw_last_error();
    gw_kv_stats(kv, &stats);
    if (step >= 4 && stats.lost_workers > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::ofstream(dir + "/result." + std::to_string(rank)) << static_cast<int>(st) << "\n"
                                                         << stats.lost_workers << "\n"
                                                         << msg << "\n";
  gw_kv_destroy(kv);
  gw_comm_destroy(comm);
  return 0;
}

int server_main() {
  const gw_status_t s = gw_kv_serve(nullptr);
  if (s != GW_OK) std::fprintf(stderr, "serve: %s\n", gw_last_error());
  return s == GW_OK ? 0 : 30;
}

const bool kWorker = register_child_case("KvChild", "Worker", worker_main);
const bool kServer = register_child_case("KvChild", "Server", server_main);

struct Result {
  int code = -1;
  uint64_t lost = 0;
  std::string msg;
};

Result read_result(const std::string& path) {
  Result r;
  std::ifstream f(path);
  if (!f.good()) return r;
  f >> r.code >> r.lost;
  std::getline(f, r.msg);
  std::getline(f, r.msg);
  return r;
}

// A job of `world` workers and `servers` server processes on a fresh store; worker `victim` dies
// at "go" (-1: none). kill_server: the server index the test kills at "go" (-1: none).
class Job {
 public:
  Job(int world, int servers, int mode, int victim) : world_(world) {
    char tmpl[] = "/tmp/gw_kv_proc_XXXXXX";
    dir_ = mkdtemp(tmpl);
    const int port = gw::testing::free_port();
    const std::string store = "127.0.0.1:" + std::to_string(port);
    const std::vector<std::string> common = {
        "GW_TIMEOUT_MS=" + std::to_string(kTimeoutMs), "GW_KV_SERVERS=" + std::to_string(servers),
        "GW_TEST_KV_DIR=" + dir_, "GW_JOB_TOKEN=kv-proc-test", "GW_DAEMON="};
    for (int r = 0; r < world; ++r) {
      auto env = common;
      env.push_back("GW_TEST_KV_RANK=" + std::to_string(r));
      env.push_back("GW_TEST_KV_WORLD=" + std::to_string(world));
      env.push_back("GW_TEST_KV_MODE=" + std::to_string(mode));
      env.push_back("GW_TEST_KV_VICTIM=" + std::to_string(victim));
      env.push_back("GW_TEST_KV_STORE=" + store);
      workers.push_back(std::make_unique<ExecChild>("KvChild.Worker", env));
    }
    for (int s = 0; s < servers; ++s) {
      auto env = common;
      env.push_back("GW_ROLE=server");
      env.push_back("GW_KV_SERVER_RANK=" + std::to_string(s));
      env.push_back("GW_STORE=" + store);
      servers_.push_back(std::make_unique<ExecChild>("KvChild.Server", env));
    }
  }
  ~Job() { std::system(("rm -rf " + dir_).c_str()); }
  bool all_ready() {
    for (int r = 0; r < world_; ++r) {
      if (!wait_for(dir_ + "/ready." + std::to_string(r), 30000)) return false;
    }
    return true;
  }
  void flag(const char* name) { touch(dir_ + "/" + name); }
  Result result(int r) { return read_result(dir_ + "/result." + std::to_string(r)); }

  std::vector<std::unique_ptr<ExecChild>> workers;
  std::vector<std::unique_ptr<ExecChild>> servers_;

 private:
  int world_;
  std::string dir_;
};

TEST(KvProcTest, KilledWorkerUnderBspFailsTheOthersNamingIt) {
  Job job(3, 1, GW_KV_BSP, /*victim=*/2);
  ASSERT_TRUE(job.all_ready());
  const auto t0 = std::chrono::steady_clock::now();
  job.flag("go");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(job.workers[r]->wait(kTimeoutMs * 3), 0) << "worker " << r;
    const Result res = job.result(r);
    EXPECT_EQ(res.code, GW_ERR_PEER) << res.msg;
    EXPECT_NE(res.msg.find("worker 2 died"), std::string::npos) << res.msg;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(kTimeoutMs + 3000));
  job.servers_[0]->wait(kTimeoutMs * 3);
}

// ssp:1, asp and sync:2 (two of three workers still live): the job goes on without the dead one.
class KvProcLossTest : public ::testing::TestWithParam<int> {};

TEST_P(KvProcLossTest, KilledWorkerIsCountedAndTheOthersGoOn) {
  Job job(3, 1, GetParam(), /*victim=*/2);
  ASSERT_TRUE(job.all_ready());
  job.flag("go");
  job.workers[2]->wait(kTimeoutMs);
  job.flag("dead");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(job.workers[r]->wait(kTimeoutMs * 3), 0) << "worker " << r;
    const Result res = job.result(r);
    EXPECT_EQ(res.code, GW_OK) << res.msg;
    EXPECT_EQ(res.lost, 1u);
  }
  EXPECT_EQ(job.servers_[0]->wait(kTimeoutMs * 3), 0) << "the server ends once every worker left";
}

INSTANTIATE_TEST_SUITE_P(Modes, KvProcLossTest, ::testing::Values(GW_KV_SSP, GW_KV_ASP, GW_KV_SYNC),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(i.param == GW_KV_SSP   ? "ssp1"
                                              : i.param == GW_KV_ASP ? "asp"
                                                                     : "sync2of3");
                         });

TEST(KvProcTest, KilledServerFailsEveryWorkerNamingItAndItsKeys) {
  Job job(2, 2, GW_KV_ASP, /*victim=*/-1);
  ASSERT_TRUE(job.all_ready());
  job.servers_[1]->kill_now();
  job.flag("go");
  job.flag("dead");
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(job.workers[r]->wait(kTimeoutMs * 3), 0) << "worker " << r;
    const Result res = job.result(r);
    EXPECT_EQ(res.code, GW_ERR_PEER) << res.msg;
    EXPECT_NE(res.msg.find("kv server 1"), std::string::npos) << res.msg;
    EXPECT_NE(res.msg.find("key 11 (partitions"), std::string::npos) << res.msg;
  }
}

}  // namespace
