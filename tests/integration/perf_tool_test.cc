// gradwire-perf as a user runs it: the table and its columns, --check, --json (one valid document,
// with "error" on failure), bad arguments, --dump-config, the collectives and --codec
// (perf_tool_p2p_test.cc has the p2p subcommand).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "gradwire/gradwire.h"
#include "tests/integration/perf_tool_util.h"
#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

TEST(PerfToolTest, DumpConfigListsTheTable) {
  auto res = run_perf({"--dump-config"});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  EXPECT_NE(res.output.find("GW_TIMEOUT_MS"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("GW_TRANSPORT"), std::string::npos) << res.output;
  auto toml = run_perf({"--dump-config", "--toml"});
  ASSERT_TRUE(toml.exited && toml.exit_code == 0) << toml.describe();
  EXPECT_NE(toml.output.find("timeout_ms = "), std::string::npos) << toml.output;
}

// The layers as --dump-config shows them: a TOML file (GW_CONFIG_FILE) sets values, the
// environment overrides some of them, and each row names its source.
TEST(PerfToolTest, DumpConfigShowsTheFileAndTheEnvironmentOverridingIt) {
  TempFile file;
  std::ofstream(file.path()) << "timeout_ms = 60000\n"
                                "algo = \"ring\"\n"
                                "\n"
                                "[socket]\n"
                                "chunk = \"2M\"\n";
  Env env = clean_env();
  env["GW_CONFIG_FILE"] = file.path();
  env["GW_ALGO"] = "rhd";                       // beats the file's "ring"
  auto res = run_perf({"--dump-config"}, env);  // run_perf sets GW_TIMEOUT_MS=20000
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  std::map<std::string, std::vector<std::string>> by_name;
  for (auto& cols : data_rows(res.output)) by_name[cols[0]] = cols;
  // columns: variable type default value source meaning...
  ASSERT_TRUE(by_name.count("GW_SOCKET_CHUNK")) << res.output;
  EXPECT_EQ(by_name["GW_SOCKET_CHUNK"][3], "2M") << res.output;
  EXPECT_EQ(by_name["GW_SOCKET_CHUNK"][4], file.path() + ":5") << res.output;
  EXPECT_EQ(by_name["GW_ALGO"][3], "rhd") << res.output;
  EXPECT_EQ(by_name["GW_ALGO"][4], "env") << res.output;
  EXPECT_EQ(by_name["GW_TIMEOUT_MS"][3], "20000") << res.output;
  EXPECT_EQ(by_name["GW_TIMEOUT_MS"][4], "env") << res.output;
  EXPECT_EQ(by_name["GW_SPIN_US"][4], "default") << res.output;
  EXPECT_EQ(by_name["GW_CONFIG_FILE"][4], "env") << res.output;

  // Without the environment's values the file's show through.
  env.erase("GW_ALGO");
  env.erase("GW_TIMEOUT_MS");
  ProcGroup group;
  group.start({GW_PERF_PATH, "--dump-config", "--toml"}, env);
  auto toml = group.wait_all(60000)[0];
  ASSERT_TRUE(toml.exited && toml.exit_code == 0) << toml.describe();
  EXPECT_NE(toml.output.find("algo = \"ring\"\n"), std::string::npos) << toml.output;
  EXPECT_NE(toml.output.find("from " + file.path() + ":2)"), std::string::npos) << toml.output;
  EXPECT_NE(toml.output.find("timeout_ms = 60000\n"), std::string::npos) << toml.output;
}

// The perf tool's options are API-layer settings, in libgradwire too (gw_config_set): --algo
// beats GW_ALGO from the environment, which would otherwise stop the communicator.
TEST(PerfToolTest, OptionsBeatTheEnvironment) {
  Env env = clean_env();
  env["GW_ALGO"] = "bogus";
  auto bad = run_perf({"allreduce", "--np", "2", "-b", "8", "-e", "8"}, env);
  ASSERT_TRUE(bad.exited) << bad.describe();
  EXPECT_EQ(bad.exit_code, 2) << bad.describe();
  EXPECT_NE(bad.output.find("bogus"), std::string::npos) << bad.output;
  auto good = run_perf({"allreduce", "--np", "2", "-b", "8", "-e", "8", "--algo", "ring"}, env);
  ASSERT_TRUE(good.exited && good.exit_code == 0) << good.describe();
}

// A file with an unknown key or a value of the wrong type stops a run, naming file, line and key.
TEST(PerfToolTest, BadConfigFileNamesFileLineAndKey) {
  TempFile file;
  std::ofstream(file.path()) << "algo = \"ring\"\n"
                                "timout_ms = 5\n"
                                "nchannels = \"two\"\n";
  Env env = clean_env();
  env["GW_CONFIG_FILE"] = file.path();
  auto res = run_perf({"allreduce", "--np", "2", "-b", "8", "-e", "8"}, env);
  ASSERT_TRUE(res.exited) << res.describe();
  EXPECT_EQ(res.exit_code, 2) << res.describe();
  EXPECT_NE(res.output.find(file.path() + ":2: key 'timout_ms': unknown key"), std::string::npos)
      << res.output;
  EXPECT_NE(res.output.find(file.path() + ":3: key 'nchannels': expected an integer, got string"),
            std::string::npos)
      << res.output;
}

// --dump-config with a broken file (or a malformed variable) says what a run would say and exits
// 2, instead of printing the defaults (issue 26, item 6); a directory is no file (issue 33).
TEST(PerfToolTest, DumpConfigReportsABrokenFile) {
  TempFile file;
  std::ofstream(file.path()) << "timout_ms = 5\n";
  Env env = clean_env();
  env["GW_CONFIG_FILE"] = file.path();
  for (bool toml : {false, true}) {
    std::vector<std::string> args = {"--dump-config"};
    if (toml) args.push_back("--toml");
    auto res = run_perf(args, env);
    ASSERT_TRUE(res.exited) << res.describe();
    EXPECT_EQ(res.exit_code, 2) << res.describe();
    EXPECT_NE(res.output.find(file.path() + ":1: key 'timout_ms': unknown key"), std::string::npos)
        << res.output;
    EXPECT_EQ(res.output.find("GW_SPIN_US"), std::string::npos) << res.output;
  }
  env["GW_CONFIG_FILE"] = "/tmp";
  auto dir = run_perf({"--dump-config"}, env);
  EXPECT_EQ(dir.exit_code, 2) << dir.describe();
  EXPECT_NE(dir.output.find("/tmp: is a directory"), std::string::npos) << dir.output;
}

// The settings lines (not comments) of a TOML dump.
std::string settings_of(const std::string& toml) {
  std::istringstream in(toml);
  std::string line, out;
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') out += line + "\n";
  }
  return out;
}

