#include "daemon/job.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <utility>

#include "core/bootstrap.h"
#include "core/log.h"
#include "core/net/handshake.h"
#include "core/sys/time.h"
#include "core/timeline.h"
#include "daemon/transport_offer.h"

namespace gw::daemon {

void Trainer::mark_lost(std::string why) {
  std::lock_guard<std::mutex> lock(reason_mu);
  if (lost_reason.empty()) lost_reason = std::move(why);
  lost.store(true, std::memory_order_release);
}

std::string Trainer::reason() {
  std::lock_guard<std::mutex> lock(reason_mu);
  return lost_reason;
}

std::string Trainer::name() const {
  return fmt::format("rank {} (pid {}, client {})", hello.rank, pid, id);
}

std::string job_key(const Hello& h) {
  return fmt::format("{}|{}:{}|{}", h.job_token, h.store_host, h.store_port, h.world_size);
}

std::string job_name(const Hello& h) {
  uint64_t x = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : h.job_token) x = (x ^ c) * 0x100000001b3ull;
  return fmt::format("{:016x}", x);
}

std::string nccl_job_of(const Hello& h) {
  const std::string& t = h.job_token;
  constexpr size_t kId = 16;
  constexpr size_t kConn = 32;
  if (t.size() != 5 + kId + 1 + kConn || t.compare(0, 5, "nccl-") != 0 || t[5 + kId] != '-') {
    return "";
  }
  for (size_t i = 5; i < t.size(); ++i) {
    if (i != 5 + kId && !std::isxdigit(static_cast<unsigned char>(t[i]))) return "";
  }
  return t.substr(5, kId);
}

Result<std::shared_ptr<kv::Server>> start_kv_server(const Hello& h) {
  kv::ServerOptions o;
  o.rank = h.host_index;
  o.token = h.job_token;
  o.timeout_ms = h.timeout_ms;
  o.route_host = h.store_host;
  GW_ASSIGN_OR_RETURN(auto s, kv::Server::start(o));
  return std::shared_ptr<kv::Server>(std::move(s));
}

Job::Job(int server_wake_fd, const Hello& h, Counters* c, std::vector<std::string> offer)
    : server_wake_fd(server_wake_fd),
      first(h),
      counters(c),
      offer(std::move(offer)),
      tslot(c->other_slot()) {
  members.resize(h.local_size);
  nccl_job = nccl_job_of(h);
  if (!nccl_job.empty()) nccl_totals = c->nccl_totals(nccl_job);
}

namespace {
// "host 0 offers dpdk,tcp; host 1 offers tcp".
std::string agree_note(const std::vector<std::vector<std::string>>& offers) {
  std::string s;
  for (size_t h = 0; h < offers.size(); ++h) {
    s += fmt::format("{}host {} offers {}", h == 0 ? "" : "; ", h, encode_offer(offers[h]));
  }
  return s;
}

// The job's store as start_comm and the daemons' communicator see it: every call fails at once
// with "gradwired: stopping" once `stop` is set, and a get (the one call that waits for another
// daemon) waits in slices of kStopSliceMs so that a stop ends it within one slice, whatever
// deadline the client chose. set, add and erase do not wait for a peer: only the store's own
// round trip, which the deadline bounds.
class StoppableStore : public Store {
 public:
  StoppableStore(std::shared_ptr<Store> base, const std::atomic<bool>* stop)
      : base_(std::move(base)), stop_(stop) {}
  Status set(const std::string& key, const Bytes& value, Deadline deadline) override {
    GW_RETURN_IF_ERROR(stopping());
    return base_->set(key, value, deadline);
  }
  Result<Bytes> get(const std::string& key, Deadline deadline) override {
    for (;;) {
      GW_RETURN_IF_ERROR(stopping());
      Result<Bytes> v = base_->get(key, std::min(deadline, sys::deadline_after_ms(kStopSliceMs)));
      if (v.ok() || v.status().code() != Code::kTimeout || sys::expired(deadline)) return v;
    }
  }
  Result<int64_t> add(const std::string& key, int64_t delta, Deadline deadline) override {
    GW_RETURN_IF_ERROR(stopping());
    return base_->add(key, delta, deadline);
  }
  Status erase(const std::string& key, Deadline deadline) override {
    GW_RETURN_IF_ERROR(stopping());
    return base_->erase(key, deadline);
  }

