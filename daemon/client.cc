#include "daemon/client.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.h"
#include "core/sys/unix_socket.h"
#include "core/timeline.h"
#include "daemon/daemon_config.h"

namespace gw::daemon {

namespace {

// The longest wait_for sleeps in one poll before it looks at the completion ring again (a
// wake-up another thread drained, completion_fd(), is then late by at most this).
constexpr int kWaitSliceMs = 10;

Status write_frame(int sock, const std::vector<uint8_t>& body, sys::Deadline deadline) {
  const std::vector<uint8_t> frame = frame_message(body);
  return sys::send_with_fds(sock, frame.data(), frame.size(), {}, deadline, "hello to gradwired");
}

// Reads exactly n bytes (and whatever descriptors come with them).
Status read_exact(int sock, uint8_t* out, size_t n, std::vector<sys::Fd>* fds,
                  sys::Deadline deadline) {
  size_t got = 0;
  while (got < n) {
    GW_ASSIGN_OR_RETURN(size_t k, sys::recv_with_fds(sock, out + got, n - got, fds, deadline,
                                                     "welcome from gradwired"));
    if (k == 0) return peer_error("gradwired closed the connection during the hello");
    got += k;
  }
  return ok_status();
}

// GW_DAEMON_GROUP's gid (a name or a number); nullopt when unset.
Result<std::optional<gid_t>> configured_group() {
  const std::string name = config::get_string(daemon_config::kGroup);
  if (name.empty()) return std::optional<gid_t>();
  if (name.find_first_not_of("0123456789") == std::string::npos) {
    errno = 0;
    const unsigned long long v = std::strtoull(name.c_str(), nullptr, 10);
    if (errno != 0 || v >= static_cast<unsigned long long>(static_cast<gid_t>(-1))) {
      return invalid_arg("GW_DAEMON_GROUP {} is not a group number", name);
    }
    return std::optional<gid_t>(static_cast<gid_t>(v));
  }
  group g{};
  group* found = nullptr;
  std::vector<char> buf(16384);
  const int rc = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found);
  if (rc != 0)
    return system_error(fmt::format("looking up group '{}' (GW_DAEMON_GROUP)", name), rc);
  if (found == nullptr) return invalid_arg("GW_DAEMON_GROUP: group '{}' does not exist", name);
  return std::optional<gid_t>(g.gr_gid);
}

// Who answered on `path` may be given the hello (check_daemon_peer)?
Status check_daemon(int sock, const std::string& path) {
  GW_ASSIGN_OR_RETURN(ucred cred, sys::peer_credentials(sock));
  GW_ASSIGN_OR_RETURN(std::optional<gid_t> group, configured_group());
  std::vector<gid_t> groups;
  if (group && cred.uid != ::geteuid() && cred.uid != 0)
    groups = sys::peer_groups(sock).value_or(std::vector<gid_t>{});
  return check_daemon_peer(cred, ::geteuid(), group ? &*group : nullptr, groups, path);
}

// GW_TIMELINE in a daemon-mode trainer (capi/daemon_session_trace.h): the phases the client sees.
// A wait for a completion, recorded when it ends: when the completion came (or the connection
// broke), or when a wait with a deadline ran out; a look without waiting (gw_test) that found
// nothing is not a phase.
class WaitPhase {
 public:
  WaitPhase(uint64_t seq, const bool* done, sys::Deadline deadline)
      : seq_(seq), done_(done), looks_only_(deadline == sys::kNoWait), ts_(timeline::now_us()) {}
  ~WaitPhase() {
    if (!*done_ && looks_only_) return;
    timeline::complete("wait for daemon", "phase", ts_, timeline::now_us() - ts_,
                       fmt::format("\"seq\":{}", seq_));
  }
  WaitPhase(const WaitPhase&) = delete;
  WaitPhase& operator=(const WaitPhase&) = delete;

 private:
  uint64_t seq_;
  const bool* done_;
  bool looks_only_;
  int64_t ts_;
};

}  // namespace

