// One job in gradwired: the trainers of one (job token, store, world) on this host, their
// arenas' rings, and the thread that runs their collectives with the job's other daemons.
//
// Made and fed by the admission code (daemon/admission.cc) on the serve loop's thread; once every
// local trainer has joined, run() runs on a thread of its own until every trainer is gone or
// stop is set. The serve loop touches a started job only through its atomics, wake, abort_comm()
// and transport_name().
//
// Files: job.cc (forming the daemons' communicator, the rings, the loop), job_collectives.cc
// (what each collective does on this host and across hosts), job_p2p.h (sends and receives),
// job_p2p_remote.h (those across hosts), job_dmabuf.cc (trainers' dma-bufs registered with the
// NIC of the job's link to another host).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/compress/compress.h"
#include "core/store.h"
#include "core/sys/fd.h"
#include "core/sys/memfd_region.h"
#include "daemon/counters.h"
#include "daemon/device_import.h"
#include "daemon/job_p2p.h"
#include "daemon/job_p2p_remote.h"
#include "daemon/job_trace.h"
#include "daemon/protocol.h"
#include "daemon/reduce_pool.h"
#include "daemon/ring.h"
#include "kv/server.h"

namespace gw::daemon {

// The daemons' communicator dma-bufs are registered on, while it exists: the job clears it just
// before the communicator goes (whose connections then free their registrations themselves), so
// a registration that outlives it (held by an op to the end) only gives its addresses back.
struct DmabufLink {
  coll::Communicator* comm = nullptr;
};

// A trainer's device buffer handed over as a dma-buf (register_dmabuf, job_dmabuf.cc): registered
// on the job's daemons' communicator's data connections with the peer's host, addressed by an
// address range the daemon reserved for it (no access: the daemon never touches the buffer
// through a CPU mapping; only the NIC reaches it, through the dma-buf).
//
// Shared: the trainer's table holds it until deregister_dmabuf or the trainer goes, and every
// send or receive that names it (its P2pDevice::keep: on the board, in a held message's claim, in
// a cross-host op of RemoteP2p) holds it until the communicator is done with the op. The last
// holder releases it (its memory regions deregistered, its addresses unmapped): never under an op
// the NIC may still run. Job thread (or the waker, under the job's p2p_mu) only.
struct DmabufRegistration {
  DmabufRegistration() = default;
  DmabufRegistration(const DmabufRegistration&) = delete;
  DmabufRegistration& operator=(const DmabufRegistration&) = delete;
  ~DmabufRegistration() { (void)release(); }
  // Deregisters the regions (on the link's communicator, while there is one) and unmaps the
  // range; once (later calls return OK).
  Status release();

