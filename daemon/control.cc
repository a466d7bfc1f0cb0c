#include "daemon/control.h"

#include <cstring>
#include <utility>

#include "daemon/control_trace.h"

namespace gw::daemon {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 8;  // the deepest answer is 3 levels; beyond this is refused unparsed

// Whether the JSON text nests deeper than `limit` (strings skipped): checked before parsing so
// that no input, however nested, makes the parser or the destructor recurse deeply.
bool too_deep(const uint8_t* p, size_t n, int limit) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < n; ++i) {
    const uint8_t c = p[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

Result<json> parse_object(const uint8_t* body, size_t size, const char* what) {
  if (too_deep(body, size, kMaxDepth)) {
    return peer_error("{}: JSON nested deeper than {} levels", what, kMaxDepth);
  }
  json doc = json::parse(body, body + size, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return peer_error("{}: not valid JSON", what);
  if (!doc.is_object()) return peer_error("{}: not a JSON object", what);
  return doc;
}

enum class Kind { kString, kInt, kNumber, kBool };

bool has(const json& obj, const char* key, Kind kind) {
  auto it = obj.find(key);
  if (it == obj.end()) return false;
  switch (kind) {
    case Kind::kString:
      return it->is_string();
    case Kind::kInt:
      return it->is_number_integer();
    case Kind::kNumber:
      return it->is_number();
    case Kind::kBool:
      return it->is_boolean();
  }
  return false;
}

struct Field {
  const char* key;
  Kind kind;
};

// The fields of each answer (docs/wire-daemon.md); a renderer reads only these.
constexpr Field kStatusFields[] = {{"version", Kind::kString},
                                   {"pid", Kind::kInt},
                                   {"uptime_s", Kind::kNumber},
                                   {"socket", Kind::kString},
                                   {"control_socket", Kind::kString},
                                   {"transport", Kind::kString},
                                   {"host_id", Kind::kString},
                                   {"clients", Kind::kInt},
                                   {"jobs", Kind::kInt},
                                   {"arenas", Kind::kInt},
                                   {"accepted", Kind::kInt},
                                   {"refused", Kind::kInt},
                                   {"collectives", Kind::kInt},
                                   {"failed", Kind::kInt}};
constexpr Field kJobFields[] = {{"job", Kind::kString},         {"world", Kind::kInt},
                                {"hosts", Kind::kInt},          {"host_index", Kind::kInt},
                                {"local_trainers", Kind::kInt}, {"local_size", Kind::kInt},
                                {"state", Kind::kString},       {"collectives", Kind::kInt},
                                {"errors", Kind::kInt},         {"transport", Kind::kString}};
constexpr Field kClientFields[] = {{"id", Kind::kInt},          {"pid", Kind::kInt},
                                   {"uid", Kind::kInt},         {"job", Kind::kString},
                                   {"rank", Kind::kInt},        {"local_rank", Kind::kInt},
                                   {"arena_bytes", Kind::kInt}, {"requests", Kind::kInt}};
constexpr Field kKvFields[] = {
    {"job", Kind::kString},     {"host_index", Kind::kInt}, {"store", Kind::kInt},
    {"mode", Kind::kString},    {"update", Kind::kString},  {"codec", Kind::kString},
    {"workers", Kind::kInt},    {"live", Kind::kInt},       {"keys", Kind::kInt},
    {"partitions", Kind::kInt}, {"bytes", Kind::kInt},      {"min_clock", Kind::kInt},
    {"max_clock", Kind::kInt},  {"lag", Kind::kInt},        {"dropped", Kind::kInt},
    {"lost", Kind::kInt},       {"state", Kind::kString}};
constexpr Field kConfigFields[] = {{"name", Kind::kString},
                                   {"key", Kind::kString},
                                   {"value", Kind::kString},
                                   {"default", Kind::kString},
                                   {"source", Kind::kString}};

template <size_t N>
Status check_fields(const json& obj, const Field (&fields)[N], std::string_view what) {
  if (!obj.is_object()) return peer_error("control answer: {} is not an object", what);
  for (const Field& f : fields) {
    if (!has(obj, f.key, f.kind)) {
      return peer_error("control answer: {} lacks '{}' or it has the wrong type", what, f.key);
    }
  }
  return ok_status();
}

template <size_t N>
Status check_rows(const json& result, const Field (&fields)[N], std::string_view what) {
  if (!result.is_array()) return peer_error("control answer: {} is not an array", what);
  for (const json& row : result) GW_RETURN_IF_ERROR(check_fields(row, fields, what));
  return ok_status();
}

std::string dump(const json& doc) {
  // Host ids, config values and messages come from outside: never throw on bad UTF-8.
  return doc.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

std::string control_socket_path(const std::string& socket_path) { return socket_path + ".ctl"; }

const char* control_command_name(ControlCommand command) {
  switch (command) {
    case ControlCommand::kStatus:
      return "status";
    case ControlCommand::kJobs:
      return "jobs";
    case ControlCommand::kClients:
      return "clients";
    case ControlCommand::kConfig:
      return "config";
    case ControlCommand::kKv:
      return "kv";
    case ControlCommand::kTrace:
      return "trace";
  }
  return "?";
}

Result<ControlCommand> parse_control_command(std::string_view name) {
  for (ControlCommand c : {ControlCommand::kStatus, ControlCommand::kJobs, ControlCommand::kClients,
                           ControlCommand::kConfig, ControlCommand::kKv, ControlCommand::kTrace}) {
    if (name == control_command_name(c)) return c;
  }
  return invalid_arg("unknown control command '{}' (status, jobs, clients, config, kv, trace)",
                     name.substr(0, 64));
}

std::string encode_control_request(ControlCommand command) {
  json doc;
  doc["version"] = kControlVersion;
  doc["command"] = control_command_name(command);
  return dump(doc);
}

Result<ControlCommand> decode_control_request(const uint8_t* body, size_t size) {
  if (size > kMaxControlRequestBytes) {
    return peer_error("control request of {} bytes (at most {})", size, kMaxControlRequestBytes);
  }
  GW_ASSIGN_OR_RETURN(json doc, parse_object(body, size, "control request"));
  if (!has(doc, "version", Kind::kInt)) {
    return invalid_arg("control request: no integer 'version'");
  }
  if (doc["version"] != kControlVersion) {
    return invalid_arg("control request: version {} (this daemon speaks {})", dump(doc["version"]),
                       kControlVersion);
  }
  if (!has(doc, "command", Kind::kString)) {
    return invalid_arg("control request: no string 'command'");
  }
  return parse_control_command(doc["command"].get_ref<const std::string&>());
}

std::string encode_control_result(ControlCommand command, json result) {
  json doc;
  doc["version"] = kControlVersion;
  doc["ok"] = true;
  doc["command"] = control_command_name(command);
  doc["result"] = std::move(result);
  return dump(doc);
}

std::string encode_control_error(const Status& why) {
  json doc;
  doc["version"] = kControlVersion;
  doc["ok"] = false;
  doc["error"] = why.message();
  return dump(doc);
}

Result<json> decode_control_response(const uint8_t* body, size_t size, ControlCommand command) {
  if (size > kMaxControlResponseBytes) {
    return peer_error("control answer of {} bytes (at most {})", size, kMaxControlResponseBytes);
  }
  GW_ASSIGN_OR_RETURN(json doc, parse_object(body, size, "control answer"));
  if (!has(doc, "version", Kind::kInt) || doc["version"] != kControlVersion) {
    return peer_error("control answer: no 'version' {} (another gradwired version?)",
                      kControlVersion);
  }
  if (!has(doc, "ok", Kind::kBool)) return peer_error("control answer: no boolean 'ok'");
  if (!doc["ok"].get<bool>()) {
    if (!has(doc, "error", Kind::kString)) return peer_error("control answer: no string 'error'");
    return invalid_arg("gradwired refused: {}", doc["error"].get_ref<const std::string&>());
  }
  if (!has(doc, "command", Kind::kString) ||
      doc["command"].get_ref<const std::string&>() != control_command_name(command)) {
    return peer_error("control answer: not an answer to '{}'", control_command_name(command));
  }
  auto it = doc.find("result");
  if (it == doc.end()) return peer_error("control answer: no 'result'");
  json result = std::move(*it);
  switch (command) {
    case ControlCommand::kStatus:
      GW_RETURN_IF_ERROR(check_fields(result, kStatusFields, "status"));
      break;
    case ControlCommand::kJobs:
      GW_RETURN_IF_ERROR(check_rows(result, kJobFields, "a job"));
      break;
    case ControlCommand::kClients:
      GW_RETURN_IF_ERROR(check_rows(result, kClientFields, "a client"));
      break;
    case ControlCommand::kConfig:
      GW_RETURN_IF_ERROR(check_rows(result, kConfigFields, "a config row"));
      break;
    case ControlCommand::kKv:
      GW_RETURN_IF_ERROR(check_rows(result, kKvFields, "a kv store"));
      break;
    case ControlCommand::kTrace:
      GW_RETURN_IF_ERROR(check_trace_result(result));
      break;
  }
  return result;
}

std::vector<uint8_t> frame_control(const std::string& body) {
  std::vector<uint8_t> out(4 + body.size());
  const uint32_t len = static_cast<uint32_t>(body.size());
  std::memcpy(out.data(), &len, sizeof(len));
  std::memcpy(out.data() + 4, body.data(), body.size());
  return out;
}

}  // namespace gw::daemon
