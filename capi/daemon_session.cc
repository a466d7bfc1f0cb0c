#include "capi/daemon_session.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/compress/codec.h"
#include "collectives/cost_model.h"
#include "core/bootstrap.h"
#include "core/config.h"
#include "core/log.h"
#include "core/net/handshake.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "daemon/daemon_config.h"
#include "gpudirect/cuda_driver.h"

namespace gw::capi {

using daemon::Opcode;
using daemon::SqEntry;

// ---- set-up ------------------------------------------------------------------------------------

namespace {

Status write_frame(int sock, const std::vector<uint8_t>& body, sys::Deadline deadline) {
  std::vector<uint8_t> frame(daemon::kFrameHeaderBytes);
  const uint32_t len = static_cast<uint32_t>(body.size());
  std::memcpy(frame.data(), &len, sizeof(len));
  frame.insert(frame.end(), body.begin(), body.end());
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

Result<sys::Fd> make_eventfd() {
  sys::Fd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) return system_error("eventfd", errno);
  return fd;
}

std::string solo_token() {
  std::random_device rd;
  return fmt::format("solo-{}-{:08x}{:08x}", ::getpid(), rd(), rd());
}

}  // namespace

Result<std::unique_ptr<Session>> DaemonSession::create(const SessionOptions& options,
                                                       const std::string& address) {
  if (address.rfind("unix:", 0) != 0 || address.size() <= 5) {
    return invalid_arg("GW_DAEMON '{}': expected unix:/path/to/gradwired.sock", address);
  }
  const sys::Deadline deadline = sys::deadline_after_ms(options.timeout_ms);
  daemon::Hello h;
  h.rank = options.rank;
  h.world_size = options.world_size;
  h.timeout_ms = options.timeout_ms;
  h.arena_bytes = static_cast<uint64_t>(config::get_int(daemon_config::kArena));
  h.host_id = host_identity();
  h.store_token = options.job_token;
  std::shared_ptr<Store> store;
  std::unique_ptr<Store> agreed;  // under this communicator's own key prefix
  std::vector<int> host_of_rank(1, 0);
  if (options.world_size > 1) {
    if (options.store_host.empty()) {
      return invalid_arg(
          "no store address for {} ranks: set config.store_addr, GW_STORE or "
          "MASTER_ADDR/MASTER_PORT",
          options.world_size);
    }
    TcpStoreOptions so;
    so.host = options.store_host;
    so.port = options.store_port;
    so.host_server = options.rank == 0;
    so.token = options.job_token;
    so.connect_timeout_ms = options.timeout_ms;
    auto tcp = TcpStore::create(so);
    if (!tcp.ok()) return tcp.status().with_context("rendezvous store");
    store = *tcp;
    // The keys a direct-mode communicator agrees its token and host map under: a job whose ranks
    // run some in daemon mode and some directly meets there, and the modes exchanged with the
    // host map fail it at once on every rank.
    auto prefix = next_communicator_prefix(*store, options.rank, deadline);
    if (!prefix.ok()) return prefix.status().with_context("rendezvous store");
    agreed = make_prefix_store(store, *prefix);
    if (!options.job_token.empty()) {
      h.job_token = options.job_token;
    } else {
      GW_ASSIGN_OR_RETURN(h.job_token, agree_job_token(*agreed, options.rank, deadline));
    }
    GW_ASSIGN_OR_RETURN(
        HostMap map, exchange_hosts(*agreed, options.rank, options.world_size, deadline, "daemon"));
    h.host_index = map.my_host;
    h.num_hosts = static_cast<int32_t>(map.ranks_of_host.size());
    h.local_rank = map.local_rank;
    h.local_size = static_cast<int32_t>(map.ranks_of_host[map.my_host].size());
    h.store_host = options.store_host;
    h.store_port = static_cast<uint16_t>(options.store_port);
    host_of_rank = map.host_of_rank;
  } else {
    h.job_token = options.job_token.empty() ? solo_token() : options.job_token;
  }
  auto s = connect(h, address, std::move(store), std::move(host_of_rank));
  if (agreed) {
    GW_RETURN_IF_ERROR(agree_chunk(*agreed, options.rank, options.world_size, s.status(),
                                   s.ok() ? &(*s)->chunk_bytes_ : nullptr, deadline));
  }
  if (!s.ok()) return s.status();
  return std::unique_ptr<Session>(std::move(*s));
}

Status DaemonSession::agree_chunk(Store& store, int rank, int size, const Status& joined,
                                  size_t* chunk, sys::Deadline deadline) {
  // Every rank must cut chunks and slices alike (the daemons pair them up one by one), and each
  // rank's chunk comes from its own GW_DAEMON_CHUNK and arena: the job takes the least of them.
  // This is the set-up's last use of the store, so it ends with store_release_host.
  auto key_of = [](int r) { return fmt::format("daemon_chunk/{}", r); };
  const std::string release_key = "daemon_chunk_read";
  constexpr std::string_view kFailed = "failed: ";
  if (!joined.ok()) {
    // Best effort: the others learn at once why this rank is missing instead of waiting out
    // their deadline, and rank 0 keeps its store until they have read it.
    const std::string why = std::string(kFailed) + joined.message();
    if (store.set(key_of(rank), Bytes(why.begin(), why.end()), deadline).ok()) {
      (void)store_release_host(store, release_key, rank, size, deadline);
    }
    return joined;
  }
  const size_t own = *chunk;
  const std::string mine = std::to_string(own);
  GW_RETURN_IF_ERROR(store.set(key_of(rank), Bytes(mine.begin(), mine.end()), deadline)
                         .with_context("daemon mode: publishing this rank's chunk"));
  GW_ASSIGN_OR_RETURN(auto all, gather_joined(store, size, key_of, deadline));
  // Read everything first: a rank's failure is the error to report, even when the release that
  // follows times out (a rank that died since it published).
  Status failed;
  size_t least = own;
  size_t whose = static_cast<size_t>(rank);
  for (size_t r = 0; r < all.size() && failed.ok(); ++r) {
    const std::string text(all[r].begin(), all[r].end());
    size_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.rfind(kFailed, 0) == 0) {
      failed = peer_error("daemon mode: rank {} could not join its daemon: {}", r,
                          text.substr(kFailed.size()));
    } else if (ec != std::errc() || end != text.data() + text.size() || v < 4096) {
      failed = peer_error("daemon mode: rank {} published a chunk of '{}' bytes", r, text);
    } else if (v < least) {
      least = v;
      whose = r;
    }
  }
  Status released = store_release_host(store, release_key, rank, size, deadline)
                        .with_context("daemon mode: the end of the set-up");
  if (!failed.ok()) return failed;
  GW_RETURN_IF_ERROR(released);
  if (least < own) {
    GW_LOG_INFO("daemon mode: chunks of {} (rank {}'s), not {}: every rank of the job cuts alike",
                coll::format_bytes(least), whose, coll::format_bytes(own));
    *chunk = least;
  }
  return ok_status();
}

