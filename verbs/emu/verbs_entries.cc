// The emulator's ibv_* table (verbs/emu/emu_verbs.h, as Linux rxe's rxe_verbs.c): the device,
// ports and GIDs it reports, and the verbs that create, modify and destroy its objects, post work
// and poll completions. The data moves in the NIC thread (verbs/emu/nic.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/log.h"
#include "verbs/emu/emu_verbs.h"
#include "verbs/emu/nic.h"

namespace gw::verbs::emu {
namespace {

// The device's limits (ibv_query_device, ibv_query_port).
constexpr int kMaxQpWr = 4096;
constexpr int kMaxSge = 4;
constexpr int kMaxInline = 256;
constexpr int kMaxCqe = 1 << 16;
constexpr uint64_t kMaxMsg = uint64_t{1} << 31;
constexpr int kGidCount = 5;

// The QP or CQ an async event is about, or null for port and device events.
const void* affiliated_object(const ibv_async_event& ev) {
  switch (ev.event_type) {
    case IBV_EVENT_CQ_ERR:
      return ev.element.cq;
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return ev.element.qp;
    default:
      return nullptr;
  }
}

EmuDevice* the_device() {
  static EmuDevice* d = [] {
    auto* e = new EmuDevice();
    std::snprintf(e->dev.name, sizeof(e->dev.name), "gwemu0");
    std::snprintf(e->dev.dev_name, sizeof(e->dev.dev_name), "uverbs-gwemu0");
    std::snprintf(e->dev.dev_path, sizeof(e->dev.dev_path), "/emulated/gwemu0");
    std::snprintf(e->dev.ibdev_path, sizeof(e->dev.ibdev_path), "/emulated/gwemu0");
    e->dev.node_type = IBV_NODE_CA;
    e->dev.transport_type = IBV_TRANSPORT_IB;
    return e;
  }();
  return d;
}

ibv_device** emu_get_device_list(int* num) {
  auto** list = static_cast<ibv_device**>(calloc(2, sizeof(ibv_device*)));
  list[0] = &the_device()->dev;
  if (num != nullptr) *num = 1;
  return list;
}
void emu_free_device_list(ibv_device** list) { free(list); }
const char* emu_get_device_name(ibv_device* d) { return d->name; }

int emu_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int emu_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int emu_poll_cq(ibv_cq* cq, int num, ibv_wc* wc);

ibv_context* emu_open_device(ibv_device* d) {
  Nic& nic = Nic::get();
  if (d != &the_device()->dev) {
    errno = ENODEV;
    return nullptr;
  }
  if (!nic.start()) {
    GW_LOG_WARN("verbs emulator: {}", nic.start_error);
    errno = EADDRNOTAVAIL;
    return nullptr;
  }
  auto* c = new EmuContext();
  int p[2];
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    delete c;
    return nullptr;
  }
  c->ctx.device = d;
  c->ctx.async_fd = p[0];
  c->ctx.cmd_fd = -1;
  c->ctx.num_comp_vectors = 1;
  c->ctx.ops.post_send = &emu_post_send;
  c->ctx.ops.post_recv = &emu_post_recv;
  c->ctx.ops.poll_cq = &emu_poll_cq;
  c->pipe_w = p[1];
  std::lock_guard<std::mutex> lock(nic.mu);
  nic.contexts.push_back(c);
  return &c->ctx;
}

int emu_close_device(ibv_context* ctx) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto it = std::find_if(nic.contexts.begin(), nic.contexts.end(),
                         [ctx](EmuContext* c) { return &c->ctx == ctx; });
  if (it == nic.contexts.end()) return EINVAL;
  EmuContext* c = *it;
  nic.contexts.erase(it);
  close(c->ctx.async_fd);
  close(c->pipe_w);
  delete c;
  return 0;
}

