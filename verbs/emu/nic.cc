// The emulated NIC's shared part (verbs/emu/nic.h): the process-wide instance and its fork
// handling, the listener and the thread's event loop, completion queues, async events, and the
// error state. The requester and the responder are in nic_requester.cc and nic_responder.cc.
#include "verbs/emu/nic.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/config.h"
#include "core/log.h"
#include "verbs/verbs_config.h"

namespace gw::verbs::emu {

Nic& Nic::get() {
  static Nic* nic = [] {
    auto* n = new Nic();  // never destroyed: the thread may run until exit
    n->dmabuf_supported = config::get_bool(verbs_config::kVerbsEmuDmabuf);
    // A forked child has no NIC thread and must not touch the parent's QPs (hardware behaves
    // alike): it starts with an empty device of its own.
    pthread_atfork([] { get().mu.lock(); }, [] { get().mu.unlock(); },
                   [] {
                     Nic& c = get();
                     c.reset_in_child();
                     c.mu.unlock();
                   });
    return n;
  }();
  return *nic;
}

void Nic::reset_in_child() {
  for (InConn& c : in_) close(c.fd);
  in_.clear();
  for (auto& [qpn, q] : qps) {
    if (q->out_fd >= 0) close(q->out_fd);
    q->out_fd = -1;
    q->qp.state = IBV_QPS_ERR;  // inherited QPs are dead in the child
  }
  qps.clear();
  mrs.clear();
  contexts.clear();
  unacked.clear();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
  started_ = false;
  start_error.clear();
}

bool Nic::start() {
  std::lock_guard<std::mutex> lock(mu);
  if (started_) return start_error.empty();
  started_ = true;
  std::string a = config::get_string(verbs_config::kVerbsEmuAddr);
  if (inet_pton(AF_INET, a.c_str(), &addr) != 1) {
    start_error = "GW_VERBS_EMU_ADDR='" + a + "' is not an IPv4 address";
    return false;
  }
  const std::string link = config::get_string(verbs_config::kVerbsEmuLink);
  if (link != "roce" && link != "ib") {
    start_error = "GW_VERBS_EMU_LINK='" + link + "': expected roce or ib";
    return false;
  }
  ib_link = link == "ib";
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr = addr;
  socklen_t len = sizeof(sa);
  // The LID is the listener's port; InfiniBand's unicast LIDs are 1..0xBFFF, so an IB port
  // takes a port in that range (tried at random), a RoCE port any.
  int bound = -1;
  uint32_t seed =
      static_cast<uint32_t>(getpid()) * 2654435761u ^ static_cast<uint32_t>(sys::now_ns());
  for (int attempt = 0; listen_fd_ >= 0 && attempt < (ib_link ? 200 : 1); ++attempt) {
    if (ib_link) {
      seed = seed * 1103515245u + 12345u;
      sa.sin_port = htons(static_cast<uint16_t>(20000 + (seed >> 8) % (0xBFFF - 20000)));
    }
    bound = bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    if (bound == 0 || errno != EADDRINUSE) break;
  }
  if (listen_fd_ < 0 || bound != 0 || ::listen(listen_fd_, 128) != 0 ||
      getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    start_error = std::string("emulated NIC listener on ") + a + ": " + strerror(errno);
    return false;
  }
  port = ntohs(sa.sin_port);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  std::thread([this] { run(); }).detach();
  // A forked child inherits none of this thread; it must not use the parent's NIC.
  return true;
}

void Nic::run() {
  std::vector<pollfd> fds;
  std::vector<std::pair<int, uint32_t>> owners;  // (kind, id): 0 listen, 1 wake, 2 qp, 3 in
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    fds.clear();
    owners.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    owners.push_back({0, 0});
    fds.push_back({wake_fd_, POLLIN, 0});
    owners.push_back({1, 0});
    int64_t now = sys::now_ns();
    int64_t next_due = now + 20 * 1000000LL;
    for (auto& [qpn, q] : qps) {
      if (q->out_fd >= 0) {
        short ev = POLLIN;
        if (q->out == OutState::kConnecting || q->tx_active) ev |= POLLOUT;
        fds.push_back({q->out_fd, ev, 0});
        owners.push_back({2, qpn});
      }
      if (!q->sq.empty() && !q->tx_active && q->out != OutState::kConnecting &&
          q->qp.state == IBV_QPS_RTS) {
        next_due = std::min(next_due, q->sq.front().due_ns);
      }
    }
    for (size_t i = 0; i < in_.size(); ++i) {
      short ev = POLLIN;
      if (!in_[i].out.empty()) ev |= POLLOUT;
      fds.push_back({in_[i].fd, ev, 0});
      owners.push_back({3, static_cast<uint32_t>(i)});
    }
    int wait_ms = static_cast<int>(std::clamp<int64_t>((next_due - now) / 1000000, 0, 20));
    lock.unlock();
    (void)::poll(fds.data(), fds.size(), wait_ms);
    lock.lock();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [kind, id] = owners[i];
      if (kind == 0) {
        accept_all();
      } else if (kind == 1) {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof(v));
      } else if (kind == 2) {
        auto it = qps.find(id);
        if (it != qps.end() && it->second->out_fd == fds[i].fd) service_out(it->second);
      } else if (id < in_.size() && in_[id].fd == fds[i].fd) {
        service_in(in_[id]);
      }
    }
    std::erase_if(in_, [](const InConn& c) { return c.fd < 0; });
    now = sys::now_ns();
    for (auto& [qpn, q] : qps) drive(q, now);
  }
}

