#include "daemon/server.h"

#include <grp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/compress/compress.h"
#include "collectives/reduce.h"
#include "core/bootstrap.h"
#include "core/config.h"
#include "core/log.h"
#include "core/net/backend_registry.h"
#include "core/net/handshake.h"
#include "core/store.h"
#include "core/sys/fd.h"
#include "core/sys/memfd_region.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "daemon/control.h"
#include "daemon/daemon_config.h"
#include "daemon/protocol.h"
#include "daemon/reduce_pool.h"
#include "daemon/transport_offer.h"

namespace gw::daemon {
namespace {

// The transports bytes are counted by: the ones a daemon may offer, then any other.
inline constexpr const char* kTransportNames[] = {"tcp", "dpdk", "verbs", "other"};
inline constexpr int kTransportSlots = 4;
int transport_slot(const std::string& name) {
  for (int i = 0; i < kTransportSlots - 1; ++i) {
    if (name == kTransportNames[i]) return i;
  }
  return kTransportSlots - 1;
}

struct Counters {
  std::atomic<uint64_t> accepted{0}, refused{0}, live_clients{0}, live_arenas{0}, live_jobs{0},
      collectives{0}, failed{0};
  std::atomic<uint64_t> by_opcode[kNumOpcodes][2] = {};
  std::atomic<uint64_t> errors[kNumErrorKinds] = {};
  std::atomic<uint64_t> collective_errors[9] = {};
  std::atomic<uint64_t> arena_in{0}, arena_out{0};
  // Inter-host bytes by the transport their job's daemons agreed on (transport_slot).
  std::atomic<uint64_t> inter_in[kTransportSlots] = {}, inter_out[kTransportSlots] = {};
  struct Histogram {
    std::atomic<uint64_t> buckets[DurationHistogram::kBuckets] = {};
    std::atomic<uint64_t> count{0}, sum_ns{0};
  } phases[kNumPhases];

  // Bytes read from (in) and written into (out) the trainers' arenas; handed to (out) and got back
  // from (in) the inter-host collective.
  void arena(uint64_t in, uint64_t out) {
    arena_in.fetch_add(in, std::memory_order_relaxed);
    arena_out.fetch_add(out, std::memory_order_relaxed);
  }
  void inter(int slot, uint64_t in, uint64_t out) {
    inter_in[slot].fetch_add(in, std::memory_order_relaxed);
    inter_out[slot].fetch_add(out, std::memory_order_relaxed);
  }
  void error(ErrorKind kind) {
    errors[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
  }
  void observe(Phase phase, int64_t ns) {
    Histogram& h = phases[static_cast<int>(phase)];
    const double s = static_cast<double>(ns) / 1e9;
    int b = 0;
    while (b < DurationHistogram::kBuckets - 1 && s > DurationHistogram::kBounds[b]) ++b;
    h.buckets[b].fetch_add(1, std::memory_order_relaxed);
    h.count.fetch_add(1, std::memory_order_relaxed);
    h.sum_ns.fetch_add(static_cast<uint64_t>(std::max<int64_t>(ns, 0)), std::memory_order_relaxed);
  }
  // A collective's end: by opcode, and its error's kind.
  void collective(Opcode op, const Status& s) {
    const int k = static_cast<int>(op) - 1;
    if (k >= 0 && k < kNumOpcodes) by_opcode[k][s.ok() ? 0 : 1].fetch_add(1);
    if (s.ok()) return;
    error(ErrorKind::kCollective);
    const int code = static_cast<int>(s.code());
    if (code >= 0 && code < 9) collective_errors[code].fetch_add(1);
  }
};

// A collective's phases for the metrics: each phase's time runs from the previous mark.
class PhaseClock {
 public:
  explicit PhaseClock(Counters* c) : counters_(c) {}
  void mark(Phase phase) {
    const int64_t now = sys::now_ns();
    counters_->observe(phase, now - last_ns_);
    last_ns_ = now;
  }

 private:
  Counters* counters_;
  int64_t last_ns_ = sys::now_ns();
};

Result<sys::Fd> make_eventfd() {
  sys::Fd fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!fd.valid()) return system_error("eventfd", errno);
  return fd;
}

void signal_fd(int fd) {
  uint64_t one = 1;
  ssize_t n = ::write(fd, &one, sizeof(one));
  (void)n;  // EAGAIN: the counter is already non-zero, the reader wakes anyway
}

void drain_fd(int fd) {
  uint64_t v;
  ssize_t n = ::read(fd, &v, sizeof(v));
  (void)n;
}

// One trainer: its socket (main thread only), its arena and eventfds, and the job thread's view
// of its rings.
struct Client {
  explicit Client(Counters* c) : counters(c) {}
  ~Client() {
    if (arena.mapped()) counters->live_arenas.fetch_sub(1);
  }
  Counters* counters;
  uint64_t id = 0;
  pid_t pid = 0;
  uid_t uid = 0;
  sys::Fd sock;
  Hello hello;
  Welcome geo;
  sys::MemfdRegion arena;
  sys::Fd sq_efd, cq_efd;
  ArenaHeader* hdr = nullptr;
  uint8_t* data = nullptr;

  // Set once by whoever sees the client go (main thread: socket closed; job thread: refused).
  std::atomic<bool> lost{false};
  std::atomic<uint64_t> requests{0};  // submissions accepted (gradwirectl clients)
  std::mutex reason_mu;
  std::string lost_reason;

  // Job thread only.
  uint64_t next_seq = 1;
  uint64_t sq_head = 0;  // the daemon's own copies; the shared ones are only published
  uint64_t cq_tail = 0;
  std::deque<Request> pending;

  void mark_lost(std::string why) {
    std::lock_guard<std::mutex> lock(reason_mu);
    if (lost_reason.empty()) lost_reason = std::move(why);
    lost.store(true, std::memory_order_release);
  }
  std::string reason() {
    std::lock_guard<std::mutex> lock(reason_mu);
    return lost_reason;
  }
  std::string name() const {
    return fmt::format("rank {} (pid {}, client {})", hello.rank, pid, id);
  }
};

std::string job_key(const Hello& h) {
  return fmt::format("{}|{}:{}|{}", h.job_token, h.store_host, h.store_port, h.world_size);
}

int server_wake_fd_of(Server::Impl* s);

// allreduce_pipelined: the piece size and how many pieces the progress thread holds at once.
inline constexpr size_t kPipelinePiece = 4u << 20;
inline constexpr size_t kPiecesInFlight = 3;
// The least a helper thread of the pool gets of a local sum or copy (smaller ones stay inline).
inline constexpr size_t kMinPartBytes = 256u << 10;

struct Job {
  Job(Server::Impl* s, const Hello& h, Counters* c, std::vector<std::string> offer)
      : server(s), first(h), counters(c), offer(std::move(offer)) {
    members.resize(h.local_size);
  }
  Server::Impl* server;
  ReducePool* pool = nullptr;  // the server's, for large local sums and copies
  Hello first;                 // the job's shape as its first trainer told it
  Counters* counters;
  std::vector<std::string> offer;  // the server's transports, best first (transport_offer.h)
  int64_t spin_ns = 0;
  std::vector<std::shared_ptr<Client>> members;  // by local rank
  int joined = 0;
  bool started = false;
  sys::Fd wake;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> finished{false};
  // For gradwirectl jobs (read by the main thread).
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> done{0}, errors{0};

  std::mutex comm_mu;     // guards comm (abort() from the main thread) and transport
  std::string transport;  // agreed by the job's daemons in start_comm ("" until then, or local)
  int tslot = kTransportSlots - 1;  // transport_slot(transport), for the byte counters
  std::shared_ptr<Store> store;
  std::unique_ptr<coll::Communicator> comm;
  std::vector<int32_t> host_of_rank;
  std::vector<std::vector<int32_t>> ranks_of_host;  // ascending, by host index

