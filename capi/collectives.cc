// The C ABI's collectives: the blocking calls and their i-forms (gw_iallreduce, gw_ibroadcast,
// ...). Each checks its arguments here, once, whatever Session runs it (capi/session.h), and
// hands the Session the call.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "capi/capi_internal.h"
#include "capi/session.h"
#include "collectives/call.h"
#include "collectives/types.h"
#include "gradwire/gradwire.h"

using gw::Code;
using gw::Result;
using gw::Status;
using namespace gw::capi;  // NOLINT: this file implements gw::capi

namespace {

// Distinct buffers must not overlap (in place means exactly equal pointers).
Status check_overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  if (a == nullptr || b == nullptr || a == b || a_bytes == 0 || b_bytes == 0) {
    return gw::ok_status();
  }
  auto x = reinterpret_cast<uintptr_t>(a);
  auto y = reinterpret_cast<uintptr_t>(b);
  if (x < y + b_bytes && y < x + a_bytes) {
    return gw::invalid_arg("sendbuf and recvbuf overlap without being equal (in place)");
  }
  return gw::ok_status();
}

gw::coll::DataType dt(int d) { return static_cast<gw::coll::DataType>(d); }
gw::coll::ReduceOp rop(int o) { return static_cast<gw::coll::ReduceOp>(o); }

Status check_allreduce(const void* sendbuf, void* recvbuf, size_t count, int dtype, int op) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_RETURN_IF_ERROR(check_op(op));
  GW_ASSIGN_OR_RETURN(size_t bytes, buffer_bytes("count", count, dtype));
  GW_RETURN_IF_ERROR(check_buffer("sendbuf", sendbuf, bytes));
  GW_RETURN_IF_ERROR(check_buffer("recvbuf", recvbuf, bytes));
  GW_RETURN_IF_ERROR(check_host_memory("sendbuf", sendbuf));
  if (recvbuf != sendbuf) GW_RETURN_IF_ERROR(check_host_memory("recvbuf", recvbuf));
  return check_overlap(sendbuf, bytes, recvbuf, bytes);
}

// The checks of each collective's arguments (whatever runs it); each returns the call as data.
using gw::coll::CallKind;
using gw::coll::CollectiveCall;

CollectiveCall make_call(CallKind kind, const void* sendbuf, void* recvbuf, size_t count, int dtype,
                         int op, int root) {
  CollectiveCall c;
  c.kind = kind;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = count;
  c.dtype = dt(dtype);
  c.op = rop(op);
  c.root = root;
  return c;
}

Result<CollectiveCall> check_broadcast(const Session& st, void* buf, size_t count, int dtype,
                                       int root) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_ASSIGN_OR_RETURN(size_t bytes, buffer_bytes("count", count, dtype));
  GW_RETURN_IF_ERROR(check_buffer("buf", buf, bytes));
  GW_RETURN_IF_ERROR(check_host_memory("buf", buf));
  if (root < 0 || root >= st.size()) {
    return gw::invalid_arg("argument root {} is out of range for {} ranks", root, st.size());
  }
  return make_call(CallKind::kBroadcast, nullptr, buf, count, dtype, 0, root);
}

Result<CollectiveCall> check_allgather(const Session& st, const void* sendbuf, void* recvbuf,
                                       size_t sendcount, int dtype) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  // The whole first: a count that overflows with the rank count says so.
  GW_ASSIGN_OR_RETURN(size_t recv_bytes,
                      buffer_bytes("sendcount", sendcount, dtype, static_cast<size_t>(st.size())));
  GW_ASSIGN_OR_RETURN(size_t send_bytes, buffer_bytes("sendcount", sendcount, dtype));
  GW_RETURN_IF_ERROR(check_buffer("sendbuf", sendbuf, send_bytes));
  GW_RETURN_IF_ERROR(check_buffer("recvbuf", recvbuf, recv_bytes));
  GW_RETURN_IF_ERROR(check_host_memory("sendbuf", sendbuf));
  GW_RETURN_IF_ERROR(check_host_memory("recvbuf", recvbuf));
  // In place: sendbuf is this rank's block of recvbuf.
  const void* own_block = static_cast<const uint8_t*>(recvbuf) + st.rank() * send_bytes;
  if (sendbuf != own_block) {
    GW_RETURN_IF_ERROR(check_overlap(sendbuf, send_bytes, recvbuf, recv_bytes));
  }
  return make_call(CallKind::kAllgather, sendbuf, recvbuf, sendcount, dtype, 0, 0);
}

