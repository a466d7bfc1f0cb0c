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

// Both buffers of a call that may be in place (sendbuf == recvbuf: one query).
Status check_pair(const Session& st, const void* sendbuf, const void* recvbuf, DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(check_memory(st, "sendbuf", sendbuf, &dev->send));
  if (recvbuf == sendbuf) {
    dev->recv = dev->send;
    return gw::ok_status();
  }
  return check_memory(st, "recvbuf", recvbuf, &dev->recv);
}

gw::coll::DataType dt(int d) { return static_cast<gw::coll::DataType>(d); }
gw::coll::ReduceOp rop(int o) { return static_cast<gw::coll::ReduceOp>(o); }

Status check_allreduce(const Session& st, const void* sendbuf, void* recvbuf, size_t count,
                       int dtype, int op, DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_RETURN_IF_ERROR(check_op(op));
  GW_ASSIGN_OR_RETURN(size_t bytes, buffer_bytes("count", count, dtype));
  GW_RETURN_IF_ERROR(check_buffer("sendbuf", sendbuf, bytes));
  GW_RETURN_IF_ERROR(check_buffer("recvbuf", recvbuf, bytes));
  GW_RETURN_IF_ERROR(check_pair(st, sendbuf, recvbuf, dev));
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
                                       int root, DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_ASSIGN_OR_RETURN(size_t bytes, buffer_bytes("count", count, dtype));
  GW_RETURN_IF_ERROR(check_buffer("buf", buf, bytes));
  GW_RETURN_IF_ERROR(check_memory(st, "buf", buf, &dev->recv));
  if (root < 0 || root >= st.size()) {
    return gw::invalid_arg("argument root {} is out of range for {} ranks", root, st.size());
  }
  return make_call(CallKind::kBroadcast, nullptr, buf, count, dtype, 0, root);
}

// allgather (the receive buffer holds every rank's block) and reduce_scatter (the send buffer
// does): the buffers' sizes, then host memory, then no overlap unless the block buffer is this
// rank's block of the whole one (in place). The whole's size first: a count that overflows with
// the rank count says so.
Status check_blocks(const Session& st, const char* count_name, const void* sendbuf,
                    const void* recvbuf, size_t count, int dtype, bool send_is_whole,
                    DeviceFlags* dev) {
  GW_ASSIGN_OR_RETURN(size_t whole,
                      buffer_bytes(count_name, count, dtype, static_cast<size_t>(st.size())));
  GW_ASSIGN_OR_RETURN(size_t block, buffer_bytes(count_name, count, dtype));
  const size_t send_bytes = send_is_whole ? whole : block;
  const size_t recv_bytes = send_is_whole ? block : whole;
  GW_RETURN_IF_ERROR(check_buffer("sendbuf", sendbuf, send_bytes));
  GW_RETURN_IF_ERROR(check_buffer("recvbuf", recvbuf, recv_bytes));
  GW_RETURN_IF_ERROR(check_memory(st, "sendbuf", sendbuf, &dev->send));
  GW_RETURN_IF_ERROR(check_memory(st, "recvbuf", recvbuf, &dev->recv));
  const void* whole_buf = send_is_whole ? sendbuf : recvbuf;
  const void* block_buf = send_is_whole ? recvbuf : sendbuf;
  if (block_buf != static_cast<const uint8_t*>(whole_buf) + st.rank() * block) {
    GW_RETURN_IF_ERROR(check_overlap(sendbuf, send_bytes, recvbuf, recv_bytes));
  }
  return gw::ok_status();
}

Result<CollectiveCall> check_allgather(const Session& st, const void* sendbuf, void* recvbuf,
                                       size_t sendcount, int dtype, DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_RETURN_IF_ERROR(check_blocks(st, "sendcount", sendbuf, recvbuf, sendcount, dtype, false, dev));
  return make_call(CallKind::kAllgather, sendbuf, recvbuf, sendcount, dtype, 0, 0);
}

