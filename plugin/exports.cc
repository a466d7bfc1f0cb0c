// The exported NCCL tables: ncclNetPlugin_v12 (NCCL 2.30+), _v11 (2.28.3+), _v10, _v9 and _v8,
// and the tuner ncclTunerPlugin_v5 (plugin/tuner.h). Each entry point only reshapes its arguments
// for NetPlugin or the tuner, maps the Status to an ncclResult_t and, on failure, logs one WARN
// through NCCL's logger that says what to do (plugin/nccl_edge.h). No exception crosses into
// NCCL. These six symbols are the only ones the library exports (plugin/exports.map).
#include <climits>
#include <cstring>
#include <new>

#include "plugin/nccl_edge.h"
#include "plugin/nccl_net_abi.h"
#include "plugin/nccl_tuner_abi.h"
#include "plugin/net_plugin.h"
#include "plugin/tuner.h"

namespace gw::plugin {
namespace {

constexpr const char* kPluginName = "gradwire";

NetPlugin& plugin() { return NetPlugin::instance(); }

ncclResult_t listen_in(Result<Context*> ctx, int dev, void* handle, void** listen_comm) {
  return guarded("listen", [&]() -> Status {
    if (listen_comm == nullptr) return internal_error("NULL listenComm");
    *listen_comm = nullptr;
    if (!ctx.ok()) return ctx.status();
    ListenComm* lc = nullptr;
    GW_RETURN_IF_ERROR(plugin().listen(*ctx, dev, handle, &lc));
    *listen_comm = lc;
    return ok_status();
  });
}

ncclResult_t connect_in(Result<Context*> ctx, int dev, void* handle, void** send_comm) {
  return guarded("connect", [&]() -> Status {
    if (send_comm == nullptr) return internal_error("NULL sendComm");
    *send_comm = nullptr;
    if (!ctx.ok()) return ctx.status();
    PluginComm* comm = nullptr;
    GW_RETURN_IF_ERROR(plugin().connect(*ctx, dev, handle, &comm));
    *send_comm = comm;
    return ok_status();
  });
}

ncclResult_t accept_conn(void* listen_comm, void** recv_comm, ncclNetDeviceHandle_v11_t** /*dev*/) {
  return guarded("accept", [&]() -> Status {
    if (recv_comm == nullptr) return internal_error("NULL recvComm");
    *recv_comm = nullptr;
    GW_ASSIGN_OR_RETURN(ListenComm * lc, as_listen(listen_comm));
    PluginComm* comm = nullptr;
    GW_RETURN_IF_ERROR(plugin().accept(lc, &comm));
    *recv_comm = comm;
    return ok_status();
  });
}

Result<PluginComm*> as_any_comm(void* comm) {
  auto send = as_comm(comm, true);
  if (send.ok()) return send;
  auto recv = as_comm(comm, false);
  if (recv.ok()) return recv;
  return send.status();
}

ncclResult_t reg_mr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guarded("regMr", [&]() -> Status {
    if (mhandle == nullptr) return internal_error("NULL mhandle");
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_any_comm(comm));
    if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
      return internal_error("memory type {} is neither NCCL_PTR_HOST nor NCCL_PTR_CUDA", type);
    }
    Result<MemHandle*> mh = c->reg_mr(data, size, type == NCCL_PTR_CUDA);
    if (!mh.ok() && type == NCCL_PTR_CUDA && mh.status().code() == Code::kUnsupported) {
      // NCCL asks for this only where getProperties reported NCCL_PTR_CUDA (daemon mode: where
      // the daemon said so, but the process may lack a driver that exports dma-bufs).
      return internal_error("NCCL_PTR_CUDA memory this comm cannot register: {}",
                            mh.status().message());
    }
    if (!mh.ok()) return mh.status();
    *mhandle = *mh;
    return ok_status();
  });
}

ncclResult_t reg_mr_dma_buf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                            void** mhandle) {
  return guarded("regMrDmaBuf", [&]() -> Status {
    if (mhandle == nullptr) return internal_error("NULL mhandle");
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_any_comm(comm));
    if (type != NCCL_PTR_CUDA && type != NCCL_PTR_DMABUF) {
      return internal_error("regMrDmaBuf of memory type {} (expected NCCL_PTR_CUDA)", type);
    }
    GW_ASSIGN_OR_RETURN(MemHandle * mh, c->reg_mr_dmabuf(data, size, offset, fd));
    *mhandle = mh;
    return ok_status();
  });
}

