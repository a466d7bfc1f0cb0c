// gradwirectl trace and the stall inspector in daemon mode (issue 31): two gradwired daemons on
// this machine (daemon_pair.h).
// - A trace of 2 s while 4 trainers (2 per daemon) allreduce: a Chrome trace whose every event
//   has the trace-event fields, with each phase the daemon sees (queued per local trainer,
//   local_reduce, inter_host, copy_back) inside its collective; a second trace of the same job
//   at once, a job that does not exist and --seconds out of range are refused, saying why.
// - GW_TIMELINE in daemon-mode trainers: each writes its side of every call with its phases.
// - One of two trainers on a daemon sleeps before an allreduce: the daemon names it in a WARN
//   within GW_STALL_WARN_S + 1 s and repeats it until it comes; the allreduce then completes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tests/daemon/daemon_pair.h"
#include "tests/integration/proc_harness.h"

namespace gw::test {
namespace {

using namespace ::gw::test::daemon_it;
using nlohmann::json;

ProcResult gradwirectl(const std::vector<std::string>& args) {
  ProcGroup g;
  std::vector<std::string> argv = {GRADWIRECTL_PATH};
  argv.insert(argv.end(), args.begin(), args.end());
  g.start(argv, clean_env());
  auto r = g.wait_all(30000);
  return r.empty() ? ProcResult{} : r[0];
}

TEST(DaemonTrace, ATraceOfTwoSecondsHoldsEveryPhaseOfTheJobsCollectives) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  for (int r = 0; r < 4; ++r) d.start_trainer(g, r, 4, port, {"loop"});
  for (size_t r = 0; r < 4; ++r) ASSERT_TRUE(g.wait_for_output(r, "LOOPING", 30000)) << g.output(r);
  const std::string sock = d.socket(0);  // host A: ranks 0 and 2, local ranks 0 and 1
  json jobs = json::parse(gradwirectl({"jobs", "--json", "--socket", sock}).output, nullptr, false);
  ASSERT_TRUE(jobs.is_array() && jobs.size() == 1) << jobs;
  const std::string job = jobs[0]["job"];

  // The trace, in the background; a second one of the same job while it runs is refused.
  const std::string file = dir.path() + "/trace.json";
  ProcGroup tracer;
  const auto t0 = std::chrono::steady_clock::now();
  tracer.start({GRADWIRECTL_PATH, "trace", job, "--seconds", "2", "-o", file, "--socket", sock},
               clean_env());
  ASSERT_TRUE(d.daemon_said(0, "tracing job " + job, 10000)) << d.daemon_output(0);
  ProcResult second = gradwirectl({"trace", job, "--seconds", "1", "--socket", sock});
  EXPECT_EQ(second.exit_code, 1) << second.describe();
  EXPECT_NE(second.output.find("job " + job + " is already being traced"), std::string::npos)
      << second.output;
  auto done = tracer.wait_all(30000);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_EQ(done.size(), 1u);
  ASSERT_EQ(done[0].exit_code, 0) << done[0].describe();
  EXPECT_NE(done[0].output.find("wrote " + file), std::string::npos) << done[0].output;
  EXPECT_GE(took, 2.0);  // answered at the trace's end, not before
  std::printf("trace of 2 s answered after %.2f s\n", took);