Result<CollectiveCall> check_reduce_scatter(const Session& st, const void* sendbuf, void* recvbuf,
                                            size_t recvcount, int dtype, int op) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_RETURN_IF_ERROR(check_op(op));
  GW_ASSIGN_OR_RETURN(size_t send_bytes,
                      buffer_bytes("recvcount", recvcount, dtype, static_cast<size_t>(st.size())));
  GW_ASSIGN_OR_RETURN(size_t recv_bytes, buffer_bytes("recvcount", recvcount, dtype));
  GW_RETURN_IF_ERROR(check_buffer("sendbuf", sendbuf, send_bytes));
  GW_RETURN_IF_ERROR(check_buffer("recvbuf", recvbuf, recv_bytes));
  GW_RETURN_IF_ERROR(check_host_memory("sendbuf", sendbuf));
  GW_RETURN_IF_ERROR(check_host_memory("recvbuf", recvbuf));
  const void* own_block = static_cast<const uint8_t*>(sendbuf) + st.rank() * recv_bytes;
  if (recvbuf != own_block) {
    GW_RETURN_IF_ERROR(check_overlap(sendbuf, send_bytes, recvbuf, recv_bytes));
  }
  return make_call(CallKind::kReduceScatter, sendbuf, recvbuf, recvcount, dtype, op, 0);
}

Result<CollectiveCall> check_alltoall(const Session& st, const void* sendbuf, void* recvbuf,
                                      size_t count, int dtype) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_ASSIGN_OR_RETURN(size_t bytes,
                      buffer_bytes("count", count, dtype, static_cast<size_t>(st.size())));
  GW_RETURN_IF_ERROR(check_buffer("sendbuf", sendbuf, bytes));
  GW_RETURN_IF_ERROR(check_buffer("recvbuf", recvbuf, bytes));
  GW_RETURN_IF_ERROR(check_host_memory("sendbuf", sendbuf));
  if (recvbuf != sendbuf) GW_RETURN_IF_ERROR(check_host_memory("recvbuf", recvbuf));
  GW_RETURN_IF_ERROR(check_overlap(sendbuf, bytes, recvbuf, bytes));
  return make_call(CallKind::kAlltoall, sendbuf, recvbuf, count, dtype, 0, 0);
}

// reduce, gather, scatter: coll::check_call's checks, then host memory.
Result<CollectiveCall> check_rooted(const Session& st, CallKind kind, const void* sendbuf,
                                    void* recvbuf, size_t count, int dtype, int op, int root) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  if (kind == CallKind::kReduce) GW_RETURN_IF_ERROR(check_op(op));
  if (root < 0 || root >= st.size()) {
    return gw::invalid_arg("argument root {} is out of range for {} ranks", root, st.size());
  }
  CollectiveCall c = make_call(kind, sendbuf, recvbuf, count, dtype, op, root);
  GW_RETURN_IF_ERROR(gw::coll::check_call(c, st.rank(), st.size()));
  GW_RETURN_IF_ERROR(check_host_memory("sendbuf", sendbuf));
  if (recvbuf != sendbuf) GW_RETURN_IF_ERROR(check_host_memory("recvbuf", recvbuf));
  return c;
}

Result<CollectiveCall> check_alltoallv(const Session& st, const void* sendbuf,
                                       const size_t* sendcounts, const size_t* sdispls,
                                       void* recvbuf, const size_t* recvcounts,
                                       const size_t* rdispls, int dtype) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  if (!sendcounts || !sdispls || !recvcounts || !rdispls) {
    return gw::invalid_arg(
        "arguments sendcounts, sdispls, recvcounts and rdispls must not be NULL");
  }
  CollectiveCall c = make_call(CallKind::kAlltoallv, sendbuf, recvbuf, 0, dtype, 0, 0);
  const auto p = static_cast<size_t>(st.size());
  c.sendcounts.assign(sendcounts, sendcounts + p);
  c.sdispls.assign(sdispls, sdispls + p);
  c.recvcounts.assign(recvcounts, recvcounts + p);
  c.rdispls.assign(rdispls, rdispls + p);
  GW_RETURN_IF_ERROR(gw::coll::check_call(c, st.rank(), st.size()));
  GW_RETURN_IF_ERROR(check_host_memory("sendbuf", sendbuf));
  if (recvbuf != sendbuf) GW_RETURN_IF_ERROR(check_host_memory("recvbuf", recvbuf));
  return c;
}

