// A PluginComm's data path: isend, irecv, iflush and test over the core/net comm, through a fixed
// pool of request slots (NCCL keeps at most NCCL_NET_MAX_REQUESTS in flight per comm).
#include <algorithm>

#include "core/timeline.h"
#include "plugin/net_plugin.h"
#include "plugin/plugin_timeline.h"

namespace gw::plugin {

namespace {

// What the timeline needs of a request being posted: one relaxed load when it is off.
void note_post(Request* r, Request::Kind kind, int tag, size_t bytes) {
  r->posted_us = timeline::on() ? timeline::now_us() : -1;
  r->kind = kind;
  r->tag = tag;
  r->bytes = bytes;
}

const char* event_name(Request::Kind kind) {
  switch (kind) {
    case Request::Kind::kSend:
      return "isend";
    case Request::Kind::kRecv:
      return "irecv";
    case Request::Kind::kFlush:
      return "iflush";
  }
  return "?";
}

}  // namespace

Status PluginComm::check_buffer(const void* data, size_t size, MemHandle* mh,
                                const char* op) const {
  if (size > kMaxMessageBytes) {
    return internal_error("{} of {} bytes exceeds the plugin's maxP2pBytes ({} bytes)", op, size,
                          kMaxMessageBytes);
  }
  if (data == nullptr && size > 0) return internal_error("{}: NULL buffer of {} bytes", op, size);
  if (mh == nullptr) return ok_status();
  if (mh->comm != this) return internal_error("{}: memory handle registered on another comm", op);
  const char* p = static_cast<const char*>(data);
  if (size > 0 && (p < mh->base || p + size > mh->base + mh->size)) {
    return internal_error("{}: buffer [{}, +{}) lies outside its registration [{}, +{})", op, data,
                          size, (const void*)mh->base, mh->size);
  }
  return ok_status();
}

Request* PluginComm::take_slot() {
  if (free_.empty()) return nullptr;
  Request* r = &requests_[free_.back()];
  r->slot = free_.back();
  free_.pop_back();
  r->comm = this;
  r->req = nullptr;
  return r;
}

void PluginComm::put_slot(Request* r) {
  r->magic = 0;
  r->req = nullptr;
  free_.push_back(r->slot);
}

Status PluginComm::adopt(Request* r, Result<net::Request*> posted, Request** request) {
  if (!posted.ok() || *posted == nullptr) {
    put_slot(r);
    return posted.status();
  }
  r->req = *posted;
  r->magic = Request::kMagic;
  *request = r;
  return ok_status();
}

Status PluginComm::isend(const void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  GW_RETURN_IF_ERROR(check_buffer(data, size, mh, "isend"));
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = take_slot();
  if (r == nullptr) return ok_status();  // NCCL retries after testing an older request
  note_post(r, Request::Kind::kSend, tag, size);
  return adopt(r, send_->isend(data, size, tag, mh ? mh->mr : nullptr), request);
}

Status PluginComm::irecv(void* data, size_t size, int tag, MemHandle* mh, Request** request) {
  *request = nullptr;
  // A receive may be posted larger than maxP2pBytes would allow a send; only what arrives counts.
  GW_RETURN_IF_ERROR(check_buffer(data, std::min(size, kMaxMessageBytes), mh, "irecv"));
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = take_slot();
  if (r == nullptr) return ok_status();
  note_post(r, Request::Kind::kRecv, tag, size);
  return adopt(r, recv_->irecv(data, size, tag, mh ? mh->mr : nullptr), request);
}

Status PluginComm::iflush(void* data, size_t size, MemHandle* mh, Request** request) {
  *request = nullptr;
  if (recv_ == nullptr) return internal_error("iflush on a send comm");
  if (mh == nullptr || mh->mr == nullptr || mh->mr->type != net::MemType::kCuda) {
    return ok_status();  // host memory: what the NIC wrote is visible already
  }
  GW_RETURN_IF_ERROR(check_buffer(data, size, mh, "iflush"));
  std::lock_guard<std::mutex> lock(mu_);
  Request* r = take_slot();
  if (r == nullptr) {
    return internal_error("iflush: all {} request slots of the comm with {} are in flight", kSlots,
                          peer_name());
  }
  note_post(r, Request::Kind::kFlush, 0, size);
  return adopt(r, recv_->iflush(data, size, mh->mr), request);
}

Status PluginComm::test(Request* r, bool* done, size_t* size) {
  bool finished = false;
  size_t bytes = 0;
  Status st;
  Request posted;  // what the timeline reports once the slot is free again
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (r->magic != Request::kMagic || r->comm != this) {
      return internal_error("request {} is not in flight on this comm", (void*)r);
    }
    st = comm()->test(r->req, &finished, &bytes);
    if (!st.ok() || finished) {
      posted = *r;
      put_slot(r);  // core/net frees a failed request
    }
  }
  if (posted.posted_us >= 0) {  // the timeline was on when it was posted
    const bool failed = !st.ok();
    trace::transfer(*this, event_name(posted.kind), posted.posted_us, failed ? 0 : bytes,
                    posted.bytes, posted.tag, failed);
  }
  if (!st.ok()) return st;
  *done = finished;
  *size = bytes;
  return ok_status();
}
}  // namespace gw::plugin
