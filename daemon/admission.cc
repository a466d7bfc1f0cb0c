// gradwired's admission (Server::Impl, daemon/server_impl.h): the trainers' socket, peer
// credentials, the hello, a trainer's arena and welcome, its job, and its departure.
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "core/log.h"
#include "core/sys/memfd_region.h"
#include "core/sys/unix_socket.h"
#include "daemon/ring.h"
#include "daemon/server_impl.h"

namespace gw::daemon {

namespace {

// The peer's supplementary groups as of its connect (sys::peer_groups); where the kernel cannot
// say, the Groups: line of /proc/PID/status now.
std::vector<gid_t> peer_groups(int sock, pid_t pid) {
  if (std::optional<std::vector<gid_t>> known = sys::peer_groups(sock)) return std::move(*known);
  std::vector<gid_t> groups;
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream in(line.substr(7));
    for (unsigned long g; in >> g;) groups.push_back(static_cast<gid_t>(g));
  }
  return groups;
}

}  // namespace

// Listens on `path` (mode 0700 by the umask: the owner's only). A socket file left by a daemon that
// died is replaced; a live daemon's is refused.
Result<sys::Fd> bind_listener(const std::string& path) {
  GW_ASSIGN_OR_RETURN(auto addr, sys::UnixAddress::path(path));
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return invalid_arg("gradwired: {} exists and is not a socket", path);
    auto probe = sys::connect_unix(addr, SOCK_STREAM);
    if (probe.ok()) return invalid_arg("gradwired: another daemon already listens on {}", path);
    ::unlink(path.c_str());
  }
  const mode_t old = ::umask(0077);  // the socket is its owner's only
  auto fd = sys::listen_unix(addr, SOCK_STREAM, SOMAXCONN);
  ::umask(old);
  return fd;
}

// GW_DAEMON_GROUP: a group name or number.
Result<gid_t> resolve_group(const std::string& name) {
  if (!name.empty() && name.find_first_not_of("0123456789") == std::string::npos) {
    return static_cast<gid_t>(std::stoul(name));
  }
  group g{};
  group* found = nullptr;
  std::vector<char> buf(16384);
  const int rc = ::getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found);
  if (rc != 0) return system_error(fmt::format("gradwired: looking up group '{}'", name), rc);
  if (found == nullptr) {
    return invalid_arg("gradwired: group '{}' does not exist (GW_DAEMON_GROUP)", name);
  }
  return g.gr_gid;
}

// Opens a listening socket to the group: owned by it, mode 0660.
Status share_with_group(const std::string& path, gid_t gid, const std::string& name) {
  if (::chown(path.c_str(), static_cast<uid_t>(-1), gid) != 0) {
    return system_error(
        fmt::format("gradwired: giving {} to group {} (the daemon must be in the group, or root)",
                    path, name),
        errno);
  }
  if (::chmod(path.c_str(), 0660) != 0) {
    return system_error(fmt::format("gradwired: chmod 0660 {}", path), errno);
  }
  return ok_status();
}

// A job's name for gradwirectl: a hash of its token (the token itself is the job's secret).
void Server::Impl::refuse_conn(sys::Fd& sock, pid_t pid, const Status& why, ErrorKind kind) {
  counters.refused.fetch_add(1);
  counters.error(kind);
  GW_LOG_WARN("gradwired: refusing the connection of pid {}: {}", pid, why.message());
  Welcome w;
  w.status = static_cast<int32_t>(why.code() == Code::kOk ? Code::kInternal : why.code());
  w.message = why.message();
  const std::vector<uint8_t> frame = frame_message(encode_welcome(w));
  // Best effort: the client may be gone or not reading.
  (void)sys::send_with_fds(sock.get(), frame.data(), frame.size(), {}, sys::deadline_after_ms(100),
                           "refusal");
  sock.reset();
}