 private:
  Status stopping() const {
    return stop_->load() ? aborted_error("gradwired: stopping") : ok_status();
  }
  std::shared_ptr<Store> base_;
  const std::atomic<bool>* stop_;
};

}  // namespace

Status Job::start_comm() {
  const Hello& h = first;
  if (h.num_hosts == 1) return ok_status();
  // The waits below are the client's (timeout_ms, up to 2^31-1 ms) but stopping the daemon must
  // not wait for them: they run in slices of kStopSliceMs, and stop ends them between slices.
  const sys::Deadline deadline = sys::deadline_after_ms(h.timeout_ms);
  auto stopping = [&] { return stop.load() ? aborted_error("gradwired: stopping") : ok_status(); };
  TcpStoreOptions so;
  so.host = h.store_host;
  so.port = h.store_port;
  so.host_server = false;
  so.token = h.store_token;
  Result<std::shared_ptr<TcpStore>> tcp = timeout_error("gradwired: no store");
  for (;;) {
    so.connect_timeout_ms = std::max(1, std::min(sys::ms_until(deadline), kStopSliceMs));
    tcp = TcpStore::create(so);
    if (tcp.ok() || sys::expired(deadline)) break;
    GW_RETURN_IF_ERROR(stopping());
    if (tcp.status().code() != Code::kTimeout) break;  // a refusal is final
  }
  if (!tcp.ok()) {
    return tcp.status().with_context(fmt::format(
        "gradwired: the job's rendezvous store (the trainers' timeout: {} ms)", h.timeout_ms));
  }
  // Every job of the store (a split makes more) meets under a prefix of its own.
  const net::handshake::Mac tag =
      net::handshake::hmac_sha256(h.job_token, reinterpret_cast<const uint8_t*>("gwd"), 3);
  std::shared_ptr<Store> prefixed = make_prefix_store(std::make_shared<StoppableStore>(*tcp, &stop),
                                                      "gwd/" + to_hex(tag.data(), 8) + "/");
  // The transport: the first of host 0's offer that every daemon of the job offers.
  const std::string mine = encode_offer(offer);
  GW_RETURN_IF_ERROR(
      prefixed
          ->set("offer/" + std::to_string(h.host_index), Bytes(mine.begin(), mine.end()), deadline)
          .with_context("gradwired: publishing this daemon's transports"));
  GW_LOG_INFO("gradwired: job of {} ranks (host {} of {}): offered {}; meeting the other daemons",
              h.world_size, h.host_index, h.num_hosts, mine);
  std::vector<std::vector<std::string>> offers;
  for (int32_t host = 0; host < h.num_hosts; ++host) {
    Result<Bytes> v = prefixed->get("offer/" + std::to_string(host), deadline);
    if (!v.ok()) {
      return v.status().with_context(
          fmt::format("gradwired: waiting for the transports of host {}'s daemon", host));
    }
    auto names = decode_offer(std::string(v->begin(), v->end()));
    if (!names.ok()) {
      return names.status().with_context(fmt::format("gradwired: host {}'s daemon", host));
    }
    offers.push_back(std::move(*names));
  }
  GW_ASSIGN_OR_RETURN(std::string agreed, agree_transport(offers));
  if (agreed != offer.front()) {
    GW_LOG_INFO("gradwired: job of {} ranks (host {} of {}) runs over {}, not {}: {}", h.world_size,
                h.host_index, h.num_hosts, agreed, offer.front(), agree_note(offers));
  }
  coll::CommOptions co;
  co.rank = h.host_index;
  co.world_size = h.num_hosts;
  co.store = prefixed;
  co.transport = agreed;
  co.timeout_ms = h.timeout_ms;
  co.job_token = h.job_token;
  co.host_id = h.host_id;
  // Creation waits only on the store (stopped above); the first collective's connects and
  // accepts poll the communicator's abort flag, which abort_comm() sets once comm is published.
  auto made = coll::Communicator::create(co);
  if (!made.ok()) return made.status().with_context("gradwired: joining the job's other daemons");
  {
    std::lock_guard<std::mutex> lock(comm_mu);
    store = *tcp;
    comm = std::move(*made);
  }
  // A stop that came before comm was published found nothing to abort: abort it here.
  if (stop.load()) abort_comm();
  // Which host holds every rank (broadcast roots): each daemon fills its own ranks.
  std::vector<int32_t> map(h.world_size, -1);
  for (const auto& m : members) map[m->hello.rank] = h.host_index;
  GW_RETURN_IF_ERROR(comm->allreduce(map.data(), map.data(), map.size(), coll::DataType::kI32,
                                     coll::ReduceOp::kMax)
                         .with_context("gradwired: exchanging the job's host map"));
  for (size_t r = 0; r < map.size(); ++r) {
    if (map[r] < 0) {
      return invalid_arg("gradwired: no daemon of the job has rank {} (host layout disagrees)", r);
    }
  }
  {
    std::lock_guard<std::mutex> lock(comm_mu);
    transport = agreed;
    tslot = counters->transport_slot(agreed);
  }
  ranks_of_host.assign(static_cast<size_t>(h.num_hosts), {});
  for (size_t r = 0; r < map.size(); ++r) {
    ranks_of_host[static_cast<size_t>(map[r])].push_back(static_cast<int32_t>(r));
  }
  host_of_rank = std::move(map);
  return ok_status();
}

