// NetPlugin's connection set-up: listen, connect and accept (none of them blocks: "not yet" is a
// NULL comm with an OK status, and NCCL calls again), and the closes.
#include <cstring>

#include "core/timeline.h"
#include "plugin/net_plugin.h"
#include "plugin/plugin_timeline.h"

namespace gw::plugin {

void NetPlugin::name_comm(PluginComm* comm, uint64_t comm_id, int dev) {
  CommOrigin o;
  o.comm_id = comm_id;
  o.conn = trace::next_conn();
  auto d = device(dev);
  o.backend = d.ok() ? (*d)->backend : "?";
  comm->set_origin(std::move(o));
  if (timeline::on()) {
    CommOrigin with_args = comm->origin();
    with_args.trace_args = trace::origin_args(*comm);
    comm->set_origin(std::move(with_args));
  }
}

Status NetPlugin::listen(Context* ctx, int dev, void* handle, ListenComm** listen_comm) {
  if (handle == nullptr) return internal_error("NULL handle buffer");
  GW_ASSIGN_OR_RETURN(std::shared_ptr<net::Transport> t, transport_for(dev));
  net::Handle h;
  GW_ASSIGN_OR_RETURN(std::unique_ptr<net::Listener> listener, t->listen(&h));
  auto lc = std::make_unique<ListenComm>();
  lc->dev = dev;
  lc->comm_id = ctx->comm_id;
  lc->transport = std::move(t);
  lc->listener = std::move(listener);
  std::memcpy(handle, h.bytes.data(), h.bytes.size());
  *listen_comm = lc.release();
  return ok_status();
}

Status NetPlugin::connect(Context* ctx, int dev, void* handle, PluginComm** send_comm) {
  *send_comm = nullptr;
  if (handle == nullptr) return internal_error("NULL handle buffer");
  std::lock_guard<std::mutex> lock(ctx->mu);
  auto it = ctx->pending.find(handle);
  if (it != ctx->pending.end() &&
      std::memcmp(it->second.handle.bytes.data(), handle, net::kHandleSize) != 0) {
    ctx->pending.erase(it);  // the buffer now holds another peer's handle
    it = ctx->pending.end();
  }
  if (it == ctx->pending.end()) {
    Context::PendingConnect pc;
    pc.since_us = timeline::on() ? timeline::now_us() : -1;
    std::memcpy(pc.handle.bytes.data(), handle, net::kHandleSize);
    GW_ASSIGN_OR_RETURN(pc.transport, transport_for(dev));
    GW_ASSIGN_OR_RETURN(pc.connector, pc.transport->connect(pc.handle));
    it = ctx->pending.emplace(handle, std::move(pc)).first;
  }
  auto polled = it->second.connector->poll();
  const int64_t since = it->second.since_us;
  if (!polled.ok()) {
    ctx->pending.erase(it);
    if (since >= 0) trace::setup_failed("connect", ctx->comm_id, since, polled.status().message());
    return polled.status();
  }
  if (*polled == nullptr) return ok_status();  // NCCL calls again with the same handle
  *send_comm = new PluginComm(it->second.transport, std::move(*polled));
  ctx->pending.erase(it);
  name_comm(*send_comm, ctx->comm_id, dev);
  if (since >= 0) trace::setup(**send_comm, "connect", since);
  return ok_status();
}

Status NetPlugin::accept(ListenComm* lc, PluginComm** recv_comm) {
  *recv_comm = nullptr;
  if (lc->accept_since_us < 0 && timeline::on()) lc->accept_since_us = timeline::now_us();
  auto accepted = lc->listener->accept();
  if (!accepted.ok()) {
    if (lc->accept_since_us >= 0) {
      trace::setup_failed("accept", lc->comm_id, lc->accept_since_us, accepted.status().message());
    }
    return accepted.status();
  }
  if (*accepted == nullptr) return ok_status();
  *recv_comm = new PluginComm(lc->transport, std::move(*accepted));
  name_comm(*recv_comm, lc->comm_id, lc->dev);
  if (lc->accept_since_us >= 0) {
    trace::setup(**recv_comm, "accept", lc->accept_since_us);
    lc->accept_since_us = -1;  // a listen comm reused for another connection starts again
  }
  return ok_status();
}

Status NetPlugin::close_listen(ListenComm* lc) {
  lc->magic = 0;
  delete lc;
  return ok_status();
}

Status NetPlugin::close_comm(PluginComm* comm, bool send) {
  delete comm;
  return ok_status();
}

}  // namespace gw::plugin