void Server::Impl::accept_all() {
  // At most kMaxPendingHellos a round, and a newcomer evicts only a connection that has had its
  // grace period to send its hello (the rest wait in the backlog).
  for (size_t accepted = 0; accepted < kMaxPendingHellos; ++accepted) {
    if (full_of_young(pending, kMaxPendingHellos)) return;
    auto fd = sys::accept_unix(listen.get());
    if (!fd.ok()) {
      GW_LOG_WARN("gradwired: accept: {}", fd.status().message());
      return;
    }
    if (!fd->valid()) return;
    PendingConn p;
    p.sock = std::move(*fd);
    p.deadline = sys::deadline_after_ms(opt.hello_timeout_ms);
    p.evictable = sys::deadline_after_ms(sys::kEvictGraceMs);
    auto cred = sys::peer_credentials(p.sock.get());
    if (!cred.ok()) {
      refuse_conn(p.sock, 0, cred.status(), ErrorKind::kCredentials);
      continue;
    }
    p.pid = cred->pid;
    p.uid = cred->uid;
    if (Status ok = check_peer(p.sock.get(), *cred); !ok.ok()) {
      refuse_conn(p.sock, p.pid, ok, ErrorKind::kCredentials);
      continue;
    }
    if (clients.size() >= static_cast<size_t>(opt.max_clients)) {
      refuse_conn(
          p.sock, p.pid,
          no_memory("the daemon has {} clients already (GW_DAEMON_MAX_CLIENTS)", opt.max_clients),
          ErrorKind::kCapacity);
      continue;
    }
    // A trainer sends its hello right after its connect: read what is there already.
    if (step_pending(p)) continue;
    if (pending.size() >= kMaxPendingHellos) {
      PendingConn& oldest = pending.front();
      refuse_conn(oldest.sock, oldest.pid,
                  no_memory("evicted: {} connections were waiting for their hello and this was "
                            "the oldest",
                            kMaxPendingHellos),
                  ErrorKind::kCapacity);
      pending.erase(pending.begin());
    }
    pending.push_back(std::move(p));
  }
}

bool Server::Impl::step_pending(PendingConn& p) {
  uint8_t tmp[512];
  std::vector<sys::Fd> fds;
  auto n = sys::recv_with_fds(p.sock.get(), tmp, sizeof(tmp), &fds, sys::kNoWait, "hello");
  if (!fds.empty()) {
    refuse_conn(p.sock, p.pid, peer_error("hello came with descriptors"));
    return true;
  }
  if (!n.ok()) {
    if (n.status().code() == Code::kTimeout) return false;  // nothing yet
    refuse_conn(p.sock, p.pid, n.status());
    return true;
  }
  if (*n == 0) {
    refuse_conn(p.sock, p.pid, peer_error("closed before its hello"));
    return true;
  }
  p.buf.insert(p.buf.end(), tmp, tmp + *n);
  if (p.buf.size() < kFrameHeaderBytes) return false;
  uint32_t len = 0;
  std::memcpy(&len, p.buf.data(), sizeof(len));
  if (len > kMaxHelloBytes) {
    refuse_conn(p.sock, p.pid, peer_error("hello of {} bytes (at most {})", len, kMaxHelloBytes));
    return true;
  }
  if (p.buf.size() < kFrameHeaderBytes + len) return false;
  if (p.buf.size() > kFrameHeaderBytes + len) {
    refuse_conn(p.sock, p.pid, peer_error("bytes after the hello"));
    return true;
  }
  auto h = decode_hello(p.buf.data() + kFrameHeaderBytes, len);
  if (!h.ok()) {
    refuse_conn(p.sock, p.pid, h.status());
    return true;
  }
  Status s = admit(p, *h);
  if (!s.ok()) {
    refuse_conn(p.sock, p.pid, s,
                s.code() == Code::kNoMemory ? ErrorKind::kCapacity : ErrorKind::kHello);
  }
  return true;
}