// --dump-config --toml loads back (issue 34, item 4): a run with the dumped file as its
// GW_CONFIG_FILE works (the file used to name config_file and the NCCL plugin's rows, which the
// library refuses), and dumping again gives the same settings. The job token is never printed
// (issue 33, item 7), neither by the dump nor in a run's header and JSON.
TEST(PerfToolTest, DumpConfigTomlLoadsBackAndDumpsTheSame) {
  Env env = clean_env();
  env["GW_ALGO"] = "ring";
  env["GW_HOSTID"] = "quoted \"host\" \\ \xc3\xa9";
  env["GW_JOB_TOKEN"] = "s3cret-perf-token";
  ProcGroup first_run;
  first_run.start({GW_PERF_PATH, "--dump-config", "--toml"}, env);
  auto first = first_run.wait_all(60000)[0];
  ASSERT_TRUE(first.exited && first.exit_code == 0) << first.describe();
  EXPECT_EQ(first.output.find("s3cret"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("\n# config_file = "), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("\n# plugin_backend = "), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("\n# job_token = (set)\n"), std::string::npos) << first.output;
  TempFile file;
  std::ofstream(file.path()) << first.output;

  // The file alone carries the settings now (the token stays in the environment).
  Env loaded = clean_env();
  loaded["GW_CONFIG_FILE"] = file.path();
  loaded["GW_JOB_TOKEN"] = "s3cret-perf-token";
  ProcGroup second_run;
  second_run.start({GW_PERF_PATH, "--dump-config", "--toml"}, loaded);
  auto second = second_run.wait_all(60000)[0];
  ASSERT_TRUE(second.exited && second.exit_code == 0) << second.describe();
  EXPECT_EQ(settings_of(second.output), settings_of(first.output));
  EXPECT_NE(second.output.find("from " + file.path() + ":"), std::string::npos) << second.output;

  TempFile json_out;
  auto run =
      run_perf({"allreduce", "--np", "2", "-b", "8", "-e", "8", "--json", json_out.path()}, loaded);
  ASSERT_TRUE(run.exited && run.exit_code == 0) << run.describe();
  EXPECT_NE(run.output.find("GW_JOB_TOKEN=(set)"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("s3cret"), std::string::npos) << run.output;
  json doc = json_out.read_json();
  EXPECT_EQ(doc["config"]["gw_env"]["GW_JOB_TOKEN"], "(set)") << doc.dump();
  EXPECT_EQ(doc.dump().find("s3cret"), std::string::npos);
}

TEST(PerfToolTest, HelpDescribesEverySubcommand) {
  auto res = run_perf({"--help"});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  for (const char* sub :
       {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall", "alltoallv", "reduce",
        "gather", "scatter", "p2p", "compress", "doctor"}) {
    EXPECT_NE(res.output.find(sub), std::string::npos) << sub << "\n" << res.output;
  }
}

TEST(PerfToolTest, BadArgumentsFailWithAMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"allreduce", "--np", "2", "-b", "1M", "-e", "1K"}, "-b"},
      {{"allreduce", "--np", "2", "-b", "1X"}, "suffix"},
      {{"allreduce", "--np", "2", "-d", "float99"}, "datatype"},
      {{"allreduce", "--np", "2", "-o", "xor"}, "op"},
      {{"allreduce", "--np", "2", "-f", "1"}, "factor"},
      {{"allreduce", "--np", "2", "--transport", "udp"}, "transport"},
      {{"broadcast", "--np", "2", "--root", "5"}, "root"},
      {{"allreduce", "--np", "0"}, "np"},
      {{"p2p", "--transport", "auto"}, "transport"},
      {{"p2p", "--np", "3"}, "exactly 2"},
      {{"frobnicate"}, "frobnicate"},
  };
  for (const auto& c : cases) {
    auto res = run_perf(c.args);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_TRUE(res.exited && res.exit_code != 0) << joined << res.describe();
    EXPECT_NE(res.output.find(c.expect), std::string::npos) << joined << res.describe();
  }
}