ncclResult_t dereg_mr(void* comm, void* mhandle) {
  return guarded("deregMr", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_any_comm(comm));
    GW_ASSIGN_OR_RETURN(MemHandle * mh, as_mem(mhandle));
    return c->dereg_mr(mh);
  });
}

ncclResult_t isend_any(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                       void** request) {
  return guarded("isend", [&]() -> Status {
    if (request == nullptr) return internal_error("NULL request pointer");
    *request = nullptr;
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_comm(send_comm, true));
    GW_ASSIGN_OR_RETURN(MemHandle * mh, as_mem(mhandle));
    Request* r = nullptr;
    Status st = c->isend(data, size, tag, mh, &r);
    if (!st.ok())
      return st.with_context(fmt::format("isend of {} bytes to {}", size, c->peer_name()));
    *request = r;
    return ok_status();
  });
}

ncclResult_t irecv_any(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                       void** mhandles, void** request) {
  return guarded("irecv", [&]() -> Status {
    if (request == nullptr) return internal_error("NULL request pointer");
    // NCCL may store NCCL_NET_OPTIONAL_RECV_COMPLETION here as a hint; always overwrite it.
    *request = nullptr;
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_comm(recv_comm, false));
    if (n != 1) return internal_error("irecv of {} buffers, but the plugin reports maxRecvs=1", n);
    if (data == nullptr || sizes == nullptr || tags == nullptr) {
      return internal_error("NULL data, sizes or tags array");
    }
    GW_ASSIGN_OR_RETURN(MemHandle * mh, as_mem(mhandles ? mhandles[0] : nullptr));
    Request* r = nullptr;
    Status st = c->irecv(data[0], sizes[0], tags[0], mh, &r);
    if (!st.ok()) {
      return st.with_context(fmt::format("irecv of {} bytes from {}", sizes[0], c->peer_name()));
    }
    *request = r;
    return ok_status();
  });
}

// NCCL calls iflush after a receive into GPU memory (when it registered the buffer with
// NCCL_PTR_CUDA and has GDR flush on). As NCCL's IB transport does, one flush of the last buffer
// that received bytes orders them all; host memory and tcp need none (NULL: nothing to wait for).
ncclResult_t iflush_any(void* recv_comm, int n, void** data, int* sizes, void** mhandles,
                        void** request) {
  return guarded("iflush", [&]() -> Status {
    if (request == nullptr) return internal_error("NULL request pointer");
    *request = nullptr;
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_comm(recv_comm, false));
    if (n < 0 || (n > 0 && (data == nullptr || sizes == nullptr || mhandles == nullptr))) {
      return internal_error("iflush with n={} and a missing array", n);
    }
    int last = -1;
    for (int i = 0; i < n; ++i) {
      if (sizes[i] > 0) last = i;
    }
    if (last < 0) return ok_status();
    GW_ASSIGN_OR_RETURN(MemHandle * mh, as_mem(mhandles[last]));
    Request* r = nullptr;
    GW_RETURN_IF_ERROR(c->iflush(data[last], static_cast<size_t>(sizes[last]), mh, &r));
    *request = r;
    return ok_status();
  });
}

ncclResult_t test_request(void* request, int* done, int* sizes) {
  return guarded("test", [&]() -> Status {
    if (done == nullptr) return internal_error("NULL done pointer");
    GW_ASSIGN_OR_RETURN(Request * r, as_request(request));
    PluginComm* c = r->comm;
    bool finished = false;
    size_t bytes = 0;
    Status st = c->test(r, &finished, &bytes);
    if (!st.ok()) {
      return st.with_context(
          fmt::format("{} with {}", c->is_send() ? "send" : "receive", c->peer_name()));
    }
    if (finished && bytes > static_cast<size_t>(INT_MAX)) {
      return internal_error("completed message of {} bytes does not fit NCCL's int size", bytes);
    }
    *done = finished ? 1 : 0;
    if (finished && sizes != nullptr) sizes[0] = static_cast<int>(bytes);
    return ok_status();
  });
}