void Nic::push_cqe(EmuCq* cq, const ibv_wc& wc) {
  if (static_cast<int>(cq->entries.size()) >= cq->depth) {
    if (!cq->overrun) {
      cq->overrun = true;
      post_event_for_cq(cq);
    }
    return;
  }
  cq->entries.push_back(wc);
}

void Nic::post_event(ibv_context* ctx, const ibv_async_event& ev) {
  for (EmuContext* c : contexts) {
    if (&c->ctx == ctx) {
      c->events.push_back(ev);
      char b = 1;
      (void)!write(c->pipe_w, &b, 1);
    }
  }
}

// Events not yet read that name a destroyed object go with it (the kernel drops them too): the
// next object at the same address must not receive them.
void Nic::drop_events(const void* object) {
  for (EmuContext* c : contexts) {
    std::erase_if(c->events, [object](const ibv_async_event& ev) {
      return ev.element.qp == object || ev.element.cq == object;
    });
  }
}

// Waits (bounded: a consumer that never acks must not hang the destroy for good) until every
// event about `object` that get_async_event handed out was acked. `lock` holds mu.
void Nic::wait_acked(std::unique_lock<std::mutex>& lock, const void* object) {
  auto none = [&] { return unacked.find(object) == unacked.end(); };
  if (!acked.wait_for(lock, std::chrono::seconds(10), none)) {
    GW_LOG_WARN(
        "verbs emulator: an async event was not acked within 10 s of destroying its object");
    unacked.erase(object);
  }
}

void Nic::post_event_for_cq(EmuCq* cq) {
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_CQ_ERR;
  ev.element.cq = &cq->cq;
  post_event(cq->cq.context, ev);
}

// Completes the front WR of `q`'s send queue with `status`.
void Nic::complete_front(EmuQp* q, ibv_wc_status status) {
  Wr w = std::move(q->sq.front());
  q->sq.pop_front();
  q->tx_active = false;
  if (status == IBV_WC_SUCCESS && !w.signaled) {
    ++q->unsignaled_done;
    return;
  }
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = status;
  // WRITE_WITH_IMM completes as a write on the send side.
  wc.opcode = w.op == kOpRead ? IBV_WC_RDMA_READ : IBV_WC_RDMA_WRITE;
  wc.byte_len = static_cast<uint32_t>(w.length);
  wc.qp_num = q->qp.qp_num;
  push_cqe(q->scq, wc);
  q->sq_used -= 1 + q->unsignaled_done;
  q->unsignaled_done = 0;
}

void Nic::close_out(EmuQp* q) {
  if (q->out_fd >= 0) close(q->out_fd);
  q->out_fd = -1;
  q->tx_active = false;
  q->rx_resp_got = 0;
  q->rx_read_left = 0;
  q->rx_read_got = 0;
}

// Error state: the first WR carries `status`, everything else flushes (signaled or not).
void Nic::to_error(EmuQp* q, ibv_wc_status first) {
  if (q->qp.state == IBV_QPS_ERR) return;
  q->qp.state = IBV_QPS_ERR;
  close_out(q);
  q->out = OutState::kNone;
  bool first_done = false;
  while (!q->sq.empty()) {
    Wr& w = q->sq.front();
    w.signaled = true;
    complete_front(q, first_done ? IBV_WC_WR_FLUSH_ERR : first);
    first_done = true;
  }
  q->sq_used = 0;
  q->unsignaled_done = 0;
  while (!q->rq.empty()) {
    ibv_wc wc{};
    wc.wr_id = q->rq.front();
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = q->qp.qp_num;
    push_cqe(q->rcq, wc);
    q->rq.pop_front();
  }
}

}  // namespace gw::verbs::emu