Status Server::Impl::admit(PendingConn& p, const Hello& h) {
  if (h.host_id != host_id) {
    return invalid_arg(
        "the trainer's host identity '{}' differs from the daemon's '{}': give both the same "
        "GW_HOSTID (or neither)",
        h.host_id, host_id);
  }
  if (h.arena_bytes > opt.max_arena_bytes) {
    return no_memory("arena of {} bytes asked, the daemon allows {} (GW_DAEMON_MAX_ARENA)",
                     h.arena_bytes, opt.max_arena_bytes);
  }
  // The job's table of local trainers is sized by local_size: no more than this daemon admits.
  if (h.local_size > opt.max_clients) {
    return no_memory("{} trainers on this host asked, the daemon admits {} (GW_DAEMON_MAX_CLIENTS)",
                     h.local_size, opt.max_clients);
  }
  const std::string key = job_key(h);
  std::shared_ptr<Job> job;
  auto it = jobs.find(key);
  if (it != jobs.end()) {
    job = it->second;
    const Hello& f = job->first;
    if (job->started) {
      return invalid_arg("the job's {} trainers on this host have all joined already",
                         f.local_size);
    }
    if (f.num_hosts != h.num_hosts || f.host_index != h.host_index ||
        f.local_size != h.local_size || f.store_token != h.store_token) {
      return invalid_arg(
          "rank {} disagrees with rank {} of its job on the layout (hosts {} vs {}, host index {} "
          "vs {}, local size {} vs {})",
          h.rank, f.rank, h.num_hosts, f.num_hosts, h.host_index, f.host_index, h.local_size,
          f.local_size);
    }
    if (job->members[h.local_rank]) {
      return invalid_arg("local rank {} of the job is taken (rank {})", h.local_rank,
                         job->members[h.local_rank]->hello.rank);
    }
    for (const auto& m : job->members) {
      if (m && m->hello.rank == h.rank) return invalid_arg("rank {} joined twice", h.rank);
    }
  }

  auto c = std::make_shared<Trainer>(&counters);
  c->id = next_client_id++;
  c->pid = p.pid;
  c->uid = p.uid;
  c->hello = h;
  GW_ASSIGN_OR_RETURN(c->geo, arena_geometry(h.arena_bytes, opt.ring_entries));
  GW_ASSIGN_OR_RETURN(c->arena,
                      sys::MemfdRegion::create(fmt::format("gwd-arena-{}", c->id), h.arena_bytes));
  counters.live_arenas.fetch_add(1);
  c->hdr = new (c->arena.data()) ArenaHeader();
  c->hdr->magic = kArenaMagic;
  c->hdr->version = kProtocolVersion;
  c->data = static_cast<uint8_t*>(c->arena.data()) + c->geo.data_offset;
  GW_ASSIGN_OR_RETURN(c->sq_efd, make_eventfd());
  GW_ASSIGN_OR_RETURN(c->cq_efd, make_eventfd());
  c->sq = RingConsumer<SqEntry>(submission_ring(c->arena.data(), c->geo, c->sq_efd.get()));
  c->cq = RingProducer<CqEntry>(completion_ring(c->arena.data(), c->geo, c->cq_efd.get()));

  Welcome w = c->geo;
  w.client_id = c->id;
  w.transport = encode_offer(job_offer());
  // The job's parameter server, started with the job (a socket and a thread; docs/daemon.md).
  std::shared_ptr<kv::Server> kv = job ? job->kv : nullptr;
  // A connection of the NCCL plugin's daemon mode (nccl_job_of) is a job of its own and never
  // uses one: it gets none (no socket and thread per NCCL connection).
  if (!job && nccl_job_of(h).empty()) {
    auto started = start_kv_server(h);
    if (started.ok()) {
      kv = std::move(*started);
    } else {
      GW_LOG_WARN("gradwired: no kv server for a job of {} ranks: {}", h.world_size,
                  started.status().message());
    }
  }
  if (kv) w.kv_address = kv->address();
  const std::vector<uint8_t> frame = frame_message(encode_welcome(w));
  const int fds[3] = {c->arena.fd(), c->sq_efd.get(), c->cq_efd.get()};
  GW_RETURN_IF_ERROR(sys::send_with_fds(p.sock.get(), frame.data(), frame.size(), fds,
                                        sys::deadline_after_ms(opt.hello_timeout_ms), "welcome"));
  c->arena.close_fd();  // the mapping stays; the client holds its own descriptor
  c->sock = std::move(p.sock);

  if (!job) {
    job = std::make_shared<Job>(wake_efd.get(), h, &counters, job_offer());
    job->spin_ns = opt.spin_us * 1000;
    job->pool = pool.get();
    GW_ASSIGN_OR_RETURN(job->wake, make_eventfd());
    job->kv = std::move(kv);
    if (job->kv) counters.add_kv(job_name(h), h.host_index, job->kv);
    jobs[key] = job;
    counters.live_jobs.fetch_add(1);
  }
  job->members[h.local_rank] = c;
  ++job->joined;
  clients[c->id] = c;
  client_job[c->id] = job;
  counters.accepted.fetch_add(1);
  counters.live_clients.fetch_add(1);
  GW_LOG_INFO("gradwired: {} joined a job of {} ranks (local {}/{}, host {} of {}), arena {} bytes",
              c->name(), h.world_size, job->joined, h.local_size, h.host_index, h.num_hosts,
              h.arena_bytes);
  if (job->joined == h.local_size) {
    job->started = true;
    Job* raw = job.get();
    job->thread = std::thread([raw] { raw->run(); });
  }
  return ok_status();
}