TEST(PerfToolTest, MalformedKnobIsReportedInTheJson) {
  TempFile out;
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = "soon";
  ProcGroup group;
  group.start({GW_PERF_PATH, "allreduce", "--np", "2", "--json", out.path()}, env);
  auto res = group.wait_all(30000)[0];
  ASSERT_TRUE(res.exited) << res.describe();
  EXPECT_EQ(res.exit_code, 2) << res.describe();
  EXPECT_NE(res.output.find("GW_TIMEOUT_MS"), std::string::npos) << res.describe();
  json doc = out.read_json();
  ASSERT_FALSE(doc.is_discarded()) << "--json must hold one valid document";
  ASSERT_TRUE(doc.contains("error"));
  EXPECT_NE(doc["error"].get<std::string>().find("GW_TIMEOUT_MS"), std::string::npos);
}

TEST(PerfToolTest, AllreduceSweepChecksAndWritesJson) {
  TempFile out;
  auto res =
      run_perf({"allreduce", "--np", "3", "--transport", "tcp", "-b", "1K", "-e", "256K", "-f", "4",
                "--check", "--iters", "3", "--warmup", "1", "--json", out.path()});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  auto rows = data_rows(res.output);
  ASSERT_EQ(rows.size(), 5u) << res.output;  // 1K 4K 16K 64K 256K
  uint64_t size = 1024;
  for (const auto& row : rows) {
    ASSERT_EQ(row.size(), 13u) << res.output;  // out-of-place and in-place columns
    EXPECT_EQ(row[0], std::to_string(size));
    EXPECT_EQ(row[1], std::to_string(size / 4));
    EXPECT_EQ(row[2], "float");  // nccl-tests' name for float32
    EXPECT_EQ(row[3], "sum");
    EXPECT_EQ(row[4], "-1");            // root: none
    EXPECT_GE(std::stod(row[5]), 0.0);  // time(us); algbw/busbw are checked in the JSON below
    EXPECT_EQ(row[8], "0");
    EXPECT_GE(std::stod(row[9]), 0.0);  // in-place time(us)
    EXPECT_EQ(row[12], "0");
    size *= 4;
  }
  EXPECT_NE(res.output.find("# Avg bus bandwidth : "), std::string::npos);
  EXPECT_NE(res.output.find("# ranks: 3"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("median"), std::string::npos) << res.output;
  json doc = out.read_json();
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_FALSE(doc.contains("error")) << doc.dump();
  ASSERT_EQ(doc["rows"].size(), 5u) << doc.dump();
  for (const auto& row : doc["rows"]) {
    EXPECT_EQ(row["wrong"], 0) << row.dump();
    // The table rounds to 0.001 GB/s, which a loaded machine can reach at 1 KiB; the JSON does not.
    double time_us = row["time_us"].get<double>(), algbw = row["algbw_gbps"].get<double>();
    EXPECT_GT(time_us, 0) << row.dump();
    EXPECT_NEAR(algbw, row["size_bytes"].get<double>() / (time_us * 1e-6) / 1e9, algbw * 1e-9);
    EXPECT_NEAR(row["busbw_gbps"].get<double>(), algbw * 2 * 2 / 3, algbw * 1e-9)  // 2(n-1)/n
        << row.dump();
  }
  EXPECT_EQ(doc["config"]["ranks"], 3);
  EXPECT_EQ(doc["check_passed"], true);
  // What was resolved, in the header and the JSON: the transport and its interface, the channels
  // and the algorithm table's choice by size.
  EXPECT_EQ(doc["config"]["transport_requested"], "tcp") << doc.dump();
  EXPECT_EQ(doc["config"]["transport"], "tcp") << doc.dump();
  EXPECT_EQ(doc["config"]["interface"], "lo:127.0.0.1") << doc.dump();
  EXPECT_NE(doc["config"]["channels"].get<std::string>().find("auto"), std::string::npos);
  EXPECT_FALSE(doc["config"]["allreduce_algorithms"].get<std::string>().empty()) << doc.dump();
  EXPECT_NE(res.output.find("# transport: tcp on lo:127.0.0.1 (asked: tcp)  channels: auto"),
            std::string::npos)
      << res.output;
  EXPECT_NE(res.output.find("# allreduce algorithm by size: "), std::string::npos) << res.output;

  // auto resolves to a named transport: shared memory between ranks of one host.
  TempFile auto_out;
  auto shm = run_perf({"allreduce", "--np", "2", "-b", "1K", "-e", "1K", "--iters", "1", "--warmup",
                       "0", "--json", auto_out.path()});
  ASSERT_TRUE(shm.exited && shm.exit_code == 0) << shm.describe();
  json auto_doc = auto_out.read_json();
  EXPECT_EQ(auto_doc["config"]["transport_requested"], "auto") << auto_doc.dump();
  EXPECT_EQ(auto_doc["config"]["transport"], "shm") << auto_doc.dump();
  EXPECT_EQ(auto_doc["config"]["interface"], "") << auto_doc.dump();
  EXPECT_NE(shm.output.find("# transport: shm (asked: auto)"), std::string::npos) << shm.output;
}

// --warmup-ms: untimed calls of the first size until every rank has spent the time (they agree
// after each call, so no rank is left waiting in a call the others never make), then the sweep as
// usual; 0 leaves it out; a negative value is refused.
TEST(PerfToolTest, StartUpWarmupRunsItsTimeOnEveryRankBeforeTheFirstSize) {
  TempFile out;
  const auto t0 = std::chrono::steady_clock::now();
  auto res =
      run_perf({"allreduce", "--np",        "3",   "--transport", "tcp",     "-b",      "4K",
                "-e",        "16K",         "-f",  "4",           "--iters", "2",       "--warmup",
                "0",         "--warmup-ms", "700", "--check",     "--json",  out.path()});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  EXPECT_GE(secs, 0.7) << res.output;
  EXPECT_EQ(data_rows(res.output).size(), 2u) << res.output;
  EXPECT_NE(res.output.find("warmup: 0 (and 700 ms before the first size)"), std::string::npos)
      << res.output;
  json doc = out.read_json();
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_EQ(doc["check_passed"], true) << doc.dump();
  EXPECT_EQ(doc["config"]["warmup_ms"], 700) << doc.dump();

  auto none = run_perf({"allreduce", "--np", "2", "--transport", "tcp", "-b", "4K", "-e", "4K",
                        "--iters", "1", "--warmup-ms", "0"});
  ASSERT_TRUE(none.exited && none.exit_code == 0) << none.describe();
  EXPECT_EQ(none.output.find("before the first size"), std::string::npos) << none.output;

  auto bad = run_perf({"allreduce", "--np", "2", "--warmup-ms", "-5"});
  ASSERT_TRUE(bad.exited) << bad.describe();
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("--warmup-ms"), std::string::npos) << bad.output;
}