  std::shared_ptr<DmabufLink> link;
  int32_t peer_host = 0;  // the daemons' communicator's rank of the peer's host
  void* iova = nullptr;   // the reserved range [iova, + bytes)
  size_t bytes = 0;
  net::MemRegion* send = nullptr;  // on the connection to peer_host (kDmabufSends)
  net::MemRegion* recv = nullptr;  // on the connection from it (kDmabufReceives)
};

// The daemon's view of one trainer: its socket (serve loop only), its arena and eventfds, and the
// job thread's ends of its rings.
struct Trainer {
  explicit Trainer(Counters* c) : counters(c) {}
  ~Trainer() {
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

  // Set once by whoever sees the trainer go (serve loop: socket closed; job thread: refused).
  std::atomic<bool> lost{false};
  // With lost: it closed its connection on purpose (the arena's client_leaving), not killed.
  std::atomic<bool> left{false};
  std::atomic<uint64_t> requests{0};  // submissions accepted (gradwirectl clients)
  std::mutex reason_mu;
  std::string lost_reason;

  // Job thread only: the daemon's ends of the rings (made with the arena) and the decoded
  // submissions waiting for the job's other trainers.
  RingConsumer<SqEntry> sq;
  RingProducer<CqEntry> cq;
  uint64_t next_seq = 1;
  std::deque<Request> pending;
  // Its device allocations: the sizes the decoder checks against (as decoded), and the imports
  // opened (as answered). Closed when the trainer goes (the last reference to it).
  AllocSizes alloc_sizes;
  std::map<uint32_t, std::unique_ptr<DeviceImport>> imports;
  // While the job is traced (job_trace.h): when the job thread read each submission, by seq.
  std::map<uint64_t, int64_t> queued_us;
  // Version 8: the descriptors it passed on its socket (protocol.h FdRecord), by ticket, until a
  // register_dmabuf names one: the serve loop adds (after sock_in and sock_fds, its own, make a
  // whole record), the job thread takes.
  std::vector<uint8_t> sock_in;
  std::deque<sys::Fd> sock_fds;
  std::mutex fds_mu;
  std::condition_variable fds_cv;
  std::map<uint32_t, sys::Fd> passed_fds;
  // Job thread: its dma-buf registrations by id (let go when the trainer goes or the job ends;
  // each is released once the last op using it ended too: DmabufRegistration).
  std::map<uint32_t, std::shared_ptr<DmabufRegistration>> dmabufs;
  uint32_t next_dmabuf_id = 1;
  // Its sends and receives naming a registration, not answered yet: seq -> the registration's id
  // (a deregister_dmabuf of one in use is refused). Under p2p_mu, as the completions.
  std::map<uint64_t, uint32_t> device_ops;

  void mark_lost(std::string why);
  std::string reason();
  std::string name() const;
};

// The jobs' key: token, store and world.
std::string job_key(const Hello& h);
// A job's name for gradwirectl and /metrics: a hash of its token (the token is the job's secret).
std::string job_name(const Hello& h);
// The NCCL job of a connection of the plugin's daemon mode (plugin/daemon_transport.h: its job
// token is "nccl-<16 hex: the NCCL job's id>-<connection>"): the id, or "" for any other job.
std::string nccl_job_of(const Hello& h);
// The job's parameter server (docs/parameter-server.md, "Daemon mode"): started with the job,
// listening on every interface, advertised as the address this host routes toward the job's store
// (127.0.0.1 for a job without one); the job's trainers' Hellos must carry its job token.
Result<std::shared_ptr<kv::Server>> start_kv_server(const Hello& h);

// allreduce_pipelined: the piece size and how many pieces the progress thread holds at once.
inline constexpr size_t kPipelinePiece = 4u << 20;
inline constexpr size_t kPiecesInFlight = 3;
// The least a helper thread of the pool gets of a local sum or copy (smaller ones stay inline).
inline constexpr size_t kMinPartBytes = 256u << 10;
// start_comm's waits on the store (the daemons' communicator's too) run in slices this long, so a
// stop ends them promptly.
inline constexpr int kStopSliceMs = 200;
// The longest a job that ends because a trainer left on purpose waits for its goodbyes to the
// job's other daemons to be taken by the communicator and answered (RemoteP2p::say_goodbye).
inline constexpr int64_t kByeWaitMs = 1000;
// The longest a trainer's leaving waits for the refusals of the device messages held for it (and
// a job's end for its answers to other daemons' goodbyes) to be taken by the communicator before
// the job's end aborts it (RemoteP2p::flush_replies).
inline constexpr int64_t kRefuseWaitMs = 500;

struct Job {
  // server_wake_fd: signalled when the job refuses a trainer or finishes.
  Job(int server_wake_fd, const Hello& h, Counters* c, std::vector<std::string> offer);
  int server_wake_fd;
  ReducePool* pool = nullptr;  // the server's, for large local sums and copies
  Hello first;                 // the job's shape as its first trainer told it
  Counters* counters;
  std::vector<std::string> offer;  // the server's transports, best first (transport_offer.h)
  int64_t spin_ns = 0;
  // wait_for_work's spins in a row that found no work (job thread); at kSpinMisses it stops
  // spinning until work comes within spin_ns of a sleep's start.
  int spin_misses = 0;
  static constexpr int kSpinMisses = 4;
  std::vector<std::shared_ptr<Trainer>> members;  // by local rank
  int joined = 0;
  bool started = false;
  sys::Fd wake;
  std::thread thread;
  std::atomic<bool> stop{false};
  std::atomic<bool> finished{false};
  // For gradwirectl jobs (read by the serve loop): failed, or ended by a trainer that left on
  // purpose between collectives (its other trainers may still be attached).
  std::atomic<bool> failed{false};
  std::atomic<bool> ended{false};
  std::atomic<uint64_t> done{0}, errors{0};
  // A connection of the NCCL plugin's daemon mode: its NCCL job (nccl_job_of; "" for any other
  // job) and the bytes its listener (rank 1) received, for gradwirectl jobs.
  std::string nccl_job;
  std::atomic<uint64_t> nccl_bytes{0};
  std::shared_ptr<Counters::NcclTotals> nccl_totals;  // its NCCL job's, for /metrics
  // Device allocations of its trainers imported now (gradwirectl jobs): held by each import.
  std::shared_ptr<std::atomic<uint64_t>> imports = std::make_shared<std::atomic<uint64_t>>(0);

  std::mutex comm_mu;     // guards comm (abort() from the serve loop) and transport
  std::string transport;  // agreed by the job's daemons in start_comm ("" until then, or local)
  int tslot;              // counters->transport_slot(transport), for the byte counters
  std::shared_ptr<Store> store;
  std::unique_ptr<coll::Communicator> comm;
  // comm for the trainers' dma-buf registrations (job_dmabuf.cc): set once comm exists, cleared
  // just before it goes.
  std::shared_ptr<DmabufLink> dmabuf_link = std::make_shared<DmabufLink>();
  std::vector<int32_t> host_of_rank;
  std::vector<std::vector<int32_t>> ranks_of_host;  // ascending, by host index
  // The job's parameter server (null when it could not start): its stores live in this daemon's
  // memory until every worker of the job is done with them (run() waits for that at its end).
  std::shared_ptr<kv::Server> kv;