void Server::Impl::expire_pending(PendingConn& p) {
  refuse_conn(p.sock, p.pid, timeout_error("no complete hello within {} ms", opt.hello_timeout_ms));
}

Status Server::Impl::take_fd_records(Trainer& t, const uint8_t* b, size_t n,
                                     std::vector<sys::Fd>* fds) {
  t.sock_in.insert(t.sock_in.end(), b, b + n);
  for (sys::Fd& fd : *fds) t.sock_fds.push_back(std::move(fd));
  fds->clear();
  while (t.sock_in.size() >= kFdRecordBytes) {
    GW_ASSIGN_OR_RETURN(uint32_t ticket, decode_fd_record(t.sock_in.data()));
    if (t.sock_fds.empty()) {
      return peer_error("it sent a descriptor record (ticket {}) without a descriptor", ticket);
    }
    {
      std::lock_guard<std::mutex> lock(t.fds_mu);
      if (t.passed_fds.count(ticket) != 0 || t.passed_fds.size() >= kMaxPassedDmabufs) {
        return peer_error(
            "descriptor record: ticket {} in use, or more than {} descriptors "
            "waiting for their registration",
            ticket, kMaxPassedDmabufs);
      }
      t.passed_fds[ticket] = std::move(t.sock_fds.front());
    }
    t.fds_cv.notify_all();
    t.sock_fds.pop_front();
    t.sock_in.erase(t.sock_in.begin(), t.sock_in.begin() + kFdRecordBytes);
  }
  // A descriptor travels with its record's first byte: more than the records hold is a flood.
  if (t.sock_fds.size() > (t.sock_in.empty() ? 0u : 1u)) {
    return peer_error("it passed {} descriptors without their records", t.sock_fds.size());
  }
  return ok_status();
}