int emu_query_device(ibv_context*, ibv_device_attr* a) {
  std::memset(a, 0, sizeof(*a));
  std::snprintf(a->fw_ver, sizeof(a->fw_ver), "gradwire-emulator");
  a->max_mr_size = UINT64_MAX;
  a->page_size_cap = 4096;
  a->max_qp = 4096;
  a->max_qp_wr = kMaxQpWr;
  a->max_sge = kMaxSge;
  a->max_cq = 4096;
  a->max_cqe = kMaxCqe;
  a->max_mr = 1 << 20;
  a->max_pd = 1024;
  a->max_qp_rd_atom = 16;
  a->max_qp_init_rd_atom = 16;
  a->phys_port_cnt = 1;
  return 0;
}

int emu_query_port(ibv_context*, uint8_t port, ibv_port_attr* a) {
  if (port != 1) return EINVAL;
  Nic& nic = Nic::get();
  std::memset(a, 0, sizeof(*a));
  a->state = IBV_PORT_ACTIVE;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = IBV_MTU_4096;
  a->gid_tbl_len = kGidCount;
  a->max_msg_sz = static_cast<uint32_t>(kMaxMsg - 1);
  a->lid = nic.port;     // where this process's emulated NIC listens (real RoCE: 0)
  a->active_width = 2;   // 4x
  a->active_speed = 32;  // EDR-like; the emulator has no line rate
  a->phys_state = 5;     // LinkUp
  a->link_layer = nic.ib_link ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
  if (nic.ib_link) {
    a->sm_lid = 1;  // a subnet manager assigned the LIDs
    a->lmc = 0;
  }
  return 0;
}

// A table shaped like a RoCE port of a real NIC: link-local v1/v2, IPv4 v1/v2, and one index
// whose type read fails with EINVAL (as in containers).
// An InfiniBand port has one GID in use: the default subnet prefix fe80::/64 and the port GUID
// (here an OUI, the IPv4 address and the LID); the other entries are unset.
int emu_query_gid(ibv_context*, uint8_t port, int index, ibv_gid* gid) {
  if (port != 1 || index < 0 || index >= kGidCount) return EINVAL;
  std::memset(gid, 0, sizeof(*gid));
  Nic& nic = Nic::get();
  if (nic.ib_link) {
    if (index == 0) {
      gid->raw[0] = 0xfe;
      gid->raw[1] = 0x80;
      gid->raw[8] = 0x02;  // GUID: OUI 02:c9:00, the address, the LID
      gid->raw[9] = 0xc9;
      std::memcpy(&gid->raw[10], &nic.addr, 4);
      gid->raw[14] = static_cast<uint8_t>(nic.port >> 8);
      gid->raw[15] = static_cast<uint8_t>(nic.port);
    }
    return 0;
  }
  if (index <= 1) {
    gid->raw[0] = 0xfe;
    gid->raw[1] = 0x80;
    gid->raw[15] = 1;
  } else if (index <= 3) {
    gid->raw[10] = 0xff;
    gid->raw[11] = 0xff;
    std::memcpy(&gid->raw[12], &Nic::get().addr, 4);
  }
  return 0;
}

int emu_query_gid_type(ibv_context*, uint8_t port, int index, char* out, size_t len) {
  if (port != 1 || index < 0 || index >= kGidCount - 1) return EINVAL;
  if (Nic::get().ib_link) {  // sysfs says "IB/RoCE v1" for every entry of an IB port
    std::snprintf(out, len, "IB/RoCE v1");
    return 0;
  }
  std::snprintf(out, len, "%s", index % 2 == 0 ? "IB/RoCE v1" : "RoCE v2");
  return 0;
}

ibv_pd* emu_alloc_pd(ibv_context* ctx) {
  auto* p = new EmuPd();
  p->pd.context = ctx;
  p->pd.handle = 1;
  return &p->pd;
}

int emu_dealloc_pd(ibv_pd* pd) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto* p = reinterpret_cast<EmuPd*>(pd);
  if (p->users > 0) return EBUSY;
  delete p;
  return 0;
}

ibv_mr* make_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;  // ibv_reg_mr(3): remote write or atomic needs local write
    return nullptr;
  }
  if (addr == nullptr && length > 0) {
    errno = EFAULT;
    return nullptr;
  }
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto* m = new EmuMr();
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  uint32_t key = nic.next_key;
  nic.next_key += 0x101;
  m->mr.lkey = key;
  m->mr.rkey = key;
  m->access = access;
  nic.mrs[key] = m;
  ++reinterpret_cast<EmuPd*>(pd)->users;
  return &m->mr;
}