Result<std::unique_ptr<DaemonSession>> DaemonSession::connect(const daemon::Hello& h,
                                                              const std::string& address,
                                                              std::shared_ptr<Store> store,
                                                              std::vector<int> host_of_rank) {
  const std::string path = address.substr(5);
  const sys::Deadline deadline = sys::deadline_after_ms(h.timeout_ms);
  std::unique_ptr<DaemonSession> s(new DaemonSession());
  s->link_->session = s.get();
  s->rank_ = h.rank;
  s->size_ = h.world_size;
  s->timeout_ms_ = h.timeout_ms;
  s->spin_ns_ = std::max<int64_t>(0, config::get_int(daemon_config::kSpinUs)) * 1000;
  s->address_ = address;
  s->hello_ = h;
  s->store_ = std::move(store);
  s->host_of_rank_ = std::move(host_of_rank);

  // Connect (the daemon may still be starting: retry until the deadline, at most 10 s).
  GW_ASSIGN_OR_RETURN(auto addr, sys::UnixAddress::path(path));
  const sys::Deadline connect_by = std::min(deadline, sys::deadline_after_ms(10000));
  for (;;) {
    auto fd = sys::connect_unix(addr, SOCK_STREAM);
    if (fd.ok()) {
      s->sock_ = std::move(*fd);
      break;
    }
    if (fd.status().code() != Code::kPeer || sys::expired(connect_by)) {
      return fd.status().with_context(
          fmt::format("no gradwired answers on {} (GW_DAEMON={})", path, address));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A connect in progress completes on the first write; wait for it like a send.
  const Status sent = write_frame(s->sock_.get(), daemon::encode_hello(h), deadline);
  // A daemon that refuses at the connect (a peer of another uid) answers and closes before it
  // reads the hello: the write may fail then, but the refusal, which says why, is there to read.
  const sys::Deadline read_by =
      sent.ok() ? deadline : std::min(deadline, sys::deadline_after_ms(1000));

  std::vector<sys::Fd> fds;
  uint8_t header[daemon::kFrameHeaderBytes];
  if (Status got = read_exact(s->sock_.get(), header, sizeof(header), &fds, read_by); !got.ok()) {
    return sent.ok() ? got : sent;
  }
  uint32_t len = 0;
  std::memcpy(&len, header, sizeof(len));
  if (len > daemon::kMaxWelcomeBytes) {
    return peer_error("gradwired sent a welcome of {} bytes (at most {})", len,
                      daemon::kMaxWelcomeBytes);
  }
  std::vector<uint8_t> body(len);
  if (Status got = read_exact(s->sock_.get(), body.data(), body.size(), &fds, read_by); !got.ok()) {
    return sent.ok() ? got : sent;
  }
  GW_ASSIGN_OR_RETURN(s->geo_, daemon::decode_welcome(body.data(), body.size()));
  if (s->geo_.status != 0) {
    return Status(static_cast<Code>(s->geo_.status),
                  fmt::format("gradwired at {} refused this trainer: {}", path, s->geo_.message));
  }
  GW_RETURN_IF_ERROR(sent);
  if (fds.size() != 3) {
    return peer_error("gradwired sent {} descriptors with its welcome (3 expected)", fds.size());
  }
  GW_ASSIGN_OR_RETURN(s->arena_, sys::MemfdRegion::map(std::move(fds[0]), s->geo_.arena_bytes));
  s->sq_efd_ = std::move(fds[1]);
  s->cq_efd_ = std::move(fds[2]);
  GW_ASSIGN_OR_RETURN(s->abort_efd_, make_eventfd());
  s->hdr_ = static_cast<daemon::ArenaHeader*>(s->arena_.data());
  if (s->hdr_->magic != daemon::kArenaMagic || s->hdr_->version != daemon::kProtocolVersion) {
    return peer_error("gradwired's arena has a bad header");
  }
  s->data_ = static_cast<uint8_t*>(s->arena_.data()) + s->geo_.data_offset;
  // Chunks of GW_DAEMON_CHUNK, or less where the arena could not stage a few in flight: the
  // largest power of two within an eighth of the data region (ranks with the same
  // GW_DAEMON_ARENA and GW_DAEMON_CHUNK cut the same way).
  size_t fit = 4096;
  while (fit * 2 <= s->geo_.data_bytes / 8) fit *= 2;
  s->chunk_bytes_ = std::min(
      fit, static_cast<size_t>(std::max<int64_t>(4096, config::get_int(daemon_config::kChunk))));
  s->alloc_ = std::make_unique<daemon::ArenaAllocator>(s->geo_.data_bytes);
  GW_LOG_INFO("daemon mode: rank {} of {} on host {} of {} (local {} of {}), {} arena", h.rank,
              h.world_size, h.host_index, h.num_hosts, h.local_rank, h.local_size,
              s->geo_.arena_bytes);
  return s;
}

std::string DaemonSession::describe() const {
  return fmt::format("daemon mode ({}; {} host{}, {} trainer{} here, {} among the daemons)",
                     address_, hello_.num_hosts, hello_.num_hosts == 1 ? "" : "s",
                     hello_.local_size, hello_.local_size == 1 ? "" : "s",
                     geo_.transport.empty() ? "?" : geo_.transport);
}

std::map<std::string, std::string> DaemonSession::resolved() const {
  const std::string among = hello_.num_hosts == 1
                                ? std::string("local sum in gradwired (one host)")
                                : fmt::format("local sum in gradwired, then {} among {} daemons",
                                              geo_.transport, hello_.num_hosts);
  return {{"summary", describe()},
          {"transport", "daemon"},
          {"transport_within_hosts", "daemon"},
          {"interface", address_.substr(5)},
          {"daemon_transport", geo_.transport},
          {"channels", "the daemon's"},
          {"chunk", coll::format_bytes(chunk_bytes_)},
          {"allreduce", among}};
}

DaemonSession::~DaemonSession() {
  // Requests still outstanding no longer reach this session (its arena goes with it): nothing
  // is copied into a caller's buffer after this.
  std::lock_guard<std::mutex> lock(link_->mu);
  link_->session = nullptr;
}

// ---- the data path -----------------------------------------------------------------------------

bool DaemonSession::in_arena(const void* p, size_t bytes, uint64_t* off) const {
  const auto* b = static_cast<const uint8_t*>(p);
  if (b < data_ || b > data_ + geo_.data_bytes) return false;
  const uint64_t o = static_cast<uint64_t>(b - data_);
  if (bytes > geo_.data_bytes - o) return false;
  *off = o;
  return true;
}

Result<std::pair<DaemonSession::Placed, DaemonSession::Placed>> DaemonSession::place_pair(
    const void* sendbuf, void* recvbuf, size_t bytes) {
  GW_ASSIGN_OR_RETURN(Placed s, place(sendbuf, bytes, true));
  if (recvbuf == sendbuf) return std::make_pair(s, s);
  auto r = place(recvbuf, bytes, false);
  if (!r.ok()) {
    unplace(s);
    return r.status();
  }
  return std::make_pair(s, *r);
}

void DaemonSession::unplace_pair(const Placed& s, const Placed& r, bool in_place) {
  unplace(s);
  if (!in_place) unplace(r);
}

Result<DaemonSession::Placed> DaemonSession::place(const void* p, size_t bytes, bool copy_in) {
  Placed out;
  if (bytes == 0) return out;
  if (in_arena(p, bytes, &out.off)) return out;
  auto off = alloc_->alloc(bytes);
  if (!off.ok()) {
    return no_memory(
        "a {} byte buffer does not fit the free part of the daemon arena ({}; raise "
        "GW_DAEMON_ARENA or allocate buffers with gw_mem_alloc)",
        bytes, off.status().message());
  }
  out.off = *off;
  out.staged = true;
  if (copy_in) std::memcpy(data_ + out.off, p, bytes);
  return out;
}

void DaemonSession::unplace(const Placed& p) {
  if (p.staged) (void)alloc_->free(p.off);
}

Status DaemonSession::broken(Status s) {
  if (broken_.ok()) broken_ = s;
  return s;
}

Result<uint64_t> DaemonSession::post(SqEntry e, const char* what) {
  if (aborted_.load()) return aborted_error("{}: communicator aborted", what);
  if (!broken_.ok()) return broken_;
  // The ring holds sq_entries submissions not yet completed: make room by reading completions.
  while (next_seq_ - 1 - completed_ >= geo_.sq_entries) {
    const uint64_t oldest = completed_ + 1;
    bool done = false;
    daemon::CompressedDone info;
    Status s = wait_for(oldest, sys::deadline_after_ms(timeout_ms_), &done, what, &info);
    if (!done) return broken(timeout_error("{}: the submission ring stays full", what));
    if (!broken_.ok()) return broken_;
    done_[oldest] = Done{s, info};  // an iallreduce's or a chunk's: keep it for its caller
  }
  e.seq = next_seq_++;
  const uint64_t tail = e.seq - 1;  // submissions made before this one
  auto* slot = static_cast<uint8_t*>(arena_.data()) + geo_.sq_offset +
               (tail % geo_.sq_entries) * sizeof(SqEntry);
  std::memcpy(slot, &e, sizeof(e));
  hdr_->sq_tail.store(tail + 1, std::memory_order_release);
  // A daemon busy-polling the ring sees the entry without a wake-up (docs/wire-daemon.md §5).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (hdr_->daemon_polling.load(std::memory_order_relaxed) == 1) return e.seq;
  uint64_t one = 1;
  if (::write(sq_efd_.get(), &one, sizeof(one)) < 0 && errno != EAGAIN) {
    return broken(system_error("signalling gradwired", errno));
  }
  return e.seq;
}

Status DaemonSession::drain_completions() {
  for (;;) {
    const uint64_t ct = hdr_->cq_tail.load(std::memory_order_acquire);
    if (ct == cq_head_) return ok_status();
    Status ring = daemon::check_ring(cq_head_, ct, geo_.cq_entries, "completion");
    if (!ring.ok()) return broken(ring);
    daemon::CqEntry c;
    std::memcpy(&c,
                static_cast<uint8_t*>(arena_.data()) + geo_.cq_offset +
                    (cq_head_ % geo_.cq_entries) * sizeof(daemon::CqEntry),
                sizeof(c));
    ++cq_head_;
    hdr_->cq_head.store(cq_head_, std::memory_order_release);
    Done got;
    Status d = daemon::decode_completion(c, completed_ + 1, &got.status, &got.info);
    if (!d.ok()) return broken(d);
    done_[++completed_] = got;
  }
}

Status DaemonSession::wait_for(uint64_t seq, sys::Deadline deadline, bool* done, const char* what,
                               daemon::CompressedDone* info) {
  *done = false;
  // Poll the completion counter for GW_DAEMON_SPIN_US first, yielding the core between looks (a
  // small collective completes within it: no wake-up on either side, and on a host with fewer
  // cores than trainers plus the daemon the yield lets the others run), then sleep on the eventfd
  // and the socket. While polling, client_spinning tells the daemon to skip the eventfd; it is
  // cleared (and cq_tail read again, below) before sleeping (docs/wire-daemon.md §5).
  if (spin_ns_ > 0 && hdr_->cq_tail.load(std::memory_order_acquire) == cq_head_ &&
      completed_ < seq) {
    hdr_->client_spinning.store(1, std::memory_order_relaxed);
    const int64_t spin_until = sys::now_ns() + spin_ns_;
    while (hdr_->cq_tail.load(std::memory_order_acquire) == cq_head_ &&
           sys::now_ns() < spin_until && !aborted_.load(std::memory_order_relaxed)) {
      sched_yield();
    }
    hdr_->client_spinning.store(0, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  for (;;) {
    Status d = drain_completions();
    auto it = done_.find(seq);
    if (it != done_.end()) {
      Status st = it->second.status;
      if (info != nullptr) *info = it->second.info;
      done_.erase(it);
      *done = true;
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
        {cq_efd_.get(), POLLIN, 0}, {sock_.get(), POLLIN, 0}, {abort_efd_.get(), POLLIN, 0}};
    int n = ::poll(p, 3, sys::ms_until(deadline));
    if (n < 0 && errno != EINTR) return broken(system_error("poll", errno));
    if (p[0].revents & POLLIN) {
      uint64_t v;
      ssize_t k = ::read(cq_efd_.get(), &v, sizeof(v));
      (void)k;
    }
    if (p[1].revents != 0 && hdr_->cq_tail.load(std::memory_order_acquire) == cq_head_) {
      // The daemon never writes after the welcome: readable means closed.
      *done = true;
      return broken(peer_error(
          "{}: gradwired ({}) closed the connection: the daemon stopped or died, or refused "
          "this trainer",
          what, address_));
    }
  }
}

Status DaemonSession::submit(SqEntry e, const char* what, daemon::CompressedDone* info) {
  GW_ASSIGN_OR_RETURN(uint64_t seq, post(e, what));
  bool done = false;
  Status s = wait_for(seq, sys::deadline_after_ms(timeout_ms_), &done, what, info);
  if (!done) {
    return broken(
        timeout_error("{}: no completion from gradwired within {} ms", what, timeout_ms_));
  }
  return s;
}

namespace {

// The C ABI refuses device memory for the plain collectives before any session sees it
// (capi/host_memory.cc); the compressed allreduce takes device memory in direct mode, not yet
// here. Managed memory passes: the CPU copies it into the arena.
Status refuse_device(const void* buf) {
  if (buf != nullptr && cuda::resident_memory_kind(buf) == cuda::MemoryKind::kDevice) {
    return unsupported("GPU buffers are not supported in daemon mode yet (GW_DAEMON)");
  }
  return ok_status();
}

SqEntry entry(Opcode op) {
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(op);
  return e;
}

}  // namespace

Status DaemonSession::run_chunks(
    size_t bytes, size_t elem, const char* what,
    const std::function<Result<Chunk>(size_t offset, size_t len)>& post_chunk,
    const std::function<void(const Chunk&, bool ok)>& finish_chunk, size_t step_bytes) {
  const size_t step = std::max(elem, (step_bytes ? step_bytes : chunk_bytes_) / elem * elem);
  std::vector<Chunk> flight;  // oldest first
  Status first;
  auto retire = [&]() {
    Chunk c = flight.front();
    flight.erase(flight.begin());
    bool done = false;
    Status st = wait_for(c.seq, sys::deadline_after_ms(timeout_ms_), &done, what);
    if (!done) {
      st =
          broken(timeout_error("{}: no completion from gradwired within {} ms", what, timeout_ms_));
    }
    finish_chunk(c, st.ok());
    if (first.ok() && !st.ok()) first = st;
  };
  for (size_t off = 0; off < bytes && first.ok();) {
    const size_t len = std::min(step, bytes - off);
    if (flight.size() >= kChunksInFlight) {
      retire();
      continue;
    }
    auto c = post_chunk(off, len);
    if (!c.ok()) {
      // The arena is full of chunks in flight: make room. With none in flight it cannot fit.
      if (c.status().code() == Code::kNoMemory && !flight.empty()) {
        retire();
        continue;
      }
      first = c.status();
      break;
    }
    flight.push_back(*c);
    off += len;
  }
  while (!flight.empty()) retire();  // a failed chunk fails the job: the rest end at once
  return first;
}

Status DaemonSession::allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                coll::DataType dtype, coll::ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = coll::dtype_size(dtype);
  const size_t bytes = count * elem;
  const bool in_place = recvbuf == sendbuf;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  auto* rb = static_cast<uint8_t*>(recvbuf);
  if (bytes == 0) {
    SqEntry e = entry(Opcode::kAllreduce);
    e.dtype = static_cast<uint8_t>(dtype);
    e.op = static_cast<uint8_t>(op);
    return submit(e, "allreduce");
  }
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    GW_ASSIGN_OR_RETURN(auto placed, place_pair(sb + off, rb + off, len));
    SqEntry e = entry(Opcode::kAllreduce);
    e.dtype = static_cast<uint8_t>(dtype);
    e.op = static_cast<uint8_t>(op);
    e.count = len / elem;
    e.send_off = placed.first.off;
    e.recv_off = placed.second.off;
    auto seq = post(e, "allreduce");
    if (!seq.ok()) {
      unplace_pair(placed.first, placed.second, in_place);
      return seq.status();
    }
    return Chunk{*seq,
                 off,
                 len,
                 placed.first.off,
                 placed.second.off,
                 placed.first.staged,
                 placed.second.staged};
  };
  auto finish_chunk = [&](const Chunk& c, bool ok) {
    if (ok && c.recv_staged) std::memcpy(rb + c.offset, data_ + c.recv_off, c.len);
    unplace_pair(Placed{c.send_off, c.send_staged}, Placed{c.recv_off, c.recv_staged}, in_place);
  };
  return run_chunks(bytes, elem, "allreduce", post_chunk, finish_chunk);
}

// An iallreduce in flight: its staging stays allocated until it is waited for. It reaches the
// session through its Link, so that it may outlive it (then it ends in kAborted).
class DaemonRequest final : public SessionRequest {
 public:
  DaemonRequest(std::shared_ptr<DaemonSession::Link> link, uint64_t seq, DaemonSession::Placed send,
                DaemonSession::Placed recv, void* user_recv, size_t bytes, bool in_place)
      : link_(std::move(link)),
        seq_(seq),
        send_(send),
        recv_(recv),
        user_recv_(user_recv),
        bytes_(bytes),
        in_place_(in_place) {}
  ~DaemonRequest() override {
    if (!finished_) (void)wait(-1);  // bounded by the communicator's deadline
  }
  Status wait(int64_t timeout_ms) override {
    std::lock_guard<std::mutex> held(link_->mu);
    DaemonSession* s = link_->session;
    if (s == nullptr) return orphaned();
    std::lock_guard<std::mutex> lock(s->mu_);
    return step(s, sys::deadline_after_ms(timeout_ms < 0 ? s->timeout_ms_ : timeout_ms));
  }
  Status test(bool* done) override {
    std::lock_guard<std::mutex> held(link_->mu);
    DaemonSession* s = link_->session;
    if (s == nullptr) {
      *done = true;
      return orphaned();
    }
    std::lock_guard<std::mutex> lock(s->mu_);
    Status st = step(s, sys::kNoWait);
    *done = finished_;
    return finished_ ? st : ok_status();
  }

 private:
  Status orphaned() {
    if (!finished_) {
      finished_ = true;
      final_ = aborted_error("iallreduce: the communicator was destroyed before it completed");
    }
    return final_;
  }
  Status step(DaemonSession* s, sys::Deadline deadline) {
    if (finished_) return final_;
    bool done = false;
    Status st = s->wait_for(seq_, deadline, &done, "iallreduce");
    if (!done) return st;  // kTimeout: still running
    if (st.ok() && recv_.staged) std::memcpy(user_recv_, s->data_ + recv_.off, bytes_);
    s->unplace_pair(send_, recv_, in_place_);
    finished_ = true;
    final_ = st;
    return st;
  }
  std::shared_ptr<DaemonSession::Link> link_;
  uint64_t seq_;
  DaemonSession::Placed send_, recv_;
  void* user_recv_;
  size_t bytes_;
  bool in_place_;
  bool finished_ = false;
  Status final_;
};

Result<std::unique_ptr<SessionRequest>> DaemonSession::iallreduce(const void* sendbuf,
                                                                  void* recvbuf, size_t count,
                                                                  coll::DataType dtype,
                                                                  coll::ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t bytes = count * coll::dtype_size(dtype);
  GW_ASSIGN_OR_RETURN(auto placed, place_pair(sendbuf, recvbuf, bytes));
  const auto [s, r] = placed;
  SqEntry e = entry(Opcode::kAllreduce);
  e.dtype = static_cast<uint8_t>(dtype);
  e.op = static_cast<uint8_t>(op);
  e.count = count;
  e.send_off = s.off;
  e.recv_off = r.off;
  auto seq = post(e, "iallreduce");
  if (!seq.ok()) {
    unplace_pair(s, r, recvbuf == sendbuf);
    return seq.status();
  }
  return std::unique_ptr<SessionRequest>(
      new DaemonRequest(link_, *seq, s, r, recvbuf, bytes, recvbuf == sendbuf));
}

Status DaemonSession::broadcast(void* buf, size_t count, coll::DataType dtype, int root) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = coll::dtype_size(dtype);
  const size_t bytes = count * elem;
  auto* b = static_cast<uint8_t*>(buf);
  if (bytes == 0) {
    SqEntry e = entry(Opcode::kBroadcast);
    e.dtype = static_cast<uint8_t>(dtype);
    e.root = root;
    return submit(e, "broadcast");
  }
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    GW_ASSIGN_OR_RETURN(Placed p, place(b + off, len, rank_ == root));
    SqEntry e = entry(Opcode::kBroadcast);
    e.dtype = static_cast<uint8_t>(dtype);
    e.root = root;
    e.count = len / elem;
    e.send_off = p.off;
    e.recv_off = p.off;
    auto seq = post(e, "broadcast");
    if (!seq.ok()) {
      unplace(p);
      return seq.status();
    }
    return Chunk{*seq, off, len, p.off, p.off, p.staged, p.staged};
  };
  auto finish_chunk = [&](const Chunk& c, bool ok) {
    if (ok && c.recv_staged && rank_ != root) std::memcpy(b + c.offset, data_ + c.recv_off, c.len);
    unplace(Placed{c.recv_off, c.recv_staged});
  };
  return run_chunks(bytes, elem, "broadcast", post_chunk, finish_chunk);
}