Result<CollectiveCall> check_reduce_scatter(const Session& st, const void* sendbuf, void* recvbuf,
                                            size_t recvcount, int dtype, int op, DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_RETURN_IF_ERROR(check_op(op));
  GW_RETURN_IF_ERROR(check_blocks(st, "recvcount", sendbuf, recvbuf, recvcount, dtype, true, dev));
  return make_call(CallKind::kReduceScatter, sendbuf, recvbuf, recvcount, dtype, op, 0);
}

Result<CollectiveCall> check_alltoall(const Session& st, const void* sendbuf, void* recvbuf,
                                      size_t count, int dtype, DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  GW_ASSIGN_OR_RETURN(size_t bytes,
                      buffer_bytes("count", count, dtype, static_cast<size_t>(st.size())));
  GW_RETURN_IF_ERROR(check_buffer("sendbuf", sendbuf, bytes));
  GW_RETURN_IF_ERROR(check_buffer("recvbuf", recvbuf, bytes));
  GW_RETURN_IF_ERROR(check_pair(st, sendbuf, recvbuf, dev));
  GW_RETURN_IF_ERROR(check_overlap(sendbuf, bytes, recvbuf, bytes));
  return make_call(CallKind::kAlltoall, sendbuf, recvbuf, count, dtype, 0, 0);
}

// coll::check_call's checks, then host memory (recvbuf may be sendbuf: in place).
Result<CollectiveCall> checked_call(const Session& st, CollectiveCall c, DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(gw::coll::check_call(c, st.rank(), st.size()));
  GW_RETURN_IF_ERROR(check_pair(st, c.sendbuf, c.recvbuf, dev));
  return c;
}

// reduce, gather, scatter: coll::check_call's checks, then host memory.
Result<CollectiveCall> check_rooted(const Session& st, CallKind kind, const void* sendbuf,
                                    void* recvbuf, size_t count, int dtype, int op, int root,
                                    DeviceFlags* dev) {
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  if (kind == CallKind::kReduce) GW_RETURN_IF_ERROR(check_op(op));
  if (root < 0 || root >= st.size()) {
    return gw::invalid_arg("argument root {} is out of range for {} ranks", root, st.size());
  }
  return checked_call(st, make_call(kind, sendbuf, recvbuf, count, dtype, op, root), dev);
}

Result<CollectiveCall> check_alltoallv(const Session& st, const void* sendbuf,
                                       const size_t* sendcounts, const size_t* sdispls,
                                       void* recvbuf, const size_t* recvcounts,
                                       const size_t* rdispls, int dtype, DeviceFlags* dev) {
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
  return checked_call(st, std::move(c), dev);
}

Status check_request(gw_request_t* request) {
  if (request == nullptr) return gw::invalid_arg("argument request (the output pointer) is NULL");
  return gw::ok_status();
}

// An i-form's last step: the started operation becomes the caller's request.
Status hand_out(Result<std::unique_ptr<SessionRequest>> op, const char* who,
                gw_request_t* request) {
  if (!op.ok()) return op.status();
  if (!*op) return gw::internal_error("{} returned no operation", who);
  *request = register_request(std::move(*op), 0);
  return gw::ok_status();
}

// An i-form: starts the checked call and hands out its request.
Status start_call(Session& st, Result<CollectiveCall> call, DeviceFlags dev,
                  gw_request_t* request) {
  GW_RETURN_IF_ERROR(check_request(request));
  if (!call.ok()) return call.status();
  if (dev.any()) return hand_out(start_staged(st, *call, dev, false), "the session", request);
  return hand_out(st.start(*call), "the session", request);
}

// A blocking call of a kind the Session has no method of its own for.
Status run_call(Session& st, Result<CollectiveCall> call, DeviceFlags dev) {
  if (!call.ok()) return call.status();
  if (dev.any()) return run_staged(st, *call, dev);
  return st.run(*call);
}

// A blocking entry point for a kind the Session has no method of its own for: the
// communicator, the call `check` makes of the arguments (and which are device memory), its run
// (staged when some are: device_staging.h).
template <typename Check>
gw_status_t run_form(const char* name, gw_comm_t comm, Check&& check) {
  return guarded(name, [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    DeviceFlags dev;  // which buffers check() found to be device memory
    Result<CollectiveCall> call = check(*st, &dev);
    return run_call(*st, std::move(call), dev);
  });
}