  // Job thread state.
  Status failure;  // ok until the job fails; then every request completes with it
  std::vector<uint8_t> scratch;
  // allreduce_compressed's error feedback between the daemons (per tensor key), made on first use.
  std::unique_ptr<coll::Compressor> compressor;
  std::vector<CompressedDone> done_info;  // by member, when the last collective carries one

  void run();
  void count_inter(uint64_t in, uint64_t out) { counters->inter(tslot, in, out); }
  std::string transport_name() {
    std::lock_guard<std::mutex> lock(comm_mu);
    return transport;
  }
  void abort_comm() {
    std::lock_guard<std::mutex> lock(comm_mu);
    if (comm) comm->abort();
  }

 private:
  Status start_comm();
  void fail(const Status& s);
  void refuse(Client& c, const Status& why);
  void consume(Client& c);
  void complete(Client& c, uint64_t seq, const Status& s, const CompressedDone* done = nullptr);
  void run_ready();
  Status execute(const std::vector<Request>& reqs);
  Status alltoall(const std::vector<Request>& reqs);
  // Across hosts: an allgather / reduce-scatter among the daemons of slots packed by host.
  Status allgather_by_host(const std::vector<Request>& reqs);
  Status reduce_scatter_by_host(const std::vector<Request>& reqs);
  Status allreduce_pipelined(const std::vector<Request>& reqs);
  // dst = op over the trainers' send ranges [send_off + off, + bytes), on the server's pool; with
  // `block`, over [off, + bytes) of rank `block`'s block of each send buffer (reduce_scatter:
  // the blocks lie send_stride apart).
  void local_sum(const std::vector<Request>& reqs, coll::ReduceOp op, uint8_t* dst, size_t off,
                 size_t bytes, size_t block = 0);
  // src into every trainer's receive range [recv_off + off, + bytes), on the server's pool.
  void copy_back(const std::vector<Request>& reqs, const uint8_t* src, size_t off, size_t bytes);
  Status allreduce_compressed(const std::vector<Request>& reqs);
  std::string describe(const Request& r) const;
};

}  // namespace

struct Server::Impl {
  ServerOptions opt;
  TransportOffer offer;  // the transports this daemon offers its jobs, best first
  std::string host_id;
  std::string ctl_path;    // the control socket (gradwirectl)
  bool has_group = false;  // ServerOptions::group, resolved
  gid_t group_gid = 0;
  sys::Fd listen;
  sys::Fd ctl_listen;
  sys::Fd stop_efd;  // stop()
  sys::Fd wake_efd;  // a job finished or refused a client
  Counters counters;
  std::unique_ptr<ReducePool> pool;
  uint64_t next_client_id = 1;
  int64_t started_ns = sys::now_ns();

  struct Pending {
    sys::Fd sock;
    pid_t pid = 0;
    uid_t uid = 0;
    std::vector<uint8_t> buf;
    sys::Deadline deadline;
  };
  std::vector<Pending> pending;
  std::vector<Pending> ctl_pending;  // control connections waiting for their request
  std::map<uint64_t, std::shared_ptr<Client>> clients;
  std::map<uint64_t, std::shared_ptr<Job>> client_job;
  std::map<std::string, std::shared_ptr<Job>> jobs;