Status DaemonSession::run_sliced(Opcode opcode, const void* sendbuf, void* recvbuf, size_t block,
                                 coll::DataType dtype, coll::ReduceOp op, const char* what) {
  const size_t elem = coll::dtype_size(dtype);
  const size_t world = static_cast<size_t>(size_);
  const size_t total = block * world;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  auto* rb = static_cast<uint8_t*>(recvbuf);
  // How many blocks each side holds, and where a side of world_size blocks lies in the arena.
  const bool send_all = opcode != Opcode::kAllgather;
  const bool recv_all = opcode != Opcode::kReduceScatter;
  uint64_t send_at = 0, recv_at = 0;
  bool send_direct = send_all && in_arena(sendbuf, total, &send_at);
  bool recv_direct = recv_all && in_arena(recvbuf, total, &recv_at);
  if (send_all && recv_all && send_direct != recv_direct) {
    send_direct = recv_direct = false;  // one stride for both sides: stage both
  }
  const bool direct = send_all ? send_direct : recv_direct;
  // A slice of every block: world_size x step bytes at most, two chunks (each slice is a
  // collective of its own among the daemons: fewer, larger ones cost less; staged ones still
  // fit the arena, a chunk being at most an eighth of it).
  const size_t step = std::max<size_t>(1, slice_bytes() / (world * elem)) * elem;
  auto place_side = [&](bool all, bool direct_side, uint64_t at, const uint8_t* base, size_t off,
                        size_t len, bool copy_in) -> Result<Placed> {
    if (!all) return place(base + off, len, copy_in);
    if (direct_side) return Placed{at + off, false};
    auto o = alloc_->alloc(world * len);
    if (!o.ok()) {
      return no_memory(
          "{}: a slice of {} bytes does not fit the free part of the daemon arena ({})", what,
          world * len, o.status().message());
    }
    if (copy_in) {
      for (size_t b = 0; b < world; ++b)
        std::memcpy(data_ + *o + b * len, base + b * block + off, len);
    }
    return Placed{*o, true};
  };
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    GW_ASSIGN_OR_RETURN(Placed ps, place_side(send_all, send_direct, send_at, sb, off, len, true));
    auto pr = place_side(recv_all, recv_direct, recv_at, rb, off, len, false);
    if (!pr.ok()) {
      unplace(ps);
      return pr.status();
    }
    SqEntry e = entry(opcode);
    e.dtype = static_cast<uint8_t>(dtype);
    if (opcode == Opcode::kReduceScatter) e.op = static_cast<uint8_t>(op);
    e.count = len / elem;
    e.send_off = ps.off;
    e.recv_off = pr->off;
    e.stride = direct ? block : 0;
    auto seq = post(e, what);
    if (!seq.ok()) {
      unplace(ps);
      unplace(*pr);
      return seq.status();
    }
    return Chunk{*seq, off, len, ps.off, pr->off, ps.staged, pr->staged};
  };
  auto finish_chunk = [&](const Chunk& c, bool ok) {
    if (ok && c.recv_staged) {
      if (!recv_all) {
        std::memcpy(rb + c.offset, data_ + c.recv_off, c.len);
      } else {
        for (size_t b = 0; b < world; ++b) {
          std::memcpy(rb + b * block + c.offset, data_ + c.recv_off + b * c.len, c.len);
        }
      }
    }
    unplace(Placed{c.send_off, c.send_staged});
    unplace(Placed{c.recv_off, c.recv_staged});
  };
  return run_chunks(block, elem, what, post_chunk, finish_chunk, step);
}

