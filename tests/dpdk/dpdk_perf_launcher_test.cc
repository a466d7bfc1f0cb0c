// gradwire-perf under a launcher (GW_RANK/GW_WORLD_SIZE/GW_STORE), one rank per "host": p2p as two
// launched ranks over tcp and over DPDK (a net_memif pair, no privileges needed), the collective
// sweep reaching the DPDK backend through the C ABI (a bad EAL argument is a clear error on every
// rank), and the refusals that tell the user how to run DPDK instead (--np with dpdk, a p2p job
// of 3 ranks). The same paths across namespace hosts: dpdk_vs_tcp_script (perf/dpdk_vs_tcp.sh).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/support/free_port.h"
#include "tests/support/shell_run.h"

namespace {

using gw::testing::run_shell;
using gw::testing::ShellRun;

using gw::testing::slurp;

using gw::testing::free_port;

// Two launched ranks of `args`, each with its own extra environment; rank 0's output and JSON,
// rank 1's output, both exit statuses.
struct PairRun {
  int rc0 = -1, rc1 = -1;
  std::string out0, out1;
  nlohmann::json doc;
};

// delay1_s: rank 1 starts that many seconds after rank 0.
PairRun run_pair(const std::string& args, const std::string& env0, const std::string& env1,
                 int delay1_s = 0) {
  const std::string tag = "/tmp/gw_perf_launch_" + std::to_string(getpid()) + "_";
  const int port = free_port();
  const std::string common = "GW_WORLD_SIZE=2 GW_STORE=127.0.0.1:" + std::to_string(port) +
                             " GW_TIMEOUT_MS=15000 timeout -k 5 60 " GW_PERF_BINARY " " + args;
  const std::string cmd = "(sleep " + std::to_string(delay1_s) + "; env GW_RANK=1 " + env1 + " " +
                          common + " > " + tag + "out1 2>&1; echo $? > " + tag +
                          "rc1) & env GW_RANK=0 " + env0 + " " + common + " -J " + tag + "json > " +
                          tag + "out0 2>&1; echo $? > " + tag + "rc0; wait";
  PairRun r;
  run_shell("bash -c '" + cmd + "'");
  r.out0 = slurp(tag + "out0");
  r.out1 = slurp(tag + "out1");
  // An exit status file that was never written (the rank was killed first) reads as -1.
  auto status = [&](const char* name) {
    const std::string text = slurp(tag + name);
    return text.empty() ? -1 : std::atoi(text.c_str());
  };
  r.rc0 = status("rc0");
  r.rc1 = status("rc1");
  std::ifstream in(tag + "json");
  r.doc = nlohmann::json::parse(in, nullptr, false);
  for (const char* f : {"out0", "out1", "rc0", "rc1", "json"}) unlink((tag + f).c_str());
  return r;
}

TEST(PerfLauncher, P2pTcpAsTwoLaunchedRanks) {
  PairRun r = run_pair("p2p --transport tcp --minbytes 4K -e 64K -f 16 --lat-iters 200", "", "");
  ASSERT_EQ(r.rc0, 0) << r.out0 << r.out1;
  ASSERT_EQ(r.rc1, 0) << r.out1;
  EXPECT_NE(r.out0.find("2 ranks from the launcher (GW_*"), std::string::npos) << r.out0;
  EXPECT_EQ(r.out1.find("#bytes"), std::string::npos) << "only rank 0 prints: " << r.out1;
  ASSERT_FALSE(r.doc.is_discarded()) << r.out0;
  EXPECT_FALSE(r.doc.contains("error")) << r.doc.dump();
  ASSERT_EQ(r.doc["bandwidth"].size(), 2u) << r.doc.dump();  // 4K, 64K
  for (const auto& row : r.doc["bandwidth"]) EXPECT_GT(row.value("bw_average_MBps", 0.0), 0.0);
  EXPECT_GT(r.doc["latency"].value("t_median_us", 0.0), 0.0) << r.doc.dump();
  EXPECT_EQ(r.doc["transport_properties"].value("transport", ""), "tcp") << r.doc.dump();
}

// Each rank brings its own port, as on two hosts: here the two ends of a net_memif pair.
TEST(PerfLauncher, P2pDpdkAsTwoLaunchedRanksEachWithItsOwnPort) {
  const std::string eal =
      "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error --vdev "
      "net_memif0,id=0,socket=/gw-perf-launch-" +
      std::to_string(getpid()) + ".sock";
  PairRun r = run_pair(
      "p2p --transport dpdk --minbytes 4K -e 64K -f 16 --lat-iters 200",
      "GW_DPDK_IP=10.68.0.1 GW_DPDK_EAL_ARGS=\"" + eal + ",role=server,mac=02:68:00:00:00:01\"",
      "GW_DPDK_IP=10.68.0.2 GW_DPDK_EAL_ARGS=\"" + eal + ",role=client,mac=02:68:00:00:00:02\"");
  if (r.rc0 != 0 && r.out0.find("rte_eal_init") != std::string::npos) {
    GTEST_SKIP() << "DPDK cannot start here: " << r.out0;
  }
  ASSERT_EQ(r.rc0, 0) << r.out0 << r.out1;
  ASSERT_EQ(r.rc1, 0) << r.out1;
  ASSERT_FALSE(r.doc.is_discarded()) << r.out0;
  EXPECT_FALSE(r.doc.contains("error")) << r.doc.dump();
  EXPECT_EQ(r.doc["transport_properties"].value("transport", ""), "dpdk") << r.doc.dump();
  // The port GW_DPDK_EAL_ARGS named, not one the tool made up.
  EXPECT_NE(r.doc["transport_properties"].value("interfaces", "").find("10.68.0.1"),
            std::string::npos)
      << r.doc.dump();
  EXPECT_EQ(r.doc["bandwidth"].size(), 2u) << r.doc.dump();
  EXPECT_GT(r.doc["latency"].value("t_median_us", 0.0), 0.0) << r.doc.dump();
}

// A net_memif client connects to its server once when its port starts; a server that comes up
// later (the other host's process starting second) is reached because the engine checks the link
// and starts a client port whose link is down again (dpdk_port.cc, check_link). Before that, this
// run failed with "not established within N ms".
TEST(PerfLauncher, P2pDpdkMemifClientStartedBeforeItsServerConnects) {
  const std::string eal =
      "-l 0 --no-huge -m 512 --no-pci --no-shconf --no-telemetry --log-level=*:error --vdev "
      "net_memif0,id=0,socket=/gw-perf-late-" +
      std::to_string(getpid()) + ".sock";
  PairRun r = run_pair(
      "p2p --transport dpdk --minbytes 4K -e 4K -f 16 --lat-iters 50",
      "GW_LOG_LEVEL=info GW_DPDK_IP=10.68.1.1 GW_DPDK_EAL_ARGS=\"" + eal +
          ",role=client,mac=02:68:01:00:00:01\"",
      "GW_DPDK_IP=10.68.1.2 GW_DPDK_EAL_ARGS=\"" + eal + ",role=server,mac=02:68:01:00:00:02\"",
      /*delay1_s=*/2);
  if (r.rc0 != 0 && r.out0.find("rte_eal_init") != std::string::npos) {
    GTEST_SKIP() << "DPDK cannot start here: " << r.out0;
  }
  ASSERT_EQ(r.rc0, 0) << r.out0 << r.out1;
  ASSERT_EQ(r.rc1, 0) << r.out1;
  ASSERT_FALSE(r.doc.is_discarded()) << r.out0;
  EXPECT_EQ(r.doc["transport_properties"].value("transport", ""), "dpdk") << r.doc.dump();
  EXPECT_GT(r.doc["latency"].value("t_median_us", 0.0), 0.0) << r.doc.dump();
  // The client said once that its server did not answer, and that its link was down; DPDK's own
  // complaint about the failed connect comes once (at the first start), not every retry.
  EXPECT_NE(r.out0.find("its net_memif server does not answer yet"), std::string::npos) << r.out0;
  EXPECT_NE(r.out0.find("link down (net_memif client"), std::string::npos) << r.out0;
  size_t complaints = 0;
  for (size_t at = 0; (at = r.out0.find("Failed to connect socket", at)) != std::string::npos;
       ++at) {
    ++complaints;
  }
  EXPECT_LE(complaints, 1u) << r.out0;
}

TEST(PerfLauncher, AllreduceDpdkWithBadEalArgumentsFailsClearlyOnEveryRank) {
  const std::string env =
      "GW_DPDK_EAL_ARGS=\"-l 0 --no-huge -m 512 --no-pci --no-shconf --vdev net_nosuchpmd0\"";
  PairRun r = run_pair("allreduce --transport dpdk -b 4K -e 4K", env, env);
  EXPECT_EQ(r.rc0, 2) << r.out0;
  EXPECT_EQ(r.rc1, 2) << r.out1;
  for (const std::string& out : {r.out0, r.out1}) {
    EXPECT_NE(out.find("rte_eal_init"), std::string::npos) << out;
    EXPECT_NE(out.find("net_nosuchpmd0"), std::string::npos) << out;
  }
  ASSERT_FALSE(r.doc.is_discarded()) << r.out0;
  EXPECT_NE(r.doc.value("error", "").find("transport dpdk"), std::string::npos) << r.doc.dump();
}

TEST(PerfLauncher, P2pJobOfThreeRanksIsRefused) {
  ShellRun r = run_shell("env GW_RANK=0 GW_WORLD_SIZE=3 GW_STORE=127.0.0.1:1 " GW_PERF_BINARY
                         " p2p --transport tcp -e 1K");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("exactly 2 ranks"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--np 2"), std::string::npos) << r.out;
}

TEST(PerfLauncher, ForkedDpdkCollectiveIsRefusedWithHowToRunIt) {
  for (const char* coll : {"allreduce", "allgather", "reduce_scatter", "broadcast"}) {
    ShellRun r =
        run_shell(std::string(GW_PERF_BINARY " ") + coll + " --np 2 --transport dpdk -e 4K");
    EXPECT_EQ(r.rc, 2) << coll << ": " << r.out;
    EXPECT_NE(r.out.find("one rank per host"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("perf/dpdk_vs_tcp.sh"), std::string::npos) << r.out;
  }
}

}  // namespace