// An i-form's entry point: the communicator, the call `check` makes of the arguments, its start.
template <typename Check>
gw_status_t start_form(const char* name, gw_comm_t comm, gw_request_t* request, Check&& check) {
  return guarded(name, [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    DeviceFlags dev;
    Result<CollectiveCall> call = check(*st, &dev);
    return start_call(*st, std::move(call), dev, request);
  });
}

}  // namespace

GW_EXPORT gw_status_t gw_allreduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                   gw_dtype_t dtype_arg, gw_op_t op_arg) {
  return guarded("gw_allreduce", [&]() -> Status {
    const int dtype = raw_enum(dtype_arg);
    const int op = raw_enum(op_arg);
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    DeviceFlags dev;
    GW_RETURN_IF_ERROR(check_allreduce(*st, sendbuf, recvbuf, count, dtype, op, &dev));
    if (dev.any()) {
      const auto c = make_call(CallKind::kAllreduce, sendbuf, recvbuf, count, dtype, op, 0);
      return st->takes_device_memory() ? st->device_collective(c) : run_staged(*st, c, dev);
    }
    return st->allreduce(sendbuf, recvbuf, count, dt(dtype), rop(op));
  });
}

GW_EXPORT gw_status_t gw_broadcast(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype,
                                   int root) {
  return guarded("gw_broadcast", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    DeviceFlags dev;
    GW_ASSIGN_OR_RETURN(auto c, check_broadcast(*st, buf, count, raw_enum(dtype), root, &dev));
    if (dev.any()) {
      return st->takes_device_memory() ? st->device_collective(c) : run_staged(*st, c, dev);
    }
    return st->broadcast(buf, count, c.dtype, root);
  });
}

GW_EXPORT gw_status_t gw_allgather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                   size_t sendcount, gw_dtype_t dtype) {
  return guarded("gw_allgather", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    DeviceFlags dev;
    GW_ASSIGN_OR_RETURN(auto c,
                        check_allgather(*st, sendbuf, recvbuf, sendcount, raw_enum(dtype), &dev));
    if (dev.any()) {
      return st->takes_device_memory() ? st->device_collective(c) : run_staged(*st, c, dev);
    }
    return st->allgather(sendbuf, recvbuf, sendcount, c.dtype);
  });
}

GW_EXPORT gw_status_t gw_reduce_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                        size_t recvcount, gw_dtype_t dtype, gw_op_t op) {
  return guarded("gw_reduce_scatter", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    DeviceFlags dev;
    GW_ASSIGN_OR_RETURN(auto c, check_reduce_scatter(*st, sendbuf, recvbuf, recvcount,
                                                     raw_enum(dtype), raw_enum(op), &dev));
    if (dev.any()) {
      return st->takes_device_memory() ? st->device_collective(c) : run_staged(*st, c, dev);
    }
    return st->reduce_scatter(sendbuf, recvbuf, recvcount, c.dtype, c.op);
  });
}

GW_EXPORT gw_status_t gw_alltoall(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                  gw_dtype_t dtype) {
  return guarded("gw_alltoall", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    DeviceFlags dev;
    GW_ASSIGN_OR_RETURN(auto c,
                        check_alltoall(*st, sendbuf, recvbuf, count, raw_enum(dtype), &dev));
    if (dev.any()) {
      return st->takes_device_memory() ? st->device_collective(c) : run_staged(*st, c, dev);
    }
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
  return run_form("gw_reduce", comm, [&](const Session& st, DeviceFlags* dev) {
    return check_rooted(st, CallKind::kReduce, sendbuf, recvbuf, count, raw_enum(dtype),
                        raw_enum(op), root, dev);
  });
}

GW_EXPORT gw_status_t gw_gather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                size_t sendcount, gw_dtype_t dtype, int root) {
  return run_form("gw_gather", comm, [&](const Session& st, DeviceFlags* dev) {
    return check_rooted(st, CallKind::kGather, sendbuf, recvbuf, sendcount, raw_enum(dtype), 0,
                        root, dev);
  });
}

