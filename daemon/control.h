// gradwired's control protocol (docs/wire-daemon.md, "Control socket"): what gradwirectl asks the
// daemon on the control socket (`<socket>.ctl`) and what the daemon answers. One request per
// connection: a frame (u32 little-endian length, then a JSON body) each way, then the daemon
// closes.
//
// Shared by the daemon (daemon/control_server.cc) and gradwirectl (daemon/gradwirectl.cc). Both
// decoders take bytes the other side controls: decode_control_request() refuses anything but a
// bounded object naming a known command at a known version; decode_control_response() checks the
// shape of the answer to the command asked (every field a renderer reads, with its JSON type), so a
// renderer may read those fields without further checks. tests/fuzz/daemon_proto_fuzz.cc runs both
// on arbitrary bytes.
//
// Thread-compatible; the only state is the caller's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace gw::daemon {

inline constexpr int kControlVersion = 1;
// Bounds of a body (the frame header's length is checked against them before anything is read).
inline constexpr size_t kMaxControlRequestBytes = 1024;
inline constexpr size_t kMaxControlResponseBytes = 16u << 20;

// kTrace: the answer comes when the trace ends, not at once (daemon/control_trace.h).
enum class ControlCommand { kStatus, kJobs, kClients, kConfig, kKv, kTrace };

// "status", "jobs", "clients", "config", "kv", "trace".
const char* control_command_name(ControlCommand command);
// The control socket of a daemon whose trainers' socket is `socket_path`: beside it,
// `socket_path` + ".ctl". GW_DAEMON=auto probes it.
std::string control_socket_path(const std::string& socket_path);

// kInvalidArg naming the known commands.
Result<ControlCommand> parse_control_command(std::string_view name);

// A request's body: {"version":1,"command":"status"}.
std::string encode_control_request(ControlCommand command);
// kInvalidArg (kPeer for a body beyond its bound) on anything but a JSON object with an integer
// "version" equal to kControlVersion and a known "command" string; other keys are ignored.
Result<ControlCommand> decode_control_request(const uint8_t* body, size_t size);

// Responses: {"version":1,"ok":true,"command":"...","result":...} or
// {"version":1,"ok":false,"error":"..."}.
std::string encode_control_result(ControlCommand command, nlohmann::json result);
std::string encode_control_error(const Status& why);
// The result of `command` when the daemon answered ok; the daemon's error as kInvalidArg when it
// refused; kPeer when the bytes are not a well-formed answer to `command` (the message says which
// field is wrong). On success every field docs/wire-daemon.md lists for the command is present
// with its type.
Result<nlohmann::json> decode_control_response(const uint8_t* body, size_t size,
                                               ControlCommand command);

// Frames a body: u32 little-endian length, then the bytes.
std::vector<uint8_t> frame_control(const std::string& body);

// gradwirectl's side: connects to `control_path`, sends the request, reads the answer, all within
// timeout_ms. kPeer "no gradwired listens on PATH" when nothing answers there; kTimeout when the
// daemon does not answer in time.
Result<nlohmann::json> control_call(const std::string& control_path, ControlCommand command,
                                    int64_t timeout_ms);
// The same with the request's body given (a command with arguments: encode_trace_request()).
Result<nlohmann::json> control_call_body(const std::string& control_path, const std::string& body,
                                         ControlCommand command, int64_t timeout_ms);

}  // namespace gw::daemon
