// GW_TIMELINE in the NCCL plugin: a fresh nccl_plugin_peer process ("timeline": one connection
// pair, the kTimelineSizes transfers) writes a trace-event file whose isend / irecv events are the
// transfers done (count, bytes, tags, posted sizes), with one connect, one accept and a regMr and
// deregMr per buffer, all with pid = the launcher's rank; and nothing when GW_TIMELINE is unset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A fresh directory under the test's temporary directory, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gw_plugin_tl_XXXXXX").string();
    if (mkdtemp(tmpl.data()) != nullptr) path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

// Every event has the members the trace-event format requires, complete events a time span.
void check_event(const json& e) {
  ASSERT_TRUE(e.is_object()) << e.dump();
  ASSERT_TRUE(e.contains("name") && e["name"].is_string()) << e.dump();
  ASSERT_TRUE(e.contains("ph") && e["ph"].is_string()) << e.dump();
  ASSERT_TRUE(e.contains("pid") && e["pid"].is_number_integer()) << e.dump();
  ASSERT_TRUE(e.contains("tid") && e["tid"].is_number_integer()) << e.dump();
  const std::string ph = e["ph"];
  ASSERT_TRUE(ph == "X" || ph == "M") << e.dump();
  if (ph == "X") {
    ASSERT_TRUE(e.contains("ts") && e["ts"].is_number_integer()) << e.dump();
    ASSERT_TRUE(e.contains("dur") && e["dur"].is_number_integer()) << e.dump();
    EXPECT_GE(e["dur"].get<int64_t>(), 0) << e.dump();
    ASSERT_TRUE(e.contains("args") && e["args"].is_object()) << e.dump();
  }
}

TEST(PluginTimeline, FileNameFollowsTheCAbisRuleWithNccl) {
  // A pattern without %r: ".<rank>" then ".nccl" before ".json".
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string pattern = (dir.path() / "trace.json").string();
  ASSERT_EQ(run_peer({"GW_TIMELINE=" + pattern, "GW_RANK=5"}, {"timeline", "1"}), 0);
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"trace.5.nccl.json"});
}

TEST(PluginTimeline, EveryTransferIsAnEventAndNothingWhenUnset) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  const std::string pattern = (dir.path() / "rank%r.json").string();
  ASSERT_EQ(run_peer({"GW_TIMELINE=" + pattern, "GW_RANK=3"}, {"timeline", "1"}), 0);
  ASSERT_EQ(files_in(dir.path()), std::vector<std::string>{"rank3.nccl.json"});

  std::ifstream in(dir.path() / "rank3.nccl.json");
  json trace = json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(trace.is_array()) << "not a JSON array (the file must be closed at exit)";
  std::map<std::string, std::vector<json>> by_name;
  bool named_process = false;
  for (const json& e : trace) {
    check_event(e);
    if (testing::Test::HasFatalFailure()) return;
    EXPECT_EQ(e["pid"], 3) << e.dump();
    if (e["ph"] == "M" && e["name"] == "process_name") named_process = true;
    if (e["ph"] == "X") {
      EXPECT_EQ(e.value("cat", ""), "nccl-net") << e.dump();
      by_name[e["name"]].push_back(e);
    }
  }
  EXPECT_TRUE(named_process);
  const size_t n = std::size(kTimelineSizes);
  ASSERT_EQ(by_name["isend"].size(), n);
  ASSERT_EQ(by_name["irecv"].size(), n);
  // Each exchange completes before the next is posted, so the events come in the transfers' order.
  std::vector<json> sends = by_name["isend"], recvs = by_name["irecv"];
  auto by_tag = [](const json& a, const json& b) { return a["args"]["tag"] < b["args"]["tag"]; };
  std::sort(sends.begin(), sends.end(), by_tag);
  std::sort(recvs.begin(), recvs.end(), by_tag);
  std::set<int> conns;
  for (size_t i = 0; i < n; ++i) {
    const json& s = sends[i]["args"];
    const json& r = recvs[i]["args"];
    EXPECT_EQ(s["tag"], kTimelineTag0 + static_cast<int>(i));
    EXPECT_EQ(s["bytes"], kTimelineSizes[i]) << s.dump();
    EXPECT_FALSE(s.contains("posted")) << s.dump();
    EXPECT_EQ(r["tag"], kTimelineTag0 + static_cast<int>(i));
    EXPECT_EQ(r["bytes"], kTimelineSizes[i]) << r.dump();
    EXPECT_EQ(r["posted"], kTimelineSizes[i] + kTimelineRecvExtra) << r.dump();
    for (const json* a : {&s, &r}) {
      EXPECT_EQ((*a)["transport"], "tcp") << a->dump();
      EXPECT_EQ((*a)["comm"], "0x0000000000001234") << a->dump();
      EXPECT_FALSE(a->contains("failed")) << a->dump();
      EXPECT_TRUE((*a)["peer"].is_string() && !(*a)["peer"].get<std::string>().empty());
    }
    conns.insert(s["conn"].get<int>());
    conns.insert(r["conn"].get<int>());
  }
  EXPECT_EQ(conns.size(), 2u) << "one send comm and one receive comm";
  EXPECT_EQ(by_name["connect"].size(), 1u);
  EXPECT_EQ(by_name["accept"].size(), 1u);
  EXPECT_EQ(by_name["regMr"].size(), 2 * n);
  EXPECT_EQ(by_name["deregMr"].size(), 2 * n);
  for (const json& e : by_name["regMr"]) EXPECT_EQ(e["args"]["type"], "host") << e.dump();
  EXPECT_EQ(by_name.size(), 6u) << "only the plugin's events";

  // The same run without GW_TIMELINE: no timeline INFO line (the peer checks), no new file.
  const auto size_before = fs::file_size(dir.path() / "rank3.nccl.json");
  ASSERT_EQ(run_peer({"-GW_TIMELINE", "GW_RANK=3"}, {"timeline", "0"}), 0);
  EXPECT_EQ(files_in(dir.path()), std::vector<std::string>{"rank3.nccl.json"});
  EXPECT_EQ(fs::file_size(dir.path() / "rank3.nccl.json"), size_before);
}

}  // namespace
}  // namespace gw::plugin_test
