// The parameter server in daemon mode across two gradwired daemons (docs/parameter-server.md,
// "Daemon mode"): two trainer processes on each (kv_daemon_trainer.cc), every daemon serving a
// share of one key's partitions; push_pull under bsp exact (its pushes fp16-encoded); `gradwirectl
// kv` and /metrics show the store on each daemon (codec, keys, partitions, clocks, lag), and no
// longer once the job ended; a
// daemon keeps serving its keys after its own trainers left, while other hosts' workers use them; a
// daemon killed mid-push_pull fails every worker with GW_ERR_PEER naming its kv server, within
// the deadline.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/daemon/daemon_pair.h"
#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

using namespace ::gw::test::daemon_it;

// gradwirectl kv [--json] against daemon h: its output ("" when it failed).
std::string gradwirectl_kv(const DaemonPair& d, int h, bool json) {
  ProcGroup g;
  std::vector<std::string> argv = {GRADWIRECTL_PATH, "kv", "--socket", d.socket(h)};
  if (json) argv.push_back("--json");
  g.start(argv, clean_env());
  auto r = g.wait_all(30000);
  if (r.empty() || !r[0].exited || r[0].exit_code != 0) return "";
  return r[0].output;
}

TEST(KvDaemon, TwoDaemonsServeTheKeysAndShowTheStore) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  const int metrics_port = free_port();
  ASSERT_TRUE(d.start(metrics_port));
  const std::string hold = dir.path() + "/hold";
  ProcGroup g;
  const int port = free_port();
  constexpr int kWorld = 4;
  for (int r = 0; r < kWorld; ++r) {
    d.start_trainer(g, r, kWorld, port, {"--codec", "fp16", "pushpull", "3", hold});
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(g.wait_for_output(r, "HOLDING", 60000)) << "rank " << r << ":\n"
                                                        << g.output(r) << "\ndaemon A:\n"
                                                        << d.daemon_output(0) << "\ndaemon B:\n"
                                                        << d.daemon_output(1);
  }
  // Each daemon holds its share of the store: 100 floats in 16-float partitions are 7, split
  // between the two daemons; every worker finished clock 3.
  uint64_t partitions = 0;
  for (int h = 0; h < 2; ++h) {
    auto rows = nlohmann::json::parse(gradwirectl_kv(d, h, true), nullptr, false);
    ASSERT_TRUE(rows.is_array()) << "daemon " << h;
    ASSERT_EQ(rows.size(), 1u) << rows.dump();
    const auto& k = rows[0];
    EXPECT_EQ(k["mode"], "bsp");
    EXPECT_EQ(k["update"], "sum");
    EXPECT_EQ(k["codec"], "fp16,ef=0");  // the canonical spec the Hello carries
    EXPECT_EQ(k["host_index"], h);
    EXPECT_EQ(k["workers"], kWorld);
    EXPECT_EQ(k["live"], kWorld);
    EXPECT_EQ(k["keys"], 1);
    EXPECT_EQ(k["min_clock"], 3);
    EXPECT_EQ(k["max_clock"], 3);
    EXPECT_EQ(k["lag"], 0);
    EXPECT_EQ(k["dropped"], 0);
    EXPECT_EQ(k["lost"], 0);
    EXPECT_EQ(k["state"], "open");
    EXPECT_GT(k["partitions"].get<uint64_t>(), 0u) << "daemon " << h << " serves no partition";
    partitions += k["partitions"].get<uint64_t>();
  }
  EXPECT_EQ(partitions, 7u);
  const std::string text = gradwirectl_kv(d, 0, false);
  EXPECT_NE(text.find("PARTITIONS"), std::string::npos) << text;
  EXPECT_NE(text.find("bsp"), std::string::npos) << text;
  EXPECT_NE(text.find("CODEC"), std::string::npos) << text;
  EXPECT_NE(text.find("fp16,ef=0"), std::string::npos) << text;
