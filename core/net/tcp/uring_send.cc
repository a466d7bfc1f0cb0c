#include "core/net/tcp/uring_send.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <mutex>

#include "core/log.h"
#include "core/net/tcp/socket.h"

#ifdef GW_HAVE_URING
#include <liburing.h>
#endif

// The CQE flags of SEND_ZC (include/uapi/linux/io_uring.h); defined here so the accounting
// builds (and is tested) without liburing.
#ifndef IORING_CQE_F_MORE
#define IORING_CQE_F_MORE (1U << 1)
#endif
#ifndef IORING_CQE_F_NOTIF
#define IORING_CQE_F_NOTIF (1U << 3)
#endif
// Kernel 6.2+, newer than liburing 2.3's header: the notification's res says whether the kernel
// copied the bytes after all (loopback, a same-host peer).
#ifndef IORING_SEND_ZC_REPORT_USAGE
#define IORING_SEND_ZC_REPORT_USAGE (1U << 3)
#endif
#ifndef IORING_NOTIF_USAGE_ZC_COPIED
#define IORING_NOTIF_USAGE_ZC_COPIED (1U << 31)
#endif

namespace gw::net::tcp {
namespace {

std::atomic<uint64_t> g_results{0};
std::atomic<uint64_t> g_notifs{0};
std::atomic<uint64_t> g_copied{0};
std::atomic<bool> g_skip_notif{false};

// The probe's outcome, once per process (a test may inject a failure and probe again).
struct Probe {
  std::mutex mu;
  bool done = false;
  bool usable = false;
  std::string why;
  std::string injected;
};
Probe& probe_state() {
  static Probe* p = new Probe();  // never destroyed: sends may run during static teardown
  return *p;
}

constexpr uint64_t kSendTag = 0x5a43;  // user_data of our SEND_ZC requests

#ifdef GW_HAVE_URING
// Sets up a ring and asks the kernel whether it knows SEND_ZC. Empty when usable.
std::string probe_kernel() {
  io_uring ring;
  int err = io_uring_queue_init(4, &ring, 0);
  if (err < 0) {
    char buf[128];
    return fmt::format("io_uring_queue_init: {} (kernel.io_uring_disabled, or a sandbox)",
                       strerror_r(-err, buf, sizeof(buf)));
  }
  std::string why;
  io_uring_probe* p = io_uring_get_probe_ring(&ring);
  if (p == nullptr) {
    why = "the kernel cannot list its io_uring opcodes (older than 5.6)";
  } else if (!io_uring_opcode_supported(p, IORING_OP_SEND_ZC)) {
    why = "the kernel has no IORING_OP_SEND_ZC (older than 6.0)";
  }
  if (p != nullptr) io_uring_free_probe(p);
  io_uring_queue_exit(&ring);
  return why;
}
#endif

}  // namespace

bool uring_built() {
#ifdef GW_HAVE_URING
  return true;
#else
  return false;
#endif
}

bool uring_usable(std::string* why) {
  Probe& p = probe_state();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.done) {
    p.done = true;
#ifdef GW_HAVE_URING
    p.why = p.injected.empty() ? probe_kernel() : p.injected;
#else
    p.why = "this build has no io_uring (GW_WITH_URING=OFF or liburing-dev missing)";
#endif
    p.usable = p.why.empty();
    if (p.usable) {
      GW_LOG_INFO("tcp: GW_SOCKET_ZEROCOPY=uring: large sends go by io_uring SEND_ZC");
    } else {
      GW_LOG_INFO("tcp: GW_SOCKET_ZEROCOPY=uring: io_uring unavailable ({}): sends copy instead",
                  p.why);
    }
  }
  if (why != nullptr) *why = p.why;
  return p.usable;
}

void uring_inject_unavailable_for_test(const std::string& reason) {
  Probe& p = probe_state();
  std::lock_guard<std::mutex> lock(p.mu);
  p.injected = reason;
  p.done = false;
}

void uring_skip_notification_wait_for_test(bool skip) { g_skip_notif.store(skip); }
bool uring_skip_notification_wait() { return g_skip_notif.load(std::memory_order_relaxed); }

Status SendZcAccount::on_submit() {
  if (in_flight_) return internal_error("tcp io_uring: a send submitted while one is in flight");
  in_flight_ = true;
  return ok_status();
}

Status SendZcAccount::on_cqe(int32_t res, uint32_t flags, size_t* sent, bool* copied) {
  *sent = 0;
  *copied = false;
  if ((flags & IORING_CQE_F_NOTIF) != 0) {
    if (notifs_pending_ > 0) {
      --notifs_pending_;
    } else if (in_flight_) {
      ++early_notifs_;  // its result is still to come; it must then say F_MORE
    } else {
      return internal_error("tcp io_uring: a SEND_ZC notification with no send outstanding");
    }
    *copied = (static_cast<uint32_t>(res) & IORING_NOTIF_USAGE_ZC_COPIED) != 0;
    g_notifs.fetch_add(1, std::memory_order_relaxed);
    if (*copied) g_copied.fetch_add(1, std::memory_order_relaxed);
    return ok_status();
  }
  if (!in_flight_) return internal_error("tcp io_uring: a SEND_ZC result with no send in flight");
  in_flight_ = false;
  if ((flags & IORING_CQE_F_MORE) != 0) {
    if (early_notifs_ > 0) {
      --early_notifs_;
    } else {
      ++notifs_pending_;
    }
  } else if (early_notifs_ > 0) {
    return internal_error("tcp io_uring: a notification came for a send that promised none");
  }
  if (res < 0) return system_error("tcp io_uring SEND_ZC", -res);
  *sent = static_cast<size_t>(res);
  if (res > 0) g_results.fetch_add(1, std::memory_order_relaxed);
  return ok_status();
}