void Job::fail(const Status& s, bool left, int32_t who) {
  bool pending = false;
  for (const auto& m : members) pending = pending || (m && !m->pending.empty());
  // A trainer that left on purpose between collectives ends the job; anything else fails it,
  // even after such an end (a trainer killed after its peer closed).
  const bool usual_end = left && !pending && s.code() == Code::kPeer;
  (usual_end ? ended : failed).store(true);
  if (!failure.ok()) return;
  failure = s;
  if (!usual_end) {
    GW_LOG_WARN("gradwired: job of {} ranks (host {} of {}) failed: {}", first.world_size,
                first.host_index, first.num_hosts, s.message());
  } else {  // a trainer left between collectives: the usual end of a job
    GW_LOG_INFO("gradwired: job of {} ranks (host {} of {}) ends: {}", first.world_size,
                first.host_index, first.num_hosts, s.message());
    // Before the connections close: the other daemons then take their close for this end, not
    // for a failure (job_p2p_remote.h). Bounded: a daemon that cannot be reached delays nobody.
    if (remote && who >= 0)
      remote->say_goodbye(who, std::min<int64_t>(kByeWaitMs, first.timeout_ms));
  }
  // The answer to another daemon's goodbye (its job ended first, which may have ended this one),
  // which that daemon waits for before its connections close: delivered before the abort.
  if (remote) remote->flush_replies(std::min<int64_t>(kRefuseWaitMs, first.timeout_ms));
  abort_comm();  // the job's other daemons see the connections close
}

void Job::refuse(Trainer& t, const Status& why) {
  GW_LOG_WARN("gradwired: refusing {}: {}", t.name(), why.message());
  counters->refused.fetch_add(1);
  counters->error(ErrorKind::kProtocol);
  t.mark_lost(fmt::format("refused: {}", why.message()));
  (void)signal_eventfd(server_wake_fd);
}

void Job::complete(Trainer& t, uint64_t seq, const Status& s, const CompressedDone* done,
                   bool moved) {
  if (!t.device_ops.empty()) t.device_ops.erase(seq);  // its registration is free to go
  if (t.lost.load(std::memory_order_acquire)) return;
  Result<uint64_t> used = t.cq.used();
  Status ring = used.status();
  if (ring.ok() && *used >= t.geo.cq_entries) {
    ring = peer_error("completion ring full: the client does not read its completions");
  }
  if (!ring.ok()) {
    refuse(t, ring);
    return;
  }
  if (nccl_totals && done != nullptr && moved && s.ok() && t.hello.rank == 1) {
    const uint64_t bytes = p2p_done(*done).bytes;
    nccl_bytes.fetch_add(bytes, std::memory_order_relaxed);
    nccl_totals->bytes.fetch_add(bytes, std::memory_order_relaxed);
  }
  t.cq.push(make_completion(seq, s, done));
  // A client busy-polling its completion ring sees the entry without a wake-up; a failed
  // eventfd write is not the trainer's fault, and its socket tells it when the daemon goes.
  (void)t.cq.kick();
}

