// Internal to libgradwire.so: what every C entry point uses: handle lookup, the argument checks
// that hold whatever Session runs the call, Status -> gw_status_t with the message kept for
// gw_last_error(), and the exception barrier. capi/gradwire.cc defines them; other capi/*.cc
// files (compressed.cc) use them so that every part of the C ABI reports errors and checks
// handles and arguments the same way.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>

#include "capi/session.h"
#include "core/status.h"
#include "gradwire/gradwire.h"

#define GW_EXPORT extern "C" __attribute__((visibility("default")))

namespace gw::capi {

// Stores "call: message" for gw_last_error() on this thread and returns the matching code.
gw_status_t fail(const char* call, const Status& s);

// The Session of a live handle, or kInvalidArg (NULL, destroyed, foreign).
Result<std::shared_ptr<Session>> lookup(gw_comm_t comm);
// Same, and kAborted when the communicator was aborted.
Result<std::shared_ptr<Session>> usable(gw_comm_t comm);

// The raw bits of an enum argument. C callers may pass any int; loading such a value as the C++
// enum type would be undefined, so the bytes are copied instead and validated as an int.
template <typename E>
int raw_enum(const E& e) {
  static_assert(sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

// kInvalidArg unless v is a gw_dtype_t / gw_op_t enumerator.
Status check_dtype(int v);
Status check_op(int v);
// The most bytes a buffer (or the work of one call) may span: no 64-bit Linux process can address
// more (user space ends at 2^47 on x86-64, 2^56 with 5-level paging, 2^52 on arm64).
inline constexpr uint64_t kMaxBufferBytes = sizeof(void*) >= 8 ? (1ull << 57) : (1ull << 31);
// The bytes of count elements of dtype (checked), `blocks` times; kInvalidArg naming `arg` when
// that overflows size_t or exceeds kMaxBufferBytes (a count no buffer can hold is the caller's
// error, not a failed allocation deep inside the collective).
Result<size_t> buffer_bytes(const char* arg, size_t count, int dtype, size_t blocks = 1);
// kInvalidArg when p is NULL with bytes to transfer, or when p + bytes passes the end of the
// address space kMaxBufferBytes allows.
Status check_buffer(const char* name, const void* p, size_t bytes);

// Whether p is CUDA device memory (not managed memory: the CPU reads that in place), asked of the
// CUDA driver only when the process has it loaded (one attribute query for host memory). For
// device memory: *device = true when st takes it (Session::device_memory, direct mode), else
// kUnsupported naming `arg`. OK for host memory, *device untouched (capi/host_memory.cc).
Status check_memory(const Session& st, const char* arg, const void* p, bool* device);

// Registers a new request handle over `op` (capi/requests.cc); p2p_elem is the dtype's size for a
// point-to-point request (gw_wait_recv reports its count), 0 for the collectives' i-forms.
gw_request_t register_request(std::unique_ptr<SessionRequest> op, size_t p2p_elem);

// Runs an entry point's body: converts its Status, and every exception, to a gw_status_t.
template <typename F>
gw_status_t guarded(const char* call, F&& body) noexcept {
  try {
    Status s = body();
    if (s.ok()) return GW_OK;
    return fail(call, s);
  } catch (const std::bad_alloc&) {
    return fail(call, gw::no_memory("out of memory"));
  } catch (const std::length_error& e) {
    // A container asked for more than it can ever hold: a size too large for memory, not a bug.
    return fail(call, gw::no_memory("more memory than this process can hold ({})", e.what()));
  } catch (const std::exception& e) {
    return fail(call, gw::internal_error("unexpected exception: {}", e.what()));
  } catch (...) {
    return fail(call, gw::internal_error("unexpected non-standard exception"));
  }
}

}  // namespace gw::capi
