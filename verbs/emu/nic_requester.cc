// The NIC's requester side (as Linux rxe's rxe_req.c and the response half of rxe_comp.c): it
// takes the front work request of a QP's send queue, checks its local keys, connects to the
// peer's NIC, transmits the request (header, then the gathered payload), and handles the
// response: ACK, READ response data placed into the scatter list, RNR and access NAKs, and the
// timeouts and retries that decide when a peer is gone.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "verbs/emu/nic.h"

namespace gw::verbs::emu {

// The requester's timers and transmissions for one QP.
void Nic::drive(EmuQp* q, int64_t now) {
  if (q->qp.state != IBV_QPS_RTS || q->sq.empty()) return;
  Wr& w = q->sq.front();
  if (w.awaiting) {
    if (now < w.due_ns) return;
    if (w.acked) {  // a held ACK takes effect now
      complete_front(q, IBV_WC_SUCCESS);
      drive(q, now);
      return;
    }
    // No response within the ACK timeout: retry, or give up.
    if (w.retries >= q->retry_cnt) {
      to_error(q, IBV_WC_RETRY_EXC_ERR);
      return;
    }
    ++w.retries;
    ++counters.retransmits;
    w.awaiting = false;
    w.due_ns = now;
    if (q->out == OutState::kDead) q->out = OutState::kNone;  // try the peer again
  }
  if (q->tx_active || now < w.due_ns) return;
  if (q->delay_ms > 0 && w.retries == 0 && w.rnr_retries == 0 && w.due_ns == 0) {
    w.due_ns = now + int64_t{q->delay_ms} * 1000000;
    return;
  }
  // Local checks happen when the NIC takes the WR, as on hardware.
  if (!w.is_inline) {
    for (const ibv_sge& s : w.sges) {
      EmuMr* mr = find_mr(s.lkey);
      if (mr == nullptr || mr->mr.pd != q->qp.pd || !in_range(mr, s.addr, s.length) ||
          (w.op == kOpRead && !(mr->access & IBV_ACCESS_LOCAL_WRITE))) {
        to_error(q, IBV_WC_LOC_PROT_ERR);  // a READ writes its local buffer
        return;
      }
    }
  }
  if (q->drop > 0) {
    --q->drop;
    w.awaiting = true;
    w.due_ns = now + ack_timeout_ns(q->timeout);
    return;
  }
  if (q->out == OutState::kNone) connect_out(q);
  if (q->out == OutState::kDead) {  // the packets go nowhere; the timeout will tell
    w.awaiting = true;
    w.due_ns = now + ack_timeout_ns(q->timeout);
    return;
  }
  if (q->out != OutState::kConnected) return;
  q->tx_hdr =
      WireRequest{kMagic, w.op, {}, q->dest_qpn, w.psn, w.imm, w.rkey, w.remote_addr, w.length};
  q->tx_hdr_sent = 0;
  q->tx_sent = 0;
  q->tx_active = true;
  transmit(q);
}

void Nic::connect_out(EmuQp* q) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    q->out = OutState::kDead;
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  q->out_fd = fd;
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&q->remote), sizeof(q->remote));
  if (rc == 0) {
    q->out = OutState::kConnected;
  } else if (errno == EINPROGRESS) {
    q->out = OutState::kConnecting;
  } else {
    close_out(q);
    q->out = OutState::kDead;
  }
}

void Nic::lose_connection(EmuQp* q) {
  close_out(q);
  q->out = OutState::kDead;
  if (!q->sq.empty()) {
    Wr& w = q->sq.front();
    if (!w.awaiting) {  // mid-transmission: lost; the ACK timeout decides
      w.awaiting = true;
      w.due_ns = sys::now_ns() + ack_timeout_ns(q->timeout);
    }
  }
}

void Nic::service_out(EmuQp* q) {
  if (q->out == OutState::kConnecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(q->out_fd, SOL_SOCKET, SO_ERROR, &err, &len);
    pollfd p{q->out_fd, POLLOUT, 0};
    if (err != 0) {
      lose_connection(q);
      return;
    }
    if (::poll(&p, 1, 0) <= 0) return;
    q->out = OutState::kConnected;
    drive(q, sys::now_ns());
    return;
  }
  if (q->tx_active) transmit(q);
  // Responses.
  while (q->out_fd >= 0) {
    if (q->rx_read_left > 0) {
      if (!receive_read_data(q)) return;
      continue;
    }
    ssize_t n = recv(q->out_fd, reinterpret_cast<char*>(&q->rx_resp) + q->rx_resp_got,
                     sizeof(WireResponse) - q->rx_resp_got, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      lose_connection(q);
      return;
    }
    if (n < 0) return;
    q->rx_resp_got += static_cast<size_t>(n);
    if (q->rx_resp_got < sizeof(WireResponse)) continue;
    q->rx_resp_got = 0;
    const WireResponse& r = q->rx_resp;
    if (r.magic == kMagic && r.type == kReadResp && r.length > 0) {
      // The data follows: into the front WR's buffers when it answers that READ, else away.
      const Wr* w = q->sq.empty() ? nullptr : &q->sq.front();
      q->rx_read_place = w != nullptr && w->op == kOpRead && w->awaiting && !w->acked &&
                         w->psn == r.psn && w->length == r.length;
      q->rx_read_left = r.length;
      q->rx_read_got = 0;
      continue;
    }
    on_response(q, r);
  }
}

