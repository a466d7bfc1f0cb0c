// `gradwire-perf p2p --transport dpdk`: the two forked ranks each start their own EAL on one end
// of a net_memif pair (no privileges needed) and the tool reports bandwidth and latency in its
// JSON document. Bad input is refused before anything starts.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tests/support/shell_run.h"

namespace {

using gw::testing::run_shell;
using gw::testing::ShellRun;

TEST(DpdkPerfP2p, MemifPairReportsBandwidthAndLatency) {
  const std::string json_path = "/tmp/gw_dpdk_perf_p2p_" + std::to_string(getpid()) + ".json";
  ShellRun r = run_shell(
      "env -u GW_DPDK_EAL_ARGS -u GW_DPDK_IP GW_TIMEOUT_MS=30000 timeout 90 " GW_PERF_BINARY
      " p2p --transport dpdk --np 2 --minbytes 8 -e 1M -f 8 -J " +
      json_path);
  std::ifstream in(json_path);
  nlohmann::json doc = nlohmann::json::parse(in, nullptr, false);
  unlink(json_path.c_str());
  if (r.rc != 0 && r.out.find("rte_eal_init") != std::string::npos) {
    GTEST_SKIP() << "DPDK cannot start here: " << r.out;
  }
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_FALSE(doc.is_discarded()) << r.out;
  EXPECT_FALSE(doc.contains("error")) << doc.dump();
  EXPECT_NE(r.out.find("net_memif"), std::string::npos) << r.out;
  ASSERT_TRUE(doc.contains("bandwidth")) << doc.dump();
  // 8 B .. 1 MiB in steps of 8: 8, 64, 512, 4K, 32K, 256K.
  EXPECT_EQ(doc["bandwidth"].size(), 6u) << doc.dump();
  for (const auto& row : doc["bandwidth"]) {
    EXPECT_GT(row.value("bw_average_MBps", 0.0), 0.0) << row.dump();
  }
  ASSERT_TRUE(doc.contains("latency")) << doc.dump();
}

TEST(DpdkPerfP2p, UnknownTransportIsRefused) {
  ShellRun r = run_shell(GW_PERF_BINARY " p2p --transport carrier-pigeon -e 1K");
  EXPECT_NE(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("use one of tcp, shm, dpdk"), std::string::npos) << r.out;
}

}  // namespace