void Server::Impl::poll_clients(const std::vector<pollfd>& pfds, size_t first,
                                const std::vector<uint64_t>& ids) {
  // Trainers refused by their job thread: cut them.
  std::vector<std::pair<uint64_t, std::string>> gone;
  for (const auto& [id, c] : clients) {
    if (c->lost.load(std::memory_order_acquire)) gone.emplace_back(id, c->reason());
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const short ev = pfds[first + i].revents;
    if (ev == 0) continue;
    auto it = clients.find(ids[i]);
    if (it == clients.end()) continue;
    uint8_t b[64];
    std::vector<sys::Fd> fds;
    auto n = sys::recv_with_fds(it->second->sock.get(), b, sizeof(b), &fds, sys::kNoWait, "client");
    if (n.ok() && *n == 0) {
      // Whether it said, before closing, that it leaves on purpose (a killed process cannot).
      Trainer& t = *it->second;
      const bool left =
          t.hdr != nullptr && t.hdr->client_leaving.load(std::memory_order_acquire) == 1;
      t.left.store(left, std::memory_order_relaxed);  // published by mark_lost (release)
      gone.emplace_back(ids[i], left ? "closed its connection"
                                     : "its connection closed without a "
                                       "goodbye (killed or crashed?)");
    } else if (n.ok()) {
      // Version 8: descriptor records (a dma-buf for a register_dmabuf), nothing else.
      Status took = take_fd_records(*it->second, b, *n, &fds);
      if (!took.ok()) {
        counters.refused.fetch_add(1);
        counters.error(ErrorKind::kProtocol);
        gone.emplace_back(ids[i], "refused: " + took.message());
      }
    } else if (n.status().code() != Code::kTimeout) {
      // kPeer: a flood of descriptors, say (not a reset: the daemon never writes after the
      // welcome, so a trainer that closes leaves nothing unread). Cut, and counted as refused.
      if (n.status().code() == Code::kPeer) {
        counters.refused.fetch_add(1);
        counters.error(ErrorKind::kProtocol);
      }
      gone.emplace_back(ids[i], n.status().message());
    }
  }
  for (const auto& [id, why] : gone) client_gone(id, why);
}

void Server::Impl::client_gone(uint64_t id, const std::string& why) {
  auto it = clients.find(id);
  if (it == clients.end()) return;
  std::shared_ptr<Trainer> c = it->second;
  clients.erase(it);
  counters.live_clients.fetch_sub(1);
  c->mark_lost(why);
  c->sock.reset();
  GW_LOG_INFO("gradwired: {} disconnected: {}", c->name(), c->reason());
  auto jt = client_job.find(id);
  if (jt == client_job.end()) return;
  std::shared_ptr<Job> job = jt->second;
  client_job.erase(jt);
  if (job->started) {
    // A collective in progress (or a wait for a dma-buf's connection) ends now, not at its
    // deadline. Otherwise the job thread, woken below, ends it (Job::fail): a trainer that left on
    // purpose says goodbye to the job's other daemons first, so they take the close for a usual
    // end, and the device messages held for any trainer that went are refused first, so their
    // senders fail saying why (job_p2p_remote.h).
    if (job->in_collective.load() ||
        (!c->left.load(std::memory_order_acquire) && job->in_wait.load())) {
      job->abort_comm();
    }
    (void)signal_eventfd(job->wake.get());
    return;
  }
  // Not started: free its place (it may come back).
  job->members[c->hello.local_rank].reset();
  if (--job->joined == 0) {
    jobs.erase(job_key(job->first));
    counters.live_jobs.fetch_sub(1);
  }
}

void Server::Impl::reap_jobs(bool all) {
  for (auto it = jobs.begin(); it != jobs.end();) {
    Job& j = *it->second;
    if (all && j.started) {
      j.stop.store(true);
      j.abort_comm();
      (void)signal_eventfd(j.wake.get());
    }
    if (j.started && (all || j.finished.load())) {
      if (j.thread.joinable()) j.thread.join();
      counters.live_jobs.fetch_sub(1);
      it = jobs.erase(it);
    } else if (all) {
      counters.live_jobs.fetch_sub(1);
      it = jobs.erase(it);
    } else {
      ++it;
    }
  }
  if (all) {
    client_job.clear();
    for (auto& [id, c] : clients) c->sock.reset();
    counters.live_clients.store(0);
    clients.clear();
    pending.clear();
    ctl_pending.clear();
  }
}

Status Server::Impl::check_peer(int sock, const ucred& cred) const {
  if (cred.uid == ::geteuid() || cred.uid == 0) return ok_status();
  if (!has_group) {
    return invalid_arg("uid {} is neither the daemon's ({}) nor root", cred.uid, ::geteuid());
  }
  if (cred.gid == group_gid) return ok_status();
  for (gid_t g : peer_groups(sock, cred.pid)) {
    if (g == group_gid) return ok_status();
  }
  return invalid_arg("uid {} is neither the daemon's ({}) nor root, and not in group {} ({})",
                     cred.uid, ::geteuid(), opt.group, group_gid);
}

}  // namespace gw::daemon
