// The C ABI's requests (gw_wait, gw_test, gw_wait_recv, gw_test_recv) and point-to-point
// (gw_send, gw_recv, gw_isend, gw_irecv): request handles are reused slots of a table
// (capi/handle_table.h), each over a SessionRequest (capi/session.h); the collectives' i-forms
// register theirs through register_request (capi_internal.h). The blocking gw_send/gw_recv wait on
// their operation in place and make no handle at all.
#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "capi/capi_internal.h"
#include "capi/device_staging.h"
#include "capi/handle_table.h"
#include "capi/session.h"
#include "collectives/call.h"
#include "collectives/types.h"
#include "gradwire/gradwire.h"

using gw::Code;
using gw::Result;
using gw::Status;
using namespace gw::capi;  // NOLINT: this file implements gw::capi

namespace {
constexpr uint64_t kRequestMagic = 0x3152716552774747ull;  // "GGwReqR1"
}  // namespace

// A slot of the request table (capi/handle_table.h): reused, never freed, so that no message
// allocates a handle. Every change of a live slot happens under mu; a call finds the slot without
// a lock (the table's contains), then takes mu and checks magic: one wait/test at a time per
// request, and a request completed meanwhile by another thread is reported, not run twice.
struct gw_request {
  std::mutex mu;
  uint64_t magic = 0;  // kRequestMagic while live (under mu)
  // Does not hold the session: gw_comm_destroy frees it while requests are outstanding (a
  // SessionRequest outlives its Session and then reports the abort).
  std::unique_ptr<SessionRequest> op;
  size_t elem = 0;  // point-to-point requests: the dtype's size (0: another kind)
};

namespace {

using RequestTable = gw::capi::HandleTable<gw_request>;

gw::coll::DataType dt(int d) { return static_cast<gw::coll::DataType>(d); }

Status already_completed() {
  return gw::invalid_arg("request was already completed or is not a gradwire request");
}

// The slot of a live request, its mu held by *lock.
Result<gw_request*> lock_request(gw_request_t request, std::unique_lock<std::mutex>* lock) {
  if (request == nullptr) return gw::invalid_arg("argument request is NULL");
  if (!RequestTable::instance().contains(request)) return already_completed();
  *lock = std::unique_lock<std::mutex>(request->mu);
  if (request->magic != kRequestMagic) return already_completed();
  return request;
}

// Ends a finished request's handle (the caller holds its mu through *lock) and gives the slot
// back once the lock is released.
void retire(gw_request* request, std::unique_lock<std::mutex>* lock) {
  request->magic = 0;
  std::unique_ptr<SessionRequest> op = std::move(request->op);
  lock->unlock();
  op.reset();
  RequestTable::instance().release(request);
}

}  // namespace

namespace gw::capi {

gw_request_t register_request(std::unique_ptr<SessionRequest> op, size_t p2p_elem) {
  gw_request* r = RequestTable::instance().acquire();
  if (r == nullptr) throw std::bad_alloc();  // guarded() reports it as out of memory
  std::lock_guard<std::mutex> lock(r->mu);
  r->op = std::move(op);
  r->elem = p2p_elem;
  r->magic = kRequestMagic;
  return r;
}

}  // namespace gw::capi

namespace {

// Waits for (timeout_ms >= -1) or tests (done != nullptr) an operation. *ended: it ended, and the
// result is its final status (else OK or kTimeout: still running, the request stays valid).
Status finish_op(SessionRequest& op, int timeout_ms, int* done, bool* ended) {
  *ended = false;
  if (done != nullptr) {
    bool finished = false;
    Status s = op.test(&finished);
    *done = finished ? 1 : 0;
    *ended = finished;
    return finished ? s : gw::ok_status();
  }
  Status s = op.wait(timeout_ms);
  if (s.code() == Code::kTimeout) {
    // Still running (the request stays valid), or did the op itself end in a timeout?
    bool finished = false;
    Status t = op.test(&finished);
    if (!finished) return gw::timeout_error("request still running after {} ms", timeout_ms);
    s = t;
  }
  *ended = true;
  return s;
}

// A point-to-point op that ended well: its count (in elements of elem bytes) and source.
void p2p_outputs(const SessionRequest& op, size_t elem, size_t* count, int* source) {
  size_t bytes = 0;
  int src = -1;
  op.p2p_result(&bytes, &src);
  if (count != nullptr) *count = bytes / elem;
  if (source != nullptr) *source = src;
}

// gw_wait/gw_test (p2p false) and gw_wait_recv/gw_test_recv (p2p true) on a request handle.
Status finish_request(gw_request_t request, bool p2p, int timeout_ms, int* done, size_t* count,
                      int* source) {
  std::unique_lock<std::mutex> lock;
  GW_ASSIGN_OR_RETURN(gw_request * r, lock_request(request, &lock));
  if (p2p && r->elem == 0) {
    return gw::invalid_arg("request is not a point-to-point request (use gw_wait/gw_test)");
  }
  bool ended = false;
  Status s = finish_op(*r->op, timeout_ms, done, &ended);
  if (!ended) return s;
  if (p2p && s.ok()) p2p_outputs(*r->op, r->elem, count, source);
  retire(r, &lock);
  return s;
}

}  // namespace

GW_EXPORT gw_status_t gw_wait(gw_request_t request, int timeout_ms) {
  return guarded("gw_wait", [&]() -> Status {
    if (timeout_ms < -1) return gw::invalid_arg("argument timeout_ms {} < -1", timeout_ms);
    return finish_request(request, false, timeout_ms, nullptr, nullptr, nullptr);
  });
}

