// The shm transport's data path (shm_comm.h): one direction of a connection each, copying
// messages through the ring in slots or, from cma_min bytes, reading them from the sender's
// memory in one copy (shm_cma.h). shm_transport.cc makes the rings and the sockets (listen,
// connect, handshake) and hands them over here.
#include "core/net/shm_comm.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <deque>
#include <utility>

#include "core/log.h"
#include "core/net/comm_adapter.h"
#include "core/net/request.h"
#include "core/net/shm_cma.h"
#include "core/net/socket_util.h"
#include "core/sys/time.h"

namespace gw::net::shm {
namespace {

using sys::Fd;
using sys::now_ns;

bool is_peer_errno(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ECONNREFUSED;
}

struct ShmRequest : Request {
  uint64_t seq = 0;
  RequestState state = RequestState::kFree;
  char* data = nullptr;
  size_t size = 0;  // send: message size; receive: capacity
  int tag = 0;
  size_t msg_size = 0;
};

// What both directions share: the liveness socket, the ring, requests and the sticky error.
class ShmCommCore {
 public:
  Result<MemRegion*> reg_mr(void* data, size_t size, MemType type) {
    return mrs_.reg(data, size, type, "shm");
  }
  Status dereg_mr(MemRegion* mr) { return mrs_.dereg(mr); }
  std::string peer_name() const { return peer_; }

 protected:
  ShmCommCore(Fd sock, Ring ring, std::string peer)
      : sock_(std::move(sock)), ring_(std::move(ring)), peer_(std::move(peer)) {}

  Status fail(Status status) {
    if (error_.ok()) error_ = std::move(status);
    return error_;
  }

  // True once the peer's end of the unix socket is closed (it exited, crashed or closed the
  // comm). Checked at most every kLivenessNs so that spinning on test() stays syscall-free, and
  // the clock itself read only every kLivenessPolls calls: a caller spinning on test() makes
  // tens of millions a second, and a clock read cost as much as the rest of a small message's
  // poll (docs/perf.md, "Point to point").
  bool peer_gone(bool force) {
    if (gone_) return true;
    if (!force && ++polls_ < kLivenessPolls) return false;
    polls_ = 0;
    int64_t now = now_ns();
    if (!force && now - last_check_ns_ < kLivenessNs) return false;
    last_check_ns_ = now;
    char byte;
    ssize_t n = recv(sock_.get(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && is_peer_errno(errno))) gone_ = true;
    return gone_;
  }

  template <typename Progress>
  Status test_impl(Request* request, bool* done, size_t* size, Progress&& progress) {
    return test_request(reqs_, error_, peer_, request, done, size,
                        std::forward<Progress>(progress));
  }

  Fd sock_;
  Ring ring_;
  std::string peer_;
  RequestTable<ShmRequest> reqs_;
  Status error_;
  HostMrRegistry mrs_;
  uint64_t cur_seq_ = 0;  // message being copied
  size_t off_ = 0;        // bytes of it copied
  uint64_t count_ = 0;    // local copy of head (sender) or tail (receiver)
  bool gone_ = false;
  int64_t last_check_ns_ = 0;
  // peer_gone's calls since it last read the clock.
  static constexpr int kLivenessPolls = 32;
  int polls_ = 0;
};

// One direction of a connection; ShmSendComm forwards the SendComm interface to it.
class ShmSendCore final : public ShmCommCore {
 public:
  // cma_min > 0 offers single-copy messages of at least cma_min bytes (shm_cma.h).
  ShmSendCore(Fd sock, Ring ring, std::string peer, uint64_t cma_min)
      : ShmCommCore(std::move(sock), std::move(ring), std::move(peer)), cma_min_(cma_min) {
    if (cma_min_ == 0) return;
    RingCtrl* ctrl = ring_.ctrl();
    ctrl->cma_probe = reinterpret_cast<uintptr_t>(&ctrl->magic);
    ctrl->cma_state.store(shm::kCmaOffered, std::memory_order_release);
  }

  Result<Request*> isend(const void* data, size_t size, int tag, MemRegion* mr) {
    GW_RETURN_IF_ERROR(check_buffer("isend", data, size, tag, false, mr));
    if (!error_.ok()) return error_;
    ShmRequest* r = reqs_.post();
    if (r == nullptr) return static_cast<Request*>(nullptr);
    r->data = static_cast<char*>(const_cast<void*>(data));
    r->size = size;
    r->msg_size = size;
    r->tag = tag;
    (void)progress();
    return static_cast<Request*>(r);
  }

  Status test(Request* request, bool* done, size_t* size) {
    return test_impl(request, done, size, [this] { return progress(); });
  }