  std::ifstream in(file);
  json trace = json::parse(in, nullptr, false);
  ASSERT_TRUE(trace.is_object()) << "not a JSON object: " << file;
  ASSERT_TRUE(trace["traceEvents"].is_array());
  const json& other = trace["otherData"];
  EXPECT_EQ(other["job"], job);
  EXPECT_EQ(other["host_index"], 0);
  EXPECT_EQ(other["dropped"], 0);
  // The trace-event format: every event names its phase type, process and thread; complete
  // events ("X") have a start and a duration in microseconds.
  std::vector<json> complete;
  std::set<std::string> thread_names;
  for (const json& e : trace["traceEvents"]) {
    ASSERT_TRUE(e.is_object()) << e;
    ASSERT_TRUE(e["name"].is_string() && e["ph"].is_string()) << e;
    ASSERT_TRUE(e["pid"].is_number_integer() && e["tid"].is_number_integer()) << e;
    EXPECT_EQ(e["pid"], 1000000) << e;  // 1000000 + the daemon's host index
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") thread_names.insert(e["args"]["name"].get<std::string>());
      continue;
    }
    ASSERT_EQ(e["ph"], "X") << e;
    ASSERT_TRUE(e["ts"].is_number_integer() && e["dur"].is_number_integer()) << e;
    EXPECT_GE(e["dur"].get<int64_t>(), 0) << e;
    complete.push_back(e);
  }
  EXPECT_EQ(other["events"].get<size_t>(), complete.size());
  EXPECT_TRUE(thread_names.count("job thread")) << trace["traceEvents"][1];
  ASSERT_FALSE(complete.empty());
  // What each lane holds: the collectives and their phases on the job thread (tid 0), each local
  // trainer's queued submissions on tid 10 + its local rank.
  std::map<std::string, int> seen;
  std::vector<const json*> collectives;
  int64_t first = INT64_MAX, last = 0;
  for (const json& e : complete) {
    const std::string name = e["name"];
    const int tid = e["tid"];
    ++seen[name + "@" + std::to_string(tid)];
    first = std::min(first, e["ts"].get<int64_t>());
    last = std::max(last, e["ts"].get<int64_t>() + e["dur"].get<int64_t>());
    if (e["cat"] == "collective") {
      EXPECT_EQ(name, "allreduce") << e;
      EXPECT_EQ(e["args"]["bytes"], 262144) << e;  // loop: 2^16 float32
      EXPECT_EQ(e["args"]["dtype"], "float32") << e;
      EXPECT_EQ(e["args"]["op"], "max") << e;
      EXPECT_TRUE(e["args"]["tag"].is_number_integer()) << e;
      collectives.push_back(&e);
    }
  }
  for (const char* want :
       {"allreduce@0", "local_reduce@0", "inter_host@0", "copy_back@0", "queued@10", "queued@11"}) {
    EXPECT_GT(seen[want], 0) << want << " missing";
  }
  // The collectives' tags count up; their phases lie inside them.
  for (size_t i = 1; i < collectives.size(); ++i) {
    EXPECT_GT((*collectives[i])["args"]["tag"], (*collectives[i - 1])["args"]["tag"]);
  }
  std::vector<std::pair<int64_t, int64_t>> spans;  // the collectives' [ts, end), by ts
  for (const json* c : collectives) {
    const int64_t cts = (*c)["ts"];
    spans.emplace_back(cts, cts + (*c)["dur"].get<int64_t>());
  }
  std::sort(spans.begin(), spans.end());
  for (const json& e : complete) {
    if (e["tid"] != 0 || e["cat"] != "phase") continue;
    const int64_t ts = e["ts"], end = ts + e["dur"].get<int64_t>();
    // The collective that started last at or before the phase (one at a time on the job thread).
    auto at = std::upper_bound(spans.begin(), spans.end(), std::make_pair(ts, INT64_MAX));
    const bool inside = at != spans.begin() && end <= std::prev(at)->second;
    auto span = [&](auto it) {
      return it == spans.end()
                 ? std::string("none")
                 : "[" + std::to_string(it->first) + ", " + std::to_string(it->second) + ")";
    };
    EXPECT_TRUE(inside) << "a phase outside every collective: " << e << "; the collective before: "
                        << (at == spans.begin() ? std::string("none") : span(std::prev(at)))
                        << ", after: " << span(at);
  }
  // Recorded for about the 2 s asked (a collective under way at the end finishes in the trace).
  EXPECT_LE(last - first, 4'000'000) << "events span " << last - first << " us";
  std::printf("%zu events, %zu collectives over %.2f s\n", complete.size(), collectives.size(),
              static_cast<double>(last - first) / 1e6);

  // Refusals, each saying why (exit status 1: the daemon refused).
  ProcResult nojob = gradwirectl({"trace", "0123456789abcdef", "--seconds", "1", "--socket", sock});
  EXPECT_EQ(nojob.exit_code, 1) << nojob.describe();
  EXPECT_NE(nojob.output.find("no job 0123456789abcdef runs on this daemon"), std::string::npos)
      << nojob.output;
  for (const char* bad : {"0", "-1", "601"}) {
    ProcResult r = gradwirectl({"trace", job, "--seconds", bad, "--socket", sock});
    EXPECT_EQ(r.exit_code, 1) << bad << ": " << r.describe();
    EXPECT_NE(r.output.find("--seconds must be more than 0 and at most 600"), std::string::npos)
        << bad << ": " << r.output;
  }
  // The job still runs: the trace did not disturb it, and a new trace may start now.
  ProcResult again = gradwirectl({"trace", job, "--seconds", "0.2", "--socket", sock});
  EXPECT_EQ(again.exit_code, 0) << again.describe();
  json j = json::parse(again.output, nullptr, false);
  EXPECT_TRUE(j.is_object() && j["traceEvents"].is_array()) << again.output.substr(0, 400);
}

