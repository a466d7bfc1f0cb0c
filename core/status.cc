#include "core/status.h"

#include <cstring>

namespace gw {

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArg: return "INVALID_ARG";
    case Code::kTimeout: return "TIMEOUT";
    case Code::kPeer: return "PEER";
    case Code::kSystem: return "SYSTEM";
    case Code::kUnsupported: return "UNSUPPORTED";
    case Code::kNoMemory: return "NO_MEMORY";
    case Code::kAborted: return "ABORTED";
    case Code::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", code_name(code_), message_);
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, fmt::format("{}: {}", context, message_), reason_);
}

Status system_error(std::string_view what, int err) {
  char buf[256];
  // GNU strerror_r returns the message pointer (which may not be buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  return Status(Code::kSystem, fmt::format("{}: {} (errno {})", what, text, err));
}

}  // namespace gw
