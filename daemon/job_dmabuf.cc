// Trainers' device buffers handed over as dma-bufs (docs/wire-daemon.md, "Device buffers as
// dma-bufs"; version 8): the NCCL plugin's daemon mode passes the descriptor NCCL gave regMrDmaBuf
// on its socket, and the daemon registers it with the NIC of the job's link to the peer's host
// (the daemons' communicator's point-to-point data connections, PointToPoint::reg_dmabuf), so
// that its queue pairs reach the buffer without a copy (GPUDirect RDMA). The daemon addresses the
// registration by an address range it reserves without access: it never reads or writes the
// buffer through a CPU mapping of its own (on a GPU host it could not: a GPU's dma-buf is not
// mappable), only the NIC does, through the dma-buf.
//
// Only a job whose daemons agreed verbs registers (tcp and dpdk move bytes through the CPU), and
// only for a peer on another host (two trainers of one host have no NIC between them): anything
// else is kUnsupported, which the plugin reports as such. Ids are the trainer's own: another
// trainer (of this job or another) naming one is answered kInvalidArg, never given it.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "core/log.h"
#include "daemon/job.h"

namespace gw::daemon {

namespace {

// How long a register_dmabuf waits for its descriptor, which the trainer sends on its socket
// before it posts the submission (the serve loop reads it; normally at once).
constexpr int64_t kFdWaitMs = 2000;

}  // namespace

// Job::in_wait while the job thread may wait for a data connection: a trainer that dies
// meanwhile has the serve loop abort the communicator, which ends the wait. gone(): a trainer of
// the job went before the mark was set (the serve loop saw no wait then: the job thread ends the
// job itself, so the wait is not started).
class Job::WaitMark {
 public:
  explicit WaitMark(Job* job) : job_(job) { job_->in_wait.store(true); }
  ~WaitMark() { job_->in_wait.store(false); }
  Status gone() const {
    for (const auto& m : job_->members) {
      if (m && m->lost.load()) return aborted_error("{} left the job", m->name());
    }
    return ok_status();
  }

