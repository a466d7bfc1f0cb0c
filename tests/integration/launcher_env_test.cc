// Ranks started the way launchers start them: torchrun-style variables, Slurm-style variables,
// and a real `mpirun`, each checked for the rank the library detected and a correct allreduce.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

constexpr int kTimeoutMs = 20000;

// Every "IDENTITY rank=R size=N VAR=..." line of `output`.
std::vector<std::map<std::string, std::string>> identities(const std::string& output) {
  std::vector<std::map<std::string, std::string>> out;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    auto f = parse_tagged_line(line, "IDENTITY");
    if (f) out.push_back(*f);
  }
  return out;
}

Env base_env() {
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = std::to_string(kTimeoutMs);
  return env;
}

// Starts one process per rank with per-rank variables from make_env and checks every rank saw
// itself as `rank_var` says and the allreduce was right.
void run_launcher_style(int n, const std::function<Env(int)>& make_env,
                        const std::string& rank_var) {
  ProcGroup group;
  for (int r = 0; r < n; ++r) group.start({GW_RANK_MAIN_PATH, "identity"}, make_env(r));
  auto results = group.wait_all(kTimeoutMs * 2, /*kill_on_failure=*/true);
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    ASSERT_TRUE(res.exited && res.exit_code == 0) << "rank " << r << " " << res.describe();
    auto ids = identities(res.output);
    ASSERT_EQ(ids.size(), 1u) << res.describe();
    EXPECT_EQ(ids[0]["rank"], std::to_string(r)) << res.describe();
    EXPECT_EQ(ids[0]["size"], std::to_string(n)) << res.describe();
    EXPECT_EQ(ids[0][rank_var], std::to_string(r)) << res.describe();
  }
}

TEST(LauncherEnvTest, TorchrunVariables) {
  int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 3;
  run_launcher_style(
      n,
      [&](int r) {
        Env env = base_env();
        env["RANK"] = std::to_string(r);
        env["LOCAL_RANK"] = std::to_string(r);
        env["WORLD_SIZE"] = std::to_string(n);
        env["LOCAL_WORLD_SIZE"] = std::to_string(n);
        env["MASTER_ADDR"] = "127.0.0.1";
        env["MASTER_PORT"] = std::to_string(port);
        return env;
      },
      "RANK");
}

TEST(LauncherEnvTest, SlurmVariables) {
  int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 3;
  run_launcher_style(
      n,
      [&](int r) {
        Env env = base_env();
        env["SLURM_PROCID"] = std::to_string(r);
        env["SLURM_LOCALID"] = std::to_string(r);
        env["SLURM_NTASKS"] = std::to_string(n);
        env["SLURM_JOB_ID"] = "4242";
        env["MASTER_ADDR"] = "127.0.0.1";
        env["MASTER_PORT"] = std::to_string(port);
        return env;
      },
      "SLURM_PROCID");
}

TEST(LauncherEnvTest, GwVariablesWinOverTorchrun) {
  int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 2;
  // RANK says the opposite of GW_RANK: the GW_* variables come first.
  ProcGroup group;
  for (int r = 0; r < n; ++r) {
    Env env = base_env();
    env["GW_RANK"] = std::to_string(r);
    env["GW_WORLD_SIZE"] = std::to_string(n);
    env["GW_STORE"] = "127.0.0.1:" + std::to_string(port);
    env["RANK"] = std::to_string(n - 1 - r);
    env["WORLD_SIZE"] = std::to_string(n);
    group.start({GW_RANK_MAIN_PATH, "identity"}, env);
  }
  auto results = group.wait_all(kTimeoutMs * 2, true);
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
    auto ids = identities(res.output);
    ASSERT_EQ(ids.size(), 1u) << res.describe();
    EXPECT_EQ(ids[0]["rank"], std::to_string(r)) << res.describe();
  }
}

TEST(LauncherEnvTest, IncompleteTorchrunVariablesAreAnErrorNotAHang) {
  Env env = base_env();
  env["RANK"] = "0";  // no WORLD_SIZE, no MASTER_ADDR/MASTER_PORT
  ProcGroup group;
  group.start({GW_RANK_MAIN_PATH, "identity"}, env);
  auto results = group.wait_all(kTimeoutMs + 5000);
  ASSERT_TRUE(results[0].exited) << results[0].describe();
  EXPECT_EQ(results[0].exit_code, 10 + 1)
      << "GW_ERR_INVALID_ARG expected: " << results[0].describe();
  EXPECT_LT(results[0].elapsed_ms, 5000) << results[0].describe();
}