// nccl-tests' habits: -c N check iterations, in-place columns, -a, -z, -i, --version.
TEST(PerfToolTest, NcclTestsOptions) {
  auto version = run_perf({"--version"});
  ASSERT_TRUE(version.exited && version.exit_code == 0) << version.describe();
  EXPECT_EQ(version.output.rfind("gradwire-perf " + std::to_string(GW_VERSION_MAJOR) + ".", 0), 0u)
      << version.output;
  EXPECT_NE(version.output.find("(libgradwire "), std::string::npos) << version.output;

  auto help = run_perf({"allreduce", "--help"});
  ASSERT_TRUE(help.exited && help.exit_code == 0) << help.describe();
  for (const char* opt : {"-c,--check", "-a,--average", "-z,--blocking", "-i,--stepbytes"}) {
    EXPECT_NE(help.output.find(opt), std::string::npos) << opt << "\n" << help.output;
  }

  // -i: linear steps; -c 3: three checked calls per placement; -a: the mean over ranks.
  TempFile out;
  auto res = run_perf({"allreduce", "--np", "2",  "--transport", "tcp",    "-b",      "1K",
                       "-e",        "4K",   "-i", "1K",          "-c",     "3",       "-a",
                       "-n",        "2",    "-w", "1",           "--json", out.path()});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  auto rows = data_rows(res.output);
  ASSERT_EQ(rows.size(), 4u) << res.output;  // 1K 2K 3K 4K
  for (size_t i = 0; i < rows.size(); ++i) {
    ASSERT_EQ(rows[i].size(), 13u) << res.output;
    EXPECT_EQ(rows[i][0], std::to_string(1024 * (i + 1))) << res.output;
    EXPECT_EQ(rows[i][8], "0") << res.output;
    EXPECT_EQ(rows[i][12], "0") << res.output;
  }
  EXPECT_NE(res.output.find("in-place"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("check: 3 iterations"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("the mean over ranks"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("increment 1024"), std::string::npos) << res.output;
  json doc = out.read_json();
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_EQ(doc["config"]["check_iters"], 3) << doc.dump();
  EXPECT_EQ(doc["config"]["average"], "mean") << doc.dump();
  EXPECT_EQ(doc["config"]["step_bytes"], 1024) << doc.dump();
  ASSERT_EQ(doc["rows"].size(), 4u) << doc.dump();
  for (const auto& row : doc["rows"]) {
    ASSERT_TRUE(row.contains("in_place")) << row.dump();
    EXPECT_EQ(row["in_place"]["wrong"], 0) << row.dump();
    EXPECT_GT(row["in_place"]["time_us"].get<double>(), 0) << row.dump();
  }

  // -z 0: iterations issued with gw_iallreduce, still checked; other collectives refuse it.
  auto nb =
      run_perf({"allreduce", "--np", "2", "-b", "1K", "-e", "16K", "-f", "4",     "-z", "0",
                "-c",        "-a",   "2", "-n", "4",  "-w", "1",   "-d", "int32", "-o", "max"});
  ASSERT_TRUE(nb.exited && nb.exit_code == 0) << nb.describe();
  EXPECT_NE(nb.output.find("gw_iallreduce"), std::string::npos) << nb.output;
  EXPECT_NE(nb.output.find("the fastest rank's"), std::string::npos) << nb.output;
  for (const auto& row : data_rows(nb.output)) {
    ASSERT_EQ(row.size(), 13u) << nb.output;
    EXPECT_EQ(row[8], "0") << nb.output;
    EXPECT_EQ(row[12], "0") << nb.output;
  }
  auto refused = run_perf({"allgather", "--np", "2", "-z", "0"});
  EXPECT_TRUE(refused.exited && refused.exit_code == 2) << refused.describe();
  EXPECT_NE(refused.output.find("-z 0"), std::string::npos) << refused.describe();
  auto both = run_perf({"allreduce", "--np", "2", "-i", "1K", "-f", "4"});
  EXPECT_TRUE(both.exited && both.exit_code != 0) << both.describe();
  auto codec = run_perf({"allreduce", "--codec", "fp16", "--np", "2", "-c", "2"});
  EXPECT_TRUE(codec.exited && codec.exit_code == 2) << codec.describe();
  EXPECT_NE(codec.output.find("does not apply to --codec"), std::string::npos) << codec.describe();
}

// --mem-alloc in direct mode: the buffers come from gw_mem_alloc (plain aligned memory here), every
// collective's result is still right out of place and in place (in place, allgather's input and
// reduce_scatter's output are blocks inside the allocation), and the header and the JSON say which
// buffers were used. Daemon mode is covered on the testbed (tests/testbed/testbed_daemon_test.sh).
TEST(PerfToolTest, MemAllocBuffersAreCheckedAndReported) {
  auto help = run_perf({"allreduce", "--help"});
  ASSERT_TRUE(help.exited && help.exit_code == 0) << help.describe();
  EXPECT_NE(help.output.find("--mem-alloc"), std::string::npos) << help.output;
  for (const char* coll : {"allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall"}) {
    TempFile out;
    auto res = run_perf({coll, "--np", "3", "--mem-alloc", "-b", "96", "-e", "96K", "-f", "32",
                         "--check", "-n", "2", "-w", "1", "-d", "int32", "--json", out.path()});
    ASSERT_TRUE(res.exited && res.exit_code == 0) << coll << ": " << res.describe();
    EXPECT_NE(res.output.find("# buffers: gw_mem_alloc"), std::string::npos) << res.output;
    const auto rows = data_rows(res.output);
    ASSERT_EQ(rows.size(), 3u) << res.output;  // 96, 3K, 96K
    for (const auto& row : rows) {
      ASSERT_EQ(row.size(), 13u) << res.output;
      EXPECT_EQ(row[8], "0") << res.output;
      EXPECT_EQ(row[12], "0") << res.output;
    }
    json doc = out.read_json();
    ASSERT_FALSE(doc.is_discarded()) << coll;
    EXPECT_EQ(doc["config"]["mem_alloc"], true) << doc.dump();
    EXPECT_EQ(doc["check_passed"], true) << doc.dump();
  }
  // Without it: heap buffers, and the JSON says so.
  TempFile out;
  auto heap = run_perf({"allreduce", "--np", "2", "-b", "1K", "-e", "1K", "-n", "1", "-w", "0",
                        "--json", out.path()});
  ASSERT_TRUE(heap.exited && heap.exit_code == 0) << heap.describe();
  EXPECT_NE(heap.output.find("# buffers: heap"), std::string::npos) << heap.output;
  EXPECT_EQ(out.read_json()["config"]["mem_alloc"], false) << heap.output;
  // The codec table has buffers of its own: refused there, saying so.
  auto codec = run_perf({"allreduce", "--codec", "fp16", "--np", "2", "--mem-alloc"});
  EXPECT_TRUE(codec.exited && codec.exit_code == 2) << codec.describe();
  EXPECT_NE(codec.output.find("--mem-alloc does not apply to --codec"), std::string::npos)
      << codec.describe();
}

// Without --np and without a launcher, the error says what to do; with a half-set launcher
// environment it names the rank the launcher gave, never "rank -1".
TEST(PerfToolTest, NoLauncherSuggestsWhatToDo) {
  TempFile out;
  auto bare = run_perf({"allreduce", "-e", "1K", "--json", out.path()});
  EXPECT_TRUE(bare.exited && bare.exit_code == 2) << bare.describe();
  EXPECT_NE(bare.output.find("--np N"), std::string::npos) << bare.describe();
  EXPECT_NE(bare.output.find("GW_STORE"), std::string::npos) << bare.describe();
  json doc = out.read_json();
  ASSERT_FALSE(doc.is_discarded());
  EXPECT_NE(doc["error"].get<std::string>().find("--np N"), std::string::npos) << doc.dump();

  Env env = clean_env();
  env["SLURM_PROCID"] = "3";  // SLURM_NTASKS missing
  auto slurm = run_perf({"allreduce", "-e", "1K"}, env);
  EXPECT_TRUE(slurm.exited && slurm.exit_code == 2) << slurm.describe();
  EXPECT_NE(slurm.output.find("rank 3 (SLURM_PROCID)"), std::string::npos) << slurm.describe();
  EXPECT_NE(slurm.output.find("SLURM_NTASKS"), std::string::npos) << slurm.describe();
  EXPECT_EQ(slurm.output.find("rank -1"), std::string::npos) << slurm.describe();
}

// --codec: one row per codec after the uncompressed one, then the ef-floor reference row; the
// bytes each rank sent come from gw_comm_stats, so a compressed row must send fewer than none.
TEST(PerfToolTest, CodecAllreduceTableHasARowPerCodecAndTheFloor) {
  auto res = run_perf({"allreduce", "--np", "2", "--transport", "tcp", "-b", "1M", "-e", "1M",
                       "--iters", "2", "--warmup", "1", "--codec", "sign", "--codec", "topk:0.01"});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  auto rows = data_rows(res.output);
  ASSERT_EQ(rows.size(), 4u) << res.output;
  const char* names[] = {"none", "sign", "topk:0.01", "ef-floor"};
  for (size_t r = 0; r < rows.size(); ++r) {
    ASSERT_EQ(rows[r].size(), 9u) << res.output;
    EXPECT_EQ(rows[r][0], names[r]);
    EXPECT_EQ(rows[r][1], "1048576");
    EXPECT_GT(std::stod(rows[r][4]), 0.0) << res.output;  // time_us
    EXPECT_GT(std::stod(rows[r][8]), 0.0) << res.output;  // speedup
  }
  EXPECT_EQ(rows[0][7], "1048576");  // none: 2(p-1)/p of 1 MiB at 2 ranks
  EXPECT_LT(std::stod(rows[1][7]), 1048576.0 / 16) << res.output;
  EXPECT_LT(std::stod(rows[2][7]), 1048576.0 / 16) << res.output;
  EXPECT_EQ(rows[3][7], "0");  // the floor sends nothing
  // A bad spec is refused before any rank starts.
  auto bad = run_perf({"allreduce", "--np", "2", "--codec", "topk:7"});
  EXPECT_TRUE(bad.exited && bad.exit_code == 2) << bad.describe();
  EXPECT_NE(bad.output.find("topk"), std::string::npos) << bad.output;
}

// --codec without --np under a launcher: the processes join the launcher's job (one table, from
// rank 0, for its 4 ranks) instead of each forking a job of its own, as plain runs do. Two fake
// hosts (GW_HOSTID) make it the hierarchical form: topk sends less than none still.
TEST(PerfToolTest, CodecAllreduceRunsAsTheLaunchersRanks) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  const int n = 4;
  ProcGroup group;
  for (int r = 0; r < n; ++r) {
    Env env = clean_env();
    env["GW_TIMEOUT_MS"] = "20000";
    env["GW_RANK"] = std::to_string(r);
    env["GW_WORLD_SIZE"] = std::to_string(n);
    env["GW_STORE"] = "127.0.0.1:" + std::to_string(port);
    env["GW_HOSTID"] = "perf-host-" + std::to_string(r / 2);
    group.start({GW_PERF_PATH, "allreduce", "--transport", "tcp", "-b", "1M", "-e", "1M", "--iters",
                 "2", "--warmup", "1", "--codec", "topk:0.01"},
                env);
  }
  auto results = group.wait_all(120000, true);
  ASSERT_EQ(results.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    const auto& res = results[static_cast<size_t>(r)];
    ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
    const bool header = res.output.find("# gradwire-perf allreduce --codec") != std::string::npos;
    EXPECT_EQ(header, r == 0) << res.output;
  }
  EXPECT_NE(results[0].output.find("--codec: 4 ranks"), std::string::npos) << results[0].output;
  auto rows = data_rows(results[0].output);
  ASSERT_EQ(rows.size(), 3u) << results[0].output;  // none, topk:0.01, ef-floor
  EXPECT_EQ(rows[0][0], "none");
  EXPECT_EQ(rows[1][0], "topk:0.01");
  EXPECT_EQ(rows[0][7], "1572864");  // none: 2(p-1)/p of 1 MiB at 4 ranks
  EXPECT_LT(std::stod(rows[1][7]), 1572864.0) << results[0].output;
}

// --codec takes every option of the allreduce sweep or refuses it: --json gets one document with
// the rows and what was resolved, --algo reaches the communicator (the none row's table says so),
// --progress prints progress lines, and a refused option or a failed run is an "error" in it.
TEST(PerfToolTest, CodecAllreduceHonoursJsonAlgoAndProgress) {
  TempFile out;
  auto res = run_perf({"allreduce", "--np",       "2",      "--transport", "auto", "-b",
                       "256K",      "-e",         "1M",     "-f",          "4",    "--iters",
                       "2",         "--warmup",   "0",      "--codec",     "fp16", "--algo",
                       "ring",      "--progress", "--json", out.path()});
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  EXPECT_NE(res.output.find("# progress:"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("ring at every size (GW_ALGO)"), std::string::npos) << res.output;
  json doc = out.read_json();
  ASSERT_TRUE(doc.is_object()) << res.output;
  EXPECT_FALSE(doc.contains("error")) << doc.dump();
  EXPECT_EQ(doc["config"]["algorithm_requested"], "ring") << doc.dump();
  EXPECT_EQ(doc["config"]["transport_requested"], "auto") << doc.dump();
  // Forked codec runs take tcp for auto (docs/perf.md); the resolved name is never "auto".
  EXPECT_EQ(doc["config"]["transport"], "tcp") << doc.dump();
  EXPECT_EQ(doc["config"]["interface"], "lo:127.0.0.1") << doc.dump();
  EXPECT_EQ(doc["config"]["ranks"], 2) << doc.dump();
  EXPECT_NE(doc["config"]["allreduce_algorithms"].get<std::string>().find("ring"),
            std::string::npos)
      << doc.dump();
  ASSERT_EQ(doc["rows"].size(), 6u) << doc.dump();  // (none, fp16, ef-floor) x (256K, 1M)
  EXPECT_EQ(doc["rows"][1]["codec"], "fp16");
  EXPECT_EQ(doc["rows"][3]["size_bytes"], 1048576);
  EXPECT_GT(doc["rows"][1]["time_us"].get<double>(), 0.0);
  EXPECT_LT(doc["rows"][1]["bytes_sent"].get<double>(), doc["rows"][0]["bytes_sent"].get<double>());

  // A forced algorithm that does not apply stops the ranks, and the document says why.
  TempFile bad_algo;
  auto hier = run_perf({"allreduce", "--np", "2", "--transport", "tcp", "-b", "1M", "-e", "1M",
                        "--codec", "fp16", "--algo", "hier", "--json", bad_algo.path()});
  EXPECT_TRUE(hier.exited && hier.exit_code == 2) << hier.describe();
  json err = bad_algo.read_json();
  ASSERT_TRUE(err.is_object()) << hier.describe();
  EXPECT_NE(err.value("error", "").find("GW_ALGO"), std::string::npos) << err.dump();
  // An unknown algorithm and an option without meaning there are refused before any rank starts,
  // in the JSON too.
  TempFile refused;
  auto unknown = run_perf(
      {"allreduce", "--np", "2", "--codec", "fp16", "--algo", "fastest", "--json", refused.path()});
  EXPECT_TRUE(unknown.exited && unknown.exit_code == 2) << unknown.describe();
  EXPECT_NE(unknown.output.find("--algo fastest"), std::string::npos) << unknown.describe();
  EXPECT_NE(refused.read_json().value("error", "").find("--algo"), std::string::npos);
  auto dtype = run_perf({"allreduce", "--np", "2", "--codec", "fp16", "-d", "int32"});
  EXPECT_TRUE(dtype.exited && dtype.exit_code == 2) << dtype.describe();
  EXPECT_NE(dtype.output.find("float32 sum only"), std::string::npos) << dtype.describe();
}

TEST(PerfToolTest, DeadRankEndsTheRunWithAnError) {
  TempFile out;
  Env env = clean_env();
  env["GW_TIMEOUT_MS"] = "3000";
  ProcGroup group;
  group.start({GW_PERF_PATH, "allreduce", "--np", "3", "--transport", "tcp", "-b", "16M", "-e",
               "16M", "-n", "100000", "-w", "0", "--json", out.path()},
              env);
  ASSERT_TRUE(group.wait_for_output(0, "#wrong", 60000)) << group.output(0);
  // The header lists every rank's pid: SIGKILL rank 2 in the middle of the timed loop.
  std::string text = group.output(0);
  auto at = text.find("#   rank   2: ");
  ASSERT_NE(at, std::string::npos) << text;
  auto pid_at = text.find(" pid ", at);
  ASSERT_NE(pid_at, std::string::npos) << text;
  pid_t victim = static_cast<pid_t>(std::stol(text.substr(pid_at + 5)));
  ASSERT_GT(victim, 1);
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  auto res = group.wait_all(3000 + 15000)[0];
  ASSERT_FALSE(res.timed_out) << res.describe();
  ASSERT_TRUE(res.exited) << res.describe();
  EXPECT_EQ(res.exit_code, 2) << res.describe();
  EXPECT_NE(res.output.find("rank 2"), std::string::npos) << res.describe();
  EXPECT_NE(res.output.find("signal 9"), std::string::npos) << res.describe();
  json doc = out.read_json();
  ASSERT_FALSE(doc.is_discarded());
  ASSERT_TRUE(doc.contains("error")) << doc.dump();
  // Every rank is gone (reaped by gradwire-perf, not left running).
  for (auto pos = text.find(" pid "); pos != std::string::npos; pos = text.find(" pid ", pos + 1)) {
    pid_t pid = static_cast<pid_t>(std::stol(text.substr(pos + 5)));
    EXPECT_NE(kill(pid, 0), 0) << "rank pid " << pid << " still exists";
  }
}

struct CollCase {
  std::string coll, dtype, op, transport;
  int np;
};

class PerfCollectiveTest : public ::testing::TestWithParam<CollCase> {};

TEST_P(PerfCollectiveTest, CheckFindsNoWrongElement) {
  const auto& c = GetParam();
  std::vector<std::string> args = {c.coll,        "--np",      std::to_string(c.np),
                                   "--transport", c.transport, "-b",
                                   "64",          "-e",        "1M",
                                   "-f",          "16",        "--check",
                                   "-n",          "2",         "-w",
                                   "1",           "-d",        c.dtype};
  if (!c.op.empty()) {
    args.push_back("-o");
    args.push_back(c.op);
  }
  if (c.coll == "broadcast" || c.coll == "reduce" || c.coll == "gather" || c.coll == "scatter") {
    args.push_back("--root");
    args.push_back(std::to_string(c.np - 1));
  }
  auto res = run_perf(args);
  ASSERT_TRUE(res.exited && res.exit_code == 0) << res.describe();
  auto rows = data_rows(res.output);
  ASSERT_EQ(rows.size(), 4u) << res.output;  // 64 1K 16K 256K
  for (const auto& row : rows) {
    ASSERT_EQ(row.size(), 13u) << res.output;
    EXPECT_EQ(row[8], "0") << res.output;   // out of place
    EXPECT_EQ(row[12], "0") << res.output;  // in place
  }
}

INSTANTIATE_TEST_SUITE_P(Collectives, PerfCollectiveTest,
                         ::testing::Values(CollCase{"allreduce", "bfloat16", "sum", "shm", 3},
                                           CollCase{"allreduce", "float16", "avg", "tcp", 2},
                                           CollCase{"allreduce", "uint8", "prod", "shm", 4},
                                           CollCase{"allreduce", "int64", "max", "auto", 3},
                                           CollCase{"allgather", "float32", "", "tcp", 3},
                                           CollCase{"allgather", "uint8", "", "shm", 4},
                                           CollCase{"reduce_scatter", "int32", "sum", "shm", 3},
                                           CollCase{"reduce_scatter", "float64", "min", "tcp", 2},
                                           CollCase{"broadcast", "float32", "", "tcp", 3},
                                           CollCase{"broadcast", "int32", "", "shm", 2},
                                           CollCase{"alltoall", "float32", "", "tcp", 3},
                                           CollCase{"alltoall", "bfloat16", "", "tcp", 4},
                                           CollCase{"alltoall", "uint8", "", "shm", 2},
                                           CollCase{"reduce", "float32", "sum", "shm", 3},
                                           CollCase{"reduce", "int64", "max", "tcp", 4},
                                           CollCase{"gather", "bfloat16", "", "tcp", 3},
                                           CollCase{"gather", "uint8", "", "shm", 2},
                                           CollCase{"scatter", "float64", "", "shm", 4},
                                           CollCase{"scatter", "int32", "", "tcp", 3}),
                         [](const auto& info) {
                           const auto& c = info.param;
                           return c.coll + "_" + c.dtype + (c.op.empty() ? "" : "_" + c.op) + "_" +
                                  c.transport + "_" + std::to_string(c.np);
                         });

}  // namespace
}  // namespace gw::test