Status DaemonSession::allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                coll::DataType dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t block = sendcount * coll::dtype_size(dtype);
  const size_t total = block * static_cast<size_t>(size_);
  if (total > slice_bytes()) {
    return run_sliced(Opcode::kAllgather, sendbuf, recvbuf, block, dtype, coll::ReduceOp::kSum,
                      "allgather");
  }
  GW_ASSIGN_OR_RETURN(Placed r, place(recvbuf, total, false));
  Placed s;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  const auto* rb = static_cast<const uint8_t*>(recvbuf);
  bool inside = block > 0 && sb >= rb && sb + block <= rb + total;
  if (inside) {
    s.off = r.off + static_cast<uint64_t>(sb - rb);
    if (r.staged) std::memcpy(data_ + s.off, sendbuf, block);
  } else {
    auto ps = place(sendbuf, block, true);
    if (!ps.ok()) {
      unplace(r);
      return ps.status();
    }
    s = *ps;
  }
  SqEntry e = entry(Opcode::kAllgather);
  e.dtype = static_cast<uint8_t>(dtype);
  e.count = sendcount;
  e.send_off = s.off;
  e.recv_off = r.off;
  Status st = submit(e, "allgather");
  if (st.ok() && r.staged) std::memcpy(recvbuf, data_ + r.off, total);
  if (!inside) unplace(s);
  unplace(r);
  return st;
}