// An i-form: starts the checked call and hands out its request.
Status start_call(Session& st, Result<CollectiveCall> call, gw_request_t* request) {
  if (request == nullptr) return gw::invalid_arg("argument request (the output pointer) is NULL");
  if (!call.ok()) return call.status();
  GW_ASSIGN_OR_RETURN(std::unique_ptr<SessionRequest> op, st.start(*call));
  if (!op) return gw::internal_error("the session returned no operation");
  *request = register_request(std::move(op), 0);
  return gw::ok_status();
}

// A blocking call of a kind the Session has no method of its own for.
Status run_call(Session& st, Result<CollectiveCall> call) {
  if (!call.ok()) return call.status();
  return st.run(*call);
}

}  // namespace

GW_EXPORT gw_status_t gw_allreduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                   gw_dtype_t dtype_arg, gw_op_t op_arg) {
  return guarded("gw_allreduce", [&]() -> Status {
    const int dtype = raw_enum(dtype_arg);
    const int op = raw_enum(op_arg);
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    const DeviceMemoryScope device(*st);
    GW_RETURN_IF_ERROR(check_allreduce(sendbuf, recvbuf, count, dtype, op));
    return st->allreduce(sendbuf, recvbuf, count, dt(dtype), rop(op));
  });
}

GW_EXPORT gw_status_t gw_broadcast(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype,
                                   int root) {
  return guarded("gw_broadcast", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    const DeviceMemoryScope device(*st);
    GW_ASSIGN_OR_RETURN(auto c, check_broadcast(*st, buf, count, raw_enum(dtype), root));
    return st->broadcast(buf, count, c.dtype, root);
  });
}

GW_EXPORT gw_status_t gw_allgather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                   size_t sendcount, gw_dtype_t dtype) {
  return guarded("gw_allgather", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    const DeviceMemoryScope device(*st);
    GW_ASSIGN_OR_RETURN(auto c, check_allgather(*st, sendbuf, recvbuf, sendcount, raw_enum(dtype)));
    return st->allgather(sendbuf, recvbuf, sendcount, c.dtype);
  });
}

GW_EXPORT gw_status_t gw_reduce_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                        size_t recvcount, gw_dtype_t dtype, gw_op_t op) {
  return guarded("gw_reduce_scatter", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    const DeviceMemoryScope device(*st);
    GW_ASSIGN_OR_RETURN(auto c, check_reduce_scatter(*st, sendbuf, recvbuf, recvcount,
                                                     raw_enum(dtype), raw_enum(op)));
    return st->reduce_scatter(sendbuf, recvbuf, recvcount, c.dtype, c.op);
  });
}

GW_EXPORT gw_status_t gw_alltoall(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                  gw_dtype_t dtype) {
  return guarded("gw_alltoall", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    const DeviceMemoryScope device(*st);
    GW_ASSIGN_OR_RETURN(auto c, check_alltoall(*st, sendbuf, recvbuf, count, raw_enum(dtype)));
    return st->alltoall(sendbuf, recvbuf, count, c.dtype);
  });
}

GW_EXPORT gw_status_t gw_barrier(gw_comm_t comm) {
  return guarded("gw_barrier", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return st->barrier();
  });
}

GW_EXPORT gw_status_t gw_reduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                gw_dtype_t dtype, gw_op_t op, int root) {
  return guarded("gw_reduce", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return run_call(*st, check_rooted(*st, CallKind::kReduce, sendbuf, recvbuf, count,
                                      raw_enum(dtype), raw_enum(op), root));
  });
}

GW_EXPORT gw_status_t gw_gather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                size_t sendcount, gw_dtype_t dtype, int root) {
  return guarded("gw_gather", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return run_call(*st, check_rooted(*st, CallKind::kGather, sendbuf, recvbuf, sendcount,
                                      raw_enum(dtype), 0, root));
  });
}

GW_EXPORT gw_status_t gw_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                 size_t recvcount, gw_dtype_t dtype, int root) {
  return guarded("gw_scatter", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return run_call(*st, check_rooted(*st, CallKind::kScatter, sendbuf, recvbuf, recvcount,
                                      raw_enum(dtype), 0, root));
  });
}