GW_EXPORT gw_status_t gw_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                 size_t recvcount, gw_dtype_t dtype, int root) {
  return run_form("gw_scatter", comm, [&](const Session& st, DeviceFlags* dev) {
    return check_rooted(st, CallKind::kScatter, sendbuf, recvbuf, recvcount, raw_enum(dtype), 0,
                        root, dev);
  });
}

GW_EXPORT gw_status_t gw_alltoallv(gw_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                   const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                   const size_t* rdispls, gw_dtype_t dtype) {
  return run_form("gw_alltoallv", comm, [&](const Session& st, DeviceFlags* dev) {
    return check_alltoallv(st, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                           raw_enum(dtype), dev);
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
    GW_RETURN_IF_ERROR(check_request(request));
    DeviceFlags dev;
    GW_RETURN_IF_ERROR(check_allreduce(*st, sendbuf, recvbuf, count, dtype, op, &dev));
    if (dev.any()) {
      return hand_out(
          start_staged(*st, make_call(CallKind::kAllreduce, sendbuf, recvbuf, count, dtype, op, 0),
                       dev, true),
          "iallreduce", request);
    }
    return hand_out(st->iallreduce(sendbuf, recvbuf, count, dt(dtype), rop(op)), "iallreduce",
                    request);
  });
}

GW_EXPORT gw_status_t gw_ibroadcast(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype,
                                    int root, gw_request_t* request) {
  return start_form("gw_ibroadcast", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_broadcast(st, buf, count, raw_enum(dtype), root, dev);
  });
}

GW_EXPORT gw_status_t gw_iallgather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                    size_t sendcount, gw_dtype_t dtype, gw_request_t* request) {
  return start_form("gw_iallgather", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_allgather(st, sendbuf, recvbuf, sendcount, raw_enum(dtype), dev);
  });
}

GW_EXPORT gw_status_t gw_ireduce_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                         size_t recvcount, gw_dtype_t dtype, gw_op_t op,
                                         gw_request_t* request) {
  return start_form("gw_ireduce_scatter", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_reduce_scatter(st, sendbuf, recvbuf, recvcount, raw_enum(dtype), raw_enum(op),
                                dev);
  });
}

GW_EXPORT gw_status_t gw_ialltoall(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                   gw_dtype_t dtype, gw_request_t* request) {
  return start_form("gw_ialltoall", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_alltoall(st, sendbuf, recvbuf, count, raw_enum(dtype), dev);
  });
}

GW_EXPORT gw_status_t gw_ialltoallv(gw_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                                    const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                                    const size_t* rdispls, gw_dtype_t dtype,
                                    gw_request_t* request) {
  return start_form("gw_ialltoallv", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_alltoallv(st, sendbuf, sendcounts, sdispls, recvbuf, recvcounts, rdispls,
                           raw_enum(dtype), dev);
  });
}

GW_EXPORT gw_status_t gw_ireduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                                 gw_dtype_t dtype, gw_op_t op, int root, gw_request_t* request) {
  return start_form("gw_ireduce", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_rooted(st, CallKind::kReduce, sendbuf, recvbuf, count, raw_enum(dtype),
                        raw_enum(op), root, dev);
  });
}

GW_EXPORT gw_status_t gw_igather(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                 size_t sendcount, gw_dtype_t dtype, int root,
                                 gw_request_t* request) {
  return start_form("gw_igather", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_rooted(st, CallKind::kGather, sendbuf, recvbuf, sendcount, raw_enum(dtype), 0,
                        root, dev);
  });
}

GW_EXPORT gw_status_t gw_iscatter(gw_comm_t comm, const void* sendbuf, void* recvbuf,
                                  size_t recvcount, gw_dtype_t dtype, int root,
                                  gw_request_t* request) {
  return start_form("gw_iscatter", comm, request, [&](const Session& st, DeviceFlags* dev) {
    return check_rooted(st, CallKind::kScatter, sendbuf, recvbuf, recvcount, raw_enum(dtype), 0,
                        root, dev);
  });
}

GW_EXPORT gw_status_t gw_ibarrier(gw_comm_t comm, gw_request_t* request) {
  return start_form("gw_ibarrier", comm, request, [&](const Session&, DeviceFlags*) {
    return make_call(CallKind::kBarrier, nullptr, nullptr, 0, 0, 0, 0);
  });
}