Status DaemonSession::reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                     coll::DataType dtype, coll::ReduceOp op) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t block = recvcount * coll::dtype_size(dtype);
  const size_t total = block * static_cast<size_t>(size_);
  if (total > slice_bytes()) {
    return run_sliced(Opcode::kReduceScatter, sendbuf, recvbuf, block, dtype, op, "reduce_scatter");
  }
  GW_ASSIGN_OR_RETURN(Placed s, place(sendbuf, total, true));
  Placed r;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  const auto* rb = static_cast<const uint8_t*>(recvbuf);
  // In place: recvbuf is this rank's block of sendbuf.
  const bool inside = block > 0 && rb >= sb && rb + block <= sb + total;
  if (inside) {
    r.off = s.off + static_cast<uint64_t>(rb - sb);
    r.staged = s.staged;
  } else {
    auto pr = place(recvbuf, block, false);
    if (!pr.ok()) {
      unplace(s);
      return pr.status();
    }
    r = *pr;
  }
  SqEntry e = entry(Opcode::kReduceScatter);
  e.dtype = static_cast<uint8_t>(dtype);
  e.op = static_cast<uint8_t>(op);
  e.count = recvcount;
  e.send_off = s.off;
  e.recv_off = r.off;
  Status st = submit(e, "reduce_scatter");
  if (st.ok() && r.staged) std::memcpy(recvbuf, data_ + r.off, block);
  if (!inside) unplace(r);
  unplace(s);
  return st;
}