// An allreduce of 8 MiB across hosts runs in pieces (allreduce_pipelined): each piece's phases on
// the job thread, and its time among the daemons on the inter-host lane.
TEST(DaemonTrace, APipelinedAllreduceShowsItsPiecesInFlight) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  for (int r = 0; r < 2; ++r) {
    d.start_trainer_on(g, r, r, 2, port, {"bench", std::to_string(8 << 20), "100000", "mem"}, "",
                       "128M");  // chunks of 8 MiB (an eighth of the arena, rounded down)
  }
  const std::string sock = d.socket(0);
  std::string job;
  ASSERT_TRUE(eventually(
      [&] {
        json j =
            json::parse(gradwirectl({"jobs", "--json", "--socket", sock}).output, nullptr, false);
        if (!j.is_array() || j.empty() || j[0]["state"] != "running") return false;
        job = j[0]["job"];
        return true;
      },
      30000));
  ProcResult r = gradwirectl({"trace", job, "--seconds", "2", "--socket", sock});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  json trace = json::parse(r.output, nullptr, false);
  ASSERT_TRUE(trace.is_object()) << r.output.substr(0, 400);
  std::map<std::string, int> seen;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    ++seen[e["name"].get<std::string>() + "@" + std::to_string(e["tid"].get<int>())];
    if (e["name"] == "allreduce piece") {
      EXPECT_EQ(e["args"]["bytes"], 4 << 20) << e;
    }
    if (e["name"] == "allreduce") {
      EXPECT_EQ(e["args"]["bytes"], 8 << 20) << e;
    }
  }
  for (const char* want : {"allreduce@0", "local_reduce@0", "inter_host@0", "copy_back@0",
                           "allreduce piece@1", "queued@10"}) {
    EXPECT_GT(seen[want], 0) << want << " missing in " << r.output.substr(0, 2000);
  }
  // Two pieces per allreduce.
  EXPECT_GE(seen["allreduce piece@1"], 2 * seen["allreduce@0"] - 2);
}

TEST(DaemonTrace, TheDaemonNamesTheTrainerAnAllreduceWaitsFor) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  d.set_env(0, "GW_STALL_WARN_S", "1");
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  // Both trainers on daemon A; rank 1 calls its second allreduce 5 s late (their timeout: 30 s).
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> argv = DaemonPair::trainer_argv(r, 2, port, {"late", "1", "5000"});
    argv[0] = STALL_TRAINER_PATH;
    argv[6] = "30000";  // --timeout-ms
    Env env = clean_env();
    env["GW_DAEMON"] = "unix:" + d.socket(0);
    env["GW_HOSTID"] = DaemonPair::host(0);
    g.start(argv, env);
  }
  ASSERT_TRUE(g.wait_for_output(1, "SLEEPING", 30000)) << g.output(1);
  auto warnings = [&] {
    (void)d.daemon_said(0, "\x01", 1);  // reads what the daemon wrote so far
    const std::string out = d.daemon_output(0);
    int n = 0;
    for (size_t at = out.find("for ranks [1]"); at != std::string::npos;
         at = out.find("for ranks [1]", at + 1)) {
      ++n;
    }
    return n;
  };
  // The daemon names the sleeper, and again a period later, before it comes.
  ASSERT_TRUE(eventually([&] { return warnings() >= 2; }, 15000)) << d.daemon_output(0);
  const std::string before = d.daemon_output(0);
  EXPECT_FALSE(g.wait_for_output(1, "ENTERING", 1))
      << "the warnings came only after the sleeper entered:\n"
      << before;
  auto done = g.wait_all(30000);
  for (const auto& r : done) EXPECT_EQ(r.exit_code, 0) << r.describe();
  // The first warning: the op, its size, the wait, the missing and the entered ranks.
  std::smatch m;
  const std::regex warn(
      "stall: gradwired job [0-9a-f]{16} \\(host 0 of 1\\): allreduce \\(float32 sum, 1000 "
      "elements, 4000 bytes\\) has waited ([0-9.]+) s for ranks \\[1\\], which have not entered it "
      "\\(ranks \\[0\\] of this host have");
  const int repeated = warnings();
  const std::string out = d.daemon_output(0);
  ASSERT_TRUE(std::regex_search(out, m, warn)) << out;
  const double waited = std::stod(m[1]);
  std::printf("first stall warning after %.1f s (GW_STALL_WARN_S=1)\n", waited);
  EXPECT_GE(waited, 1.0);
  EXPECT_LE(waited, 2.0);         // within GW_STALL_WARN_S + 1 s
  EXPECT_GE(repeated, 3) << out;  // repeated every period while it slept 5 s
}