 private:
  Status progress() {
    if (!error_.ok()) return error_;
    RingCtrl* ctrl = ring_.ctrl();
    uint32_t verdict = ctrl->error_code.load(std::memory_order_acquire);
    if (verdict != 0) {
      if (verdict == static_cast<uint32_t>(Code::kInvalidArg)) {
        return fail(truncated_error(
            "send to {}: message truncated: message #{} is larger than the receive posted for it",
            peer_, ctrl->error_seq));
      }
      return fail(internal_error("send to {}: tag mismatch: the receiver rejected message #{}",
                                 peer_, ctrl->error_seq));
    }
    if (peer_gone(false)) {
      settle();  // descriptors the peer released before it closed complete first
      return fail(peer_error("send to {}: connection closed by peer", peer_));
    }
    const Geometry& g = ring_.geometry();
    while (ShmRequest* r = reqs_.active(cur_seq_)) {
      uint64_t tail = ctrl->tail.load(std::memory_order_acquire);
      if (count_ - tail >= g.nslots) break;  // ring full
      uint64_t slot = count_ % g.nslots;
      if (off_ == 0 && cma_min_ > 0 && r->size >= cma_min_ &&
          ctrl->cma_state.load(std::memory_order_acquire) == shm::kCmaAccepted) {
        shm::CmaDesc desc{reinterpret_cast<uintptr_t>(r->data), r->size};
        std::memcpy(ring_.data(slot), &desc, sizeof(desc));
        *ring_.header(slot) = SlotHeader{cur_seq_, r->size, 0, shm::kCmaLen, r->tag};
        ctrl->head.store(++count_, std::memory_order_release);
        cma_pending_.push_back({cur_seq_++, count_});
        continue;
      }
      size_t len = std::min<size_t>(g.slot_size, r->size - off_);
      if (len > 0) std::memcpy(ring_.data(slot), r->data + off_, len);
      *ring_.header(slot) = SlotHeader{cur_seq_, r->size, off_, static_cast<uint32_t>(len), r->tag};
      off_ += len;
      ctrl->head.store(++count_, std::memory_order_release);
      if (off_ == r->size) {
        off_ = 0;
        ++cur_seq_;
      }
    }
    settle();
    return ok_status();
  }

  // The receiver releases a descriptor only after reading the whole buffer: a message sent that
  // way completes then, a copied one at once (but after the ones before it).
  void settle() {
    const uint64_t tail = ring_.ctrl()->tail.load(std::memory_order_acquire);
    while (!cma_pending_.empty() && tail >= cma_pending_.front().second) cma_pending_.pop_front();
    reqs_.complete_through(cma_pending_.empty() ? cur_seq_ : cma_pending_.front().first);
  }

  const uint64_t cma_min_;
  // Messages sent as descriptors, not yet released: (message number, count after descriptor).
  std::deque<std::pair<uint64_t, uint64_t>> cma_pending_;
};

// One direction of a connection; ShmRecvComm forwards the RecvComm interface to it.
class ShmRecvCore final : public ShmCommCore {
 public:
  // pid: the sender's, for single-copy reads (shm_cma.h).
  ShmRecvCore(Fd sock, Ring ring, std::string peer, int pid, bool inject_refuse)
      : ShmCommCore(std::move(sock), std::move(ring), std::move(peer)),
        pid_(pid),
        inject_refuse_(inject_refuse) {}

  Result<Request*> irecv(void* data, size_t size, int tag, MemRegion* mr) {
    GW_RETURN_IF_ERROR(check_buffer("irecv", data, size, tag, true, mr));
    if (!error_.ok()) return error_;
    ShmRequest* r = reqs_.post();
    if (r == nullptr) return static_cast<Request*>(nullptr);
    r->data = static_cast<char*>(data);
    r->size = size;
    r->tag = tag;
    (void)progress();
    return static_cast<Request*>(r);
  }

  Status test(Request* request, bool* done, size_t* size) {
    return test_impl(request, done, size, [this] { return progress(); });
  }

 private:
  Status reject(Code code, uint64_t seq, Status status) {
    RingCtrl* ctrl = ring_.ctrl();
    ctrl->error_seq = seq;
    ctrl->error_code.store(static_cast<uint32_t>(code), std::memory_order_release);
    return fail(std::move(status));
  }