Status DaemonSession::barrier() {
  std::lock_guard<std::mutex> lock(mu_);
  return submit(entry(Opcode::kBarrier), "barrier");
}

Status DaemonSession::alltoall(const void* sendbuf, void* recvbuf, size_t count,
                               coll::DataType dtype) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t total = count * coll::dtype_size(dtype) * static_cast<size_t>(size_);
  if (total > slice_bytes()) {
    return run_sliced(Opcode::kAlltoall, sendbuf, recvbuf, count * coll::dtype_size(dtype), dtype,
                      coll::ReduceOp::kSum, "alltoall");
  }
  // In place is one buffer: the daemon packs every block before it writes any.
  GW_ASSIGN_OR_RETURN(auto placed, place_pair(sendbuf, recvbuf, total));
  const auto [s, r] = placed;
  SqEntry e = entry(Opcode::kAlltoall);
  e.dtype = static_cast<uint8_t>(dtype);
  e.count = count;
  e.send_off = s.off;
  e.recv_off = r.off;
  Status st = submit(e, "alltoall");
  if (st.ok() && r.staged) std::memcpy(recvbuf, data_ + r.off, total);
  unplace_pair(s, r, recvbuf == sendbuf);
  return st;
}

Status DaemonSession::allreduce_compressed(void* buf, size_t count, coll::DataType dtype,
                                           std::string_view codec_spec,
                                           std::string_view tensor_key) {
  std::lock_guard<std::mutex> lock(mu_);
  const char* what = "allreduce_compressed";
  // What the daemon's Compressor would refuse is refused here, before the job depends on it.
  if (dtype != coll::DataType::kF32 && dtype != coll::DataType::kF16 &&
      dtype != coll::DataType::kBF16) {
    return invalid_arg(
        "compressed allreduce: dtype {} is not supported (float32, float16, bfloat16 only)",
        coll::dtype_name(dtype));
  }
  if (tensor_key.empty()) return invalid_arg("compressed allreduce: tensor key is empty");
  GW_ASSIGN_OR_RETURN(coll::CodecSpec parsed, coll::parse_codec_spec(codec_spec));
  const std::string spec = coll::format_codec_spec(parsed);
  const std::string key =
      epoch_ == 0 ? std::string(tensor_key) : fmt::format("{}#{}", tensor_key, epoch_);
  if (spec.size() > daemon::kMaxCodecSpecBytes || key.size() > daemon::kMaxTensorKeyBytes) {
    return invalid_arg(
        "compressed allreduce in daemon mode: codec spec of {} bytes or tensor key of {} (at "
        "most {} and {})",
        spec.size(), key.size(), daemon::kMaxCodecSpecBytes, daemon::kMaxTensorKeyBytes);
  }
  if (count > 0) GW_RETURN_IF_ERROR(refuse_device(buf));
  auto known = keys_.find(key);
  if (known != keys_.end() && (known->second.spec != spec || known->second.count != count ||
                               known->second.dtype != dtype)) {
    return invalid_arg(
        "compressed allreduce: tensor key \"{}\" was used with codec {}, {} x {} and now with "
        "codec {}, {} x {}; use one key per tensor",
        tensor_key, known->second.spec, known->second.count, coll::dtype_name(known->second.dtype),
        spec, count, coll::dtype_name(dtype));
  }
  const size_t bytes = count * coll::dtype_size(dtype);
  GW_ASSIGN_OR_RETURN(Placed b, place(buf, bytes, true));
  const std::string meta = spec + key;
  auto m = place(meta.data(), meta.size(), true);
  if (!m.ok()) {
    unplace(b);
    return m.status();
  }
  const Placed mp = *m;  // staged: the string is this function's own
  SqEntry e = entry(Opcode::kAllreduceCompressed);
  e.dtype = static_cast<uint8_t>(dtype);
  e.count = count;
  e.send_off = b.off;
  e.recv_off = b.off;
  e.meta_off = mp.off;
  e.spec_len = static_cast<uint32_t>(spec.size());
  e.key_len = static_cast<uint32_t>(key.size());
  daemon::CompressedDone info;
  Status st = submit(e, what, &info);
  if (st.ok() && b.staged) std::memcpy(buf, data_ + b.off, bytes);
  unplace(mp);
  unplace(b);
  if (!st.ok()) return st;
  if (known == keys_.end()) keys_.emplace(key, KeyUse{spec, count, dtype});
  const uint64_t p = static_cast<uint64_t>(size_);
  stats_.calls += 1;
  stats_.bytes_sent += info.bytes_sent;
  if (p > 1) stats_.bytes_uncompressed += 2 * (p - 1) * bytes / p;
  return ok_status();
}

