// gradwirectl trace's decoders (daemon/control_trace.h), behind one selector byte: the daemon's
// reading of a trace request's arguments (even), and gradwirectl's check of the answer, a Chrome
// trace (odd).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "daemon/control.h"
#include "daemon/control_trace.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

void request(const uint8_t* p, size_t n) {
  auto r = daemon::decode_trace_request(p, n);
  if (!r.ok()) {
    ++counter("trace.request_refused");
    return;
  }
  ++counter("trace.request_accepted");
  check(n <= daemon::kMaxControlRequestBytes, "trace: a request within the size cap");
  check(!r->job.empty() && r->job.size() <= daemon::kMaxTraceJobChars, "trace: a bounded job");
  check(r->seconds > 0 && r->seconds <= daemon::kMaxTraceSeconds && std::isfinite(r->seconds),
        "trace: seconds within bounds");
  const std::string again = daemon::encode_trace_request(*r);
  auto back =
      daemon::decode_trace_request(reinterpret_cast<const uint8_t*>(again.data()), again.size());
  check(back.ok() && back->job == r->job && back->seconds == r->seconds,
        "trace: the request round-trips");
}

void answer(const uint8_t* p, size_t n) {
  auto r = daemon::decode_control_response(p, n, daemon::ControlCommand::kTrace);
  if (!r.ok()) {
    ++counter("trace.answer_refused");
    return;
  }
  ++counter("trace.answer_accepted");
  // What gradwirectl reads without further checks.
  check(r->is_object() && (*r)["traceEvents"].is_array() && (*r)["otherData"].is_object(),
        "trace: an accepted answer has its events and otherData");
  check((*r)["otherData"]["events"].is_number_integer(), "trace: an integer event count");
  const std::string again = daemon::encode_control_result(daemon::ControlCommand::kTrace, *r);
  check(!again.empty(), "trace: what was accepted encodes");
}

std::vector<uint8_t> with(uint8_t selector, const std::string& s) {
  std::vector<uint8_t> v(1 + s.size());
  v[0] = selector;
  std::copy(s.begin(), s.end(), v.begin() + 1);
  return v;
}

}  // namespace

int daemon_control_trace(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if (data[0] % 2 == 0) {
    request(data + 1, size - 1);
  } else {
    answer(data + 1, size - 1);
  }
  return 0;
}

std::vector<std::vector<uint8_t>> daemon_control_trace_seeds() {
  std::vector<std::vector<uint8_t>> out;
  for (double s : {2.0, 600.0, 0.25, 0.0, 601.0}) {
    out.push_back(with(0, daemon::encode_trace_request({"0123456789abcdef", s})));
  }
  out.push_back(with(0, R"({"version":1,"command":"trace","job":"","seconds":1})"));
  out.push_back(with(0, R"({"version":1,"command":"trace","job":"ab","seconds":"1"})"));
  const std::string events =
      R"([{"name":"process_name","ph":"M","pid":0,"tid":0,"args":{"name":"gradwired host 0"}},)"
      R"({"name":"allreduce","cat":"collective","ph":"X","ts":1764400000000000,"dur":120,)"
      R"("pid":0,"tid":0,"args":{"bytes":4096,"tag":3,"seq":4,"count":1024,"dtype":"float32",)"
      R"("op":"sum"}},{"name":"queued","cat":"phase","ph":"X","ts":1764399999999990,"dur":10,)"
      R"("pid":0,"tid":10,"args":{}}])";
  const std::string other =
      R"({"job":"0123456789abcdef","host_index":0,"seconds":2,"events":2,"dropped":0})";
  out.push_back(
      with(1, daemon::encode_control_result(
                  daemon::ControlCommand::kTrace,
                  nlohmann::json::parse(R"({"traceEvents":)" + events +
                                        R"(,"displayTimeUnit":"ms","otherData":)" + other + "}"))));
  out.push_back(with(1, R"({"version":1,"ok":true,"command":"trace","result":{"traceEvents":)"
                        R"([{"name":"x","ph":"X","pid":0,"tid":0}],"otherData":)" +
                            other + "}}"));
  out.push_back(with(1, R"({"version":1,"ok":false,"error":"no job 01 runs on this daemon"})"));
  return out;
}

}  // namespace gw::fuzz
