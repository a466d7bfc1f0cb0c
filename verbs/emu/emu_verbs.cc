#include "verbs/emu/emu_verbs.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "core/config.h"
#include "core/log.h"
#include "core/sys/time.h"
#include "verbs/verbs_config.h"

namespace gw::verbs::emu {
namespace {

constexpr uint32_t kMagic = 0x47574551;  // "GWEQ"
constexpr int kMaxQpWr = 4096;
constexpr int kMaxSge = 4;
constexpr int kMaxInline = 256;
constexpr int kMaxCqe = 1 << 16;
constexpr uint64_t kMaxMsg = uint64_t{1} << 31;
constexpr size_t kStep = size_t{1} << 20;  // bytes moved per socket call while holding the lock
constexpr size_t kOrderedCopyMax = 4096;   // small writes land in address order, last word last
constexpr int kGidCount = 5;

enum Op : uint8_t { kOpWrite = 1, kOpWriteImm = 2, kOpRead = 3 };
// kReadResp is followed by the read's `length` bytes; kNakInvReq answers a READ to a QP that
// takes none (max_dest_rd_atomic 0).
enum Resp : uint8_t { kAck = 1, kNakRnr = 2, kNakAccess = 3, kReadResp = 4, kNakInvReq = 5 };

// Requests and responses on the emulated wire (host byte order: both ends are this code).
struct WireRequest {
  uint32_t magic;
  uint8_t op;
  uint8_t pad[3];
  uint32_t dest_qpn;
  uint32_t psn;
  uint32_t imm;  // as the poster gave it (network order by convention)
  uint32_t rkey;
  uint64_t remote_addr;
  uint64_t length;
};
static_assert(sizeof(WireRequest) == 40);

struct WireResponse {
  uint32_t magic;
  uint8_t type;
  uint8_t rnr_timer;  // the responder's min_rnr_timer, for an RNR NAK
  uint16_t pad;
  uint32_t psn;
  uint32_t length;  // kReadResp: the data bytes that follow
};
static_assert(sizeof(WireResponse) == 16);

using sys::now_ns;

// a - b for 24-bit PSNs, in -2^23 .. 2^23-1: negative when a is before b.
int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(((a - b) & 0xffffff) << 8) >> 8;
}

// IB local ACK timeout: 4.096 us x 2^timeout; 0 means wait forever.
int64_t ack_timeout_ns(uint8_t timeout) {
  if (timeout == 0) return INT64_MAX / 4;
  return static_cast<int64_t>(4096.0 *
                              static_cast<double>(uint64_t{1} << std::min<int>(timeout, 31)));
}

// The IBA's RNR NAK timer encoding (5 bits) in microseconds; 0 encodes 655.36 ms.
int64_t rnr_delay_ns(uint8_t code) {
  static const double kUs[32] = {655360, 10,    20,    30,     40,     60,     80,     120,
                                 160,    240,   320,   480,    640,    960,    1280,   1920,
                                 2560,   3840,  5120,  7680,   10240,  15360,  20480,  30720,
                                 40960,  61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return static_cast<int64_t>(kUs[code & 31] * 1000);
}

struct EmuPd;
struct EmuCq;

struct EmuMr {
  ibv_mr mr{};
  int access = 0;
};

struct EmuCq {
  ibv_cq cq{};
  int depth = 0;
  std::deque<ibv_wc> entries;
  bool overrun = false;
  int users = 0;
};

struct EmuPd {
  ibv_pd pd{};
  int users = 0;
};

struct Wr {
  uint64_t wr_id = 0;
  uint8_t op = 0;
  bool signaled = false;
  bool is_inline = false;
  uint32_t imm = 0;
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  std::vector<ibv_sge> sges;
  std::vector<uint8_t> inline_data;
  uint64_t length = 0;
  uint32_t psn = 0;
  bool awaiting = false;  // transmitted, waiting for a response
  bool acked = false;     // awaiting: its ACK arrived and is held until due_ns (inject_ack_delay)
  int64_t due_ns = 0;     // queued: earliest transmission; awaiting: the ACK timeout
  int retries = 0;
  int rnr_retries = 0;
};

enum class OutState { kNone, kConnecting, kConnected, kDead };

struct EmuQp {
  ibv_qp qp{};
  EmuCq* scq = nullptr;
  EmuCq* rcq = nullptr;
  ibv_qp_cap cap{};
  int access = 0;
  bool sig_all = false;
  uint8_t port = 0;
  int path_mtu = 0;
  uint32_t dest_qpn = 0;
  sockaddr_in remote{};
  uint8_t timeout = 0, retry_cnt = 0, rnr_retry = 0, min_rnr_timer = 0;
  uint8_t max_dest_rd_atomic = 0;  // responder: RDMA READs it takes (0: none)
  uint32_t next_psn = 0;           // requester: next PSN to assign
  uint32_t rq_psn = 0;             // responder: next PSN expected
  std::deque<Wr> sq;
  int sq_used = 0;          // slots, including completed unsignaled WRs not yet reclaimed
  int unsignaled_done = 0;  // completed unsignaled WRs waiting for a signaled completion
  std::deque<uint64_t> rq;  // posted receive wr_ids (their SGEs are unused by WRITE_WITH_IMM)
  // Requester connection to the peer NIC.
  int out_fd = -1;
  OutState out = OutState::kNone;
  WireRequest tx_hdr{};
  size_t tx_hdr_sent = 0;
  uint64_t tx_sent = 0;  // payload bytes sent of the front WR
  bool tx_active = false;
  WireResponse rx_resp{};
  size_t rx_resp_got = 0;
  uint64_t rx_read_left = 0;   // bytes of a read response still to come
  uint64_t rx_read_got = 0;    // of it, received so far
  bool rx_read_place = false;  // the response answers the front WR: place its bytes there
  // Injected faults.
  int drop = 0;
  int delay_ms = 0;
  int ack_delay_ms = 0;
};

struct InConn {
  int fd = -1;
  WireRequest hdr{};
  size_t hdr_got = 0;
  bool in_payload = false;
  uint64_t remaining = 0;
  uint8_t* dest = nullptr;  // null: discard
  uint32_t rkey = 0;
  std::vector<uint8_t> scratch;  // small writes, copied in address order at the end
  uint64_t got = 0;
  uint8_t verdict = 0;  // 0 = drop silently, else the response to send
  std::string out;      // pending response bytes
};

struct EmuDevice {
  ibv_device dev{};
};

struct EmuContext {
  ibv_context ctx{};
  int pipe_w = -1;
  std::deque<ibv_async_event> events;
};

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

class Nic {
 public:
  static Nic& get() {
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

  void reset_in_child() {
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

  std::mutex mu;
  // Affiliated events handed out by get_async_event and not yet acked, per QP or CQ: as in
  // libibverbs, destroying the object waits for them (or the consumer could record an error
  // against an address the next QP or CQ receives).
  std::map<const void*, int> unacked;
  std::condition_variable acked;
  std::map<uint32_t, EmuQp*> qps;
  std::map<uint32_t, EmuMr*> mrs;  // by lkey (== rkey)
  std::vector<EmuContext*> contexts;
  std::vector<DmabufRecord> dmabuf;
  bool dmabuf_supported = true;
  Counters counters;
  uint32_t next_qpn = 0x100;
  uint32_t next_key = 0x1000;
  in_addr addr{};
  uint16_t port = 0;
  bool ib_link = false;  // GW_VERBS_EMU_LINK=ib: an InfiniBand port, LID-routed
  std::string start_error;

  // Starts the listener and thread once; false (with start_error) if the listener fails.
  bool start() {
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
    uint32_t seed = static_cast<uint32_t>(getpid()) * 2654435761u ^ static_cast<uint32_t>(now_ns());
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

  void wake() {
    uint64_t one = 1;
    if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof(one));
  }

  void push_cqe(EmuCq* cq, const ibv_wc& wc) {
    if (static_cast<int>(cq->entries.size()) >= cq->depth) {
      if (!cq->overrun) {
        cq->overrun = true;
        post_event_for_cq(cq);
      }
      return;
    }
    cq->entries.push_back(wc);
  }

  void post_event(ibv_context* ctx, const ibv_async_event& ev) {
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
  void drop_events(const void* object) {
    for (EmuContext* c : contexts) {
      std::erase_if(c->events, [object](const ibv_async_event& ev) {
        return ev.element.qp == object || ev.element.cq == object;
      });
    }
  }

  // Waits (bounded: a consumer that never acks must not hang the destroy for good) until every
  // event about `object` that get_async_event handed out was acked. `lock` holds mu.
  void wait_acked(std::unique_lock<std::mutex>& lock, const void* object) {
    auto none = [&] { return unacked.find(object) == unacked.end(); };
    if (!acked.wait_for(lock, std::chrono::seconds(10), none)) {
      GW_LOG_WARN(
          "verbs emulator: an async event was not acked within 10 s of destroying its object");
      unacked.erase(object);
    }
  }

  void post_event_for_cq(EmuCq* cq) {
    ibv_async_event ev{};
    ev.event_type = IBV_EVENT_CQ_ERR;
    ev.element.cq = &cq->cq;
    post_event(cq->cq.context, ev);
  }

  // Completes the front WR of `q`'s send queue with `status`.
  void complete_front(EmuQp* q, ibv_wc_status status) {
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

  void close_out(EmuQp* q) {
    if (q->out_fd >= 0) close(q->out_fd);
    q->out_fd = -1;
    q->tx_active = false;
    q->rx_resp_got = 0;
    q->rx_read_left = 0;
    q->rx_read_got = 0;
  }

  // Error state: the first WR carries `status`, everything else flushes (signaled or not).
  void to_error(EmuQp* q, ibv_wc_status first) {
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

  EmuMr* find_mr(uint32_t key) {
    auto it = mrs.find(key);
    return it == mrs.end() ? nullptr : it->second;
  }

  static bool in_range(const EmuMr* mr, uint64_t addr, uint64_t len) {
    auto base = reinterpret_cast<uint64_t>(mr->mr.addr);
    return addr >= base && addr - base <= mr->mr.length && len <= mr->mr.length - (addr - base);
  }

 private:
  void run() {
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
      int64_t now = now_ns();
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
      now = now_ns();
      for (auto& [qpn, q] : qps) drive(q, now);
    }
  }

  void accept_all() {
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

  // The requester's timers and transmissions for one QP.
  void drive(EmuQp* q, int64_t now) {
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

  void connect_out(EmuQp* q) {
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

  void lose_connection(EmuQp* q) {
    close_out(q);
    q->out = OutState::kDead;
    if (!q->sq.empty()) {
      Wr& w = q->sq.front();
      if (!w.awaiting) {  // mid-transmission: lost; the ACK timeout decides
        w.awaiting = true;
        w.due_ns = now_ns() + ack_timeout_ns(q->timeout);
      }
    }
  }

  void service_out(EmuQp* q) {
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
      drive(q, now_ns());
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
  uint8_t* sge_piece(const Wr& w, uint64_t off, uint64_t* avail) {
    for (const ibv_sge& s : w.sges) {
      if (off < s.length) {
        EmuMr* mr = find_mr(s.lkey);
        if (mr == nullptr || !in_range(mr, s.addr, s.length)) return nullptr;
        *avail = s.length - off;
        return reinterpret_cast<uint8_t*>(s.addr) + off;
      }
      off -= s.length;
    }
    return nullptr;
  }

  // Receives what has come of a read response's data; false when the socket has no more now
  // (or was lost). At the end the response takes effect (placed) or is dropped (stale).
  bool receive_read_data(EmuQp* q) {
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

  void on_response(EmuQp* q, const WireResponse& r) {
    if (q->sq.empty() || r.magic != kMagic) return;
    Wr& w = q->sq.front();
    if (!w.awaiting || w.acked || r.psn != w.psn) return;  // stale (an earlier retry's answer)
    if (r.type == kAck && q->ack_delay_ms > 0) {
      w.acked = true;
      w.due_ns = now_ns() + int64_t{q->ack_delay_ms} * 1000000;
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
      w.due_ns = now_ns() + rnr_delay_ns(r.rnr_timer);
    } else if (r.type == kNakInvReq) {
      to_error(q, IBV_WC_REM_INV_REQ_ERR);
    } else {
      to_error(q, IBV_WC_REM_ACCESS_ERR);
    }
  }

  // Sends what the socket takes of the front WR: header, then payload (gathered).
  void transmit(EmuQp* q) {
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
    w.due_ns = now_ns() + ack_timeout_ns(q->timeout);
  }

  void respond(InConn& c, uint8_t type, uint32_t psn, uint8_t rnr_timer,
               const uint8_t* data = nullptr, uint32_t length = 0) {
    WireResponse r{kMagic, type, rnr_timer, 0, psn, length};
    c.out.append(reinterpret_cast<const char*>(&r), sizeof(r));
    if (length > 0) c.out.append(reinterpret_cast<const char*>(data), length);
    flush(c);
  }

  void flush(InConn& c) {
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
  void on_header(InConn& c) {
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
      c.dest = reinterpret_cast<uint8_t*>(h.remote_addr);
      c.rkey = h.rkey;
      if (h.length <= kOrderedCopyMax) c.scratch.resize(h.length);
    }
    c.verdict = kAck;
  }

  // The whole request has arrived: place it, complete it, answer.
  void on_request_done(InConn& c) {
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
      respond(c, kReadResp, h.psn, 0, reinterpret_cast<const uint8_t*>(h.remote_addr),
              static_cast<uint32_t>(h.length));
      if (h.psn == q->rq_psn) q->rq_psn = (q->rq_psn + 1) & 0xffffff;
      return;
    }
    if (h.psn != q->rq_psn) {  // duplicate
      respond(c, kAck, h.psn, 0);
      return;
    }
    if (c.dest != nullptr && !c.scratch.empty()) {
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

  void service_in(InConn& c) {
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

  bool started_ = false;
  int listen_fd_ = -1;
  int wake_fd_ = -1;
  std::vector<InConn> in_;
};

// ---- the table's entries ---------------------------------------------------------------------

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
  ibv_mr* mr = make_mr(pd, reinterpret_cast<void*>(iova), length, access);
  if (mr != nullptr) {
    char target[256] = {};
    const std::string link = "/proc/self/fd/" + std::to_string(fd);
    ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
    std::lock_guard<std::mutex> lock(nic.mu);
    nic.dmabuf.push_back({fd, offset, length, iova, access, n > 0 ? std::string(target, n) : ""});
  }
  return mr;
}

int emu_dereg_mr(ibv_mr* mr) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  auto it = nic.mrs.find(mr->lkey);
  if (it == nic.mrs.end() || &it->second->mr != mr) return EINVAL;
  --reinterpret_cast<EmuPd*>(mr->pd)->users;
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

EmuQp* as_qp(ibv_qp* qp) { return reinterpret_cast<EmuQp*>(qp); }

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

void inject_drop(ibv_qp* qp, int count) {
  std::lock_guard<std::mutex> lock(Nic::get().mu);
  as_qp(qp)->drop = count;
}

void inject_delay(ibv_qp* qp, int ms) {
  std::lock_guard<std::mutex> lock(Nic::get().mu);
  as_qp(qp)->delay_ms = ms;
}

void inject_ack_delay(ibv_qp* qp, int ms) {
  std::lock_guard<std::mutex> lock(Nic::get().mu);
  as_qp(qp)->ack_delay_ms = ms;
}

void force_qp_error(ibv_qp* qp) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  nic.to_error(as_qp(qp), IBV_WC_WR_FLUSH_ERR);
  ibv_async_event ev{};
  ev.event_type = IBV_EVENT_QP_FATAL;
  ev.element.qp = qp;
  nic.post_event(qp->context, ev);
}

void inject_drop_all(int count) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  for (auto& [qpn, q] : nic.qps) q->drop = count;
}

void inject_ack_delay_all(int ms) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  for (auto& [qpn, q] : nic.qps) q->ack_delay_ms = ms;
}

void force_error_all() {
  std::vector<ibv_qp*> all;
  {
    std::lock_guard<std::mutex> lock(Nic::get().mu);
    for (auto& [qpn, q] : Nic::get().qps) all.push_back(&q->qp);
  }
  for (ibv_qp* qp : all) force_qp_error(qp);
}

void set_dmabuf_supported(bool supported) {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  nic.dmabuf_supported = supported;
}

std::vector<DmabufRecord> dmabuf_records() {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  return nic.dmabuf;
}

Counters counters() {
  Nic& nic = Nic::get();
  std::lock_guard<std::mutex> lock(nic.mu);
  return nic.counters;
}

}  // namespace gw::verbs::emu
