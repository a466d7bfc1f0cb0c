#include "verbs/verbs_comm.h"

#include <arpa/inet.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "core/sys/time.h"
#include "verbs/device_select.h"

namespace gw::verbs {
namespace {

constexpr int kPollBatch = 16;  // completions taken per poll_cq call
constexpr uint64_t kCtsWrId = ~uint64_t{0};
constexpr int kCtsSignalEvery = 8;  // one signaled CTS write in 8 keeps the send queue free
constexpr int64_t kHealthCheckNs = 1000000;
// How long writes posted before the peer's close still get to complete. A peer closes after its
// receive completed, and the responder sends the ACK when it places the data, so the ACK is
// already on its way when the close is seen; only its processing may lag (an emulated NIC's
// thread on a loaded host). Writes the peer never took fail at this deadline, or sooner through
// the RC retries.
constexpr int64_t kCloseGraceNs = 1000000000;

Status verbs_errno(const char* what, const std::string& where, int err) {
  return system_error(fmt::format("{} on {}", what, where), err);
}

}  // namespace

// ---- QpSet ----------------------------------------------------------------------------------

Result<std::unique_ptr<QpSet>> QpSet::create(std::shared_ptr<VerbsDevice> device,
                                             const VerbsConfig& config, int nqps, bool receiver,
                                             int access) {
  std::unique_ptr<QpSet> s(new QpSet());
  s->device_ = std::move(device);
  s->config_ = config;
  const IbvTable& ibv = s->device_->ibv();
  const int depth = nqps * (kSendDepth + kRecvDepth);
  s->cq_ = ibv.create_cq(s->device_->context(), depth, nullptr, nullptr, 0);
  if (s->cq_ == nullptr) return verbs_errno("ibv_create_cq", s->device_->name(), errno);
  for (int i = 0; i < nqps; ++i) {
    ibv_qp_init_attr a{};
    a.send_cq = s->cq_;
    a.recv_cq = s->cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = kSendDepth;
    a.cap.max_recv_wr = kRecvDepth;
    a.cap.max_send_sge = 1;
    a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = config.use_inline ? sizeof(CtsWire) : 0;
    ibv_qp* qp = ibv.create_qp(s->device_->pd(), &a);
    if (qp == nullptr && a.cap.max_inline_data > 0) {  // a device without inline sends
      a.cap.max_inline_data = 0;
      qp = ibv.create_qp(s->device_->pd(), &a);
    }
    if (qp == nullptr) return verbs_errno("ibv_create_qp", s->device_->name(), errno);
    s->max_inline_ = a.cap.max_inline_data;
    s->qps_.push_back(qp);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = s->device_->port();
    attr.qp_access_flags = static_cast<unsigned>(access);
    int err = ibv.modify_qp(qp, &attr,
                            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    if (err != 0) return verbs_errno("ibv_modify_qp(INIT)", s->device_->name(), err);
    if (receiver) GW_RETURN_IF_ERROR(s->post_receives(i, kRecvDepth));
  }
  return s;
}

QpSet::~QpSet() {
  const IbvTable& ibv = device_->ibv();
  for (ibv_qp* qp : qps_) {
    if (int err = ibv.destroy_qp(qp); err != 0) GW_LOG_WARN("verbs: ibv_destroy_qp: {}", err);
  }
  if (cq_ != nullptr) {
    if (int err = ibv.destroy_cq(cq_); err != 0) GW_LOG_WARN("verbs: ibv_destroy_cq: {}", err);
  }
  // After the destroys: ibv_destroy_qp returns only once this QP's reported events were acked.
  device_->forget_errors(qps_, cq_);
}

Status QpSet::post_receives(int qp_index, int count) {
  // Zero-SGE receives: a WRITE_WITH_IMM places its data itself and only consumes one of them.
  ibv_recv_wr wrs[kRecvDepth];
  count = std::min(count, kRecvDepth);
  for (int i = 0; i < count; ++i) {
    wrs[i] = ibv_recv_wr{};
    wrs[i].wr_id = static_cast<uint64_t>(qp_index);
    wrs[i].next = i + 1 < count ? &wrs[i + 1] : nullptr;
  }
  if (count == 0) return ok_status();
  ibv_recv_wr* bad = nullptr;
  int err = device_->ibv().post_recv(qps_[qp_index], wrs, &bad);
  if (err != 0) return verbs_errno("ibv_post_recv", device_->name(), err);
  return ok_status();
}

PortWire QpSet::local_port() const {
  PortWire p{};
  std::memcpy(p.gid, device_->gid().raw, 16);
  p.lid = device_->port_attr().lid;
  p.link_layer = device_->port_attr().link_layer;
  int mtu = device_->port_attr().active_mtu;
  if (config_.mtu_bytes > 0) mtu = std::min(mtu, mtu_from_bytes(config_.mtu_bytes));
  p.mtu = static_cast<uint8_t>(mtu);
  p.gid_index = static_cast<uint32_t>(device_->gid_index());
  return p;
}

Status QpSet::connect(const PortWire& remote, const uint32_t* remote_qpns) {
  const IbvTable& ibv = device_->ibv();
  const PortWire local = local_port();
  if (remote.link_layer != local.link_layer) {
    return invalid_arg("verbs: the peer's port is {} and this one {}",
                       remote.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
                       local.link_layer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
  }
  mtu_ = std::min(local.mtu, remote.mtu);
  for (size_t i = 0; i < qps_.size(); ++i) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(mtu_);
    a.dest_qp_num = remote_qpns[i];
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 12;  // 0.64 ms
    a.ah_attr.dlid = remote.lid;
    a.ah_attr.sl = static_cast<uint8_t>(config_.service_level);
    a.ah_attr.port_num = device_->port();
    if (local.link_layer == IBV_LINK_LAYER_ETHERNET) {
      a.ah_attr.is_global = 1;
      std::memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
      a.ah_attr.grh.sgid_index = static_cast<uint8_t>(device_->gid_index());
      a.ah_attr.grh.hop_limit = 255;
      a.ah_attr.grh.traffic_class = static_cast<uint8_t>(config_.traffic_class);
    }
    int err = ibv.modify_qp(qps_[i], &a,
                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err != 0) return verbs_errno("ibv_modify_qp(RTR)", device_->name(), err);
    a = ibv_qp_attr{};
    a.qp_state = IBV_QPS_RTS;
    a.sq_psn = 0;
    a.timeout = static_cast<uint8_t>(config_.timeout);
    a.retry_cnt = static_cast<uint8_t>(config_.retry_cnt);
    a.rnr_retry = static_cast<uint8_t>(config_.rnr_retry);
    a.max_rd_atomic = 1;
    err = ibv.modify_qp(qps_[i], &a,
                        IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                            IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
    if (err != 0) return verbs_errno("ibv_modify_qp(RTS)", device_->name(), err);
  }
  return ok_status();
}

int QpSet::index_of(uint32_t qp_num) const {
  for (size_t i = 0; i < qps_.size(); ++i) {
    if (qps_[i]->qp_num == qp_num) return static_cast<int>(i);
  }
  return -1;
}

// ---- VerbsCommCore --------------------------------------------------------------------------

VerbsCommCore::VerbsCommCore(std::unique_ptr<QpSet> qps, sys::Fd socket, std::string peer)
    : device_(qps->device()),
      qps_(std::move(qps)),
      socket_(std::move(socket)),
      peer_(std::move(peer)) {
  event_gen_ = device_->event_generation();
}

VerbsCommCore::~VerbsCommCore() {
  qps_.reset();  // no device access to any buffer after this
  for (auto& mr : mrs_) device_->release(mr->reg);
}

Result<net::MemRegion*> VerbsCommCore::reg_mr(void* data, size_t size, net::MemType type) {
  if (data == nullptr && size > 0) return invalid_arg("reg_mr: null buffer of {} bytes", size);
  constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  auto mr = std::make_unique<VerbsMr>();
  mr->base = data;
  mr->size = size;
  mr->type = type;
  if (size > 0 && type == net::MemType::kCuda) {
    // Device memory is also read by the GDR flush (VerbsRecvComm::iflush).
    GW_ASSIGN_OR_RETURN(mr->reg, device().acquire_device(
                                     data, size, kAccess | IBV_ACCESS_REMOTE_READ, qps_->config()));
  } else if (size > 0) {
    GW_ASSIGN_OR_RETURN(mr->reg, device().acquire(data, size, kAccess));
  }
  std::lock_guard<std::mutex> lock(mr_mu_);
  mrs_.push_back(std::move(mr));
  return mrs_.back().get();
}

Result<net::MemRegion*> VerbsCommCore::reg_mr_dmabuf(void* data, size_t size, uint64_t offset,
                                                     int fd) {
  auto mr = std::make_unique<VerbsMr>();
  mr->base = data;
  mr->size = size;
  mr->type = net::MemType::kCuda;
  GW_ASSIGN_OR_RETURN(
      mr->reg, device().acquire_dmabuf(
                   data, size, offset, fd,
                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ));
  std::lock_guard<std::mutex> lock(mr_mu_);
  mrs_.push_back(std::move(mr));
  return mrs_.back().get();
}

Status VerbsCommCore::dereg_mr(net::MemRegion* mr) {
  std::unique_ptr<VerbsMr> gone;
  {
    std::lock_guard<std::mutex> lock(mr_mu_);
    auto it = std::find_if(mrs_.begin(), mrs_.end(),
                           [mr](const std::unique_ptr<VerbsMr>& m) { return m.get() == mr; });
    if (mr == nullptr || it == mrs_.end()) {
      return invalid_arg("dereg_mr: {} is not a registration of this comm", static_cast<void*>(mr));
    }
    gone = std::move(*it);
    mrs_.erase(it);
  }
  device().release(gone->reg);
  return ok_status();
}

Status VerbsCommCore::health(bool* closed) {
  *closed = false;
  uint64_t gen = device_->event_generation();
  if (gen != event_gen_) {
    event_gen_ = gen;
    Status s = device_->async_error(qps_->qps(), qps_->cq());
    if (!s.ok()) return peer_error("connection to {} failed: {}", peer_, s.message());
  }
  int64_t now = sys::now_ns();
  if (now < next_check_ns_) return ok_status();
  next_check_ns_ = now + kHealthCheckNs;
  char byte;
  ssize_t n = recv(socket_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) {
    *closed = true;
    return peer_error("{} closed the connection", peer_);
  }
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
    *closed = true;
    char buf[128];
    return peer_error("connection to {} lost: {}", peer_, strerror_r(errno, buf, sizeof(buf)));
  }
  return ok_status();
}

Status VerbsCommCore::fail_from_wc(const ibv_wc& wc) {
  // After the first error every later work request flushes; keep the first.
  if (error.ok()) {
    error = peer_error(
        "work completion {} on QP {:#x} to {} (the peer is gone, unreachable or "
        "refused the access)",
        wc_status_name(wc.status), wc.qp_num, peer_);
  }
  return error;
}

// ---- VerbsSendComm --------------------------------------------------------------------------

VerbsSendComm::VerbsSendComm(std::unique_ptr<QpSet> qps, sys::Fd socket, std::string peer,
                             std::unique_ptr<CtsWire[]> fifo, VerbsDevice::Registration* fifo_reg)
    : core_(std::make_unique<VerbsCommCore>(std::move(qps), std::move(socket), std::move(peer))),
      fifo_(std::move(fifo)),
      fifo_reg_(fifo_reg) {}

VerbsSendComm::~VerbsSendComm() {
  std::shared_ptr<VerbsDevice> device = core_->qps().device();
  std::vector<VerbsDevice::Registration*> regs;
  for (uint64_t s = reqs_.done_seq(); s < reqs_.next_seq(); ++s) {
    if (Req* r = reqs_.active(s); r != nullptr && r->reg != nullptr) regs.push_back(r->reg);
  }
  core_.reset();  // destroys the QPs first: the device stops touching the buffers
  for (auto* r : regs) device->release(r);
  device->release(fifo_reg_);
}

Result<net::Request*> VerbsSendComm::isend(const void* data, size_t size, int tag,
                                           net::MemRegion* mr) {
  if (!core_->error.ok()) return core_->error;
  GW_RETURN_IF_ERROR(net::check_buffer("isend", data, size, tag, false, mr));
  const uint64_t limit = kMaxStripe * static_cast<uint64_t>(core_->qps().nqps());
  if (size > limit) {
    return invalid_arg(
        "isend: {} bytes exceed the verbs limit of {} bytes with {} QPs per "
        "connection (GW_IB_QPS_PER_CONN)",
        size, limit, core_->qps().nqps());
  }
  Req* r = reqs_.post();
  if (r == nullptr) return static_cast<net::Request*>(nullptr);
  r->data = static_cast<const uint8_t*>(data);
  r->size = size;
  r->tag = tag;
  if (size > 0) {
    Result<VerbsDevice::Registration*> reg =
        core_->device().acquire(data, size, IBV_ACCESS_LOCAL_WRITE);
    if (!reg.ok()) {
      core_->error = reg.status();
      return reg.status();
    }
    r->reg = *reg;
  }
  progress();
  return static_cast<net::Request*>(r);
}

Status VerbsSendComm::test(net::Request* request, bool* done, size_t* size) {
  return net::test_request(reqs_, core_->error, core_->peer(), request, done, size,
                           [this] { progress(); });
}

void VerbsSendComm::poll() {
  const IbvTable& ibv = core_->device().ibv();
  ibv_wc wcs[kPollBatch];
  while (core_->error.ok()) {
    int n = ibv.poll_cq(core_->qps().cq(), kPollBatch, wcs);
    if (n < 0) {
      core_->error = peer_error("ibv_poll_cq failed on the connection to {}", core_->peer());
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (wcs[i].status != IBV_WC_SUCCESS) {
        (void)core_->fail_from_wc(wcs[i]);
        break;
      }
      if (Req* r = reqs_.active(wcs[i].wr_id); r != nullptr) --r->pending;
    }
    if (n < kPollBatch) break;
  }
  // Requests complete in posting order once every stripe's write is done.
  while (!reqs_.idle()) {
    Req* r = reqs_.active(reqs_.done_seq());
    if (r == nullptr || !r->issued || r->pending > 0) break;
    r->msg_size = r->size;
    core_->device().release(r->reg);
    r->reg = nullptr;
    reqs_.complete_through(r->seq + 1);
  }
}

void VerbsSendComm::progress() {
  poll();
  if (!core_->error.ok()) return;
  if (!peer_closed_.ok()) {
    settle_after_close();
    return;
  }
  bool closed = false;
  if (Status h = core_->health(&closed); !h.ok()) {
    poll();  // completions that arrived before the failure still count
    if (!core_->error.ok()) return;
    if (!closed) {
      core_->error = h;
      return;
    }
    // A receiver may close as soon as its last receive completed, before the ACK of that write
    // has completed it here: the write's own completion decides, not the close.
    peer_closed_ = h;
    close_deadline_ns_ = sys::now_ns() + kCloseGraceNs;
    settle_after_close();
    return;
  }
  issue();
}

void VerbsSendComm::settle_after_close() {
  // Requests are issued and completed in order: if any issued one is outstanding, the oldest is.
  Req* r = reqs_.idle() ? nullptr : reqs_.active(reqs_.done_seq());
  const bool awaiting = r != nullptr && r->issued;
  if (!awaiting || sys::now_ns() >= close_deadline_ns_) core_->error = peer_closed_;
}

void VerbsSendComm::issue() {
  const IbvTable& ibv = core_->device().ibv();
  const int nqps = core_->qps().nqps();
  while (issue_seq_ < reqs_.next_seq() && core_->error.ok()) {
    CtsWire& slot = fifo_[issue_seq_ % kFifoDepth];
    if (__atomic_load_n(&slot.seq_plus_one, __ATOMIC_ACQUIRE) != issue_seq_ + 1) return;
    Req* r = reqs_.active(issue_seq_);
    if (r == nullptr) return;
    uint32_t verdict = 0;
    if (slot.tag != net::kAnyTag && slot.tag != r->tag) {
      verdict = kImmError | kImmTagMismatch | (static_cast<uint32_t>(r->tag) & kImmTagMask);
    } else if (r->size > slot.capacity) {
      verdict = kImmError | kImmTruncated;
    }
    for (int i = 0; i < nqps; ++i) {
      uint64_t off = 0, len = 0;
      if (verdict == 0) stripe(r->size, nqps, i, &off, &len);
      ibv_sge sge{};
      sge.addr = reinterpret_cast<uint64_t>(r->data) + off;
      sge.length = static_cast<uint32_t>(len);
      sge.lkey = r->reg != nullptr ? r->reg->mr->lkey : 0;
      ibv_send_wr wr{};
      wr.wr_id = issue_seq_;
      wr.sg_list = &sge;
      wr.num_sge = len > 0 ? 1 : 0;
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.imm_data = htonl(verdict != 0 ? verdict : static_cast<uint32_t>(len));
      wr.wr.rdma.remote_addr = slot.addr + off;
      wr.wr.rdma.rkey = slot.rkey;
      ibv_send_wr* bad = nullptr;
      int err = ibv.post_send(core_->qps().qps()[i], &wr, &bad);
      if (err != 0) {
        core_->error = verbs_errno("ibv_post_send", core_->peer(), err);
        return;
      }
      ++r->pending;
    }
    r->issued = true;
    if ((verdict & kImmTruncated) != 0) {
      core_->error = truncated_error(
          "isend: message truncated: {} bytes sent to a receive of {} bytes "
          "posted by {}",
          r->size, slot.capacity, core_->peer());
    }
    ++issue_seq_;
  }
}

// ---- VerbsRecvComm --------------------------------------------------------------------------

VerbsRecvComm::VerbsRecvComm(std::unique_ptr<QpSet> qps, sys::Fd socket, std::string peer,
                             uint64_t fifo_addr, uint32_t fifo_rkey, bool use_inline)
    : core_(std::make_unique<VerbsCommCore>(std::move(qps), std::move(socket), std::move(peer))),
      fifo_addr_(fifo_addr),
      fifo_rkey_(fifo_rkey),
      use_inline_(use_inline) {
  recv_count_.assign(static_cast<size_t>(core_->qps().nqps()), 0);
}

Status VerbsRecvComm::init() {
  cts_.reset(new CtsWire[kFifoDepth]());
  GW_ASSIGN_OR_RETURN(cts_reg_, core_->device().acquire(cts_.get(), sizeof(CtsWire) * kFifoDepth,
                                                        IBV_ACCESS_LOCAL_WRITE));
  return ok_status();
}

VerbsRecvComm::~VerbsRecvComm() {
  std::shared_ptr<VerbsDevice> device = core_->qps().device();
  std::vector<VerbsDevice::Registration*> regs;
  for (uint64_t s = reqs_.done_seq(); s < reqs_.next_seq(); ++s) {
    if (Req* r = reqs_.active(s); r != nullptr && r->reg != nullptr) regs.push_back(r->reg);
  }
  flush_qps_.reset();  // no READ lands in flush_buf_ after this
  if (flush_reg_ != nullptr) device->release(flush_reg_);
  core_.reset();
  for (auto* r : regs) device->release(r);
  device->release(cts_reg_);
}

Result<net::Request*> VerbsRecvComm::irecv(void* data, size_t size, int tag, net::MemRegion* mr) {
  if (!core_->error.ok()) return core_->error;
  GW_RETURN_IF_ERROR(net::check_buffer("irecv", data, size, tag, true, mr));
  Req* r = reqs_.post();
  if (r == nullptr) return static_cast<net::Request*>(nullptr);
  r->data = static_cast<uint8_t*>(data);
  r->capacity = size;
  r->tag = tag;
  if (size > 0) {
    Result<VerbsDevice::Registration*> reg =
        core_->device().acquire(data, size, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!reg.ok()) {
      core_->error = reg.status();
      return reg.status();
    }
    r->reg = *reg;
  }
  progress();
  return static_cast<net::Request*>(r);
}

Status VerbsRecvComm::test(net::Request* request, bool* done, size_t* size) {
  for (Flush& f : flushes_) {
    if (request == &f) return test_flush(&f, done, size);
  }
  return net::test_request(reqs_, core_->error, core_->peer(), request, done, size,
                           [this] { progress(); });
}

// ---- the GDR flush ---------------------------------------------------------------------------

Status VerbsRecvComm::start_flush_qp() {
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  GW_ASSIGN_OR_RETURN(
      std::unique_ptr<QpSet> qps,
      QpSet::create(core_->qps().device(), core_->qps().config(), 1, false, access));
  const uint32_t self = qps->qps()[0]->qp_num;
  GW_RETURN_IF_ERROR(qps->connect(qps->local_port(), &self));
  flush_buf_.reset(new uint8_t[kFlushSlots]());
  GW_ASSIGN_OR_RETURN(
      flush_reg_, core_->device().acquire(flush_buf_.get(), kFlushSlots, IBV_ACCESS_LOCAL_WRITE));
  flush_qps_ = std::move(qps);
  return ok_status();
}

Result<net::Request*> VerbsRecvComm::iflush(void* data, size_t size, net::MemRegion* mr) {
  if (!core_->error.ok()) return core_->error;
  auto* vmr = static_cast<VerbsMr*>(mr);
  if (size == 0 || data == nullptr || vmr == nullptr || vmr->type != net::MemType::kCuda ||
      !core_->qps().config().gdr_flush) {
    return static_cast<net::Request*>(nullptr);  // host memory: the CPU sees it already
  }
  if (vmr->reg == nullptr || reinterpret_cast<uintptr_t>(data) < vmr->reg->begin ||
      reinterpret_cast<uintptr_t>(data) + 1 > vmr->reg->end) {
    return invalid_arg("iflush: {} bytes at {} lie outside the registration given", size, data);
  }
  if (flush_qps_ == nullptr) {
    Status s = start_flush_qp();
    if (!s.ok()) return s.with_context("GDR flush: the loopback queue pair");
  }
  poll_flushes();
  int slot = -1;
  for (int i = 0; i < kFlushSlots && slot < 0; ++i) {
    if (!flushes_[i].busy) slot = i;
  }
  if (slot < 0) {
    return internal_error("iflush: {} flushes already in flight on the connection to {}",
                          kFlushSlots, core_->peer());
  }
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uint64_t>(flush_buf_.get() + slot);
  sge.length = 1;
  sge.lkey = flush_reg_->mr->lkey;
  ibv_send_wr wr{};
  wr.wr_id = static_cast<uint64_t>(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(data);
  wr.wr.rdma.rkey = vmr->reg->mr->rkey;
  ibv_send_wr* bad = nullptr;
  if (int err = core_->device().ibv().post_send(flush_qps_->qps()[0], &wr, &bad); err != 0) {
    return verbs_errno("ibv_post_send (GDR flush read)", core_->device().name(), err);
  }
  Flush& f = flushes_[slot];
  f.busy = true;
  f.done = false;
  f.status = ok_status();
  return static_cast<net::Request*>(&f);
}

void VerbsRecvComm::poll_flushes() {
  if (flush_qps_ == nullptr) return;
  ibv_wc wcs[kFlushSlots];
  int n = core_->device().ibv().poll_cq(flush_qps_->cq(), kFlushSlots, wcs);
  if (n < 0) {
    for (Flush& f : flushes_) {
      if (f.busy && !f.done) {
        f.done = true;
        f.status = system_error(
            fmt::format("GDR flush: ibv_poll_cq failed on {}", core_->device().name()), EIO);
      }
    }
    return;
  }
  for (int i = 0; i < n; ++i) {
    if (wcs[i].wr_id >= static_cast<uint64_t>(kFlushSlots)) continue;
    Flush& f = flushes_[wcs[i].wr_id];
    f.done = true;
    if (wcs[i].status != IBV_WC_SUCCESS) {
      f.status =
          Status(Code::kSystem, fmt::format("GDR flush on {}: the loopback read completed with {}",
                                            core_->device().name(), wc_status_name(wcs[i].status)));
    }
  }
}

Status VerbsRecvComm::test_flush(Flush* f, bool* done, size_t* size) {
  if (!f->busy) return internal_error("test: flush request {} is not in flight", (void*)f);
  *done = false;
  poll_flushes();
  if (!f->done) return ok_status();
  f->busy = false;
  if (!f->status.ok()) return f->status;
  *done = true;
  if (size != nullptr) *size = 0;
  return ok_status();
}

void VerbsRecvComm::poll() {
  const IbvTable& ibv = core_->device().ibv();
  QpSet& qps = core_->qps();
  const int nqps = qps.nqps();
  ibv_wc wcs[kPollBatch];
  int repost[kMaxQps] = {};
  while (core_->error.ok()) {
    int n = ibv.poll_cq(qps.cq(), kPollBatch, wcs);
    if (n < 0) {
      core_->error = peer_error("ibv_poll_cq failed on the connection to {}", core_->peer());
      break;
    }
    for (int i = 0; i < n && core_->error.ok(); ++i) {
      const ibv_wc& wc = wcs[i];
      if (wc.status != IBV_WC_SUCCESS) {
        (void)core_->fail_from_wc(wc);
        break;
      }
      if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) continue;  // our CTS writes
      int q = qps.index_of(wc.qp_num);
      if (q < 0) continue;
      Req* r = reqs_.active(recv_count_[static_cast<size_t>(q)]++);
      ++repost[q];
      if (r == nullptr) {
        core_->error = internal_error("verbs: data from {} for a receive that was never posted",
                                      core_->peer());
        break;
      }
      uint32_t imm = ntohl(wc.imm_data);
      if ((imm & kImmError) != 0) {
        r->verdict = imm;
      } else {
        r->got += imm;
      }
      ++r->arrived;
    }
    if (n < kPollBatch) break;
  }
  // Complete in posting order.
  while (!reqs_.idle() && core_->error.ok()) {
    Req* r = reqs_.active(reqs_.done_seq());
    if (r == nullptr || r->arrived < nqps) break;
    if ((r->verdict & kImmTruncated) != 0) {
      core_->error =
          truncated_error("irecv: message truncated: {} sent more than the {} bytes posted",
                          core_->peer(), r->capacity);
      break;
    }
    if ((r->verdict & kImmTagMismatch) != 0) {
      core_->error = internal_error(
          "irecv: tag mismatch: the receive expected tag {}, {} sent "
          "tag {}",
          r->tag, core_->peer(), r->verdict & kImmTagMask);
      break;
    }
    r->msg_size = static_cast<size_t>(r->got);
    core_->device().release(r->reg);
    r->reg = nullptr;
    reqs_.complete_through(r->seq + 1);
  }
  for (int q = 0; q < nqps && core_->error.ok(); ++q) {
    if (repost[q] > 0) {
      Status s = qps.post_receives(q, repost[q]);
      if (!s.ok()) core_->error = s;
    }
  }
}

void VerbsRecvComm::progress() {
  poll();
  if (!core_->error.ok()) return;
  bool closed = false;
  if (Status h = core_->health(&closed); !h.ok()) {
    poll();  // messages that arrived before the close still complete
    if (core_->error.ok()) core_->error = h;
    return;
  }
  advertise();
}

void VerbsRecvComm::advertise() {
  const IbvTable& ibv = core_->device().ibv();
  ibv_qp* qp = core_->qps().qps()[0];
  while (cts_seq_ < reqs_.next_seq()) {
    Req* r = reqs_.active(cts_seq_);
    if (r == nullptr) {  // already complete: cannot happen before its CTS went out
      ++cts_seq_;
      continue;
    }
    const int slot = static_cast<int>(cts_seq_ % kFifoDepth);
    CtsWire& e = cts_[slot];
    e.addr = reinterpret_cast<uint64_t>(r->data);
    e.capacity = r->capacity;
    e.rkey = r->reg != nullptr ? r->reg->mr->rkey : 0;
    e.tag = r->tag;
    e.seq_plus_one = cts_seq_ + 1;
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uint64_t>(&e);
    sge.length = sizeof(CtsWire);
    sge.lkey = cts_reg_->mr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = kCtsWrId;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = 0;
    if (use_inline_ && core_->qps().max_inline() >= sizeof(CtsWire)) {
      wr.send_flags |= IBV_SEND_INLINE;
    }
    if (cts_posted_ % kCtsSignalEvery == kCtsSignalEvery - 1) {
      wr.send_flags |= IBV_SEND_SIGNALED;
    }
    wr.wr.rdma.remote_addr = fifo_addr_ + static_cast<uint64_t>(slot) * sizeof(CtsWire);
    wr.wr.rdma.rkey = fifo_rkey_;
    ibv_send_wr* bad = nullptr;
    int err = ibv.post_send(qp, &wr, &bad);
    if (err != 0) {
      core_->error = verbs_errno("ibv_post_send (clear-to-send)", core_->peer(), err);
      return;
    }
    ++cts_posted_;
    ++cts_seq_;
  }
}

}  // namespace gw::verbs