Status check_daemon_peer(const ucred& daemon, uid_t self, const gid_t* group,
                         const std::vector<gid_t>& daemon_groups, const std::string& path) {
  if (daemon.uid == self || daemon.uid == 0) return ok_status();
  if (group != nullptr) {
    if (daemon.gid == *group) return ok_status();
    for (gid_t g : daemon_groups) {
      if (g == *group) return ok_status();
    }
  }
  return peer_error(
      "the process answering on {} (pid {}) runs as uid {}: neither this trainer's uid ({}) nor "
      "root{}; not sending it the job's tokens (check GW_DAEMON)",
      path, daemon.pid, daemon.uid, self,
      group != nullptr ? fmt::format(", nor in group {} (GW_DAEMON_GROUP)", *group) : "");
}

Status no_daemon_error(const std::string& path) {
  struct stat st {};
  const bool there = ::stat(path.c_str(), &st) == 0;
  return peer_error(
      "GW_DAEMON=unix:{}: no gradwired there: {} is {}; start gradwired with --socket {} (or point "
      "GW_DAEMON at its socket), and `gradwirectl status --socket {}` says whether one answers",
      path, path,
      there ? "a socket nobody listens on: a gradwired that died left it" : "no such file", path,
      path);
}

Result<std::unique_ptr<Client>> Client::connect(const std::string& path, const Hello& h,
                                                int64_t spin_ns) {
  const sys::Deadline deadline = sys::deadline_after_ms(h.timeout_ms);
  std::unique_ptr<Client> c(new Client());
  c->path_ = path;
  c->timeout_ms_ = h.timeout_ms;
  c->spin_ns_ = spin_ns;

  // Connect. Nothing listening (no socket file, or refused) is known at once; it is retried for
  // kStartGraceMs only, the window of a daemon started just before its trainers (between its
  // bind and its listen). A busy listener (its backlog full) is retried until the deadline, at
  // most 10 s, saying every few seconds what this trainer waits for.
  constexpr int64_t kStartGraceMs = 1000;
  constexpr auto kSayEvery = std::chrono::seconds(3);
  GW_ASSIGN_OR_RETURN(auto addr, sys::UnixAddress::path(path));
  const auto start = sys::Clock::now();
  const sys::Deadline connect_by = std::min(deadline, sys::deadline_after_ms(10000));
  const sys::Deadline grace_by = std::min(connect_by, sys::deadline_after_ms(kStartGraceMs));
  auto say_at = start + kSayEvery;
  for (;;) {
    bool nobody = false;
    auto fd = sys::connect_unix(addr, SOCK_STREAM, &nobody);
    if (fd.ok()) {
      c->sock_ = std::move(*fd);
      break;
    }
    if (nobody && sys::expired(grace_by)) return no_daemon_error(path);
    if (fd.status().code() != Code::kPeer || sys::expired(connect_by)) {
      return fd.status().with_context(
          fmt::format("no gradwired answers on {} (GW_DAEMON=unix:{})", path, path));
    }
    if (sys::Clock::now() >= say_at) {
      GW_LOG_WARN(
          "waiting for gradwired on {} to accept this trainer ({}; {} s so far, {} s at "
          "most)",
          path, fd.status().message(),
          std::chrono::duration_cast<std::chrono::seconds>(sys::Clock::now() - start).count(),
          std::chrono::duration_cast<std::chrono::seconds>(connect_by - start).count());
      say_at += kSayEvery;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Nothing is sent (the hello carries the job's tokens) before the listener is known to be a
  // daemon this trainer trusts.
  GW_RETURN_IF_ERROR(check_daemon(c->sock_.get(), path));
  // A connect in progress completes on the first write; wait for it like a send.
  const Status sent = write_frame(c->sock_.get(), encode_hello(h), deadline);
  // A daemon that refuses at the connect (a peer of another uid) answers and closes before it
  // reads the hello: the write may fail then, but the refusal, which says why, is there to read.
  const sys::Deadline read_by =
      sent.ok() ? deadline : std::min(deadline, sys::deadline_after_ms(1000));

  std::vector<sys::Fd> fds;
  uint8_t header[kFrameHeaderBytes];
  if (Status got = read_exact(c->sock_.get(), header, sizeof(header), &fds, read_by); !got.ok()) {
    return sent.ok() ? got : sent;
  }
  uint32_t len = 0;
  std::memcpy(&len, header, sizeof(len));
  if (len > kMaxWelcomeBytes) {
    return peer_error("gradwired sent a welcome of {} bytes (at most {})", len, kMaxWelcomeBytes);
  }
  std::vector<uint8_t> body(len);
  if (Status got = read_exact(c->sock_.get(), body.data(), body.size(), &fds, read_by); !got.ok()) {
    return sent.ok() ? got : sent;
  }
  GW_ASSIGN_OR_RETURN(c->geo_, decode_welcome(body.data(), body.size()));
  if (c->geo_.status != 0) {
    return Status(static_cast<Code>(c->geo_.status),
                  fmt::format("gradwired at {} refused this trainer: {}", path, c->geo_.message));
  }
  GW_RETURN_IF_ERROR(sent);
  if (fds.size() != 3) {
    return peer_error("gradwired sent {} descriptors with its welcome (3 expected)", fds.size());
  }
  GW_ASSIGN_OR_RETURN(c->arena_, sys::MemfdRegion::map(std::move(fds[0]), c->geo_.arena_bytes));
  c->sq_efd_ = std::move(fds[1]);
  c->cq_efd_ = std::move(fds[2]);
  GW_ASSIGN_OR_RETURN(c->abort_efd_, make_eventfd());
  const auto* hdr = static_cast<const ArenaHeader*>(c->arena_.data());
  if (hdr->magic != kArenaMagic || hdr->version != kProtocolVersion) {
    return peer_error("gradwired's arena has a bad header");
  }
  c->data_ = static_cast<uint8_t*>(c->arena_.data()) + c->geo_.data_offset;
  c->sq_ = RingProducer<SqEntry>(submission_ring(c->arena_.data(), c->geo_, c->sq_efd_.get()));
  c->cq_ = RingConsumer<CqEntry>(completion_ring(c->arena_.data(), c->geo_, c->cq_efd_.get()));
  c->alloc_ = ArenaAllocator(c->geo_.data_bytes);
  return c;
}

Client::~Client() {
  if (data_ == nullptr) return;  // never welcomed: no arena to speak through
  auto* hdr = static_cast<ArenaHeader*>(arena_.data());
  hdr->client_leaving.store(1, std::memory_order_release);
}

bool Client::in_data(const void* p, size_t bytes, uint64_t* off) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < data_ || b > data_ + geo_.data_bytes) return false;
  const uint64_t o = static_cast<uint64_t>(b - data_);
  if (bytes > geo_.data_bytes - o) return false;
  *off = o;
  return true;
}

Result<std::pair<Client::Placed, Client::Placed>> Client::place_pair(const void* sendbuf,
                                                                     void* recvbuf, size_t bytes) {
  GW_ASSIGN_OR_RETURN(Placed s, place(sendbuf, bytes, true));
  if (recvbuf == sendbuf) return std::make_pair(s, s);
  auto r = place(recvbuf, bytes, false);
  if (!r.ok()) {
    unplace(s);
    return r.status();
  }
  return std::make_pair(s, *r);
}

void Client::unplace_pair(const Placed& s, const Placed& r, bool in_place) {
  unplace(s);
  if (!in_place) unplace(r);
}

Result<Client::Placed> Client::place(const void* p, size_t bytes, bool copy_in) {
  Placed out;
  if (bytes == 0) return out;
  if (in_data(p, bytes, &out.off)) return out;
  auto off = alloc_.alloc(bytes);
  if (!off.ok()) {
    return no_memory(
        "a {} byte buffer does not fit the free part of the daemon arena ({}; raise "
        "GW_DAEMON_ARENA or allocate buffers with gw_mem_alloc)",
        bytes, off.status().message());
  }
  out.off = *off;
  out.staged = true;
  if (copy_in) {
    const int64_t ts = timeline::on() ? timeline::now_us() : -1;
    std::memcpy(data_ + out.off, p, bytes);
    if (ts >= 0) {
      timeline::complete("copy to arena", "phase", ts, timeline::now_us() - ts,
                         fmt::format("\"bytes\":{}", bytes));
    }
  }
  return out;
}

void Client::unplace(const Placed& p) {
  if (p.staged) (void)alloc_.free(p.off);
}

Result<uint32_t> Client::pass_fd(int fd, const char* what) {
  if (!broken_.ok()) return broken_;
  if (aborted_.load()) return aborted_error("{}: communicator aborted", what);
  if (fd < 0 || ::fcntl(fd, F_GETFD) < 0) {
    return invalid_arg("{}: {} is not an open descriptor of this process", what, fd);
  }
  const uint32_t ticket = next_ticket_;
  next_ticket_ = next_ticket_ >= 0x7fffffffu ? 1 : next_ticket_ + 1;
  const std::vector<uint8_t> rec = encode_fd_record(ticket);
  const int fds[1] = {fd};
  Status s = sys::send_with_fds(sock_.get(), rec.data(), rec.size(), fds,
                                sys::deadline_after_ms(timeout_ms_), what);
  if (!s.ok()) {
    return broken(s.with_context(
        fmt::format("{}: passing a descriptor to gradwired (unix:{})", what, path_)));
  }
  return ticket;
}

Status Client::broken(Status s) {
  if (broken_.ok()) broken_ = s;
  return s;
}

Result<uint64_t> Client::post(SqEntry e, const char* what) {
  if (aborted_.load()) return aborted_error("{}: communicator aborted", what);
  if (!broken_.ok()) return broken_;
  // The ring holds sq_entries submissions not yet completed: make room by reading completions
  // (kept in done_ for their callers: an iallreduce's, a chunk's, a send's or a receive's).
  if (open_.size() >= geo_.sq_entries) {
    GW_RETURN_IF_ERROR(wait_room(sys::deadline_after_ms(timeout_ms_), what));
  }
  e.seq = sq_.tail() + 1;
  sq_.push(e);
  open_.insert(e.seq);
  if (timeline::on()) {
    if (timeline::CallNotes* n = timeline::call_notes(); n != nullptr) {
      if (n->first_seq == 0) n->first_seq = e.seq;
      ++n->submissions;
    }
  }
  // A daemon busy-polling the ring sees the entry without a wake-up (docs/wire-daemon.md §5).
  if (Status kicked = sq_.kick(); !kicked.ok()) {
    return broken(kicked.with_context("signalling gradwired"));
  }
  return e.seq;
}

Status Client::drain_completions() {
  for (;;) {
    Result<uint64_t> ready = cq_.ready();
    if (!ready.ok()) return broken(ready.status());
    if (*ready == 0) return ok_status();
    const CqEntry c = cq_.front();
    cq_.pop();
    Done got;
    const uint64_t lowest = open_.empty() ? sq_.tail() + 1 : *open_.begin();
    Status d = decode_completion_in(c, lowest, sq_.tail(), &got.status, &got.info);
    if (!d.ok()) return broken(d);
    if (open_.erase(c.seq) == 0) {
      return broken(peer_error("completion of sequence {} twice", c.seq));
    }
    ++completed_;
    done_[c.seq] = got;
  }
}

Status Client::wait_for(uint64_t seq, sys::Deadline deadline, bool* done, const char* what,
                        CompressedDone* info) {
  *done = false;
  std::optional<WaitPhase> phase;
  if (timeline::on()) phase.emplace(seq, done, deadline);
  // Poll the completion counter for GW_DAEMON_SPIN_US first, yielding the core between looks (a
  // small collective completes within it: no wake-up on either side, and on a host with fewer
  // cores than trainers plus the daemon the yield lets the others run), then sleep on the eventfd
  // and the socket. While polling, the ring's polling flag tells the daemon to skip the eventfd;
  // it is cleared (and the ring looked at again, below) before sleeping (daemon/ring.h).
  if (spin_ns_ > 0 && !cq_.posted() && open_.count(seq) != 0) {
    cq_.begin_polling();
    const int64_t spin_until = sys::now_ns() + spin_ns_;
    while (!cq_.posted() && sys::now_ns() < spin_until &&
           !aborted_.load(std::memory_order_relaxed)) {
      sched_yield();
    }
    cq_.end_polling();
  }
  for (;;) {
    Status d = drain_completions();
    auto it = done_.find(seq);
    if (it != done_.end()) {
      Status st = it->second.status;
      if (info != nullptr) *info = it->second.info;
      done_.erase(it);
      *done = true;
      if (!st.ok() && timeline::on()) {
        timeline::CallNotes* n = timeline::call_notes();
        if (n != nullptr && n->first_seq != 0 && seq >= n->first_seq) n->failed = true;
      }
      if (!st.ok()) return st.with_context(what);
      return st;
    }
    if (!d.ok() || !broken_.ok()) {
      *done = true;
      return broken_;
    }
    if (aborted_.load()) {
      *done = true;
      return broken(aborted_error("{}: communicator aborted", what));
    }
    if (sys::expired(deadline)) return timeout_error("{}: still running", what);
    pollfd p[3] = {
        {cq_.wake_fd(), POLLIN, 0}, {sock_.get(), POLLIN, 0}, {abort_efd_.get(), POLLIN, 0}};
    int n = ::poll(p, 3, std::min<int>(sys::ms_until(deadline), kWaitSliceMs));
    if (n < 0 && errno != EINTR) return broken(system_error("poll", errno));
    if (p[0].revents & POLLIN) cq_.drain_wake();
    if (p[1].revents != 0 && !cq_.posted()) {
      // The daemon never writes after the welcome: readable means closed.
      *done = true;
      return broken(peer_error(
          "{}: gradwired (unix:{}) closed the connection: the daemon stopped or died, or refused "
          "this trainer",
          what, path_));
    }
  }
}

Status Client::check_alive(const char* what) {
  if (!broken_.ok()) return broken_;
  if (aborted_.load()) return broken(aborted_error("{}: communicator aborted", what));
  pollfd p{sock_.get(), POLLIN, 0};
  if (::poll(&p, 1, 0) > 0 && p.revents != 0 && !cq_.posted()) {
    return broken(peer_error(
        "{}: gradwired (unix:{}) closed the connection: the daemon stopped or died, or refused "
        "this client",
        what, path_));
  }
  return ok_status();
}

Status Client::wait_room(sys::Deadline deadline, const char* what) {
  for (;;) {
    GW_RETURN_IF_ERROR(drain_completions());
    if (open_.size() < geo_.sq_entries) return ok_status();
    if (!broken_.ok()) return broken_;
    if (aborted_.load()) return broken(aborted_error("{}: communicator aborted", what));
    if (sys::expired(deadline)) {
      return broken(timeout_error("{}: the submission ring stays full", what));
    }
    pollfd p[3] = {
        {cq_.wake_fd(), POLLIN, 0}, {sock_.get(), POLLIN, 0}, {abort_efd_.get(), POLLIN, 0}};
    int n = ::poll(p, 3, std::min(sys::ms_until(deadline), 100));
    if (n < 0 && errno != EINTR) return broken(system_error("poll", errno));
    if (p[0].revents & POLLIN) cq_.drain_wake();
    if (p[1].revents != 0 && !cq_.posted()) {
      return broken(peer_error("{}: gradwired (unix:{}) closed the connection", what, path_));
    }
  }
}

Status Client::submit(SqEntry e, const char* what, CompressedDone* info) {
  GW_ASSIGN_OR_RETURN(uint64_t seq, post(e, what));
  bool done = false;
  Status s = wait_for(seq, sys::deadline_after_ms(timeout_ms_), &done, what, info);
  if (!done) {
    return broken(
        timeout_error("{}: no completion from gradwired within {} ms", what, timeout_ms_));
  }
  return s;
}

void Client::abort() {
  aborted_.store(true);
  if (abort_efd_.valid()) (void)signal_eventfd(abort_efd_.get());
}

}  // namespace gw::daemon
