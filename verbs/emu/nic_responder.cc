// The NIC's responder side (as Linux rxe's rxe_resp.c): it accepts the peers' connections, reads
// each request's header, decides its verdict (PSN, receive queue, rkey bounds and access), places
// the payload (small writes in address order, the last word last), completes a WRITE_WITH_IMM's
// receive, and answers with an ACK, a NAK or the READ's data.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "verbs/emu/nic.h"

namespace gw::verbs::emu {
namespace {

constexpr size_t kOrderedCopyMax = 4096;  // small writes land in address order, last word last

}  // namespace

void Nic::accept_all() {
  while (true) {
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    InConn c;
    c.fd = fd;
    in_.push_back(std::move(c));
  }
}

void Nic::respond(InConn& c, uint8_t type, uint32_t psn, uint8_t rnr_timer, const uint8_t* data,
                  uint32_t length) {
  WireResponse r{kMagic, type, rnr_timer, 0, psn, length};
  c.out.append(reinterpret_cast<const char*>(&r), sizeof(r));
  if (length > 0) c.out.append(reinterpret_cast<const char*>(data), length);
  flush(c);
}

void Nic::flush(InConn& c) {
  while (!c.out.empty()) {
    ssize_t n = send(c.fd, c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      close(c.fd);
      c.fd = -1;
      return;
    }
    c.out.erase(0, static_cast<size_t>(n));
  }
}

// Decides what to do with a request whose header arrived.
void Nic::on_header(InConn& c) {
  const WireRequest& h = c.hdr;
  c.in_payload = true;
  c.remaining = h.length;
  c.got = 0;
  c.dest = nullptr;
  c.verdict = 0;
  c.scratch.clear();
  auto it = qps.find(h.dest_qpn);
  if (h.magic != kMagic || it == qps.end()) return;  // silently dropped
  EmuQp* q = it->second;
  if (q->qp.state != IBV_QPS_RTR && q->qp.state != IBV_QPS_RTS) return;
  if (h.op == kOpRead) {
    c.remaining = 0;  // a READ request carries no payload
    // A duplicate READ is executed again (its response was lost), a future one dropped.
    if (psn_diff(h.psn, q->rq_psn) > 0) return;
    if (q->max_dest_rd_atomic == 0) {
      c.verdict = kNakInvReq;
      return;
    }
    EmuMr* mr = h.length > 0 ? find_mr(h.rkey) : nullptr;
    if (h.length > 0 &&
        (mr == nullptr || mr->mr.pd != q->qp.pd || !in_range(mr, h.remote_addr, h.length) ||
         !(mr->access & IBV_ACCESS_REMOTE_READ) || !(q->access & IBV_ACCESS_REMOTE_READ))) {
      c.verdict = kNakAccess;
      return;
    }
    c.dest = mr != nullptr ? bytes_at(mr, h.remote_addr) : nullptr;  // read from, at once
    c.verdict = kReadResp;
    return;
  }
  if (h.psn != q->rq_psn) {
    if (psn_diff(h.psn, q->rq_psn) < 0) c.verdict = kAck;  // duplicate: re-ACK
    return;
  }
  if (h.op == kOpWriteImm && q->rq.empty()) {
    c.verdict = kNakRnr;
    return;
  }
  if (h.length > 0) {
    EmuMr* mr = find_mr(h.rkey);
    if (mr == nullptr || mr->mr.pd != q->qp.pd || !in_range(mr, h.remote_addr, h.length) ||
        !(mr->access & IBV_ACCESS_REMOTE_WRITE) || !(q->access & IBV_ACCESS_REMOTE_WRITE)) {
      c.verdict = kNakAccess;
      return;
    }
    c.dest = bytes_at(mr, h.remote_addr);
    c.rkey = h.rkey;
    if (h.length <= kOrderedCopyMax) c.scratch.resize(h.length);
  }
  c.verdict = kAck;
}

// The whole request has arrived: place it, complete it, answer.
void Nic::on_request_done(InConn& c) {
  c.in_payload = false;
  const WireRequest& h = c.hdr;
  auto it = qps.find(h.dest_qpn);
  EmuQp* q = it == qps.end() ? nullptr : it->second;
  if (c.verdict == 0 || q == nullptr) return;
  if (c.verdict == kNakRnr) {
    respond(c, kNakRnr, h.psn, q->min_rnr_timer);
    return;
  }
  if (c.verdict == kNakAccess) {
    respond(c, kNakAccess, h.psn, 0);
    to_error(q, IBV_WC_REM_ACCESS_ERR);
    return;
  }
  if (c.verdict == kNakInvReq) {
    respond(c, kNakInvReq, h.psn, 0);
    to_error(q, IBV_WC_REM_INV_REQ_ERR);
    return;
  }
  if (c.verdict == kReadResp) {
    // The bytes as they are now (the registration was checked with the header).
    respond(c, kReadResp, h.psn, 0, c.dest, static_cast<uint32_t>(h.length));
    c.dest = nullptr;
    if (h.psn == q->rq_psn) q->rq_psn = (q->rq_psn + 1) & 0xffffff;
    return;
  }
  if (h.psn != q->rq_psn) {  // duplicate
    respond(c, kAck, h.psn, 0);
    return;
  }
  if (c.dest != nullptr && !c.scratch.empty()) {
    // A buffered write lands only now: its registration may have gone since the header (a real
    // NIC checks every packet against the MR it names). Then nothing is written: the requester
    // gets a remote access error and this QP goes to error, as for a bad rkey.
    EmuMr* mr = find_mr(c.rkey);
    if (mr == nullptr || mr->mr.pd != q->qp.pd || !in_range(mr, h.remote_addr, h.length)) {
      c.dest = nullptr;
      respond(c, kNakAccess, h.psn, 0);
      to_error(q, IBV_WC_REM_ACCESS_ERR);
      return;
    }
    c.dest = bytes_at(mr, h.remote_addr);
    // Address order, the last 8 bytes last: a poller of the last word sees the rest.
    size_t n = c.scratch.size();
    size_t head = n > 8 ? n - 8 : 0;
    std::memcpy(c.dest, c.scratch.data(), head);
    std::atomic_thread_fence(std::memory_order_release);
    std::memcpy(c.dest + head, c.scratch.data() + head, n - head);
  }
  q->rq_psn = (q->rq_psn + 1) & 0xffffff;  // PSNs are 24 bits, as the requester's
  if (h.op == kOpWriteImm) {
    ibv_wc wc{};
    wc.wr_id = q->rq.front();
    q->rq.pop_front();
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    wc.byte_len = static_cast<uint32_t>(h.length);
    wc.imm_data = h.imm;
    wc.wc_flags = IBV_WC_WITH_IMM;
    wc.qp_num = q->qp.qp_num;
    push_cqe(q->rcq, wc);
  }
  respond(c, kAck, h.psn, 0);
}

void Nic::service_in(InConn& c) {
  flush(c);
  size_t budget = 8 * kStep;
  while (c.fd >= 0 && budget > 0) {
    if (!c.in_payload) {
      ssize_t n = recv(c.fd, reinterpret_cast<char*>(&c.hdr) + c.hdr_got,
                       sizeof(WireRequest) - c.hdr_got, MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        close(c.fd);
        c.fd = -1;
        return;
      }
      if (n < 0) return;
      c.hdr_got += static_cast<size_t>(n);
      if (c.hdr_got < sizeof(WireRequest)) continue;
      c.hdr_got = 0;
      on_header(c);
      if (c.remaining == 0) on_request_done(c);
      continue;
    }
    // The registration may have gone since the header: the rest is discarded.
    if (c.dest != nullptr && c.scratch.empty()) {
      EmuMr* mr = find_mr(c.rkey);
      if (mr == nullptr || !in_range(mr, c.hdr.remote_addr, c.hdr.length)) {
        c.dest = nullptr;
        c.verdict = kNakAccess;
      }
    }
    uint8_t sink[65536];
    uint8_t* into;
    size_t chunk;
    if (c.dest == nullptr) {
      into = sink;
      chunk = static_cast<size_t>(std::min<uint64_t>(c.remaining, sizeof(sink)));
    } else if (!c.scratch.empty()) {
      into = c.scratch.data() + c.got;
      chunk = static_cast<size_t>(c.remaining);
    } else {
      into = c.dest + c.got;
      chunk = static_cast<size_t>(std::min<uint64_t>(c.remaining, kStep));
    }
    ssize_t n = recv(c.fd, into, chunk, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      close(c.fd);
      c.fd = -1;
      return;
    }
    if (n < 0) return;
    c.got += static_cast<uint64_t>(n);
    c.remaining -= static_cast<uint64_t>(n);
    budget -= std::min(budget, static_cast<size_t>(n));
    if (c.remaining == 0) on_request_done(c);
  }
}

}  // namespace gw::verbs::emu