GW_EXPORT gw_status_t gw_test(gw_request_t request, int* done) {
  return guarded("gw_test", [&]() -> Status {
    if (done == nullptr) return gw::invalid_arg("argument done (the output pointer) is NULL");
    return finish_request(request, false, 0, done, nullptr, nullptr);
  });
}

// ---- point-to-point ---------------------------------------------------------------------------

namespace {

// Checks a point-to-point call's arguments and starts it: its operation and the session it runs
// on (held by the caller while it waits: gw_comm_destroy waits for such calls to return).
Status start_op(gw_comm_t comm, bool send, const void* buf, size_t count, int dtype, int peer,
                int tag, std::shared_ptr<Session>* session, std::unique_ptr<SessionRequest>* out) {
  GW_ASSIGN_OR_RETURN(auto st, usable(comm));
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_ASSIGN_OR_RETURN(size_t bytes, buffer_bytes("count", count, dtype));
  GW_RETURN_IF_ERROR(check_buffer("buf", buf, bytes));
  if (tag < 0) return gw::invalid_arg("argument tag {} is negative (tags are >= 0)", tag);
  const int lowest = send ? 0 : GW_ANY_SOURCE;
  if (peer < lowest || peer >= st->size()) {
    return gw::invalid_arg("argument peer {} is not a rank of this communicator (0..{}){}", peer,
                           st->size() - 1, send ? "" : " nor GW_ANY_SOURCE (-1)");
  }
  bool device = false;
  GW_RETURN_IF_ERROR(check_memory(*st, "buf", buf, &device));
  std::unique_ptr<SessionRequest> op;
  if (device) {
    GW_ASSIGN_OR_RETURN(op, p2p_staged(*st, send, const_cast<void*>(buf), bytes, peer, tag));
  } else if (send) {
    GW_ASSIGN_OR_RETURN(op, st->isend(buf, bytes, peer, tag));
  } else {
    GW_ASSIGN_OR_RETURN(op, st->irecv(const_cast<void*>(buf), bytes, peer, tag));
  }
  if (!op) return gw::internal_error("point-to-point call returned no operation");
  *session = std::move(st);
  *out = std::move(op);
  return gw::ok_status();
}

// gw_isend / gw_irecv: the operation behind a new request handle.
Status start_p2p(gw_comm_t comm, bool send, const void* buf, size_t count, int dtype, int peer,
                 int tag, gw_request_t* request) {
  if (request == nullptr) {
    GW_RETURN_IF_ERROR(usable(comm).status());
    return gw::invalid_arg("argument request (the output pointer) is NULL");
  }
  std::shared_ptr<Session> st;
  std::unique_ptr<SessionRequest> op;
  GW_RETURN_IF_ERROR(start_op(comm, send, buf, count, dtype, peer, tag, &st, &op));
  *request = register_request(std::move(op), gw::coll::dtype_size(dt(dtype)));
  return gw::ok_status();
}

// gw_send / gw_recv: the operation waited for in place, no request handle at all.
Status blocking_p2p(gw_comm_t comm, bool send, const void* buf, size_t count, int dtype, int peer,
                    int tag) {
  std::shared_ptr<Session> st;
  std::unique_ptr<SessionRequest> op;
  GW_RETURN_IF_ERROR(start_op(comm, send, buf, count, dtype, peer, tag, &st, &op));
  bool ended = false;
  return finish_op(*op, -1, nullptr, &ended);
}

}  // namespace

GW_EXPORT gw_status_t gw_isend(gw_comm_t comm, const void* buf, size_t count, gw_dtype_t dtype,
                               int peer, int tag, gw_request_t* request) {
  return guarded("gw_isend", [&]() -> Status {
    return start_p2p(comm, true, buf, count, raw_enum(dtype), peer, tag, request);
  });
}

GW_EXPORT gw_status_t gw_irecv(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype, int peer,
                               int tag, gw_request_t* request) {
  return guarded("gw_irecv", [&]() -> Status {
    return start_p2p(comm, false, buf, count, raw_enum(dtype), peer, tag, request);
  });
}

GW_EXPORT gw_status_t gw_send(gw_comm_t comm, const void* buf, size_t count, gw_dtype_t dtype,
                              int peer, int tag) {
  return guarded("gw_send", [&]() -> Status {
    return blocking_p2p(comm, true, buf, count, raw_enum(dtype), peer, tag);
  });
}

GW_EXPORT gw_status_t gw_recv(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype, int peer,
                              int tag) {
  return guarded("gw_recv", [&]() -> Status {
    return blocking_p2p(comm, false, buf, count, raw_enum(dtype), peer, tag);
  });
}

GW_EXPORT gw_status_t gw_wait_recv(gw_request_t request, int timeout_ms, size_t* count,
                                   int* source) {
  return guarded("gw_wait_recv", [&]() -> Status {
    if (timeout_ms < -1) return gw::invalid_arg("argument timeout_ms {} < -1", timeout_ms);
    return finish_request(request, true, timeout_ms, nullptr, count, source);
  });
}

GW_EXPORT gw_status_t gw_test_recv(gw_request_t request, int* done, size_t* count, int* source) {
  return guarded("gw_test_recv", [&]() -> Status {
    if (done == nullptr) return gw::invalid_arg("argument done (the output pointer) is NULL");
    return finish_request(request, true, 0, done, count, source);
  });
}
