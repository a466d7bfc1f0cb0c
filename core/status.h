// Status and Result<T>: the error vocabulary used everywhere inside gradwire.
//
// Codes map one to one onto the C ABI's gw_status_t (same numeric values), so capi/ converts
// without a table. A Status carries a message that names the operation and, where one is
// involved, the peer. Outputs are set only on success; a failed call leaves them untouched.
#pragma once

#include <fmt/format.h>

#include <cassert>
#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace gw {

enum class Code : int {
  kOk = 0,
  kInvalidArg = 1,   // the caller passed something wrong; retrying the same call fails again
  kTimeout = 2,      // a deadline passed; the peer may still be alive
  kPeer = 3,         // a peer closed, reset or misbehaved; the connection is unusable
  kSystem = 4,       // a system call failed (message carries errno text)
  kUnsupported = 5,  // not available in this build or on this host
  kNoMemory = 6,
  kAborted = 7,   // the communicator was aborted; every later call fails the same way
  kInternal = 8,  // a bug or a protocol violation inside gradwire
};

const char* code_name(Code code);

// What a caller inside gradwire must tell apart within one code without reading the message.
// Internal: only the Code crosses gradwire's boundaries (the C ABI, the daemon protocol, a
// transport's notice to its peer), where a reason is not carried.
enum class Reason : uint8_t {
  kNone = 0,
  // kInvalidArg: a message was larger than the receive posted for it (either side of the
  // transfer reports it; core/net/transport.h).
  kTruncated = 1,
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  Status(Code code, std::string message, Reason reason)
      : code_(code), reason_(reason), message_(std::move(message)) {}

  static Status OK() { return Status(); }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  Reason reason() const { return reason_; }
  // A truncated message (Reason::kTruncated, code kInvalidArg).
  bool truncated() const { return reason_ == Reason::kTruncated; }
  const std::string& message() const { return message_; }
  // "PEER: recv from rank 3 (10.0.0.2:4000): connection reset"
  std::string to_string() const;

  // Prefixes context ("allreduce: ") to the message, keeping the code and the reason.
  Status with_context(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  Reason reason_ = Reason::kNone;
  std::string message_;
};

inline Status ok_status() { return Status(); }

template <typename... Args>
Status invalid_arg(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kInvalidArg, fmt::format(f, std::forward<Args>(args)...));
}
// A transport's "message truncated": the sender sent more than the receive posted for it.
// kInvalidArg with Reason::kTruncated; callers check Status::truncated(), not the text.
template <typename... Args>
Status truncated_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kInvalidArg, fmt::format(f, std::forward<Args>(args)...), Reason::kTruncated);
}
template <typename... Args>
Status timeout_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kTimeout, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status peer_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kPeer, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status unsupported(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kUnsupported, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status no_memory(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kNoMemory, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status aborted_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kAborted, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
Status internal_error(fmt::format_string<Args...> f, Args&&... args) {
  return Status(Code::kInternal, fmt::format(f, std::forward<Args>(args)...));
}
// A failed system call: `what` names the call and its object; errno text is appended.
Status system_error(std::string_view what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok() && "Result constructed from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace gw

#define GW_CONCAT_INNER(a, b) a##b
#define GW_CONCAT(a, b) GW_CONCAT_INNER(a, b)

#define GW_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::gw::Status gw_status_ = (expr);        \
    if (!gw_status_.ok()) return gw_status_; \
  } while (0)

#define GW_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define GW_ASSIGN_OR_RETURN(lhs, expr) \
  GW_ASSIGN_OR_RETURN_IMPL(GW_CONCAT(gw_result_, __LINE__), lhs, expr)