// The bytes of `w`'s scatter list at offset `off` (< its length): their address, and in *avail
// how many follow in that SGE; nullptr when the SGE's registration has gone since the post.
uint8_t* Nic::sge_piece(const Wr& w, uint64_t off, uint64_t* avail) {
  for (const ibv_sge& s : w.sges) {
    if (off < s.length) {
      EmuMr* mr = find_mr(s.lkey);
      if (mr == nullptr || !in_range(mr, s.addr, s.length)) return nullptr;
      *avail = s.length - off;
      return bytes_at(mr, s.addr) + off;
    }
    off -= s.length;
  }
  return nullptr;
}

// Receives what has come of a read response's data; false when the socket has no more now
// (or was lost). At the end the response takes effect (placed) or is dropped (stale).
bool Nic::receive_read_data(EmuQp* q) {
  uint8_t sink[65536];
  while (q->rx_read_left > 0) {
    uint8_t* into = sink;
    uint64_t avail = sizeof(sink);
    if (q->rx_read_place) {
      into = sge_piece(q->sq.front(), q->rx_read_got, &avail);
      if (into == nullptr) {
        q->rx_read_place = false;
        to_error(q, IBV_WC_LOC_PROT_ERR);  // closes the connection: nothing more to read
        return false;
      }
    }
    size_t chunk = static_cast<size_t>(std::min<uint64_t>({avail, q->rx_read_left, kStep}));
    ssize_t n = recv(q->out_fd, into, chunk, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
      lose_connection(q);
      return false;
    }
    if (n < 0) return false;
    q->rx_read_got += static_cast<uint64_t>(n);
    q->rx_read_left -= static_cast<uint64_t>(n);
  }
  if (q->rx_read_place) {
    q->rx_read_place = false;
    on_response(q, q->rx_resp);
  }
  return true;
}

void Nic::on_response(EmuQp* q, const WireResponse& r) {
  if (q->sq.empty() || r.magic != kMagic) return;
  Wr& w = q->sq.front();
  if (!w.awaiting || w.acked || r.psn != w.psn) return;  // stale (an earlier retry's answer)
  if (r.type == kAck && q->ack_delay_ms > 0) {
    w.acked = true;
    w.due_ns = sys::now_ns() + int64_t{q->ack_delay_ms} * 1000000;
  } else if (r.type == kAck || r.type == kReadResp) {
    complete_front(q, IBV_WC_SUCCESS);
    if (!q->sq.empty()) q->sq.front().due_ns = std::max<int64_t>(q->sq.front().due_ns, 0);
  } else if (r.type == kNakRnr) {
    if (q->rnr_retry != 7 && w.rnr_retries >= q->rnr_retry) {
      to_error(q, IBV_WC_RNR_RETRY_EXC_ERR);
      return;
    }
    ++w.rnr_retries;
    ++counters.retransmits;
    w.awaiting = false;
    w.due_ns = sys::now_ns() + rnr_delay_ns(r.rnr_timer);
  } else if (r.type == kNakInvReq) {
    to_error(q, IBV_WC_REM_INV_REQ_ERR);
  } else {
    to_error(q, IBV_WC_REM_ACCESS_ERR);
  }
}

// Sends what the socket takes of the front WR: header, then payload (gathered).
void Nic::transmit(EmuQp* q) {
  Wr& w = q->sq.front();
  while (q->tx_hdr_sent < sizeof(WireRequest)) {
    ssize_t n = send(q->out_fd, reinterpret_cast<char*>(&q->tx_hdr) + q->tx_hdr_sent,
                     sizeof(WireRequest) - q->tx_hdr_sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      lose_connection(q);
      return;
    }
    q->tx_hdr_sent += static_cast<size_t>(n);
  }
  size_t budget = 8 * kStep;
  const uint64_t payload = w.op == kOpRead ? 0 : w.length;  // a READ asks; the answer carries
  while (q->tx_sent < payload && budget > 0) {
    // Find the piece at tx_sent.
    const uint8_t* src = nullptr;
    uint64_t avail = 0;
    if (w.is_inline) {
      src = w.inline_data.data() + q->tx_sent;
      avail = w.length - q->tx_sent;
    } else {
      src = sge_piece(w, q->tx_sent, &avail);
      if (src == nullptr) {
        close_out(q);
        q->out = OutState::kNone;
        to_error(q, IBV_WC_LOC_PROT_ERR);
        return;
      }
    }
    size_t chunk = static_cast<size_t>(std::min<uint64_t>({avail, kStep, budget}));
    ssize_t n = send(q->out_fd, src, chunk, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      lose_connection(q);
      return;
    }
    q->tx_sent += static_cast<uint64_t>(n);
    budget -= static_cast<size_t>(n);
  }
  if (q->tx_sent < payload) return;
  q->tx_active = false;
  w.awaiting = true;
  w.due_ns = sys::now_ns() + ack_timeout_ns(q->timeout);
}

}  // namespace gw::verbs::emu