void Job::consume(Trainer& t) {
  Result<uint64_t> ready = t.sq.ready();
  if (!ready.ok()) {
    refuse(t, ready.status());
    return;
  }
  for (uint64_t k = *ready; k > 0; --k) {
    // One copy: the client cannot change it under the checks.
    const SqEntry e = t.sq.front();
    auto r =
        decode_request(e, t.next_seq, t.data, t.geo.data_bytes, first.world_size, &t.alloc_sizes);
    if (!r.ok()) {
      refuse(t, r.status());
      return;
    }
    if (r->opcode == Opcode::kImport) t.alloc_sizes[r->alloc_id] = r->alloc_bytes;
    if (r->opcode == Opcode::kRelease) t.alloc_sizes.erase(r->alloc_id);
    if (r->opcode == Opcode::kRegisterDmabuf || r->opcode == Opcode::kDeregisterDmabuf ||
        r->opcode == Opcode::kFlushDmabuf) {
      dmabuf_request(t, *r);  // the trainer's own, answered now (job_dmabuf.cc)
      t.requests.fetch_add(1, std::memory_order_relaxed);
      ++t.next_seq;
      t.sq.pop();
      continue;
    }
    if (r->opcode == Opcode::kSend || r->opcode == Opcode::kRecv) {
      // Not collective: matched at once with the other trainers' (job_p2p.h).
      // The job's failure ends its collectives, not the sends and receives among the trainers
      // still here (a trainer that left is dropped from the board alone).
      P2pDevice dev;
      Status bad;
      if (r->dmabuf != 0) bad = p2p_device(t, *r, &dev);
      if (!bad.ok()) {
        complete(t, r->seq, bad);
      } else if (p2p) {
        // Until it is answered, its registration cannot be deregistered (job_dmabuf.cc).
        if (r->dmabuf != 0) t.device_ops[r->seq] = r->dmabuf;
        p2p->submit(static_cast<size_t>(t.hello.local_rank), *r, dev);
      } else {
        complete(t, r->seq, aborted_error("gradwired: the job has ended"));
      }
      t.requests.fetch_add(1, std::memory_order_relaxed);
      ++t.next_seq;
      t.sq.pop();
      continue;
    }
    if (tracing.load(std::memory_order_relaxed)) t.queued_us[t.next_seq] = timeline::now_us();
    t.pending.push_back(*r);
    t.requests.fetch_add(1, std::memory_order_relaxed);
    ++t.next_seq;
    t.sq.pop();
  }
}

std::string Job::describe(const Request& r) const {
  if (r.opcode == Opcode::kBarrier) return "barrier";
  if (r.opcode == Opcode::kAllreduceCompressed) {
    return fmt::format("allreduce_compressed {} count {} codec \"{}\" key \"{}\"",
                       coll::dtype_name(r.dtype), r.count, r.spec, r.key);
  }
  return fmt::format("{} {} {} count {} root {}", opcode_name(r.opcode), coll::dtype_name(r.dtype),
                     static_cast<int>(r.op), r.count, r.root);
}