// GW_TIMELINE in daemon-mode trainers (capi/daemon_session_trace.h): one trainer per daemon runs
// the suite (every collective, malloc'd and gw_mem_alloc'd buffers); each writes a trace-event
// array of its calls (pid = rank) with the phases it sees: malloc'd buffers copied into and out of
// the arena around the wait for the daemon, arena buffers only waited for.
TEST(DaemonTrace, DaemonModeTrainersWriteTheirSideOfEveryCall) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  DaemonPair d(dir);
  ASSERT_TRUE(d.start());
  ProcGroup g;
  const int port = free_port();
  const Env tl = {{"GW_TIMELINE", dir.path() + "/tl.%r.json"}};
  for (int r = 0; r < 2; ++r)
    d.start_trainer_on(g, r, r, 2, port, {"suite", "1000"}, "", "16M", tl);
  auto done = g.wait_all(120000);
  ASSERT_EQ(done.size(), 2u);
  for (const auto& r : done) ASSERT_EQ(r.exit_code, 0) << r.describe();
  for (int r = 0; r < 2; ++r) {
    const std::string file = dir.path() + "/tl." + std::to_string(r) + ".json";
    std::ifstream in(file);
    json events = json::parse(in, nullptr, false);
    ASSERT_TRUE(events.is_array()) << "not a JSON array: " << file;
    std::vector<json> calls, phases;
    bool named = false;
    for (const json& e : events) {
      ASSERT_TRUE(e.is_object() && e["name"].is_string() && e["ph"].is_string()) << e;
      ASSERT_TRUE(e["pid"].is_number_integer() && e["tid"].is_number_integer()) << e;
      EXPECT_EQ(e["pid"], r) << e;
      if (e["ph"] == "M") {
        named = named ||
                (e["name"] == "process_name" && e["args"]["name"].get<std::string>().rfind(
                                                    "rank " + std::to_string(r) + " ", 0) == 0);
        continue;
      }
      ASSERT_EQ(e["ph"], "X") << e;
      ASSERT_TRUE(e["ts"].is_number_integer() && e["dur"].is_number_integer()) << e;
      EXPECT_GE(e["dur"].get<int64_t>(), 0) << e;
      (e["cat"] == "collective" ? calls : phases).push_back(e);
    }
    EXPECT_TRUE(named) << "no process_name \"rank " << r << " ...\" in " << file;
    std::map<std::string, int> seen;
    std::set<uint64_t> first_seqs;
    int copied = 0, in_arena = 0;
    for (const json& c : calls) {
      const std::string name = c["name"];
      ++seen[name];
      EXPECT_EQ(c["args"]["mode"], "daemon") << c;
      EXPECT_FALSE(c["args"].contains("failed")) << c;
      ASSERT_TRUE(c["args"]["seq"].is_number_integer()) << c;  // every call submits
      EXPECT_GE(c["args"]["submissions"].get<int>(), 1) << c;
      // No two calls claim the same submission.
      EXPECT_TRUE(first_seqs.insert(c["args"]["seq"].get<uint64_t>()).second) << c;
      if (name != "allreduce") continue;
      const int64_t ts = c["ts"], end = ts + c["dur"].get<int64_t>();
      std::set<std::string> inside;
      for (const json& p : phases) {
        const int64_t pts = p["ts"];
        if (p["tid"] == c["tid"] && pts >= ts && pts + p["dur"].get<int64_t>() <= end) {
          inside.insert(p["name"].get<std::string>());
        }
      }
      EXPECT_TRUE(inside.count("wait for daemon")) << c;
      if (inside.count("copy to arena") && inside.count("copy from arena")) ++copied;
      if (!inside.count("copy to arena") && !inside.count("copy from arena")) ++in_arena;
    }
    for (const char* want :
         {"allreduce", "reduce_scatter", "broadcast", "allgather", "barrier", "iallreduce"}) {
      EXPECT_GT(seen[want], 0) << want << " missing from " << file;
    }
    EXPECT_GT(copied, 0) << "no allreduce of malloc'd buffers copied in and out";
    EXPECT_GT(in_arena, 0) << "no allreduce of gw_mem_alloc'd buffers without copies";
    std::printf("rank %d: %zu calls, %zu phases; allreduces: %d copied, %d in the arena\n", r,
                calls.size(), phases.size(), copied, in_arena);
  }
}

}  // namespace
}  // namespace gw::test