Result<gw_comm_stats_t> DaemonSession::compression_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Status DaemonSession::reset_compression_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = gw_comm_stats_t{};
  return ok_status();
}

Status DaemonSession::release_compression() {
  // The residuals live in the daemons, shared by the job's trainers; later calls use fresh keys
  // there (so they start from empty residuals) and the old state goes with the job.
  std::lock_guard<std::mutex> lock(mu_);
  keys_.clear();
  stats_ = gw_comm_stats_t{};
  ++epoch_;
  return ok_status();
}

Result<std::unique_ptr<Session>> DaemonSession::split(int color, int key) {
  // Every rank learns every rank's (color, key) through the daemon, then the ranks of one color
  // join the daemons as a job of their own: its token derived from this job's (HMAC, so only
  // those who hold this one know it), its host layout from this one's, the same store.
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size_));
  GW_RETURN_IF_ERROR(allgather(mine, all.data(), 2, coll::DataType::kI32).with_context("split"));
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++splits_;
  }
  if (color < 0) return std::unique_ptr<Session>();
  std::vector<int> members;  // parent ranks of the new communicator, in new-rank order
  for (int r = 0; r < size_; ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  std::vector<int> hosts;  // parent host indexes of the members, ascending
  for (int r : members) hosts.push_back(host_of_rank_[static_cast<size_t>(r)]);
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  auto new_host = [&](int parent_rank) {
    const int h = host_of_rank_[static_cast<size_t>(parent_rank)];
    return static_cast<int>(std::lower_bound(hosts.begin(), hosts.end(), h) - hosts.begin());
  };
  daemon::Hello h = hello_;
  h.world_size = static_cast<int32_t>(members.size());
  h.num_hosts = static_cast<int32_t>(hosts.size());
  h.host_index = new_host(rank_);
  h.local_rank = 0;
  h.local_size = 0;
  std::vector<int> child_hosts;
  for (size_t c = 0; c < members.size(); ++c) {
    const int host = new_host(members[c]);
    child_hosts.push_back(host);
    if (members[c] == rank_) {
      h.rank = static_cast<int32_t>(c);
      h.local_rank = h.local_size;
    }
    if (host == h.host_index) ++h.local_size;
  }
  const std::string label = fmt::format("gradwire split {} color {}", seq, color);
  const net::handshake::Mac tag = net::handshake::hmac_sha256(
      hello_.job_token, reinterpret_cast<const uint8_t*>(label.data()), label.size());
  h.job_token = to_hex(tag.data(), tag.size());
  if (h.num_hosts == 1) {  // the new job's daemons need not meet
    h.store_host.clear();
    h.store_port = 0;
  }
  GW_ASSIGN_OR_RETURN(auto child, connect(h, address_, store_, std::move(child_hosts)));
  // The parent's chunk is the job's least, and no rank's own is smaller: all cut alike again.
  child->chunk_bytes_ = std::min(child->chunk_bytes_, chunk_bytes_);
  return std::unique_ptr<Session>(std::move(child));
}

// ---- memory and abort
// ----------------------------------------------------------------------------

Result<void*> DaemonSession::mem_alloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto off = alloc_->alloc(bytes);
  if (!off.ok()) {
    return no_memory("gw_mem_alloc of {} bytes: {} (GW_DAEMON_ARENA is {} bytes)", bytes,
                     off.status().message(), geo_.arena_bytes);
  }
  user_[*off] = bytes;
  return static_cast<void*>(data_ + *off);
}

Status DaemonSession::mem_free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t off = 0;
  if (!in_arena(ptr, 0, &off) || user_.count(off) == 0) {
    return invalid_arg("pointer {} was not returned by gw_mem_alloc on this communicator", ptr);
  }
  user_.erase(off);
  return alloc_->free(off);
}

void DaemonSession::abort() {
  aborted_.store(true);
  uint64_t one = 1;
  if (abort_efd_.valid()) {
    ssize_t n = ::write(abort_efd_.get(), &one, sizeof(one));
    (void)n;
  }
}

}  // namespace gw::capi