void Job::run_ready() {
  for (;;) {
    for (const auto& m : members) {
      if (m) settle(*m);
    }
    for (const auto& m : members) {
      if (!m || m->pending.empty()) return;
    }
    std::vector<Request> reqs;
    for (const auto& m : members) {
      reqs.push_back(m->pending.front());
      m->pending.pop_front();
    }
    Status s = failure;
    if (s.ok()) {
      for (size_t i = 1; i < reqs.size(); ++i) {
        const Request& a = reqs[0];
        const Request& b = reqs[i];
        if (a.opcode != b.opcode || a.dtype != b.dtype || a.op != b.op || a.count != b.count ||
            a.root != b.root || a.spec != b.spec || a.key != b.key) {
          s = invalid_arg("trainers of the job disagree: rank {} calls {}, rank {} calls {}",
                          members[0]->hello.rank, describe(a), members[i]->hello.rank, describe(b));
          break;
        }
      }
    }
    done_info.clear();
    trace_now = current_trace();
    const int64_t t0_us = trace_now ? timeline::now_us() : 0;
    if (s.ok()) {
      // Messages of other hosts are taken meanwhile by remote's waker (job_p2p_remote.h).
      in_collective.store(true, std::memory_order_release);
      p2p_mu.unlock();
      s = execute(reqs);
      p2p_mu.lock();
      in_collective.store(false, std::memory_order_release);
    }
    if (!s.ok() && s.code() == Code::kAborted) {
      // The main thread aborts the communicator when a trainer of the job goes: say that.
      for (const auto& m : members) {
        if (m->lost.load(std::memory_order_acquire)) {
          s = peer_error("{} left the job: {}", m->name(), m->reason());
          break;
        }
      }
    }
    if (trace_now) {
      record_collective(reqs, t0_us, s);
      trace_now->commit();  // the collective and its phases, together
    }
    trace_now.reset();
    counters->collective(reqs[0].opcode, s);
    if (s.ok()) {
      counters->collectives.fetch_add(1);
      done.fetch_add(1, std::memory_order_relaxed);
    } else {
      counters->failed.fetch_add(1);
      errors.fetch_add(1, std::memory_order_relaxed);
      fail(s);
    }
    for (size_t i = 0; i < members.size(); ++i) {
      complete(*members[i], reqs[i].seq, s, i < done_info.size() ? &done_info[i] : nullptr);
    }
  }
}

bool Job::wait_for_work() {
  // Busy-poll the submission counters for GW_DAEMON_POLL_US before sleeping, telling the
  // clients so (they then skip the eventfd); clear that, fence, and look once more before
  // sleeping, so a submission posted meanwhile is never left without a wake-up (daemon/ring.h).
  auto posted = [&]() {
    for (const auto& m : members) {
      if (m && (m->sq.posted() || m->lost.load(std::memory_order_relaxed))) return true;
    }
    return remote && (remote->fired() || remote->any_done());
  };
  // While spinning, the job thread also moves the daemons' point-to-point itself (one engine
  // pass per look), so that a header landing meanwhile needs no hand-off from the waker.
  auto posted_or_landed = [&]() { return posted() || (remote && remote->poke()); };
  bool ready = false;
  // Adaptive: after kSpinMisses spins in a row that found nothing (work comes further apart than
  // the spin, as a ping-pong's next message, a round trip later), the thread sleeps at once: the
  // spin then only took a core from the trainers and the other side's threads. It spins again
  // once a sleep is ended by work within spin_ns of its start.
  const bool spin = spin_ns > 0 && spin_misses < kSpinMisses;
  if (spin) {
    for (const auto& m : members) {
      if (m) m->sq.begin_polling();
    }
    const int64_t spin_until = sys::now_ns() + spin_ns;
    while (!(ready = posted_or_landed()) && sys::now_ns() < spin_until &&
           !stop.load(std::memory_order_relaxed)) {
      std::this_thread::yield();  // trainers sharing the core get it at once
    }
    for (const auto& m : members) {
      if (m) m->sq.end_polling();
    }
    ready = ready || posted();
    spin_misses = ready ? 0 : spin_misses + 1;
  } else {
    ready = posted();
  }
  if (ready) return true;
  // Sleep until a trainer, the serve loop or stop() wakes this job.
  std::vector<pollfd> pfds;
  pfds.push_back({wake.get(), POLLIN, 0});
  for (const auto& m : members) {
    if (m) pfds.push_back({m->sq.wake_fd(), POLLIN, 0});
  }
  // The daemons' point-to-point ops write wake at their end (RemoteP2p::arm): no 1 ms looks.
  const int64_t slept_ns = spin_ns > 0 ? sys::now_ns() : 0;
  int rc = ::poll(pfds.data(), pfds.size(), stall_poll_ms(1000));
  if (rc < 0 && errno != EINTR) {
    GW_LOG_ERROR("gradwired: job poll: {}", std::strerror(errno));
    return false;
  }
  if (rc > 0 && spin_ns > 0 && sys::now_ns() - slept_ns < spin_ns) spin_misses = 0;
  for (const auto& p : pfds) {
    if (p.revents & POLLIN) drain_eventfd(p.fd);
  }
  return true;
}

