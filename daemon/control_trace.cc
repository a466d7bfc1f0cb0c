#include "daemon/control_trace.h"

#include <cmath>

#include "daemon/control.h"

namespace gw::daemon {

using nlohmann::json;

std::string encode_trace_request(const TraceRequest& r) {
  json doc;
  doc["version"] = kControlVersion;
  doc["command"] = control_command_name(ControlCommand::kTrace);
  doc["job"] = r.job;
  doc["seconds"] = r.seconds;
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<TraceRequest> decode_trace_request(const uint8_t* body, size_t size) {
  // The envelope first (size, nesting, version, command), so the parse below is of a bounded,
  // shallow object.
  GW_ASSIGN_OR_RETURN(ControlCommand c, decode_control_request(body, size));
  if (c != ControlCommand::kTrace) {
    return invalid_arg("control request: '{}' is not a trace request", control_command_name(c));
  }
  const json doc = json::parse(body, body + size, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return invalid_arg("trace request: not a JSON object");
  TraceRequest r;
  auto job = doc.find("job");
  if (job == doc.end() || !job->is_string() || job->get_ref<const std::string&>().empty() ||
      job->get_ref<const std::string&>().size() > kMaxTraceJobChars) {
    return invalid_arg(
        "trace request: no job (a string of 1..{} characters, as gradwirectl jobs "
        "names it)",
        kMaxTraceJobChars);
  }
  r.job = job->get<std::string>();
  auto seconds = doc.find("seconds");
  if (seconds == doc.end() || !seconds->is_number()) {
    return invalid_arg("trace request: no number 'seconds'");
  }
  r.seconds = seconds->get<double>();
  if (!(r.seconds > 0) || !(r.seconds <= kMaxTraceSeconds) || !std::isfinite(r.seconds)) {
    return invalid_arg("trace: --seconds must be more than 0 and at most {} (got {})",
                       kMaxTraceSeconds, r.seconds);
  }
  return r;
}

namespace {

bool is_int(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer();
}
bool is_num(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number();
}
bool is_str(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string();
}

}  // namespace

Status check_trace_result(const json& result) {
  if (!result.is_object()) return peer_error("control answer: a trace is not an object");
  auto other = result.find("otherData");
  if (other == result.end() || !other->is_object()) {
    return peer_error("control answer: a trace lacks the object 'otherData'");
  }
  for (const char* key : {"host_index", "events", "dropped"}) {
    if (!is_int(*other, key)) return peer_error("control answer: trace's '{}' is no integer", key);
  }
  if (!is_str(*other, "job") || !is_num(*other, "seconds")) {
    return peer_error("control answer: a trace lacks its 'job' or 'seconds'");
  }
  auto events = result.find("traceEvents");
  if (events == result.end() || !events->is_array()) {
    return peer_error("control answer: a trace lacks the array 'traceEvents'");
  }
  for (const json& e : *events) {
    if (!e.is_object() || !is_str(e, "name") || !is_str(e, "ph") || !is_int(e, "pid") ||
        !is_int(e, "tid")) {
      return peer_error("control answer: a trace event lacks 'name', 'ph', 'pid' or 'tid'");
    }
    if (e["ph"] == "X" && (!is_num(e, "ts") || !is_num(e, "dur"))) {
      return peer_error("control answer: a complete trace event lacks 'ts' or 'dur'");
    }
  }
  return ok_status();
}

}  // namespace gw::daemon