ncclResult_t close_send(void* send_comm) {
  return guarded("closeSend", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_comm(send_comm, true));
    return plugin().close_comm(c, true);
  });
}

ncclResult_t close_recv(void* recv_comm) {
  return guarded("closeRecv", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(PluginComm * c, as_comm(recv_comm, false));
    return plugin().close_comm(c, false);
  });
}

ncclResult_t close_listen(void* listen_comm) {
  return guarded("closeListen", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(ListenComm * lc, as_listen(listen_comm));
    return plugin().close_listen(lc);
  });
}

// ---- v11 ----------------------------------------------------------------------------------

ncclResult_t init_v11(void** ctx, uint64_t comm_id, ncclNetCommConfig_v11_t* config,
                      ncclDebugLogger_t logger, ncclProfilerCallback_t /*profiler*/) {
  if (logger != nullptr) plugin().set_logger(logger);
  return guarded("init", [&]() -> Status {
    if (ctx == nullptr) return internal_error("NULL ctx pointer");
    int tc = config != nullptr ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF;
    GW_ASSIGN_OR_RETURN(Context * c, plugin().init(comm_id, tc));
    *ctx = c;
    return ok_status();
  });
}

ncclResult_t listen_v11(void* ctx, int dev, void* handle, void** listen_comm) {
  return listen_in(as_context(ctx), dev, handle, listen_comm);
}

ncclResult_t connect_v11(void* ctx, int dev, void* handle, void** send_comm,
                         ncclNetDeviceHandle_v11_t** /*send_dev_comm*/) {
  return connect_in(as_context(ctx), dev, handle, send_comm);
}

ncclResult_t isend_v10(void* send_comm, void* data, size_t size, int tag, void* mhandle,
                       void* /*phandle*/, void** request) {
  return isend_any(send_comm, data, size, tag, mhandle, request);
}

ncclResult_t irecv_v10(void* recv_comm, int n, void** data, size_t* sizes, int* tags,
                       void** mhandles, void** /*phandles*/, void** request) {
  return irecv_any(recv_comm, n, data, sizes, tags, mhandles, request);
}

ncclResult_t finalize_v11(void* ctx) {
  return guarded("finalize", [&]() -> Status {
    if (ctx == nullptr) return ok_status();  // init failed or never ran
    GW_ASSIGN_OR_RETURN(Context * c, as_context(ctx));
    return plugin().finalize(c);
  });
}

// ---- v10, v9, v8: one process-wide context ------------------------------------------------

ncclResult_t init_old(ncclDebugLogger_t logger) {
  if (logger != nullptr) plugin().set_logger(logger);
  return guarded("init", [&]() -> Status { return plugin().shared_context().status(); });
}

ncclResult_t init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t /*profiler*/) {
  return init_old(logger);
}

ncclResult_t listen_old(int dev, void* handle, void** listen_comm) {
  return listen_in(plugin().shared_context(), dev, handle, listen_comm);
}

ncclResult_t connect_v10(int dev, ncclNetCommConfig_v10_t* /*config*/, void* handle,
                         void** send_comm, ncclNetDeviceHandle_v10_t** /*send_dev_comm*/) {
  return connect_in(plugin().shared_context(), dev, handle, send_comm);
}

ncclResult_t connect_old(int dev, void* handle, void** send_comm,
                         ncclNetDeviceHandle_v9_t** /*send_dev_comm*/) {
  return connect_in(plugin().shared_context(), dev, handle, send_comm);
}

ncclResult_t isend_v8(void* send_comm, void* data, int size, int tag, void* mhandle,
                      void** request) {
  if (size < 0) {
    if (request != nullptr) *request = nullptr;
    return to_nccl(internal_error("negative size {}", size), "isend");
  }
  return isend_any(send_comm, data, static_cast<size_t>(size), tag, mhandle, request);
}

ncclResult_t irecv_v8(void* recv_comm, int n, void** data, int* sizes, int* tags, void** mhandles,
                      void** request) {
  if (n != 1 || sizes == nullptr || sizes[0] < 0) {
    if (request != nullptr) *request = nullptr;
    return to_nccl(internal_error("irecv with n={} and a missing or negative size (maxRecvs=1)", n),
                   "irecv");
  }
  size_t size = static_cast<size_t>(sizes[0]);
  return irecv_any(recv_comm, n, data, &size, tags, mhandles, request);
}