GW_EXPORT gw_status_t gw_alltoallv(gw_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                   const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                   const size_t* rdispls, gw_dtype_t dtype) {
  return guarded("gw_alltoallv", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return run_call(*st, check_alltoallv(*st, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                         rdispls, raw_enum(dtype)));
  });
}

// ---- the i-forms ------------------------------------------------------------------------------

GW_EXPORT gw_status_t gw_iallreduce(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                    size_t count, gw_dtype_t dtype_arg, gw_op_t op_arg,
                                    gw_request_t* request) {
  return guarded("gw_iallreduce", [&]() -> Status {
    const int dtype = raw_enum(dtype_arg);
    const int op = raw_enum(op_arg);
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    if (request == nullptr) return gw::invalid_arg("argument request (the output pointer) is NULL");
    GW_RETURN_IF_ERROR(check_allreduce(sendbuf, recvbuf, count, dtype, op));
    GW_ASSIGN_OR_RETURN(std::unique_ptr<SessionRequest> handle,
                        st->iallreduce(sendbuf, recvbuf, count, dt(dtype), rop(op)));
    if (!handle) return gw::internal_error("iallreduce returned no operation");
    *request = register_request(std::move(handle), 0);
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_ibroadcast(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype,
                                    int root, gw_request_t* request) {
  return guarded("gw_ibroadcast", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(*st, check_broadcast(*st, buf, count, raw_enum(dtype), root), request);
  });
}

GW_EXPORT gw_status_t gw_iallgather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                    size_t sendcount, gw_dtype_t dtype, gw_request_t* request) {
  return guarded("gw_iallgather", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(*st, check_allgather(*st, sendbuf, recvbuf, sendcount, raw_enum(dtype)),
                      request);
  });
}

GW_EXPORT gw_status_t gw_ireduce_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                         size_t recvcount, gw_dtype_t dtype, gw_op_t op,
                                         gw_request_t* request) {
  return guarded("gw_ireduce_scatter", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(
        *st, check_reduce_scatter(*st, sendbuf, recvbuf, recvcount, raw_enum(dtype), raw_enum(op)),
        request);
  });
}

GW_EXPORT gw_status_t gw_ialltoall(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                   gw_dtype_t dtype, gw_request_t* request) {
  return guarded("gw_ialltoall", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(*st, check_alltoall(*st, sendbuf, recvbuf, count, raw_enum(dtype)), request);
  });
}

GW_EXPORT gw_status_t gw_ialltoallv(gw_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                    const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                    const size_t* rdispls, gw_dtype_t dtype,
                                    gw_request_t* request) {
  return guarded("gw_ialltoallv", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(*st,
                      check_alltoallv(*st, sendbuf, sendcounts, sdispls, recvbuf, recvcounts,
                                      rdispls, raw_enum(dtype)),
                      request);
  });
}

GW_EXPORT gw_status_t gw_ireduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                 gw_dtype_t dtype, gw_op_t op, int root, gw_request_t* request) {
  return guarded("gw_ireduce", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(*st,
                      check_rooted(*st, CallKind::kReduce, sendbuf, recvbuf, count, raw_enum(dtype),
                                   raw_enum(op), root),
                      request);
  });
}

GW_EXPORT gw_status_t gw_igather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                 size_t sendcount, gw_dtype_t dtype, int root,
                                 gw_request_t* request) {
  return guarded("gw_igather", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(
        *st,
        check_rooted(*st, CallKind::kGather, sendbuf, recvbuf, sendcount, raw_enum(dtype), 0, root),
        request);
  });
}

GW_EXPORT gw_status_t gw_iscatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                  size_t recvcount, gw_dtype_t dtype, int root,
                                  gw_request_t* request) {
  return guarded("gw_iscatter", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(*st,
                      check_rooted(*st, CallKind::kScatter, sendbuf, recvbuf, recvcount,
                                   raw_enum(dtype), 0, root),
                      request);
  });
}

GW_EXPORT gw_status_t gw_ibarrier(gw_comm_t comm, gw_request_t* request) {
  return guarded("gw_ibarrier", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    return start_call(*st, make_call(CallKind::kBarrier, nullptr, nullptr, 0, 0, 0, 0), request);
  });
}
