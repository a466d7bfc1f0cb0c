// The C ABI's requests (gw_wait, gw_test, gw_wait_recv, gw_test_recv) and point-to-point
// (gw_send, gw_recv, gw_isend, gw_irecv): a registry of live request handles, each over a
// SessionRequest (capi/session.h). The collectives' i-forms register theirs through
// register_request (capi_internal.h).
#include <fmt/format.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "capi/capi_internal.h"
#include "capi/device_staging.h"
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

struct RequestState {
  std::mutex mu;  // one wait/test at a time per request
  bool finished = false;
  // Does not hold the session: gw_comm_destroy frees it while requests are outstanding (a
  // SessionRequest outlives its Session and then reports the abort).
  std::unique_ptr<SessionRequest> op;
  size_t elem = 0;  // point-to-point requests: the dtype's size (0: another kind)
};
}  // namespace

struct gw_request {
  uint64_t magic = kRequestMagic;
  std::shared_ptr<RequestState> state;
};

namespace {

// Live request handles. Allocated once and never freed, so calls made during static destruction
// still find it.
struct Registry {
  std::mutex mu;
  std::unordered_set<gw_request*> requests;
};

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

gw::coll::DataType dt(int d) { return static_cast<gw::coll::DataType>(d); }

}  // namespace

namespace gw::capi {

gw_request_t register_request(std::unique_ptr<SessionRequest> op, size_t p2p_elem) {
  auto rs = std::make_shared<RequestState>();
  rs->op = std::move(op);
  rs->elem = p2p_elem;
  auto* raw = new gw_request();
  raw->state = std::move(rs);
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  reg.requests.insert(raw);
  return raw;
}

}  // namespace gw::capi

namespace {

// Finds a live request. The handle is only dereferenced under the registry lock; callers work on
// the shared state, so a request completed by another thread meanwhile is never freed under them.
Result<std::shared_ptr<RequestState>> lookup_request(gw_request_t request) {
  if (request == nullptr) return gw::invalid_arg("argument request is NULL");
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  if (reg.requests.count(request) == 0 || request->magic != kRequestMagic) {
    return gw::invalid_arg("request was already completed or is not a gradwire request");
  }
  return request->state;
}

// Frees the handle of a finished request (the caller holds the state's mutex).
void retire(gw_request_t request, RequestState& state) {
  state.finished = true;
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  if (reg.requests.erase(request) != 0) {
    request->magic = 0;
    delete request;
  }
}

Status already_completed() {
  return gw::invalid_arg("request was already completed or is not a gradwire request");
}

}  // namespace

GW_EXPORT gw_status_t gw_wait(gw_request_t request, int timeout_ms) {
  return guarded("gw_wait", [&]() -> Status {
    if (timeout_ms < -1) return gw::invalid_arg("argument timeout_ms {} < -1", timeout_ms);
    GW_ASSIGN_OR_RETURN(auto rs, lookup_request(request));
    std::lock_guard<std::mutex> held(rs->mu);
    if (rs->finished) return already_completed();
    Status s = rs->op->wait(timeout_ms);
    if (s.code() == Code::kTimeout) {
      // Still running (the request stays valid), or did the op itself end in a timeout?
      bool done = false;
      Status t = rs->op->test(&done);
      if (!done) return gw::timeout_error("request still running after {} ms", timeout_ms);
      s = t;
    }
    retire(request, *rs);
    return s;
  });
}

GW_EXPORT gw_status_t gw_test(gw_request_t request, int* done) {
  return guarded("gw_test", [&]() -> Status {
    if (done == nullptr) return gw::invalid_arg("argument done (the output pointer) is NULL");
    GW_ASSIGN_OR_RETURN(auto rs, lookup_request(request));
    std::lock_guard<std::mutex> held(rs->mu);
    if (rs->finished) return already_completed();
    bool finished = false;
    Status s = rs->op->test(&finished);
    if (!finished) {
      *done = 0;
      return gw::ok_status();
    }
    *done = 1;
    retire(request, *rs);
    return s;
  });
}

// ---- point-to-point ---------------------------------------------------------------------------

namespace {

// Checks a point-to-point call's arguments and starts it; *request gets the handle.
Status start_p2p(gw_comm_t comm, bool send, const void* buf, size_t count, int dtype, int peer,
                 int tag, gw_request_t* request) {
  GW_ASSIGN_OR_RETURN(auto st, usable(comm));
  if (request == nullptr) return gw::invalid_arg("argument request (the output pointer) is NULL");
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
  gw_request_t raw = register_request(std::move(op), gw::coll::dtype_size(dt(dtype)));
  *request = raw;
  return gw::ok_status();
}

// Waits for (timeout_ms >= -1) or tests (done != nullptr) a point-to-point request and reports
// its count and source once it ended well.
Status finish_p2p(gw_request_t request, int timeout_ms, int* done, size_t* count, int* source) {
  GW_ASSIGN_OR_RETURN(auto rs, lookup_request(request));
  std::lock_guard<std::mutex> held(rs->mu);
  if (rs->finished) return already_completed();
  if (rs->elem == 0) {
    return gw::invalid_arg("request is not a point-to-point request (use gw_wait/gw_test)");
  }
  Status s;
  if (done != nullptr) {
    bool finished = false;
    s = rs->op->test(&finished);
    if (!finished) {
      *done = 0;
      return gw::ok_status();
    }
    *done = 1;
  } else {
    s = rs->op->wait(timeout_ms);
    if (s.code() == Code::kTimeout) {
      bool finished = false;
      Status t = rs->op->test(&finished);
      if (!finished) return gw::timeout_error("request still running after {} ms", timeout_ms);
      s = t;
    }
  }
  if (s.ok()) {
    size_t bytes = 0;
    int src = -1;
    rs->op->p2p_result(&bytes, &src);
    if (count != nullptr) *count = bytes / rs->elem;
    if (source != nullptr) *source = src;
  }
  retire(request, *rs);
  return s;
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
    gw_request_t req = nullptr;
    GW_RETURN_IF_ERROR(start_p2p(comm, true, buf, count, raw_enum(dtype), peer, tag, &req));
    return finish_p2p(req, -1, nullptr, nullptr, nullptr);
  });
}

GW_EXPORT gw_status_t gw_recv(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype, int peer,
                              int tag) {
  return guarded("gw_recv", [&]() -> Status {
    gw_request_t req = nullptr;
    GW_RETURN_IF_ERROR(start_p2p(comm, false, buf, count, raw_enum(dtype), peer, tag, &req));
    return finish_p2p(req, -1, nullptr, nullptr, nullptr);
  });
}

GW_EXPORT gw_status_t gw_wait_recv(gw_request_t request, int timeout_ms, size_t* count,
                                   int* source) {
  return guarded("gw_wait_recv", [&]() -> Status {
    if (timeout_ms < -1) return gw::invalid_arg("argument timeout_ms {} < -1", timeout_ms);
    return finish_p2p(request, timeout_ms, nullptr, count, source);
  });
}

GW_EXPORT gw_status_t gw_test_recv(gw_request_t request, int* done, size_t* count, int* source) {
  return guarded("gw_test_recv", [&]() -> Status {
    if (done == nullptr) return gw::invalid_arg("argument done (the output pointer) is NULL");
    return finish_p2p(request, 0, done, count, source);
  });
}