// ---- the tuner (v5) ------------------------------------------------------------------------

ncclResult_t tuner_init_v5(void** ctx, uint64_t comm_id, size_t nranks, size_t nnodes,
                           ncclDebugLogger_t logger, ncclNvlDomainInfo_v5_t* /*nvl*/,
                           ncclTunerConstants_v5_t* /*constants: NCCL's kept*/) {
  if (logger != nullptr) plugin().set_logger(logger);
  return guarded("tuner init", [&]() -> Status {
    if (ctx == nullptr) return internal_error("NULL context pointer");
    *ctx = nullptr;
    GW_ASSIGN_OR_RETURN(*ctx, tuner_init(comm_id, nranks, nnodes));
    return ok_status();
  });
}

ncclResult_t tuner_coll_info_v5(void* ctx, ncclFunc_t coll, size_t bytes, int /*pipe_ops*/,
                                float** /*cost_table*/, int /*num_algo*/, int /*num_proto*/,
                                int /*reg_buff*/, int* nchannels) {
  return guarded("tuner getCollInfo",
                 [&]() -> Status { return tuner_coll_info(ctx, coll, bytes, nchannels); });
}

ncclResult_t tuner_finalize_v5(void* ctx) {
  return guarded("tuner finalize", [&]() -> Status { return tuner_finalize(ctx); });
}

// The v11 and v12 tables: one context per communicator, the same 22 entries but for the struct
// getProperties fills.
template <typename Table, typename GetProperties>
constexpr Table context_table(GetProperties get_properties) {
  return Table{
      kPluginName,  init_v11,     count_devices,  get_properties, listen_v11,   connect_v11,
      accept_conn,  reg_mr,       reg_mr_dma_buf, dereg_mr,       isend_v10,    irecv_v10,
      iflush_any,   test_request, close_send,     close_recv,     close_listen,
      nullptr,  // getDeviceMr: no device offload
      nullptr,  // irecvConsumed: no device offload
      nullptr,  // makeVDevice: physical devices only
      finalize_v11,
      nullptr,  // setNetAttr: hints not used
  };
}

}  // namespace
}  // namespace gw::plugin

using namespace gw::plugin;  // NOLINT: the tables below list many of its functions

#define GW_EXPORT __attribute__((visibility("default")))

extern "C" {

// NCCL 2.30 probes v12 first; 2.28.x knows v11 at most, so both are exported (the same
// implementation; only getProperties' struct differs).
GW_EXPORT constinit ncclNet_v12_t ncclNetPlugin_v12 =
    context_table<ncclNet_v12_t>(get_properties_v12);
GW_EXPORT constinit ncclNet_v11_t ncclNetPlugin_v11 =
    context_table<ncclNet_v11_t>(get_properties_v11);

GW_EXPORT ncclNet_v10_t ncclNetPlugin_v10 = {
    kPluginName, init_v10,     count_devices,  get_properties_v10, listen_old,   connect_v10,
    accept_conn, reg_mr,       reg_mr_dma_buf, dereg_mr,           isend_v10,    irecv_v10,
    iflush_any,  test_request, close_send,     close_recv,         close_listen, nullptr,
    nullptr,     nullptr,
};

GW_EXPORT ncclNet_v9_t ncclNetPlugin_v9 = {
    kPluginName, init_old,     count_devices,  get_properties_v10, listen_old,   connect_old,
    accept_conn, reg_mr,       reg_mr_dma_buf, dereg_mr,           isend_any,    irecv_any,
    iflush_any,  test_request, close_send,     close_recv,         close_listen, nullptr,
    nullptr,     nullptr,
};

GW_EXPORT ncclNet_v8_t ncclNetPlugin_v8 = {
    kPluginName, init_old,     count_devices, get_properties_v8, listen_old,
    connect_old, accept_conn,  reg_mr,        reg_mr_dma_buf,    dereg_mr,
    isend_v8,    irecv_v8,     iflush_any,    test_request,      close_send,
    close_recv,  close_listen, nullptr,       nullptr,
};

GW_EXPORT ncclTuner_v5_t ncclTunerPlugin_v5 = {
    kPluginName,
    tuner_init_v5,
    tuner_coll_info_v5,
    tuner_finalize_v5,
};

}  // extern "C"