 private:
  Job* job_;
};

void Job::dmabuf_request(Trainer& t, const Request& r) {
  if (r.opcode == Opcode::kFlushDmabuf) {
    auto it = t.dmabufs.find(r.alloc_id);
    Status s;
    if (it == t.dmabufs.end() || it->second->recv == nullptr) {
      s = invalid_arg("flush: id {} is not a dma-buf registration of this client for receives",
                      r.alloc_id);
    } else if (r.recv_off > it->second->bytes || r.recv_bytes > it->second->bytes - r.recv_off) {
      s = invalid_arg("flush: [{}, +{}) outside dma-buf {} ({} bytes)", r.recv_off, r.recv_bytes,
                      r.alloc_id, it->second->bytes);
    } else if (!comm) {
      s = aborted_error("flush: the job's daemons have no communicator");
    }
    if (!s.ok()) {
      complete(t, r.seq, s);
      return;
    }
    const DmabufRegistration& reg = *it->second;
    // The data connection from the registration's host: the one its receives came on.
    const WaitMark mark(this);
    auto flushed =
        mark.gone().ok()
            ? comm->flush_dmabuf(reg.peer_host, static_cast<uint8_t*>(reg.iova) + r.recv_off,
                                 r.recv_bytes, reg.recv,
                                 sys::deadline_after_ms(std::min<int64_t>(first.timeout_ms, 10000)))
            : Result<bool>(mark.gone());
    if (!flushed.ok()) {
      complete(t, r.seq, flushed.status());
      return;
    }
    const CompressedDone done = p2p_wire(P2pDone{*flushed ? 1u : 0u, 0});
    complete(t, r.seq, ok_status(), &done, /*moved=*/false);
    return;
  }
  if (r.opcode == Opcode::kDeregisterDmabuf) {
    auto it = t.dmabufs.find(r.alloc_id);
    if (it == t.dmabufs.end()) {
      complete(t, r.seq,
               invalid_arg("id {} is not a dma-buf registration of this client", r.alloc_id));
      return;
    }
    // A send or receive of the trainer's that names it and is not answered yet: the NIC may
    // still move its bytes, so the registration stays and the trainer is told (NCCL deregisters
    // only once its requests completed: this is a caller's mistake, never a wait).
    size_t users = 0;
    for (const auto& [seq, id] : t.device_ops) users += id == r.alloc_id ? 1 : 0;
    if (users > 0) {
      GW_LOG_INFO(
          "gradwired: {} deregisters dma-buf {} while {} of its sends/receives naming it are "
          "not completed: refused (deregister it once they completed)",
          t.name(), r.alloc_id, users);
      complete(t, r.seq,
               invalid_arg("dma-buf {} is in use by {} sends/receives not completed yet",
                           r.alloc_id, users));
      return;
    }
    std::shared_ptr<DmabufRegistration> reg = std::move(it->second);
    t.dmabufs.erase(it);
    // Released now, unless an op already answered (failed) still holds it in the communicator:
    // then when that op ends.
    const Status s = reg.use_count() == 1 ? reg->release() : ok_status();
    complete(t, r.seq, s);
    return;
  }
  auto id = register_dmabuf(t, r);
  if (!id.ok()) {
    GW_LOG_INFO("gradwired: {} could not register a dma-buf of {} bytes: {}", t.name(),
                r.alloc_bytes, id.status().message());
    complete(t, r.seq, id.status());
    return;
  }
  const CompressedDone done = p2p_wire(P2pDone{*id, 0});
  complete(t, r.seq, ok_status(), &done, /*moved=*/false);
}

Result<uint32_t> Job::register_dmabuf(Trainer& t, const Request& r) {
  // The descriptor first: it is the trainer's whatever the answer, and must not stay behind.
  sys::Fd fd;
  {
    std::unique_lock<std::mutex> lock(t.fds_mu);
    const bool came = t.fds_cv.wait_for(lock, std::chrono::milliseconds(kFdWaitMs), [&] {
      return t.passed_fds.count(r.ticket) != 0 || t.lost.load(std::memory_order_acquire);
    });
    auto it = t.passed_fds.find(r.ticket);
    if (!came || it == t.passed_fds.end()) {
      return invalid_arg("no descriptor came with ticket {} within {} ms", r.ticket, kFdWaitMs);
    }
    fd = std::move(it->second);
    t.passed_fds.erase(it);
  }
  GW_RETURN_IF_ERROR(failure);
  if (t.dmabufs.size() >= kMaxDmabufsPerClient) {
    return no_memory("register_dmabuf: {} holds {} registrations already (the most)", t.name(),
                     kMaxDmabufsPerClient);
  }
  const int32_t peer_host = host_of_rank.empty() ? first.host_index : host_of_rank[r.root];
  if (first.num_hosts < 2 || peer_host == first.host_index) {
    // The completion carries 112 bytes of text: the reason first, the detail in the daemon's log.
    GW_LOG_INFO(
        "gradwired: {}: rank {} is on this host: device buffers go through the daemon "
        "only to a peer on another host (its NIC); host buffers between one host's "
        "trainers",
        t.name(), r.root);
    return Status(
        Code::kUnsupported,
        fmt::format("rank {} is on this host (dma-bufs: peers on other hosts only)", r.root));
  }
  const std::string agreed = transport_name();
  if (agreed != "verbs") {
    GW_LOG_INFO(
        "gradwired: {}: the job's daemons agreed {} across hosts, which moves bytes "
        "through the CPU; device buffers (dma-buf) need verbs (GPUDirect RDMA) on every "
        "host of the job",
        t.name(), agreed.empty() ? "no transport" : agreed);
    return Status(Code::kUnsupported,
                  fmt::format("daemons agreed {}: dma-bufs need verbs across hosts",
                              agreed.empty() ? "no transport" : agreed));
  }
  auto reg = std::make_shared<DmabufRegistration>();
  reg->peer_host = peer_host;
  reg->bytes = static_cast<size_t>(r.alloc_bytes);
  // The address range the registration is known by: reserved, never accessible.
  void* iova =
      ::mmap(nullptr, reg->bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (iova == MAP_FAILED) {
    return system_error(fmt::format("register_dmabuf: reserving {} bytes of addresses", reg->bytes),
                        errno);
  }
  reg->iova = iova;
  reg->link = dmabuf_link;
  const sys::Deadline deadline = sys::deadline_after_ms(std::min<int64_t>(first.timeout_ms, 10000));
  // comm changes only on this thread; the serve loop may abort it meanwhile (under comm_mu, which
  // is not held here: the wait for a connection must not hold the serve loop up).
  Status s;
  if (!comm) s = aborted_error("register_dmabuf: the job's daemons have no communicator");
  const WaitMark mark(this);
  if (s.ok()) s = mark.gone();
  for (const bool send : {true, false}) {
    if (!s.ok() || (r.dmabuf_use & (send ? kDmabufSends : kDmabufReceives)) == 0) continue;
    auto mr = comm->reg_dmabuf(peer_host, send, iova, reg->bytes, r.send_off, fd.get(), deadline);
    if (!mr.ok()) {
      s = mr.status();
      break;
    }
    (send ? reg->send : reg->recv) = *mr;
  }
  if (!s.ok()) return s;  // reg's release gives back what was made
  uint32_t id = t.next_dmabuf_id;
  while (t.dmabufs.count(id) != 0 || id == 0 || id > 0x7fffffffu) {
    id = id >= 0x7fffffffu ? 1 : id + 1;
  }
  t.next_dmabuf_id = id >= 0x7fffffffu ? 1 : id + 1;
  t.dmabufs[id] = reg;
  GW_LOG_DEBUG("gradwired: {} registered dma-buf id {} ({} bytes at offset {}) for host {}",
               t.name(), id, reg->bytes, r.send_off, peer_host);
  return id;
}

Status DmabufRegistration::release() {
  Status s;
  coll::Communicator* comm = link ? link->comm : nullptr;
  if (comm != nullptr && send != nullptr) s = comm->dereg_dmabuf(peer_host, true, send);
  if (comm != nullptr && recv != nullptr) {
    Status r2 = comm->dereg_dmabuf(peer_host, false, recv);
    if (s.ok()) s = r2;
  }
  send = recv = nullptr;
  if (iova != nullptr) ::munmap(iova, bytes);
  iova = nullptr;
  return s;
}

Status Job::p2p_device(Trainer& t, const Request& r, P2pDevice* dev) {
  const bool send = r.opcode == Opcode::kSend;
  auto it = t.dmabufs.find(r.dmabuf);
  if (it == t.dmabufs.end()) {
    return invalid_arg("{}: id {} is not a dma-buf registration of this client",
                       send ? "send" : "recv", r.dmabuf);
  }
  const DmabufRegistration& reg = *it->second;
  net::MemRegion* mr = send ? reg.send : reg.recv;
  if (mr == nullptr) {
    return invalid_arg("{}: dma-buf {} is not registered for {}", send ? "send" : "recv", r.dmabuf,
                       send ? "sends" : "receives");
  }
  const uint64_t off = send ? r.send_off : r.recv_off;
  const uint64_t n = send ? r.send_bytes : r.recv_bytes;
  if (off > reg.bytes || n > reg.bytes - off) {
    return invalid_arg("{}: [{}, +{}) outside dma-buf {} ({} bytes)", send ? "send" : "recv", off,
                       n, r.dmabuf, reg.bytes);
  }
  if (r.root < 0 || host_of_rank.empty() ||
      host_of_rank[static_cast<size_t>(r.root)] != reg.peer_host) {
    return invalid_arg("{}: rank {} is not on host {}, the one dma-buf {} is registered for",
                       send ? "send" : "recv", r.root, reg.peer_host, r.dmabuf);
  }
  dev->mr = mr;
  dev->at = static_cast<uint8_t*>(reg.iova) + off;
  dev->keep = it->second;  // held by the op until the communicator is done with it
  return ok_status();
}

void Job::release_dmabufs(Trainer& t) {
  // Its requests are forgotten (the board dropped them; the ops the communicator still runs hold
  // their registrations until they end: the comm is aborted when a trainer goes).
  t.device_ops.clear();
  size_t held = 0;
  for (auto& [id, reg] : t.dmabufs) held += reg.use_count() > 1 ? 1 : 0;
  if (!t.dmabufs.empty()) {
    GW_LOG_INFO("gradwired: {}'s {} dma-buf registrations released{}", t.name(), t.dmabufs.size(),
                held > 0 ? fmt::format(" ({} once the ops using them end)", held) : "");
  }
  t.dmabufs.clear();
  std::lock_guard<std::mutex> lock(t.fds_mu);
  t.passed_fds.clear();
}

}  // namespace gw::daemon