uint64_t uring_results() { return g_results.load(std::memory_order_relaxed); }
uint64_t uring_notifications() { return g_notifs.load(std::memory_order_relaxed); }
uint64_t uring_copied() { return g_copied.load(std::memory_order_relaxed); }

#ifdef GW_HAVE_URING

struct UringSender::Impl {
  io_uring ring;
};

Result<std::unique_ptr<UringSender>> UringSender::create(int sock, std::string peer) {
  std::unique_ptr<UringSender> s(new UringSender());
  s->impl_ = std::make_unique<Impl>();
  // 8 entries: one send and its notification at a time, with room to spare.
  int err = io_uring_queue_init(8, &s->impl_->ring, 0);
  if (err < 0) {
    s->impl_.reset();
    return system_error("tcp: io_uring_queue_init", -err);
  }
  s->sock_ = sock;
  s->peer_ = std::move(peer);
  return s;
}

UringSender::~UringSender() {
  // The kernel cancels what is in flight and keeps the pages it still sends from pinned until
  // it is done with them; the comm has failed or finished by now (its owner waits for idle()).
  if (impl_) io_uring_queue_exit(&impl_->ring);
}

int UringSender::ring_fd() const { return impl_ ? impl_->ring.ring_fd : -1; }
bool UringSender::ready() const { return impl_ && io_uring_cq_ready(&impl_->ring) > 0; }

Status UringSender::submit(const char* data, size_t len) {
  io_uring_sqe* sqe = io_uring_get_sqe(&impl_->ring);
  if (sqe == nullptr) return internal_error("tcp io_uring: no submission slot free");
  // No MSG_DONTWAIT: when the socket buffer is full the kernel waits for room itself (the
  // socket is O_NONBLOCK for the plain path, which io_uring does not consult). No MSG_WAITALL:
  // a short send completes and the caller submits the rest.
  io_uring_prep_send_zc(sqe, sock_, data, len, MSG_NOSIGNAL,
                        report_usage_ ? IORING_SEND_ZC_REPORT_USAGE : 0);
  io_uring_sqe_set_data64(sqe, kSendTag);
  GW_RETURN_IF_ERROR(account_.on_submit());
  last_data_ = data;
  last_len_ = len;
  while (true) {
    int n = io_uring_submit(&impl_->ring);
    if (n >= 0) return ok_status();
    if (n != -EINTR && n != -EAGAIN) return system_error("tcp: io_uring_submit", -n);
  }
}

Result<int> UringSender::reap(size_t* sent) {
  *sent = 0;
  int seen = 0;
  io_uring_cqe* cqe = nullptr;
  while (io_uring_peek_cqe(&impl_->ring, &cqe) == 0 && cqe != nullptr) {
    const int32_t res = cqe->res;
    const uint32_t flags = cqe->flags;
    const uint64_t tag = io_uring_cqe_get_data64(cqe);
    io_uring_cqe_seen(&impl_->ring, cqe);
    ++seen;
    if (tag != kSendTag) return internal_error("tcp io_uring: a completion that is not ours");
    // A kernel older than 6.2 refuses the usage report: the same send again without it.
    const bool notif = (flags & IORING_CQE_F_NOTIF) != 0;
    if (!notif && res == -EINVAL && report_usage_ && !any_sent_) {
      size_t ignored = 0;
      bool copied = false;
      (void)account_.on_cqe(0, flags, &ignored, &copied);
      report_usage_ = false;
      GW_RETURN_IF_ERROR(submit(last_data_, last_len_));
      continue;
    }
    if (!notif && res == -EINTR) {  // interrupted before it sent: again
      size_t ignored = 0;
      bool copied = false;
      (void)account_.on_cqe(0, flags, &ignored, &copied);
      GW_RETURN_IF_ERROR(submit(last_data_, last_len_));
      continue;
    }
    size_t bytes = 0;
    bool copied = false;
    Status s = account_.on_cqe(res, flags, &bytes, &copied);
    if (!s.ok()) {
      if (!notif && res < 0) return socket_error("send (io_uring SEND_ZC) to", peer_, -res);
      return s;
    }
    if (!notif) any_sent_ = true;
    *sent += bytes;
  }
  return seen;
}

#else  // !GW_HAVE_URING

struct UringSender::Impl {};

Result<std::unique_ptr<UringSender>> UringSender::create(int, std::string) {
  return unsupported("tcp: this build has no io_uring (GW_WITH_URING=OFF)");
}
UringSender::~UringSender() = default;
int UringSender::ring_fd() const { return -1; }
bool UringSender::ready() const { return false; }
Status UringSender::submit(const char*, size_t) {
  return unsupported("tcp: this build has no io_uring");
}
Result<int> UringSender::reap(size_t* sent) {
  *sent = 0;
  return unsupported("tcp: this build has no io_uring");
}

#endif  // GW_HAVE_URING

}  // namespace gw::net::tcp