  // Copies what the ring holds into posted receives; true when it moved anything.
  Result<bool> drain() {
    RingCtrl* ctrl = ring_.ctrl();
    const Geometry& g = ring_.geometry();
    bool moved = false;
    while (ShmRequest* r = reqs_.active(cur_seq_)) {
      uint64_t head = ctrl->head.load(std::memory_order_acquire);
      if (head == count_) break;
      if (head - count_ > g.nslots) {
        return fail(
            internal_error("recv from {}: corrupt ring (head {} tail {})", peer_, head, count_));
      }
      uint64_t slot = count_ % g.nslots;
      SlotHeader h = *ring_.header(slot);
      const bool cma = h.len == shm::kCmaLen;
      if (h.msg_seq != cur_seq_ || h.offset != off_ ||
          (cma ? off_ != 0 || !cma_accepted_
               : h.len > g.slot_size || h.len > h.msg_size - std::min(h.msg_size, h.offset)) ||
          (off_ > 0 && h.msg_size != r->msg_size)) {
        return fail(
            internal_error("recv from {}: corrupt slot header for message #{}", peer_, cur_seq_));
      }
      if (off_ == 0) {
        if (r->tag != kAnyTag && h.tag != r->tag) {
          return reject(Code::kInternal, cur_seq_,
                        internal_error("recv from {}: tag mismatch: receive #{} expects tag {}, "
                                       "message has tag {}",
                                       peer_, cur_seq_, r->tag, h.tag));
        }
        if (h.msg_size > r->size) {
          return reject(
              Code::kInvalidArg, cur_seq_,
              truncated_error("recv from {}: message truncated: message #{} has {} bytes, "
                              "the receive only {}",
                              peer_, cur_seq_, h.msg_size, r->size));
        }
        r->msg_size = h.msg_size;
      }
      if (cma) {
        shm::CmaDesc desc;
        std::memcpy(&desc, ring_.data(slot), sizeof(desc));
        if (desc.size != h.msg_size) {
          return fail(
              internal_error("recv from {}: corrupt descriptor for message #{}", peer_, cur_seq_));
        }
        Status read = shm::cma_read(pid_, r->data, desc.addr, desc.size, peer_);
        if (!read.ok()) return fail(std::move(read));
        // A sender that closed may have reused the buffer during the read: its bytes are void.
        if (peer_gone(true))
          return fail(peer_error("recv from {}: connection closed by peer", peer_));
        h.len = 0;
        off_ = desc.size;
      }
      if (h.len > 0) std::memcpy(r->data + off_, ring_.data(slot), h.len);
      off_ += h.len;
      ctrl->tail.store(++count_, std::memory_order_release);
      moved = true;
      if (off_ == r->msg_size) {
        off_ = 0;
        reqs_.complete_through(++cur_seq_);
      }
    }
    return moved;
  }

  // Answers the sender's single-copy offer once: may this process read its memory?
  void answer_cma() {
    RingCtrl* ctrl = ring_.ctrl();
    if (cma_answered_ || ctrl->cma_state.load(std::memory_order_acquire) != shm::kCmaOffered) {
      return;
    }
    cma_answered_ = true;
    cma_accepted_ = shm::cma_probe(pid_, ctrl->cma_probe, shm::kRingMagic, inject_refuse_);
    if (!cma_accepted_) {
      GW_LOG_DEBUG(
          "shm: cannot read {}'s memory (ptrace access refused): large messages go "
          "through the ring",
          peer_);
    }
    ctrl->cma_state.store(cma_accepted_ ? shm::kCmaAccepted : shm::kCmaRefused,
                          std::memory_order_release);
  }

  Status progress() {
    if (!error_.ok()) return error_;
    answer_cma();
    GW_ASSIGN_OR_RETURN(bool moved, drain());
    if (moved || reqs_.active(cur_seq_) == nullptr || !peer_gone(false)) return ok_status();
    // The sender is gone: deliver what it published before it closed, then fail.
    GW_ASSIGN_OR_RETURN(moved, drain());
    if (moved || reqs_.active(cur_seq_) == nullptr) return ok_status();
    return fail(peer_error("recv from {}: connection closed by peer", peer_));
  }

  const int pid_;
  const bool inject_refuse_;
  bool cma_answered_ = false;
  bool cma_accepted_ = false;
};

using ShmSendComm = SendCommAdapter<ShmSendCore>;
using ShmRecvComm = RecvCommAdapter<ShmRecvCore>;

}  // namespace

std::unique_ptr<SendComm> make_send_comm(Fd sock, Ring ring, std::string peer, uint64_t cma_min) {
  return std::make_unique<ShmSendComm>(std::move(sock), std::move(ring), std::move(peer), cma_min);
}

std::unique_ptr<RecvComm> make_recv_comm(Fd sock, Ring ring, std::string peer, int pid,
                                         bool inject_refuse) {
  return std::make_unique<ShmRecvComm>(std::move(sock), std::move(ring), std::move(peer), pid,
                                       inject_refuse);
}

}  // namespace gw::net::shm
