// gradwire-perf's p2p subcommand: the bandwidth and latency tables over each transport, through
// the C ABI (--capi), and perftest's server/client form across hosts (here over loopback).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "tests/integration/perf_tool_util.h"
#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

class PerfP2pTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PerfP2pTest, BandwidthAndLatencyTables) {
  TempFile out;
  auto res = run_perf({"p2p", "--transport", GetParam(), "--np", "2", "--minbytes", "1", "-e", "1M",
                       "-f", "32", "-n", "50", "--lat-iters", "200", "--json", out.path()});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  auto rows = data_rows(res.output);
  ASSERT_EQ(rows.size(), 6u) << res.output;  // 1 32 1K 32K 1M, then the latency row
  for (size_t i = 0; i + 1 < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 4u) << res.output;
    EXPECT_EQ(rows[i][1], "50") << res.output;
  }
  ASSERT_EQ(rows.back().size(), 7u) << res.output;
  double tmin = std::stod(rows.back()[2]), tmed = std::stod(rows.back()[3]),
         tmax = std::stod(rows.back()[6]);
  EXPECT_GT(tmin, 0);
  EXPECT_LE(tmin, tmed);
  EXPECT_LE(tmed, tmax);
  json doc = out.read_json();
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_EQ(doc["bandwidth"].size(), 5u) << doc.dump();
  for (const auto& bw : doc["bandwidth"]) {
    // The table rounds to 0.01 MB/s; the JSON keeps full precision.
    EXPECT_GT(bw["bw_average_MBps"].get<double>(), 0) << doc.dump();
    EXPECT_GT(bw["msg_rate_Mpps"].get<double>(), 0) << doc.dump();
  }
  EXPECT_TRUE(doc.contains("latency")) << doc.dump();
  EXPECT_FALSE(doc.contains("error")) << doc.dump();
}

// --capi: gw_isend/gw_irecv rows and the gw_send/gw_recv ping-pong, through libgradwire.
TEST_P(PerfP2pTest, CapiBandwidthAndLatency) {
  TempFile out;
  auto res = run_perf({"p2p", "--capi", "--transport", GetParam(), "--minbytes", "1", "-e", "1M",
                       "-f", "1024", "-n", "32", "--lat-iters", "100", "--json", out.path()});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  json doc = out.read_json();
  ASSERT_EQ(doc["bandwidth"].size(), 3u) << doc.dump();  // 1, 1K, 1M
  for (const auto& bw : doc["bandwidth"]) EXPECT_GT(bw["mbytes_s"].get<double>(), 0) << doc.dump();
  EXPECT_EQ(doc["latency"]["iterations"], 100) << doc.dump();
  EXPECT_LE(doc["latency"]["t_min_us"].get<double>(), doc["latency"]["t_median_us"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(Transports, PerfP2pTest, ::testing::Values("tcp", "shm"),
                         [](const auto& info) { return std::string(info.param); });

// perftest's form across hosts, here over loopback: `p2p --transport tcp` waits as the server,
// `p2p --transport tcp HOST` connects, and the client prints and writes the results. The client's
// -s, -D, --report_gbits and -b reach both sides.
TEST(PerfP2pServerClient, ClientConnectsToAWaitingServer) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  TempFile out;
  ProcGroup group;
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = "20000";
  group.start({GW_PERF_PATH, "p2p", "--transport", "tcp", "--port", std::to_string(port)}, env);
  ASSERT_TRUE(group.wait_for_output(0, "waiting up to", 20000)) << group.output(0);
  group.start(
      {GW_PERF_PATH, "p2p", "--transport", "tcp", "127.0.0.1", "--port", std::to_string(port), "-s",
       "64K", "-D", "0.2", "--report_gbits", "-b", "--lat-iters", "50", "--json", out.path()},
      env);
  auto results = group.wait_all(60000);
  ASSERT_EQ(results.size(), 2u);
  const auto& server = results[0];
  const auto& client = results[1];
  ASSERT_TRUE(server.exited && server.exit_code == 0) << server.describe();
  ASSERT_TRUE(client.exited && client.exit_code == 0) << client.describe();
  EXPECT_NE(server.output.find("p2p server: done"), std::string::npos) << server.output;
  EXPECT_NE(client.output.find("BW average[Gb/sec]"), std::string::npos) << client.output;
  EXPECT_NE(client.output.find("bidirectional"), std::string::npos) << client.output;
  auto rows = data_rows(client.output);
  ASSERT_EQ(rows.size(), 2u) << client.output;  // one size (-s), then the latency row
  EXPECT_EQ(rows[0][0], "65536");
  json doc = out.read_json();
  ASSERT_TRUE(doc.is_object()) << client.output;
  ASSERT_EQ(doc["bandwidth"].size(), 1u) << doc.dump();
  const json& bw = doc["bandwidth"][0];
  // -D 0.2: the count comes from the warm-up's pace, so the run lasts a fraction of a second.
  EXPECT_GT(bw["seconds"].get<double>(), 0.01) << doc.dump();
  EXPECT_LT(bw["seconds"].get<double>(), 5.0) << doc.dump();
  EXPECT_NEAR(bw["bw_average_Gbps"].get<double>(), bw["bw_average_MBps"].get<double>() * 8 / 1000,
              1e-6);
  // Both ways: bytes * iterations * 2 / seconds.
  EXPECT_NEAR(bw["bw_average_MBps"].get<double>(),
              65536.0 * bw["iterations"].get<double>() * 2 / bw["seconds"].get<double>() / 1e6,
              1e-3 * bw["bw_average_MBps"].get<double>());
  EXPECT_EQ(doc["config"]["bidirectional"], true);
  // Each end's interface is the one that routes to the other (here loopback), not the host's
  // first interface: the client's JSON, and the server's header.
  EXPECT_EQ(doc["transport_properties"]["interfaces"], "lo:127.0.0.1") << doc.dump();
  EXPECT_NE(server.output.find("# p2p server: interfaces: lo:127.0.0.1"), std::string::npos)
      << server.output;
}

// Every wait has a deadline: a server nobody joins, and a client with no server, end with what
// to do; -a gives perftest's sizes.
TEST(PerfP2pServerClient, LonelyServerAndClientEndWithAClearError) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = "1500";
  auto server = run_perf({"p2p", "--transport", "tcp", "--port", std::to_string(port)}, env, 30000);
  EXPECT_TRUE(server.exited && server.exit_code == 2) << server.describe();
  EXPECT_NE(server.output.find("no client connected to port " + std::to_string(port)),
            std::string::npos)
      << server.output;
  auto client = run_perf({"p2p", "--transport", "tcp", "127.0.0.1", "--port", std::to_string(port)},
                         env, 30000);
  EXPECT_TRUE(client.exited && client.exit_code == 2) << client.describe();
  EXPECT_NE(client.output.find("no p2p server at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << client.output;
  auto both = run_perf({"p2p", "--transport", "tcp", "-a", "-s", "1K", "--np", "2"});
  EXPECT_TRUE(both.exited && both.exit_code == 2) << both.describe();
  auto all = run_perf({"p2p", "--transport", "shm", "-a", "-n", "20", "--lat-iters", "20"});
  ASSERT_TRUE(all.exited && all.exit_code == 0) << all.describe();
  auto rows = data_rows(all.output);
  ASSERT_EQ(rows.size(), 24u) << all.output;  // 2 B .. 8 MiB doubling, then latency
  EXPECT_EQ(rows.front()[0], "2");
  EXPECT_EQ(rows[22][0], "8388608");
}

}  // namespace
}  // namespace gw::test
