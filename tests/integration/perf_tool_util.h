// What the gradwire-perf tests share (perf_tool_test.cc, perf_tool_p2p_test.cc): running the tool
// (GW_PERF_PATH) with a deadline, a temporary file for --json, and the data rows of its tables.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/proc_harness.h"

namespace gw::test {

using json = nlohmann::json;

// Runs gradwire-perf with `args` (GW_TIMEOUT_MS 20000 unless `env` sets it) and waits for it.
inline ProcResult run_perf(std::vector<std::string> args, Env env = clean_env(),
                           int64_t deadline_ms = 120000) {
  args.insert(args.begin(), GW_PERF_PATH);
  if (!env.count("GW_TIMEOUT_MS")) env["GW_TIMEOUT_MS"] = "20000";
  ProcGroup group;
  group.start(args, env);
  return group.wait_all(deadline_ms)[0];
}

class TempFile {
 public:
  TempFile() {
    char tmpl[] = "/tmp/gw_perf_test_XXXXXX";
    int fd = mkstemp(tmpl);
    if (fd >= 0) close(fd);
    path_ = tmpl;
  }
  ~TempFile() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }
  json read_json() const {
    std::ifstream f(path_);
    std::stringstream ss;
    ss << f.rdbuf();
    return json::parse(ss.str(), nullptr, false);
  }

 private:
  std::string path_;
};

// The data rows of the table: lines not starting with '#', split into columns.
inline std::vector<std::vector<std::string>> data_rows(const std::string& output) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(output);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::vector<std::string> cols;
    std::string w;
    while (words >> w) cols.push_back(w);
    if (!cols.empty()) rows.push_back(cols);
  }
  return rows;
}

}  // namespace gw::test
