// `gradwirectl trace JOB --seconds N` on the control protocol (daemon/control.h): the request's
// arguments, their decoder, and the check of the answer, a Chrome trace (docs/daemon.md,
// "gradwirectl trace"). Part of gw_daemon_control, shared by gradwired and gradwirectl; both
// decoders take bytes the other side controls and are fuzzed (tests/fuzz/trace_fuzz.cc).
//
// Thread-compatible; the only state is the caller's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "core/status.h"

namespace gw::daemon {

// What one trace may cover: its length, and the events the daemon keeps (later ones are counted
// as dropped). 60000 events of about 150 bytes stay well inside kMaxControlResponseBytes.
inline constexpr double kMaxTraceSeconds = 600;
inline constexpr size_t kMaxTraceEvents = 60000;
// A job's name as gradwirectl jobs shows it is 16 hex digits; longer names are refused unread.
inline constexpr size_t kMaxTraceJobChars = 64;

struct TraceRequest {
  std::string job;     // the job's name (gradwirectl jobs)
  double seconds = 0;  // how long to record: (0, kMaxTraceSeconds]
};

// {"version":1,"command":"trace","job":"...","seconds":N}: decode_control_request() reads it as
// the trace command, decode_trace_request() its arguments.
std::string encode_trace_request(const TraceRequest& r);
// The arguments of a body that decode_control_request() accepted as the trace command. kInvalidArg
// saying which: "job" not a string of 1..kMaxTraceJobChars characters, "seconds" not a number in
// (0, kMaxTraceSeconds].
Result<TraceRequest> decode_trace_request(const uint8_t* body, size_t size);

// The shape of a trace answer's result (what decode_control_response() checks for the trace
// command): {"traceEvents":[...], "displayTimeUnit":"ms", "otherData":{"job":s, "host_index":i,
// "seconds":n, "events":i, "dropped":i}}, every event an object with a string "name" and "ph", an
// integer "pid" and "tid", and numbers "ts" and "dur" where "ph" is "X". kPeer naming the field.
Status check_trace_result(const nlohmann::json& result);

}  // namespace gw::daemon