ibv_mr* emu_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return make_mr(pd, addr, length, access);
}

// The emulated NIC reaches a dma-buf's bytes as a real one does through its DMA: through the
// buffer the fd names, never through a CPU address of the registering process. So it maps the
// fd's [offset, offset + length) (the emulator's stand-in for the exporter's pages; a memfd in the
// tests) and addresses it by [iova, iova + length) (Nic::bytes_at). The fd may be closed after the
// call: the mapping holds the buffer, as a registration holds a real dma-buf. A dma-buf that
// cannot be mapped (a GPU's, where the GPU check runs over the emulator) is still registered, as
// unreachable: every access of the NIC to it is a protection error, never a CPU address.
ibv_mr* emu_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd,
                          int access) {
  Nic& nic = Nic::get();
  {
    std::lock_guard<std::mutex> lock(nic.mu);
    if (!nic.dmabuf_supported) {
      errno = EOPNOTSUPP;
      return nullptr;
    }
  }
  if (fd < 0 || fcntl(fd, F_GETFD) < 0) {
    errno = EBADF;  // the probe's answer on a device that supports dma-buf
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) return nullptr;
  if (length == 0 || iova == 0 || offset > static_cast<uint64_t>(st.st_size) ||
      length > static_cast<uint64_t>(st.st_size) - offset || iova + length < iova) {
    errno = EINVAL;  // outside the buffer (as a driver's dma_buf_map_attachment refuses)
    return nullptr;
  }
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const uint64_t lead = offset % page;
  const size_t map_len = static_cast<size_t>(lead + length);
  void* map = mmap(nullptr, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                   static_cast<off_t>(offset - lead));
  const bool reachable = map != MAP_FAILED;
  if (!reachable && (errno == EACCES || errno == EBADF)) return nullptr;  // not a readable buffer
  ibv_mr* mr = make_mr(pd, reinterpret_cast<void*>(iova), length, access);
  if (mr == nullptr) {
    const int err = errno;
    if (reachable) munmap(map, map_len);
    errno = err;
    return nullptr;
  }
  char target[256] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
  std::lock_guard<std::mutex> lock(nic.mu);
  EmuMr* m = nic.find_mr(mr->lkey);
  if (reachable) {
    m->map = map;
    m->map_len = map_len;
    m->view = static_cast<uint8_t*>(map) + lead;
  } else {
    m->unreachable = true;  // a GPU's dma-buf, say: registered, but the emulator cannot reach it
  }
  nic.dmabuf.push_back({fd, offset, length, iova, access, n > 0 ? std::string(target, n) : ""});
  return mr;
}

int emu_dereg_mr(ibv_mr* mr) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto it = nic.mrs.find(mr->lkey);
  if (it == nic.mrs.end() || &it->second->mr != mr) return EINVAL;
  --reinterpret_cast<EmuPd*>(mr->pd)->users;
  if (it->second->map != nullptr) munmap(it->second->map, it->second->map_len);
  delete it->second;
  nic.mrs.erase(it);
  return 0;
}