#ifdef GW_HAVE_PROMETHEUS
  const std::string m = scrape(metrics_port);
  EXPECT_EQ(sample(m, "gradwired_kv_stores"), 1) << m;
  EXPECT_EQ(sum_samples(m, "gradwired_kv_min_clock", {"mode=\"bsp\""}), 3) << m;
  EXPECT_EQ(sum_samples(m, "gradwired_kv_lag_clocks"), 0) << m;
  EXPECT_EQ(sum_samples(m, "gradwired_kv_dropped_pushes_total"), 0) << m;
  EXPECT_EQ(sum_samples(m, "gradwired_kv_keys"), 1) << m;
  EXPECT_EQ(sum_samples(m, "gradwired_kv_keys", {"codec=\"fp16,ef=0\""}), 1) << m;
#endif
  { std::ofstream(hold) << "go\n"; }
  auto results = g.wait_all(60000, true);
  ASSERT_EQ(results.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
        << "rank " << r << ": " << results[r].describe();
  }
  // The job is gone from both daemons, and its kv server with it: no store is listed any more.
  for (int h = 0; h < 2; ++h) {
    nlohmann::json rows;
    for (int i = 0; i < 200; ++i) {
      rows = nlohmann::json::parse(gradwirectl_kv(d, h, true), nullptr, false);
      if (rows.is_array() && rows.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(rows.is_array() && rows.empty()) << "daemon " << h << ": " << rows.dump();
  }
}

// A daemon's server outlives its own trainers while the job's other workers use its keys: host
// A's trainers push and leave; host B's then pull the sum of every push, partly from daemon A.
TEST(KvDaemon, ADaemonServesItsKeysAfterItsOwnTrainersLeft) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  const std::string hold = dir.path() + "/hold";
  ProcGroup g;
  const int port = free_port();
  constexpr int kWorld = 4;
  for (int r = 0; r < kWorld; ++r) d.start_trainer(g, r, kWorld, port, {"early", hold});
  for (int r = 0; r < kWorld; r += 2) {
    ASSERT_TRUE(g.wait_for_output(r, "DONE", 60000)) << "rank " << r << ":\n" << g.output(r);
  }
  // Daemon A has no trainer left (ranks 0 and 2 were its only ones).
  nlohmann::json clients;
  for (int i = 0; i < 200; ++i) {
    ProcGroup c;
    c.start({GRADWIRECTL_PATH, "clients", "--json", "--socket", d.socket(0)}, clean_env());
    auto r = c.wait_all(30000);
    clients = nlohmann::json::parse(r.empty() ? "" : r[0].output, nullptr, false);
    if (clients.is_array() && clients.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(clients.is_array() && clients.empty()) << clients.dump();
  // Both daemons still hold their share of the store, whose pushes are raw.
  for (int h = 0; h < 2; ++h) {
    auto rows = nlohmann::json::parse(gradwirectl_kv(d, h, true), nullptr, false);
    ASSERT_TRUE(rows.is_array() && rows.size() == 1u) << "daemon " << h << ": " << rows.dump();
    EXPECT_EQ(rows[0]["mode"], "asp");
    EXPECT_EQ(rows[0]["codec"], "none");
  }
  { std::ofstream(hold) << "go\n"; }
  auto results = g.wait_all(60000, true);
  ASSERT_EQ(results.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(results[r].exited && results[r].exit_code == 0)
        << "rank " << r << ": " << results[r].describe() << "\ndaemon A:\n"
        << d.daemon_output(0);
  }
}

TEST(KvDaemon, KillingADaemonFailsEveryWorkerWithPeer) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  constexpr int kWorld = 4;
  for (int r = 0; r < kWorld; ++r) d.start_trainer(g, r, kWorld, port, {"loop"});
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(g.wait_for_output(r, "READY", 60000)) << "rank " << r << ":\n" << g.output(r);
  }
  ASSERT_EQ(::kill(d.pid(1), SIGKILL), 0);
  auto results = g.wait_all(kTimeoutMs + kSlackMs);
  ASSERT_EQ(results.size(), static_cast<size_t>(kWorld));
  for (int r = 0; r < kWorld; ++r) {
    const auto& res = results[r];
    EXPECT_TRUE(res.exited && res.exit_code == 10 + kGwErrPeer)
        << "rank " << r << ": " << res.describe();
    // Server 1 is daemon B (the daemons are ordered by their lowest rank: rank 0 is on A).
    if (DaemonPair::host_of(r) == 0) {
      EXPECT_NE(res.output.find("kv server 1"), std::string::npos) << res.describe();
    }
  }
}

}  // namespace
}  // namespace gw::test