void Job::run() {
  p2p_mu.lock();  // let go only while a collective runs (run_ready)
  Status s = start_comm();
  dmabuf_link->comm = comm.get();  // the registrations' link (job_dmabuf.cc)
  make_p2p();
  if (!s.ok()) fail(s);
  while (!stop.load()) {
    if (!wait_for_work()) break;
    size_t live = 0;
    for (auto& m : members) {
      if (!m) continue;
      if (!m->lost.load(std::memory_order_acquire)) consume(*m);
      if (m->lost.load(std::memory_order_acquire)) {
        const Status why = peer_error("{} left the job: {}", m->name(), m->reason());
        // Off the board first, while the communicator still carries the refusals of the device
        // messages held for it (bounded), then the job ends (the communicator is aborted).
        if (p2p) p2p->drop_member(static_cast<size_t>(m->hello.local_rank), why);
        if (remote) remote->flush_replies(std::min<int64_t>(kRefuseWaitMs, first.timeout_ms));
        fail(why, m->left.load(std::memory_order_acquire), m->hello.rank);
        release_dmabufs(*m);  // its device buffers leave the NIC now, not with the job
        m.reset();            // the arena goes with the last reference
        continue;
      }
      ++live;
    }
    if (live == 0) break;
    if (remote) {
      remote->progress();  // sends and receives across hosts (job_p2p_remote.h)
      // Another daemon's job ended because a trainer there left on purpose: so does this one.
      if (failure.ok() && !remote->peer_left().ok()) {
        fail(remote->peer_left(), true, remote->peer_left_rank());
      }
    }
    if (!failure.ok()) {
      // Answer whatever the remaining trainers ask with the job's failure.
      for (auto& m : members) {
        if (!m) continue;
        while (!m->pending.empty()) {
          complete(*m, m->pending.front().seq, failure);
          m->pending.pop_front();
        }
      }
      continue;
    }
    run_ready();
    watch_stall();
  }
  if (stop.load()) {
    // Stopping: what the trainers asked is answered with why before their sockets close (the
    // serve loop joins this thread first), so none reads a closed connection as a crash.
    const Status why = peer_error("gradwired is stopping (it was told to: SIGTERM or SIGINT)");
    for (auto& m : members) {
      if (!m || m->lost.load(std::memory_order_acquire)) continue;
      consume(*m);
      if (p2p) p2p->fail_all(why);
      if (remote) remote->fail_all(why);
      for (; !m->pending.empty(); m->pending.pop_front()) {
        complete(*m, m->pending.front().seq, why);
      }
    }
  }
  if (p2p) p2p->fail_all(aborted_error("gradwired: the job has ended"));
  if (remote) {
    remote->fail_all(aborted_error("gradwired: the job has ended"));
    remote->shutdown();  // its ops end with the communicator below; it goes after that
  }
  if (p2p) p2p->set_link(nullptr);
  p2p.reset();
  for (auto& m : members) {
    // Before the connections they are registered on (those an op of remote's still holds: with
    // the connections, DmabufRegistration).
    if (m) release_dmabufs(*m);
  }
  compressor.reset();  // it borrows comm
  if (kv) {
    // The job's other workers may still use this daemon's share of the keys: the server stays
    // until they are done (or the trainers' deadline, or gradwired stops).
    Status k = kv->wait_all_finished(sys::deadline_after_ms(first.timeout_ms), &stop);
    if (!k.ok()) GW_LOG_WARN("gradwired: job's kv server ends: {}", k.message());
    kv->stop();
  }
  {
    std::lock_guard<std::mutex> lock(comm_mu);
    // The registrations that ops still hold go with the connections they are registered on;
    // those ops release only their addresses (remote.reset() below).
    dmabuf_link->comm = nullptr;
    comm.reset();
    store.reset();
  }
  remote.reset();  // no op can write into an arena or buffer any more
  p2p_mu.unlock();
  members.clear();
  finished.store(true);
  (void)signal_eventfd(server_wake_fd);
}

}  // namespace gw::daemon