ibv_cq* emu_create_cq(ibv_context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, int) {
  if (cqe < 1 || cqe > kMaxCqe || channel != nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* c = new EmuCq();
  c->cq.context = ctx;
  c->cq.cq_context = cq_context;
  c->cq.cqe = cqe;
  c->depth = cqe;
  return &c->cq;
}

int emu_destroy_cq(ibv_cq* cq) {
  Nic& nic = Nic::get();
  std::unique_lock<std::mutex> lock(nic.mu);
  auto* c = reinterpret_cast<EmuCq*>(cq);
  if (c->users > 0) return EBUSY;
  nic.drop_events(cq);
  nic.wait_acked(lock, cq);
  delete c;
  return 0;
}

ibv_qp* emu_create_qp(ibv_pd* pd, ibv_qp_init_attr* a) {
  if (a->qp_type != IBV_QPT_RC || a->send_cq == nullptr || a->recv_cq == nullptr || a->srq ||
      a->cap.max_send_wr > static_cast<uint32_t>(kMaxQpWr) ||
      a->cap.max_recv_wr > static_cast<uint32_t>(kMaxQpWr) ||
      a->cap.max_send_sge > static_cast<uint32_t>(kMaxSge) ||
      a->cap.max_recv_sge > static_cast<uint32_t>(kMaxSge) ||
      a->cap.max_inline_data > static_cast<uint32_t>(kMaxInline) || a->cap.max_send_wr == 0) {
    errno = EINVAL;
    return nullptr;
  }
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto* q = new EmuQp();
  q->qp.context = pd->context;
  q->qp.pd = pd;
  q->qp.send_cq = a->send_cq;
  q->qp.recv_cq = a->recv_cq;
  q->qp.qp_type = IBV_QPT_RC;
  q->qp.state = IBV_QPS_RESET;
  q->qp.qp_context = a->qp_context;
  q->qp.qp_num = nic.next_qpn++;
  q->scq = reinterpret_cast<EmuCq*>(a->send_cq);
  q->rcq = reinterpret_cast<EmuCq*>(a->recv_cq);
  q->cap = a->cap;
  q->sig_all = a->sq_sig_all != 0;
  ++q->scq->users;
  ++q->rcq->users;
  ++reinterpret_cast<EmuPd*>(pd)->users;
  nic.qps[q->qp.qp_num] = q;
  return &q->qp;
}

int emu_modify_qp(ibv_qp* qp, ibv_qp_attr* a, int mask) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto* q = reinterpret_cast<EmuQp*>(qp);
  if (!(mask & IBV_QP_STATE)) return EINVAL;  // only state transitions are modelled
  const ibv_qp_state from = qp->state, to = a->qp_state;
  auto require = [mask](int bits) { return (mask & bits) == bits; };
  if (to == IBV_QPS_RESET) {
    nic.close_out(q);
    q->out = OutState::kNone;
    q->sq.clear();
    q->rq.clear();
    q->sq_used = q->unsignaled_done = 0;
    qp->state = IBV_QPS_RESET;
    return 0;
  }
  if (to == IBV_QPS_ERR) {
    nic.to_error(q, IBV_WC_WR_FLUSH_ERR);
    nic.wake();
    return 0;
  }
  if (from == IBV_QPS_RESET && to == IBV_QPS_INIT) {
    if (!require(IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return EINVAL;
    if (a->port_num != 1 || a->pkey_index != 0) return EINVAL;
    q->port = a->port_num;
    q->access = static_cast<int>(a->qp_access_flags);
  } else if (from == IBV_QPS_INIT && to == IBV_QPS_RTR) {
    if (!require(IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
      return EINVAL;
    }
    if (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096) return EINVAL;
    q->remote = sockaddr_in{};
    q->remote.sin_family = AF_INET;
    if (nic.ib_link) {
      // InfiniBand: the destination LID routes (a GRH is optional and unused here); the subnet
      // is this host's, so every LID is a NIC listening on this process's address.
      if (a->ah_attr.dlid == 0 || a->ah_attr.dlid > 0xBFFF) return EINVAL;
      if (a->ah_attr.is_global && a->ah_attr.grh.sgid_index >= kGidCount) return EINVAL;
      q->remote.sin_addr = nic.addr;
    } else {
      // Ethernet link layer: RoCE needs a GRH whose GID is an IPv4-mapped address here.
      const ibv_global_route& g = a->ah_attr.grh;
      if (!a->ah_attr.is_global || g.sgid_index >= kGidCount) return EINVAL;
      static const uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
      if (std::memcmp(g.dgid.raw, kMapped, 12) != 0) return EINVAL;
      std::memcpy(&q->remote.sin_addr, &g.dgid.raw[12], 4);
    }
    q->remote.sin_port = htons(a->ah_attr.dlid);
    q->path_mtu = a->path_mtu;
    q->dest_qpn = a->dest_qp_num;
    q->rq_psn = a->rq_psn & 0xffffff;
    q->min_rnr_timer = a->min_rnr_timer;
    q->max_dest_rd_atomic = a->max_dest_rd_atomic;
  } else if (from == IBV_QPS_RTR && to == IBV_QPS_RTS) {
    if (!require(IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                 IBV_QP_TIMEOUT)) {
      return EINVAL;
    }
    if (a->retry_cnt > 7 || a->rnr_retry > 7 || a->timeout > 31) return EINVAL;
    q->next_psn = a->sq_psn & 0xffffff;
    q->timeout = a->timeout;
    q->retry_cnt = a->retry_cnt;
    q->rnr_retry = a->rnr_retry;
  } else {
    return EINVAL;
  }
  qp->state = to;
  return 0;
}

int emu_destroy_qp(ibv_qp* qp) {
  Nic& nic = Nic::get();
  std::unique_lock<std::mutex> lock(nic.mu);
  auto* q = reinterpret_cast<EmuQp*>(qp);
  nic.close_out(q);
  nic.drop_events(qp);
  nic.qps.erase(qp->qp_num);
  nic.wait_acked(lock, qp);
  --q->scq->users;
  --q->rcq->users;
  --reinterpret_cast<EmuPd*>(qp->pd)->users;
  delete q;
  return 0;
}

int emu_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto* q = reinterpret_cast<EmuQp*>(qp);
  for (; wr != nullptr; wr = wr->next) {
    auto fail = [&](int err) {
      if (bad != nullptr) *bad = wr;
      return err;
    };
    if (qp->state != IBV_QPS_RTS && qp->state != IBV_QPS_ERR) return fail(EINVAL);
    if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
        wr->opcode != IBV_WR_RDMA_READ) {
      return fail(EINVAL);  // SEND and atomics are not modelled
    }
    if (wr->opcode == IBV_WR_RDMA_READ && (wr->send_flags & IBV_SEND_INLINE) != 0) {
      return fail(EINVAL);  // a READ's data comes back: there is nothing to inline
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > q->cap.max_send_sge) {
      return fail(EINVAL);
    }
    if (q->sq_used >= static_cast<int>(q->cap.max_send_wr)) return fail(ENOMEM);
    Wr w;
    w.wr_id = wr->wr_id;
    w.op = wr->opcode == IBV_WR_RDMA_WRITE  ? kOpWrite
           : wr->opcode == IBV_WR_RDMA_READ ? kOpRead
                                            : kOpWriteImm;
    w.signaled = (wr->send_flags & IBV_SEND_SIGNALED) != 0 || q->sig_all;
    w.is_inline = (wr->send_flags & IBV_SEND_INLINE) != 0;
    w.imm = wr->imm_data;
    w.remote_addr = wr->wr.rdma.remote_addr;
    w.rkey = wr->wr.rdma.rkey;
    for (int i = 0; i < wr->num_sge; ++i) {
      w.sges.push_back(wr->sg_list[i]);
      w.length += wr->sg_list[i].length;
    }
    if (w.length >= kMaxMsg) return fail(EINVAL);
    if (w.is_inline) {
      if (w.length > q->cap.max_inline_data) return fail(EINVAL);
      for (const ibv_sge& s : w.sges) {  // inline data is copied now; the lkey is not used
        const auto* p = reinterpret_cast<const uint8_t*>(s.addr);
        w.inline_data.insert(w.inline_data.end(), p, p + s.length);
      }
      w.sges.clear();
      ++nic.counters.inline_wrs;
    }
    ++nic.counters.send_wrs;
    if (w.signaled) ++nic.counters.signaled_wrs;
    w.psn = q->next_psn;
    q->next_psn = (q->next_psn + 1) & 0xffffff;
    ++q->sq_used;
    q->sq.push_back(std::move(w));
    if (qp->state == IBV_QPS_ERR) {
      q->sq.back().signaled = true;
      nic.complete_front(q, IBV_WC_WR_FLUSH_ERR);
      q->sq_used = 0;
    }
  }
  nic.wake();
  return 0;
}

int emu_post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto* q = reinterpret_cast<EmuQp*>(qp);
  for (; wr != nullptr; wr = wr->next) {
    if (qp->state == IBV_QPS_RESET || wr->num_sge < 0 ||
        static_cast<uint32_t>(wr->num_sge) > q->cap.max_recv_sge) {
      if (bad != nullptr) *bad = wr;
      return EINVAL;
    }
    if (q->rq.size() >= q->cap.max_recv_wr) {
      if (bad != nullptr) *bad = wr;
      return ENOMEM;
    }
    ++nic.counters.recv_wrs;
    if (qp->state == IBV_QPS_ERR) {
      ibv_wc wc{};
      wc.wr_id = wr->wr_id;
      wc.status = IBV_WC_WR_FLUSH_ERR;
      wc.opcode = IBV_WC_RECV;
      wc.qp_num = qp->qp_num;
      nic.push_cqe(q->rcq, wc);
      continue;
    }
    q->rq.push_back(wr->wr_id);
  }
  return 0;
}