  // Job thread state.
  Status failure;  // ok until the job fails; then every request completes with it
  std::vector<uint8_t> scratch;
  // allreduce_compressed's error feedback between the daemons (per tensor key), made on first use.
  std::unique_ptr<coll::Compressor> compressor;
  std::vector<CompressedDone> done_info;  // by member, when the last collective carries one
  // Point-to-point among the local trainers (job_p2p.h): made once every trainer joined.
  std::unique_ptr<P2pBoard> p2p;
  // Its link to the job's other hosts (job_p2p_remote.h): with more than one host. The job thread
  // holds p2p_mu but while it runs a collective (in_collective), when remote's waker may take it.
  std::unique_ptr<RemoteP2p> remote;
  std::mutex p2p_mu;
  std::atomic<bool> in_collective{false};
  // The job thread waits for a data connection (a dma-buf registration or flush, job_dmabuf.cc):
  // the serve loop then aborts the communicator at once for a trainer that dies, as during a
  // collective; else the job thread does (Job::fail), after the device messages held for that
  // trainer were refused (their senders then fail saying why).
  std::atomic<bool> in_wait{false};
  // The host path of device buffers (job_device.cc): each member's staging of its send and
  // receive ranges for the collective being run (`shared` when they are one range).
  struct DeviceStage {
    std::vector<uint8_t> in, out;
    bool shared = false;
  };
  std::vector<DeviceStage> stage;
  bool said_device_path = false;

  // gradwirectl trace (job_trace.cc). The serve loop starts one (kInvalidArg while another of
  // this job runs); the job thread records into trace_now for the collective it runs.
  std::mutex trace_mu;
  std::weak_ptr<JobTrace> trace;  // the asker's connection holds it
  std::atomic<bool> tracing{false};
  std::shared_ptr<JobTrace> trace_now;
  Status begin_trace(const std::shared_ptr<JobTrace>& t);
  // The stall watch (job_stall.cc, job thread): GW_STALL_WARN_S of this daemon (-1: not read
  // yet), and since when (0: none) which collective has waited for some of this host's trainers.
  double stall_warn_s = -1;
  int64_t stall_since_ns = 0, stall_next_ns = 0;
  uint64_t stall_index = 0;

  // The job thread's body.
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
  // job.cc
  Status start_comm();
  // left: a trainer that closed its connection on purpose is why (the job's usual end, unless a
  // collective of the others waited for it): rank `who` (here, or on another host whose daemon
  // said goodbye). A usual end says goodbye to the job's other daemons (RemoteP2p::say_goodbye)
  // before the communicator is aborted, so their jobs end too, without a failure.
  void fail(const Status& s, bool left = false, int32_t who = -1);
  void refuse(Trainer& t, const Status& why);
  void consume(Trainer& t);
  void make_p2p();  // job_p2p.cc
  // `done`: what a success carries; `moved`: whether it counts as a message's bytes (not a
  // register_dmabuf's id).
  void complete(Trainer& t, uint64_t seq, const Status& s, const CompressedDone* done = nullptr,
                bool moved = true);
  // Busy-polls the submission rings for spin_ns (unless kSpinMisses spins in a row found
  // nothing), then sleeps on their eventfds and wake;
  bool wait_for_work();  // false when poll fails
  void run_ready();
  std::string describe(const Request& r) const;
  // job_device.cc
  // Answers the imports and releases at the front of t's queue (they are t's own, not the job's).
  void settle(Trainer& t);
  // job_dmabuf.cc: a register_dmabuf or deregister_dmabuf of t's, answered at once; and every
  // registration of t's released (the trainer goes, or the job ends).
  void dmabuf_request(Trainer& t, const Request& r);
  Result<uint32_t> register_dmabuf(Trainer& t, const Request& r);
  void release_dmabufs(Trainer& t);
  // A send's or recv's dma-buf (r.dmabuf): t's registration for that direction, the range inside
  // it, the peer on the registration's host; kInvalidArg naming what is wrong.
  Status p2p_device(Trainer& t, const Request& r, P2pDevice* dev);
  class WaitMark;  // in_wait while the job thread waits for a data connection
  // The collective, with any imported device buffer staged through host memory around it.
  Status execute(const std::vector<Request>& reqs);
  Status stage_in(const std::vector<Request>& reqs);
  Status stage_out(const std::vector<Request>& reqs);
  // Member i's send and receive range in host memory: its arena, or its device buffer's staging.
  uint8_t* src_of(size_t i, const Request& r) {
    return r.send_alloc ? stage[i].in.data() : members[i]->data + r.send_off;
  }
  uint8_t* dst_of(size_t i, const Request& r) {
    if (r.recv_alloc == 0) return members[i]->data + r.recv_off;
    return stage[i].shared ? stage[i].in.data() : stage[i].out.data();
  }
  // job_trace.cc: the trace running now (null: none; the common case is one relaxed load), and
  // the collective just run with its trainers' queued times.
  std::shared_ptr<JobTrace> current_trace();
  void record_collective(const std::vector<Request>& reqs, int64_t t0_us, const Status& s);
  // job_stall.cc: logs a WARN, every GW_STALL_WARN_S, naming the trainers of this host a
  // collective waits for; and how long wait_for_work may sleep before the next look (<= cap).
  void watch_stall();
  int stall_poll_ms(int cap) const;
  // job_collectives.cc
  Status execute_host(const std::vector<Request>& reqs);
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
};

}  // namespace gw::daemon