  Status serve();
  void accept_all();
  // Whether a peer may talk to this daemon (either socket): same uid as the daemon, root, or a
  // member of the configured group (its gid or a supplementary group).
  Status check_peer(int sock, const ucred& cred) const;
  void accept_control();
  // Reads a control connection's request; true when it is finished with (answered or refused).
  bool step_control(Pending& p);
  nlohmann::json answer(ControlCommand command) const;
  // Reads what a pending connection sent; true when it is finished with (welcomed or refused).
  bool step_pending(Pending& p);
  void refuse_conn(sys::Fd& sock, pid_t pid, const Status& why, ErrorKind kind = ErrorKind::kHello);
  Status admit(Pending& p, const Hello& h);
  void client_gone(uint64_t id, const std::string& why);
  void reap_jobs(bool all);
};

// ---- the job thread ----------------------------------------------------------------------------

namespace {

// "host 0 offers dpdk,tcp; host 1 offers tcp".
std::string agree_note(const std::vector<std::vector<std::string>>& offers) {
  std::string s;
  for (size_t h = 0; h < offers.size(); ++h) {
    s += fmt::format("{}host {} offers {}", h == 0 ? "" : "; ", h, encode_offer(offers[h]));
  }
  return s;
}

Status Job::start_comm() {
  const Hello& h = first;
  if (h.num_hosts == 1) return ok_status();
  TcpStoreOptions so;
  so.host = h.store_host;
  so.port = h.store_port;
  so.host_server = false;
  so.token = h.store_token;
  so.connect_timeout_ms = h.timeout_ms;
  auto tcp = TcpStore::create(so);
  if (!tcp.ok()) return tcp.status().with_context("gradwired: the job's rendezvous store");
  // Every job of the store (a split makes more) meets under a prefix of its own.
  const net::handshake::Mac tag =
      net::handshake::hmac_sha256(h.job_token, reinterpret_cast<const uint8_t*>("gwd"), 3);
  std::shared_ptr<Store> prefixed = make_prefix_store(*tcp, "gwd/" + to_hex(tag.data(), 8) + "/");
  // The transport: the first of host 0's offer that every daemon of the job offers.
  const sys::Deadline deadline = sys::deadline_after_ms(h.timeout_ms);
  const std::string mine = encode_offer(offer);
  GW_RETURN_IF_ERROR(
      prefixed
          ->set("offer/" + std::to_string(h.host_index), Bytes(mine.begin(), mine.end()), deadline)
          .with_context("gradwired: publishing this daemon's transports"));
  std::vector<std::vector<std::string>> offers;
  for (int32_t host = 0; host < h.num_hosts; ++host) {
    auto v = prefixed->get("offer/" + std::to_string(host), deadline);
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
  auto made = coll::Communicator::create(co);
  if (!made.ok()) return made.status().with_context("gradwired: joining the job's other daemons");
  // Which host holds every rank (broadcast roots): each daemon fills its own ranks.
  std::vector<int32_t> map(h.world_size, -1);
  for (const auto& m : members) map[m->hello.rank] = h.host_index;
  GW_RETURN_IF_ERROR((*made)
                         ->allreduce(map.data(), map.data(), map.size(), coll::DataType::kI32,
                                     coll::ReduceOp::kMax)
                         .with_context("gradwired: exchanging the job's host map"));
  for (size_t r = 0; r < map.size(); ++r) {
    if (map[r] < 0) {
      return invalid_arg("gradwired: no daemon of the job has rank {} (host layout disagrees)", r);
    }
  }
  {
    std::lock_guard<std::mutex> lock(comm_mu);
    store = *tcp;
    comm = std::move(*made);
    transport = agreed;
    tslot = transport_slot(agreed);
  }
  ranks_of_host.assign(static_cast<size_t>(h.num_hosts), {});
  for (size_t r = 0; r < map.size(); ++r) {
    ranks_of_host[static_cast<size_t>(map[r])].push_back(static_cast<int32_t>(r));
  }
  host_of_rank = std::move(map);
  return ok_status();
}

void Job::fail(const Status& s) {
  if (!failure.ok()) return;
  failure = s;
  failed.store(true);
  bool pending = false;
  for (const auto& m : members) pending = pending || (m && !m->pending.empty());
  if (pending || s.code() != Code::kPeer) {
    GW_LOG_WARN("gradwired: job of {} ranks (host {} of {}) failed: {}", first.world_size,
                first.host_index, first.num_hosts, s.message());
  } else {  // a trainer left between collectives: the usual end of a job
    GW_LOG_INFO("gradwired: job of {} ranks (host {} of {}) ends: {}", first.world_size,
                first.host_index, first.num_hosts, s.message());
  }
  abort_comm();  // the job's other daemons see the connections close
}

void Job::refuse(Client& c, const Status& why) {
  GW_LOG_WARN("gradwired: refusing {}: {}", c.name(), why.message());
  counters->refused.fetch_add(1);
  counters->error(ErrorKind::kProtocol);
  c.mark_lost(fmt::format("refused: {}", why.message()));
  signal_fd(server_wake_fd_of(server));
}

void Job::complete(Client& c, uint64_t seq, const Status& s, const CompressedDone* done) {
  if (c.lost.load(std::memory_order_acquire)) return;
  const uint64_t head = c.hdr->cq_head.load(std::memory_order_acquire);
  Status ring = check_ring(head, c.cq_tail, c.geo.cq_entries, "completion");
  if (ring.ok() && c.cq_tail - head >= c.geo.cq_entries) {
    ring = peer_error("completion ring full: the client does not read its completions");
  }
  if (!ring.ok()) {
    refuse(c, ring);
    return;
  }
  const CqEntry e = make_completion(seq, s, done);
  auto* slot = reinterpret_cast<uint8_t*>(c.arena.data()) + c.geo.cq_offset +
               (c.cq_tail % c.geo.cq_entries) * sizeof(CqEntry);
  std::memcpy(slot, &e, sizeof(e));
  ++c.cq_tail;
  c.hdr->cq_tail.store(c.cq_tail, std::memory_order_release);
  // A client busy-polling its completion ring sees the entry without a wake-up.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (c.hdr->client_spinning.load(std::memory_order_relaxed) == 1) return;
  signal_fd(c.cq_efd.get());
}

void Job::consume(Client& c) {
  const uint64_t tail = c.hdr->sq_tail.load(std::memory_order_acquire);
  Status ring = check_ring(c.sq_head, tail, c.geo.sq_entries, "submission");
  if (!ring.ok()) {
    refuse(c, ring);
    return;
  }
  while (c.sq_head != tail) {
    SqEntry e;
    const auto* slot = reinterpret_cast<const uint8_t*>(c.arena.data()) + c.geo.sq_offset +
                       (c.sq_head % c.geo.sq_entries) * sizeof(SqEntry);
    std::memcpy(&e, slot, sizeof(e));  // one copy: the client cannot change it under the checks
    auto r = decode_request(e, c.next_seq, c.data, c.geo.data_bytes, first.world_size);
    if (!r.ok()) {
      refuse(c, r.status());
      return;
    }
    c.pending.push_back(*r);
    c.requests.fetch_add(1, std::memory_order_relaxed);
    ++c.next_seq;
    ++c.sq_head;
    c.hdr->sq_head.store(c.sq_head, std::memory_order_release);
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

Status Job::execute(const std::vector<Request>& reqs) {
  const Request& r = reqs[0];
  const size_t n = members.size();
  auto buf = [&](size_t i, uint64_t off) { return members[i]->data + off; };
  coll::Communicator* cm = comm.get();
  // Phases and bytes for the metrics.
  PhaseClock clock(counters);
  switch (r.opcode) {
    case Opcode::kBarrier:
      if (cm) {
        GW_RETURN_IF_ERROR(cm->barrier());
        clock.mark(Phase::kInterHost);
      }
      return ok_status();
    case Opcode::kAllreduce: {
      const size_t bytes = r.send_bytes;
      if (cm && bytes >= 2 * kPipelinePiece) return allreduce_pipelined(reqs);
      const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
      if (scratch.size() < bytes) scratch.resize(bytes);
      uint8_t* s = scratch.data();
      local_sum(reqs, op, s, 0, bytes);
      counters->arena(bytes * n, 0);
      clock.mark(Phase::kLocalReduce);
      if (cm) {
        GW_RETURN_IF_ERROR(cm->allreduce(s, s, r.count, r.dtype, op));
        count_inter(bytes, bytes);
        clock.mark(Phase::kInterHost);
      }
      if (r.op == coll::ReduceOp::kAvg && bytes > 0) {
        coll::finalize_avg(r.dtype, s, r.count, first.world_size);
      }
      copy_back(reqs, s, 0, bytes);
      counters->arena(0, bytes * n);
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
    case Opcode::kReduceScatter: {
      if (cm && r.count > 0) return reduce_scatter_by_host(reqs);
      // One host (or an empty block across hosts): the whole input is reduced, each trainer
      // takes its block.
      const size_t block = r.recv_bytes;
      const size_t total = block * static_cast<size_t>(first.world_size);
      const uint64_t elems = r.count * static_cast<uint64_t>(first.world_size);
      const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
      if (scratch.size() < total) scratch.resize(total);
      uint8_t* s = scratch.data();
      for (size_t b = 0; b < static_cast<size_t>(first.world_size) && block > 0; ++b) {
        local_sum(reqs, op, s + b * block, 0, block, b);
      }
      counters->arena(total * n, 0);
      clock.mark(Phase::kLocalReduce);
      if (cm) {
        GW_RETURN_IF_ERROR(cm->allreduce(s, s, elems, r.dtype, op));
        count_inter(total, total);
        clock.mark(Phase::kInterHost);
      }
      if (r.op == coll::ReduceOp::kAvg && total > 0) {
        coll::finalize_avg(r.dtype, s, elems, first.world_size);
      }
      for (size_t i = 0; i < n && block > 0; ++i) {
        std::memmove(buf(i, reqs[i].recv_off),
                     s + static_cast<size_t>(members[i]->hello.rank) * block, block);
      }
      counters->arena(0, block * n);
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
    case Opcode::kBroadcast: {
      const size_t bytes = r.send_bytes;
      if (scratch.size() < bytes) scratch.resize(bytes);
      uint8_t* s = scratch.data();
      int root_local = -1;
      for (size_t i = 0; i < n; ++i) {
        if (members[i]->hello.rank == r.root) root_local = static_cast<int>(i);
      }
      if (root_local >= 0 && bytes > 0) {
        std::memcpy(s, buf(root_local, reqs[root_local].send_off), bytes);
        counters->arena(bytes, 0);
      }
      clock.mark(Phase::kLocalReduce);
      if (cm) {
        GW_RETURN_IF_ERROR(cm->broadcast(s, r.count, r.dtype, host_of_rank[r.root]));
        root_local >= 0 ? count_inter(0, bytes) : count_inter(bytes, 0);
        clock.mark(Phase::kInterHost);
      } else if (root_local < 0) {
        return internal_error("broadcast root {} is on no host of a single-host job", r.root);
      }
      for (size_t i = 0; i < n && bytes > 0; ++i) {
        if (static_cast<int>(i) != root_local) {
          std::memcpy(buf(i, reqs[i].recv_off), s, bytes);
          counters->arena(0, bytes);
        }
      }
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
    case Opcode::kAlltoall:
      return alltoall(reqs);
    case Opcode::kAllreduceCompressed:
      return allreduce_compressed(reqs);
    case Opcode::kAllgather: {
      if (cm && r.count > 0) return allgather_by_host(reqs);
      // One host (or empty blocks): these trainers' blocks are the whole result.
      const size_t block = r.send_bytes;
      const size_t world = static_cast<size_t>(first.world_size);
      const size_t total = block * world;
      if (scratch.size() < total) scratch.resize(total);
      uint8_t* s = scratch.data();
      for (size_t i = 0; i < n && block > 0; ++i) {
        std::memcpy(s + static_cast<size_t>(members[i]->hello.rank) * block,
                    buf(i, reqs[i].send_off), block);
      }
      counters->arena(block * n, 0);
      clock.mark(Phase::kLocalReduce);
      for (size_t i = 0; i < n && total > 0; ++i) {
        uint8_t* out = buf(i, reqs[i].recv_off);
        if (reqs[i].recv_stride == block) {
          std::memcpy(out, s, total);
          continue;
        }
        for (size_t b = 0; b < world; ++b) {
          std::memcpy(out + b * reqs[i].recv_stride, s + b * block, block);
        }
      }
      counters->arena(0, total * n);
      clock.mark(Phase::kCopyBack);
      return ok_status();
    }
  }
  return internal_error("unknown opcode");
}

// The blocks of a job's hosts, packed by host: host g's trainers (ascending rank) fill slot g of
// lmax blocks, lmax the most trainers a host has (a smaller host's slot ends in padding).
struct HostSlots {
  size_t lmax = 0;
  size_t slot = 0;                  // lmax blocks, in bytes
  std::vector<size_t> position_of;  // members index -> position in this host's slot
};

Result<HostSlots> host_slots(const std::vector<std::vector<int32_t>>& hosts, size_t me,
                             const std::vector<std::shared_ptr<Client>>& members, size_t block) {
  HostSlots h;
  for (const auto& g : hosts) h.lmax = std::max(h.lmax, g.size());
  h.slot = h.lmax * block;
  const auto& mine = hosts[me];
  for (const auto& m : members) {
    const auto at = std::lower_bound(mine.begin(), mine.end(), m->hello.rank);
    if (at == mine.end() || *at != m->hello.rank) {
      return internal_error("rank {} is not in this host's map", m->hello.rank);
    }
    h.position_of.push_back(static_cast<size_t>(at - mine.begin()));
  }
  return h;
}

Status Job::allgather_by_host(const std::vector<Request>& reqs) {
  // Every daemon packs its trainers' blocks into its slot, the daemons allgather the slots (an
  // allgather's traffic, padded only where hosts have fewer trainers than the largest), and every
  // trainer gets each host's blocks at their ranks' places.
  const Request& r = reqs[0];
  const size_t block = r.send_bytes;
  const size_t n = members.size();
  const size_t num_hosts = ranks_of_host.size();
  const size_t me = static_cast<size_t>(first.host_index);
  PhaseClock clock(counters);
  GW_ASSIGN_OR_RETURN(HostSlots hs, host_slots(ranks_of_host, me, members, block));
  // [my slot][every host's slot]
  const size_t need = hs.slot * (num_hosts + 1);
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* mine = scratch.data();
  uint8_t* all = mine + hs.slot;
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(mine + hs.position_of[i] * block, members[i]->data + reqs[i].send_off, block);
  }
  if (members.size() < hs.lmax) std::memset(mine + n * block, 0, (hs.lmax - n) * block);
  counters->arena(block * n, 0);
  clock.mark(Phase::kLocalReduce);
  GW_RETURN_IF_ERROR(comm->allgather(mine, all, hs.slot, coll::DataType::kU8));
  count_inter(hs.slot * num_hosts, hs.slot);
  clock.mark(Phase::kInterHost);
  for (size_t i = 0; i < n; ++i) {
    uint8_t* out = members[i]->data + reqs[i].recv_off;
    for (size_t g = 0; g < num_hosts; ++g) {
      for (size_t p = 0; p < ranks_of_host[g].size(); ++p) {
        std::memcpy(out + static_cast<size_t>(ranks_of_host[g][p]) * reqs[i].recv_stride,
                    all + g * hs.slot + p * block, block);
      }
    }
  }
  counters->arena(0, block * static_cast<size_t>(first.world_size) * n);
  clock.mark(Phase::kCopyBack);
  return ok_status();
}

Status Job::reduce_scatter_by_host(const std::vector<Request>& reqs) {
  // Every daemon sums its trainers' inputs block by block straight into host order (the blocks
  // of host g's ranks in slot g), the daemons reduce-scatter the slots (a reduce-scatter's
  // traffic), and each trainer takes its block of this host's slot.
  const Request& r = reqs[0];
  const size_t block = r.recv_bytes;
  const size_t n = members.size();
  const size_t num_hosts = ranks_of_host.size();
  const size_t me = static_cast<size_t>(first.host_index);
  const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
  PhaseClock clock(counters);
  GW_ASSIGN_OR_RETURN(HostSlots hs, host_slots(ranks_of_host, me, members, block));
  // [every host's slot][my slot, reduced]
  const size_t need = hs.slot * (num_hosts + 1);
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* all = scratch.data();
  uint8_t* mine = all + hs.slot * num_hosts;
  for (size_t g = 0; g < num_hosts; ++g) {
    const auto& ranks = ranks_of_host[g];
    for (size_t p = 0; p < ranks.size(); ++p) {
      local_sum(reqs, op, all + g * hs.slot + p * block, 0, block, static_cast<size_t>(ranks[p]));
    }
    // Padding is reduced too (and dropped): zeros keep it from holding NaNs or denormals.
    if (ranks.size() < hs.lmax) {
      std::memset(all + g * hs.slot + ranks.size() * block, 0, (hs.lmax - ranks.size()) * block);
    }
  }
  counters->arena(block * static_cast<size_t>(first.world_size) * n, 0);
  clock.mark(Phase::kLocalReduce);
  const size_t elems = hs.lmax * static_cast<size_t>(r.count);
  GW_RETURN_IF_ERROR(comm->reduce_scatter(all, mine, elems, r.dtype, op));
  count_inter(hs.slot, hs.slot * num_hosts);
  clock.mark(Phase::kInterHost);
  if (r.op == coll::ReduceOp::kAvg) {
    coll::finalize_avg(r.dtype, mine, n * static_cast<size_t>(r.count), first.world_size);
  }
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(members[i]->data + reqs[i].recv_off, mine + hs.position_of[i] * block, block);
  }
  counters->arena(0, block * n);
  clock.mark(Phase::kCopyBack);
  return ok_status();
}

Status Job::alltoall(const std::vector<Request>& reqs) {
  // Every daemon packs, for every host g, the blocks its trainers send to g's trainers (source
  // by local index, destination by g's local index, Lmax x Lmax slots of `block` bytes, Lmax the
  // most trainers a host has), exchanges them with one all-to-all among the daemons and unpacks
  // what came from every host into its trainers' receive buffers. Packing first makes in place
  // (send == recv) safe.
  const Request& r = reqs[0];
  const size_t block = static_cast<size_t>(r.count) * coll::dtype_size(r.dtype);
  if (block == 0) return ok_status();
  const size_t n = members.size();
  std::vector<std::vector<int32_t>> hosts = ranks_of_host;
  if (!comm) {  // one host: these trainers are the job
    hosts.assign(1, {});
    for (const auto& m : members) hosts[0].push_back(m->hello.rank);
    std::sort(hosts[0].begin(), hosts[0].end());
  }
  const size_t num_hosts = hosts.size();
  const size_t me = comm ? static_cast<size_t>(first.host_index) : 0;
  GW_ASSIGN_OR_RETURN(HostSlots hs, host_slots(hosts, me, members, block));
  const size_t lmax = hs.lmax;
  std::vector<size_t> member_of(n);  // local index (position in hosts[me]) -> members index
  for (size_t i = 0; i < n; ++i) member_of[hs.position_of[i]] = i;
  const size_t slot = lmax * lmax * block;
  const size_t total = num_hosts * slot;
  const size_t need = (comm ? 2 : 1) * total;  // what goes out, and (across hosts) what comes in
  // Padding grows with unevenness (many small hosts beside a large one): refuse, on every daemon
  // alike (they share the host map), what would need more than 4x the largest host's buffers.
  const size_t limit = std::max<size_t>(64u << 20, 4 * lmax * first.world_size * block);
  if (need > limit) {
    return no_memory(
        "alltoall over hosts this uneven ({} hosts, {} trainers on the largest) would need {} "
        "bytes of daemon scratch (at most {})",
        num_hosts, lmax, need, limit);
  }
  if (scratch.size() < need) scratch.resize(need);
  uint8_t* out = scratch.data();
  uint8_t* in = comm ? out + total : out;
  PhaseClock clock(counters);
  for (size_t g = 0; g < num_hosts; ++g) {
    for (size_t i = 0; i < hosts[me].size(); ++i) {
      const size_t m = member_of[i];
      const uint8_t* send = members[m]->data + reqs[m].send_off;
      for (size_t j = 0; j < hosts[g].size(); ++j) {
        std::memcpy(out + g * slot + (i * lmax + j) * block,
                    send + static_cast<size_t>(hosts[g][j]) * reqs[m].send_stride, block);
      }
    }
  }
  counters->arena(block * first.world_size * n, 0);
  clock.mark(Phase::kLocalReduce);
  if (comm) {
    GW_RETURN_IF_ERROR(comm->alltoall(out, in, slot, coll::DataType::kU8));
    count_inter((num_hosts - 1) * slot, (num_hosts - 1) * slot);
    clock.mark(Phase::kInterHost);
  }
  for (size_t h = 0; h < num_hosts; ++h) {
    for (size_t i = 0; i < hosts[h].size(); ++i) {
      for (size_t j = 0; j < hosts[me].size(); ++j) {
        const size_t m = member_of[j];
        std::memcpy(members[m]->data + reqs[m].recv_off +
                        static_cast<size_t>(hosts[h][i]) * reqs[m].recv_stride,
                    in + h * slot + (i * lmax + j) * block, block);
      }
    }
  }
  counters->arena(0, block * first.world_size * n);
  clock.mark(Phase::kCopyBack);
  return ok_status();
}

void Job::local_sum(const std::vector<Request>& reqs, coll::ReduceOp op, uint8_t* dst, size_t off,
                    size_t bytes, size_t block) {
  const coll::DataType dt = reqs[0].dtype;
  const size_t elem = coll::dtype_size(dt);
  const size_t n = members.size();
  auto src = [&](size_t i) {
    return members[i]->data + reqs[i].send_off + block * reqs[i].send_stride + off;
  };
  parallel_ranges(pool, bytes / elem, elem, kMinPartBytes, [&](size_t first_elem, size_t k) {
    const size_t o = first_elem * elem;
    if (n == 1) {
      std::memcpy(dst + o, src(0) + o, k * elem);
      return;
    }
    coll::reduce(dt, op, src(0) + o, src(1) + o, dst + o, k);
    for (size_t i = 2; i < n; ++i) coll::reduce(dt, op, dst + o, src(i) + o, dst + o, k);
  });
}

void Job::copy_back(const std::vector<Request>& reqs, const uint8_t* src, size_t off,
                    size_t bytes) {
  parallel_ranges(pool, bytes, 1, kMinPartBytes, [&](size_t first_byte, size_t k) {
    for (size_t i = 0; i < members.size(); ++i) {
      std::memcpy(members[i]->data + reqs[i].recv_off + off + first_byte, src + first_byte, k);
    }
  });
}

Status Job::allreduce_pipelined(const std::vector<Request>& reqs) {
  // An allreduce across hosts of at least two pieces: the local sum of piece k+1 and the copy
  // back of piece k-1 overlap the daemons' allreduce of piece k, which runs on the
  // communicator's progress thread (at most kPiecesInFlight queued there).
  const Request& r = reqs[0];
  const size_t n = members.size();
  const size_t bytes = r.send_bytes;
  const size_t elem = coll::dtype_size(r.dtype);
  const size_t piece = kPipelinePiece / elem * elem;
  const coll::ReduceOp op = r.op == coll::ReduceOp::kAvg ? coll::ReduceOp::kSum : r.op;
  if (scratch.size() < bytes) scratch.resize(bytes);
  uint8_t* s = scratch.data();
  struct Flight {
    size_t off = 0, len = 0;
    std::unique_ptr<coll::AsyncOp> op;
  };
  std::deque<Flight> flight;
  int64_t spent[kNumPhases] = {};
  Status err;
  auto timed = [&](Phase phase, auto&& work) {
    const int64_t t0 = sys::now_ns();
    work();
    spent[static_cast<int>(phase)] += sys::now_ns() - t0;
  };
  auto retire = [&]() {
    Flight f = std::move(flight.front());
    flight.pop_front();
    Status st;
    timed(Phase::kInterHost, [&] { st = f.op->wait(-1); });
    if (!st.ok()) {
      if (err.ok()) {
        err = st;
        abort_comm();  // the pieces still queued end at once
      }
      return;
    }
    if (!err.ok()) return;
    timed(Phase::kCopyBack, [&] {
      if (r.op == coll::ReduceOp::kAvg) {
        coll::finalize_avg(r.dtype, s + f.off, f.len / elem, first.world_size);
      }
      copy_back(reqs, s + f.off, f.off, f.len);
    });
  };
  for (size_t off = 0; off < bytes && err.ok();) {
    const size_t len = std::min(piece, bytes - off);
    timed(Phase::kLocalReduce, [&] { local_sum(reqs, op, s + off, off, len); });
    auto a = comm->iallreduce(s + off, s + off, len / elem, r.dtype, op);
    if (!a.ok()) {
      err = a.status();
      abort_comm();
      break;
    }
    flight.push_back(Flight{off, len, std::move(*a)});
    off += len;
    if (flight.size() >= kPiecesInFlight) retire();
  }
  while (!flight.empty()) retire();
  for (int p = 0; p < kNumPhases; ++p) counters->observe(static_cast<Phase>(p), spent[p]);
  counters->arena(bytes * n, bytes * n);
  count_inter(bytes, bytes);
  return err;
}

Status Job::allreduce_compressed(const std::vector<Request>& reqs) {
  // The host's trainers are summed exactly; only the sum crosses hosts, through the job's
  // Compressor among the daemons (its error feedback is per daemon and tensor key). The bytes it
  // sent are shared out among the trainers' completions for gw_comm_stats.
  const Request& r = reqs[0];
  const size_t n = members.size();
  const size_t bytes = r.send_bytes;
  PhaseClock clock(counters);
  if (scratch.size() < bytes) scratch.resize(bytes);
  uint8_t* s = scratch.data();
  local_sum(reqs, coll::ReduceOp::kSum, s, 0, bytes);
  counters->arena(bytes * n, 0);
  clock.mark(Phase::kLocalReduce);
  CompressedDone total;
  if (comm) {
    if (!compressor) compressor = std::make_unique<coll::Compressor>(comm.get());
    const coll::CompressStats before = compressor->stats();
    GW_RETURN_IF_ERROR(compressor->allreduce(s, r.count, r.dtype, r.spec, r.key));
    const coll::CompressStats after = compressor->stats();
    total.bytes_sent = after.bytes_sent - before.bytes_sent;
    total.nonfinite = after.nonfinite_steps - before.nonfinite_steps;
    count_inter(total.bytes_sent, total.bytes_sent);
    clock.mark(Phase::kInterHost);
  }
  copy_back(reqs, s, 0, bytes);
  counters->arena(0, bytes * n);
  clock.mark(Phase::kCopyBack);
  done_info.assign(n, CompressedDone{total.bytes_sent / n, total.nonfinite});
  done_info[0].bytes_sent += total.bytes_sent % n;
  return ok_status();
}

void Job::run_ready() {
  for (;;) {
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
    if (s.ok()) s = execute(reqs);
    if (!s.ok() && s.code() == Code::kAborted) {
      // The main thread aborts the communicator when a trainer of the job goes: say that.
      for (const auto& m : members) {
        if (m->lost.load(std::memory_order_acquire)) {
          s = peer_error("{} left the job: {}", m->name(), m->reason());
          break;
        }
      }
    }
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

void Job::run() {
  Status s = start_comm();
  if (!s.ok()) fail(s);
  std::vector<pollfd> pfds;
  while (!stop.load()) {
    // Busy-poll the submission counters for GW_DAEMON_POLL_US before sleeping, telling the
    // clients so (they then skip the eventfd); clear that, fence, and look once more before
    // sleeping, so a submission posted meanwhile is never left without a wake-up.
    auto posted = [&]() {
      for (const auto& m : members) {
        if (m && (m->hdr->sq_tail.load(std::memory_order_acquire) != m->sq_head ||
                  m->lost.load(std::memory_order_relaxed))) {
          return true;
        }
      }
      return false;
    };
    bool ready = false;
    if (spin_ns > 0) {
      for (const auto& m : members) {
        if (m) m->hdr->daemon_polling.store(1, std::memory_order_relaxed);
      }
      std::atomic_thread_fence(std::memory_order_seq_cst);
      const int64_t spin_until = sys::now_ns() + spin_ns;
      while (!(ready = posted()) && sys::now_ns() < spin_until &&
             !stop.load(std::memory_order_relaxed)) {
        std::this_thread::yield();  // trainers sharing the core get it at once
      }
      for (const auto& m : members) {
        if (m) m->hdr->daemon_polling.store(0, std::memory_order_relaxed);
      }
      std::atomic_thread_fence(std::memory_order_seq_cst);
      ready = ready || posted();
    }
    if (!ready) {  // sleep until a trainer, the main thread or stop() wakes this job
      pfds.clear();
      pfds.push_back({wake.get(), POLLIN, 0});
      for (const auto& m : members) {
        if (m) pfds.push_back({m->sq_efd.get(), POLLIN, 0});
      }
      int rc = ::poll(pfds.data(), pfds.size(), 1000);
      if (rc < 0 && errno != EINTR) {
        GW_LOG_ERROR("gradwired: job poll: {}", std::strerror(errno));
        break;
      }
      for (const auto& p : pfds) {
        if (p.revents & POLLIN) drain_fd(p.fd);
      }
    }
    size_t live = 0;
    for (auto& m : members) {
      if (!m) continue;
      if (!m->lost.load(std::memory_order_acquire)) consume(*m);
      if (m->lost.load(std::memory_order_acquire)) {
        fail(peer_error("{} left the job: {}", m->name(), m->reason()));
        m.reset();  // the arena goes with the last reference
        continue;
      }
      ++live;
    }
    if (live == 0) break;
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
  }
  compressor.reset();  // it borrows comm
  {
    std::lock_guard<std::mutex> lock(comm_mu);
    comm.reset();
    store.reset();
  }
  members.clear();
  finished.store(true);
  signal_fd(server_wake_fd_of(server));
}

}  // namespace

// ---- the server --------------------------------------------------------------------------------

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kHello:
      return "hello";
    case ErrorKind::kCredentials:
      return "credentials";
    case ErrorKind::kCapacity:
      return "capacity";
    case ErrorKind::kProtocol:
      return "protocol";
    case ErrorKind::kCollective:
      return "collective";
  }
  return "?";
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kLocalReduce:
      return "local_reduce";
    case Phase::kInterHost:
      return "inter_host";
    case Phase::kCopyBack:
      return "copy_back";
  }
  return "?";
}

namespace {
int server_wake_fd_of(Server::Impl* s) { return s->wake_efd.get(); }

// Listens on `path` (mode 0600). A socket file left by a daemon that died is replaced; a live
// daemon's is refused.
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
  auto fd = sys::listen_unix(addr, SOCK_STREAM, 128);
  ::umask(old);
  return fd;
}

// The peer's supplementary groups as of its connect (SO_PEERGROUPS, Linux 4.13); where the kernel
// lacks it, the Groups: line of /proc/PID/status now.
std::vector<gid_t> peer_groups(int sock, pid_t pid) {
  std::vector<gid_t> groups(64);
  for (int tries = 0; tries < 4; ++tries) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) break;
    groups.resize(len / sizeof(gid_t) + 1);
  }
  groups.clear();
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Groups:", 0) != 0) continue;
    std::istringstream in(line.substr(7));
    for (unsigned long g; in >> g;) groups.push_back(static_cast<gid_t>(g));
  }
  return groups;
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
std::string job_name(const Hello& h) {
  uint64_t x = 0xcbf29ce484222325ull;  // FNV-1a 64
  for (unsigned char c : h.job_token) x = (x ^ c) * 0x100000001b3ull;
  return fmt::format("{:016x}", x);
}
}  // namespace

Result<std::unique_ptr<Server>> Server::create(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->pool = std::make_unique<ReducePool>(options.reduce_threads);
  if (options.socket_path.empty()) return invalid_arg("gradwired: no socket path");
  if (options.max_arena_bytes < kMinArenaBytes) {
    return invalid_arg("gradwired: max arena {} bytes is below the protocol's minimum {}",
                       options.max_arena_bytes, kMinArenaBytes);
  }
  GW_RETURN_IF_ERROR(arena_geometry(kMinArenaBytes, options.ring_entries).status());
  impl->host_id = options.host_id.empty() ? host_identity() : options.host_id;
  {
    const config::Row* eal = config::find("GW_DPDK_EAL_ARGS");
    const bool dpdk_port = eal != nullptr && !config::get_string(*eal).empty();
    GW_ASSIGN_OR_RETURN(impl->offer,
                        offer_transports(options.transport.empty() ? "auto" : options.transport,
                                         &net::backend_status, dpdk_port));
  }
  GW_ASSIGN_OR_RETURN(impl->listen, bind_listener(options.socket_path));
  impl->ctl_path = control_socket_path(options.socket_path);
  auto ctl = bind_listener(impl->ctl_path);
  if (!ctl.ok()) {
    ::unlink(options.socket_path.c_str());
    return ctl.status().with_context("gradwired: the control socket");
  }
  impl->ctl_listen = std::move(*ctl);
  if (!options.group.empty()) {
    auto gid = resolve_group(options.group);
    Status shared = gid.status();
    if (gid.ok()) shared = share_with_group(options.socket_path, *gid, options.group);
    if (shared.ok()) shared = share_with_group(impl->ctl_path, *gid, options.group);
    if (!shared.ok()) {
      ::unlink(options.socket_path.c_str());
      ::unlink(impl->ctl_path.c_str());
      return shared;
    }
    impl->has_group = true;
    impl->group_gid = *gid;
  }
  GW_ASSIGN_OR_RETURN(impl->stop_efd, make_eventfd());
  GW_ASSIGN_OR_RETURN(impl->wake_efd, make_eventfd());
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  impl_->reap_jobs(true);
  ::unlink(impl_->opt.socket_path.c_str());
  ::unlink(impl_->ctl_path.c_str());
}

void Server::stop() { signal_fd(impl_->stop_efd.get()); }

const std::string& Server::socket_path() const { return impl_->opt.socket_path; }
const std::string& Server::host_id() const { return impl_->host_id; }

ServerStats Server::stats() const {
  const Counters& c = impl_->counters;
  ServerStats s;
  s.accepted = c.accepted.load();
  s.refused = c.refused.load();
  s.live_clients = c.live_clients.load();
  s.live_arenas = c.live_arenas.load();
  s.live_jobs = c.live_jobs.load();
  s.collectives = c.collectives.load();
  s.failed = c.failed.load();
  for (int k = 0; k < kNumOpcodes; ++k) {
    for (int r = 0; r < 2; ++r) s.by_opcode[k][r] = c.by_opcode[k][r].load();
  }
  for (int k = 0; k < kNumErrorKinds; ++k) s.errors[k] = c.errors[k].load();
  for (int k = 0; k < 9; ++k) s.collective_errors[k] = c.collective_errors[k].load();
  s.arena_bytes_in = c.arena_in.load();
  s.arena_bytes_out = c.arena_out.load();
  for (int t = 0; t < kTransportSlots; ++t) {
    const uint64_t in = c.inter_in[t].load(), out = c.inter_out[t].load();
    s.inter_bytes_in += in;
    s.inter_bytes_out += out;
    const std::vector<std::string>& offered = impl_->offer.names;
    if (in + out > 0 ||
        std::find(offered.begin(), offered.end(), kTransportNames[t]) != offered.end()) {
      s.inter.push_back({kTransportNames[t], in, out});
    }
  }
  s.transport = encode_offer(impl_->offer.names);
  for (int p = 0; p < kNumPhases; ++p) {
    for (int b = 0; b < DurationHistogram::kBuckets; ++b) {
      s.phases[p].buckets[b] = c.phases[p].buckets[b].load();
    }
    s.phases[p].count = c.phases[p].count.load();
    s.phases[p].sum_s = static_cast<double>(c.phases[p].sum_ns.load()) / 1e9;
  }
  return s;
}

Status Server::run() { return impl_->serve(); }

void Server::Impl::refuse_conn(sys::Fd& sock, pid_t pid, const Status& why, ErrorKind kind) {
  counters.refused.fetch_add(1);
  counters.error(kind);
  GW_LOG_WARN("gradwired: refusing the connection of pid {}: {}", pid, why.message());
  Welcome w;
  w.status = static_cast<int32_t>(why.code() == Code::kOk ? Code::kInternal : why.code());
  w.message = why.message();
  std::vector<uint8_t> body = encode_welcome(w);
  std::vector<uint8_t> frame(kFrameHeaderBytes);
  const uint32_t len = static_cast<uint32_t>(body.size());
  std::memcpy(frame.data(), &len, sizeof(len));
  frame.insert(frame.end(), body.begin(), body.end());
  // Best effort: the client may be gone or not reading.
  (void)sys::send_with_fds(sock.get(), frame.data(), frame.size(), {}, sys::deadline_after_ms(100),
                           "refusal");
  sock.reset();
}

void Server::Impl::accept_all() {
  for (;;) {
    auto fd = sys::accept_unix(listen.get());
    if (!fd.ok()) {
      GW_LOG_WARN("gradwired: accept: {}", fd.status().message());
      return;
    }
    if (!fd->valid()) return;
    Pending p;
    p.sock = std::move(*fd);
    p.deadline = sys::deadline_after_ms(opt.hello_timeout_ms);
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
    if (clients.size() + pending.size() >= static_cast<size_t>(opt.max_clients)) {
      refuse_conn(
          p.sock, p.pid,
          no_memory("the daemon has {} clients already (GW_DAEMON_MAX_CLIENTS)", opt.max_clients),
          ErrorKind::kCapacity);
      continue;
    }
    pending.push_back(std::move(p));
  }
}

bool Server::Impl::step_pending(Pending& p) {
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

Status Server::Impl::admit(Pending& p, const Hello& h) {
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

  auto c = std::make_shared<Client>(&counters);
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

  Welcome w = c->geo;
  w.client_id = c->id;
  w.transport = encode_offer(offer.names);
  std::vector<uint8_t> body = encode_welcome(w);
  std::vector<uint8_t> frame(kFrameHeaderBytes);
  const uint32_t len = static_cast<uint32_t>(body.size());
  std::memcpy(frame.data(), &len, sizeof(len));
  frame.insert(frame.end(), body.begin(), body.end());
  const int fds[3] = {c->arena.fd(), c->sq_efd.get(), c->cq_efd.get()};
  GW_RETURN_IF_ERROR(sys::send_with_fds(p.sock.get(), frame.data(), frame.size(), fds,
                                        sys::deadline_after_ms(opt.hello_timeout_ms), "welcome"));
  c->arena.close_fd();  // the mapping stays; the client holds its own descriptor
  c->sock = std::move(p.sock);

  if (!job) {
    job = std::make_shared<Job>(this, h, &counters, offer.names);
    job->spin_ns = opt.spin_us * 1000;
    job->pool = pool.get();
    GW_ASSIGN_OR_RETURN(job->wake, make_eventfd());
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

void Server::Impl::client_gone(uint64_t id, const std::string& why) {
  auto it = clients.find(id);
  if (it == clients.end()) return;
  std::shared_ptr<Client> c = it->second;
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
    job->abort_comm();  // a collective in progress ends now, not at its deadline
    signal_fd(job->wake.get());
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
      signal_fd(j.wake.get());
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

// ---- the control socket (gradwirectl; daemon/control.h) ----------------------------------------

namespace {
constexpr size_t kMaxControlConns = 16;
constexpr int64_t kControlTimeoutMs = 2000;

void answer_control(sys::Fd& sock, const std::string& body) {
  const std::vector<uint8_t> frame = frame_control(body);
  // Bounded: a gradwirectl that does not read its answer costs the main loop this long at most.
  Status s = sys::send_with_fds(sock.get(), frame.data(), frame.size(), {},
                                sys::deadline_after_ms(500), "control answer");
  if (!s.ok()) GW_LOG_WARN("gradwired: control answer: {}", s.message());
  sock.reset();
}
}  // namespace

void Server::Impl::accept_control() {
  for (;;) {
    auto fd = sys::accept_unix(ctl_listen.get());
    if (!fd.ok()) {
      GW_LOG_WARN("gradwired: control accept: {}", fd.status().message());
      return;
    }
    if (!fd->valid()) return;
    Pending p;
    p.sock = std::move(*fd);
    p.deadline = sys::deadline_after_ms(kControlTimeoutMs);
    auto cred = sys::peer_credentials(p.sock.get());
    Status ok = cred.ok() ? check_peer(p.sock.get(), *cred) : cred.status();
    if (ok.ok() && ctl_pending.size() >= kMaxControlConns) {
      ok = no_memory("{} control connections are open already", kMaxControlConns);
    }
    if (!ok.ok()) {
      GW_LOG_WARN("gradwired: refusing a control connection of pid {}: {}",
                  cred.ok() ? cred->pid : 0, ok.message());
      answer_control(p.sock, encode_control_error(ok));
      continue;
    }
    p.pid = cred->pid;
    p.uid = cred->uid;
    ctl_pending.push_back(std::move(p));
  }
}

bool Server::Impl::step_control(Pending& p) {
  uint8_t tmp[512];
  std::vector<sys::Fd> fds;
  auto n = sys::recv_with_fds(p.sock.get(), tmp, sizeof(tmp), &fds, sys::kNoWait, "control");
  Status bad;
  if (!fds.empty()) {
    bad = peer_error("control request came with descriptors");
  } else if (!n.ok()) {
    if (n.status().code() == Code::kTimeout) return false;
    bad = n.status();
  } else if (*n == 0) {
    return true;  // gone without asking
  } else {
    p.buf.insert(p.buf.end(), tmp, tmp + *n);
    if (p.buf.size() < kFrameHeaderBytes) return false;
    uint32_t len = 0;
    std::memcpy(&len, p.buf.data(), sizeof(len));
    if (len > kMaxControlRequestBytes) {
      bad = peer_error("control request of {} bytes (at most {})", len, kMaxControlRequestBytes);
    } else if (p.buf.size() < kFrameHeaderBytes + len) {
      return false;
    } else if (p.buf.size() > kFrameHeaderBytes + len) {
      bad = peer_error("bytes after the control request");
    } else {
      auto command = decode_control_request(p.buf.data() + kFrameHeaderBytes, len);
      if (command.ok()) {
        answer_control(p.sock, encode_control_result(*command, answer(*command)));
        return true;
      }
      bad = command.status();
    }
  }
  GW_LOG_WARN("gradwired: control connection of pid {}: {}", p.pid, bad.message());
  answer_control(p.sock, encode_control_error(bad));
  return true;
}

nlohmann::json Server::Impl::answer(ControlCommand command) const {
  using nlohmann::json;
  switch (command) {
    case ControlCommand::kStatus: {
      json r;
      r["version"] = GW_VERSION_STRING;
      r["pid"] = static_cast<int64_t>(::getpid());
      r["uptime_s"] = static_cast<double>(sys::now_ns() - started_ns) / 1e9;
      r["socket"] = opt.socket_path;
      r["control_socket"] = ctl_path;
      r["transport"] = encode_offer(offer.names);
      r["host_id"] = host_id;
      r["clients"] = counters.live_clients.load();
      r["jobs"] = counters.live_jobs.load();
      r["arenas"] = counters.live_arenas.load();
      r["accepted"] = counters.accepted.load();
      r["refused"] = counters.refused.load();
      r["collectives"] = counters.collectives.load();
      r["failed"] = counters.failed.load();
      return r;
    }
    case ControlCommand::kJobs: {
      json rows = json::array();
      for (const auto& [key, job] : jobs) {
        const Hello& h = job->first;
        json r;
        r["job"] = job_name(h);
        r["world"] = h.world_size;
        r["hosts"] = h.num_hosts;
        r["host_index"] = h.host_index;
        r["local_trainers"] = job->joined;
        r["local_size"] = h.local_size;
        r["state"] = !job->started          ? "joining"
                     : job->finished.load() ? "ended"
                     : job->failed.load()   ? "failed"
                                            : "running";
        r["collectives"] = job->done.load();
        r["errors"] = job->errors.load();
        // Between the job's daemons: agreed when they met; none for a job of one host.
        r["transport"] = h.num_hosts == 1 ? std::string("local") : job->transport_name();
        rows.push_back(std::move(r));
      }
      return rows;
    }
    case ControlCommand::kClients: {
      json rows = json::array();
      for (const auto& [id, c] : clients) {
        json r;
        r["id"] = id;
        r["pid"] = static_cast<int64_t>(c->pid);
        r["uid"] = static_cast<int64_t>(c->uid);
        r["job"] = job_name(c->hello);
        r["rank"] = c->hello.rank;
        r["local_rank"] = c->hello.local_rank;
        r["arena_bytes"] = c->hello.arena_bytes;
        r["requests"] = c->requests.load(std::memory_order_relaxed);
        rows.push_back(std::move(r));
      }
      return rows;
    }
    case ControlCommand::kConfig: {
      (void)daemon_config::rows();  // the daemon's own rows are registered wherever it runs
      json rows = json::array();
      for (const config::Row* row : config::table()) {
        const config::Value v = config::resolve(*row);
        json r;
        r["name"] = row->name;
        r["key"] = config::toml_key(*row);
        r["value"] = config::shown(*row, v);  // a secret only as set or unset
        r["default"] = row->default_value;
        // gradwired's command-line options are the only API-layer values in the daemon.
        r["source"] =
            v.source == config::Source::kApi ? std::string("command line") : config::source_text(v);
        rows.push_back(std::move(r));
      }
      return rows;
    }
  }
  return json::object();
}

Status Server::Impl::serve() {
  GW_LOG_INFO("gradwired: listening on {} (host {}); between daemons: {}", opt.socket_path, host_id,
              offer.reason);
  std::vector<pollfd> pfds;
  std::vector<uint64_t> ids;
  for (;;) {
    pfds.clear();
    ids.clear();
    pfds.push_back({stop_efd.get(), POLLIN, 0});
    pfds.push_back({wake_efd.get(), POLLIN, 0});
    pfds.push_back({listen.get(), POLLIN, 0});
    pfds.push_back({ctl_listen.get(), POLLIN, 0});
    for (const auto& p : pending) pfds.push_back({p.sock.get(), POLLIN, 0});
    for (const auto& p : ctl_pending) pfds.push_back({p.sock.get(), POLLIN, 0});
    for (const auto& [id, c] : clients) {
      pfds.push_back({c->sock.get(), POLLIN, 0});
      ids.push_back(id);
    }
    constexpr size_t kFixed = 4;  // stop, wake, listen, control listen
    const int timeout_ms =
        opt.tick_ms > 0 ? static_cast<int>(std::clamp<int64_t>(opt.tick_ms, 1, 200)) : 200;
    int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (opt.on_tick) opt.on_tick();
    if (rc < 0 && errno != EINTR) return system_error("gradwired: poll", errno);
    if (pfds[0].revents & POLLIN) break;
    if (pfds[1].revents & POLLIN) drain_fd(wake_efd.get());
    // Clients refused by their job thread: cut them.
    std::vector<std::pair<uint64_t, std::string>> gone;
    for (const auto& [id, c] : clients) {
      if (c->lost.load(std::memory_order_acquire)) gone.emplace_back(id, c->reason());
    }
    const size_t first_ctl = kFixed + pending.size();
    const size_t first_client = first_ctl + ctl_pending.size();
    for (size_t i = 0; i < ids.size(); ++i) {
      const short ev = pfds[first_client + i].revents;
      if (ev == 0) continue;
      auto it = clients.find(ids[i]);
      if (it == clients.end()) continue;
      uint8_t b[64];
      std::vector<sys::Fd> fds;
      auto n =
          sys::recv_with_fds(it->second->sock.get(), b, sizeof(b), &fds, sys::kNoWait, "client");
      if (n.ok() && *n == 0) {
        gone.emplace_back(ids[i], "closed its connection");
      } else if (n.ok()) {
        counters.refused.fetch_add(1);
        counters.error(ErrorKind::kProtocol);
        gone.emplace_back(ids[i], "refused: it sent bytes after its hello");
      } else if (n.status().code() != Code::kTimeout) {
        gone.emplace_back(ids[i], n.status().message());
      }
    }
    for (const auto& [id, why] : gone) client_gone(id, why);
    // Hellos in progress.
    for (size_t i = 0; i < pending.size();) {
      const short ev = pfds[kFixed + i].revents;
      bool done = false;
      if (ev != 0) {
        done = step_pending(pending[i]);
      } else if (sys::expired(pending[i].deadline)) {
        refuse_conn(pending[i].sock, pending[i].pid,
                    timeout_error("no complete hello within {} ms", opt.hello_timeout_ms));
        done = true;
      }
      if (done) {
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        // pfds no longer line up with pending: look at the rest in the next round.
        break;
      }
      ++i;
    }
    // Control connections (indices still line up: pending may have shrunk, but first_ctl was
    // taken before).
    for (size_t i = 0; i < ctl_pending.size();) {
      const short ev = pfds[first_ctl + i].revents;
      bool done = false;
      if (ev != 0) {
        done = step_control(ctl_pending[i]);
      } else if (sys::expired(ctl_pending[i].deadline)) {
        answer_control(ctl_pending[i].sock,
                       encode_control_error(timeout_error(
                           "no complete control request within {} ms", kControlTimeoutMs)));
        done = true;
      }
      if (done) {
        ctl_pending.erase(ctl_pending.begin() + static_cast<std::ptrdiff_t>(i));
        break;
      }
      ++i;
    }
    if (pfds[2].revents & POLLIN) accept_all();
    if (pfds[3].revents & POLLIN) accept_control();
    reap_jobs(false);
  }
  GW_LOG_INFO("gradwired: stopping");
  if (opt.on_stopping) opt.on_stopping();
  reap_jobs(true);
  return ok_status();
}

}  // namespace gw::daemon