int emu_poll_cq(ibv_cq* cq, int num, ibv_wc* wc) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto* c = reinterpret_cast<EmuCq*>(cq);
  ++nic.counters.poll_calls;
  if (c->overrun) return -1;  // the CQ is in error after an overrun
  int n = 0;
  while (n < num && !c->entries.empty()) {
    wc[n++] = c->entries.front();
    c->entries.pop_front();
  }
  nic.counters.completions += static_cast<uint64_t>(n);
  return n;
}

int emu_get_async_event(ibv_context* ctx, ibv_async_event* ev) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  for (EmuContext* c : nic.contexts) {
    if (&c->ctx != ctx) continue;
    char b;
    (void)!read(c->ctx.async_fd, &b, 1);
    if (c->events.empty()) {
      errno = EAGAIN;
      return -1;
    }
    *ev = c->events.front();
    c->events.pop_front();
    if (const void* object = affiliated_object(*ev)) ++nic.unacked[object];
    return 0;
  }
  errno = EINVAL;
  return -1;
}

void emu_ack_async_event(ibv_async_event* ev) {
  const void* object = ev != nullptr ? affiliated_object(*ev) : nullptr;
  if (object == nullptr) return;
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto it = nic.unacked.find(object);
  if (it == nic.unacked.end()) return;
  if (--it->second == 0) {
    nic.unacked.erase(it);
    nic.acked.notify_all();
  }
}
int emu_fork_init() { return 0; }

}  // namespace