TEST(LauncherEnvTest, MalformedRankIsInvalid) {
  Env env = base_env();
  env["RANK"] = "zero";
  env["WORLD_SIZE"] = "2";
  env["MASTER_ADDR"] = "127.0.0.1";
  env["MASTER_PORT"] = std::to_string(free_port());
  ProcGroup group;
  group.start({GW_RANK_MAIN_PATH, "identity"}, env);
  auto results = group.wait_all(kTimeoutMs + 5000);
  ASSERT_TRUE(results[0].exited) << results[0].describe();
  EXPECT_EQ(results[0].exit_code, 10 + 1) << results[0].describe();
}

std::string find_in_path(const std::string& name) {
  const char* path = getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string candidate = dir + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

TEST(LauncherEnvTest, OpenMpiMpirun) {
  std::string mpirun = find_in_path("mpirun");
  if (mpirun.empty()) GTEST_SKIP() << "mpirun not found in PATH (apt-get install openmpi-bin)";
  int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 4;
  Env env = base_env();
  env["GW_STORE"] = "127.0.0.1:" + std::to_string(port);
  ProcGroup group;
  group.start({mpirun, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(n), "-x",
               "GW_STORE", "-x", "GW_TIMEOUT_MS", GW_RANK_MAIN_PATH, "identity"},
              env);
  auto results = group.wait_all(kTimeoutMs * 3);
  const auto& res = results[0];
  ASSERT_FALSE(res.timed_out) << res.describe();
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  auto ids = identities(res.output);
  ASSERT_EQ(ids.size(), static_cast<size_t>(n)) << res.describe();
  std::set<std::string> ranks;
  for (auto& id : ids) {
    EXPECT_EQ(id["size"], std::to_string(n)) << res.describe();
    EXPECT_EQ(id["rank"], id["OMPI_COMM_WORLD_RANK"])
        << "library rank vs Open MPI's: " << res.describe();
    ranks.insert(id["rank"]);
  }
  EXPECT_EQ(ranks.size(), static_cast<size_t>(n)) << res.describe();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(parse_tagged_line(res.output, "RESULT", "rank=" + std::to_string(r) + " status=0"))
        << res.describe();
  }
}

// Under mpirun with no gradwire variable and no MASTER_ADDR: the store address and the job token
// come from rank 0 through PMIx (core/pmix_bootstrap.h), and a second communicator from the same
// environment reaches the same store without another exchange.
TEST(LauncherEnvTest, OpenMpiMpirunWithoutAnyAddressBootstrapsThroughPmix) {
  std::string mpirun = find_in_path("mpirun");
  if (mpirun.empty()) GTEST_SKIP() << "mpirun not found in PATH (apt-get install openmpi-bin)";
  const int n = 3;
  Env env = base_env();
  env["GW_LOG_LEVEL"] = "info";
  for (const char* scenario : {"identity", "twice"}) {
    ProcGroup group;
    group.start({mpirun, "--allow-run-as-root", "--oversubscribe", "-np", std::to_string(n), "-x",
                 "GW_TIMEOUT_MS", "-x", "GW_LOG_LEVEL", GW_RANK_MAIN_PATH, scenario},
                env);
    auto results = group.wait_all(kTimeoutMs * 3);
    const auto& res = results[0];
    ASSERT_FALSE(res.timed_out) << res.describe();
    if (res.output.find("PMIx bootstrap not built") != std::string::npos) {
      GTEST_SKIP() << "built without pmix.h";
    }
    ASSERT_TRUE(res.exited && res.exit_code == 0) << scenario << ": " << res.describe();
    for (int r = 0; r < n; ++r) {
      EXPECT_TRUE(
          parse_tagged_line(res.output, "RESULT", "rank=" + std::to_string(r) + " status=0"))
          << res.describe();
    }
    // Every rank's start-up line: the store from PMIx, the token made by rank 0 and shared there
    // (so it never entered the store).
    size_t lines = 0;
    for (size_t at = 0; (at = res.output.find("(PMIx", at)) != std::string::npos; ++at) ++lines;
    EXPECT_GE(lines, static_cast<size_t>(n)) << res.describe();
    EXPECT_NE(res.output.find("job token from PMIx (made by rank 0)"), std::string::npos)
        << res.describe();
    if (std::string(scenario) == "twice") {
      for (int r = 0; r < n; ++r) {
        EXPECT_NE(res.output.find("TWICE rank=" + std::to_string(r) + " ok"), std::string::npos)
            << res.describe();
      }
    }
  }
}

}  // namespace
}  // namespace gw::test