const IbvTable* emu_table() {
  static const IbvTable* table = [] {
    auto* t = new IbvTable();
    t->provider = "emulator";
    t->emulated = true;
    t->get_device_list = &emu_get_device_list;
    t->free_device_list = &emu_free_device_list;
    t->get_device_name = &emu_get_device_name;
    t->open_device = &emu_open_device;
    t->close_device = &emu_close_device;
    t->query_device = &emu_query_device;
    t->query_port = &emu_query_port;
    t->query_gid = &emu_query_gid;
    t->query_gid_type = &emu_query_gid_type;
    t->alloc_pd = &emu_alloc_pd;
    t->dealloc_pd = &emu_dealloc_pd;
    t->reg_mr = &emu_reg_mr;
    t->reg_dmabuf_mr = &emu_reg_dmabuf_mr;
    t->dereg_mr = &emu_dereg_mr;
    t->create_cq = &emu_create_cq;
    t->destroy_cq = &emu_destroy_cq;
    t->create_qp = &emu_create_qp;
    t->modify_qp = &emu_modify_qp;
    t->destroy_qp = &emu_destroy_qp;
    t->post_send = &emu_post_send;
    t->post_recv = &emu_post_recv;
    t->poll_cq = &emu_poll_cq;
    t->get_async_event = &emu_get_async_event;
    t->ack_async_event = &emu_ack_async_event;
    t->fork_init = &emu_fork_init;
    return t;
  }();
  return table;
}

}  // namespace gw::verbs::emu
