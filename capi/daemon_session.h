// The daemon-mode Session (GW_DAEMON=unix:PATH): this rank is a client of the host's gradwired
// (daemon/server.h, docs/wire-daemon.md). It joins the job's rendezvous store like direct mode
// (rank 0 hosts it; the job token and the host map are agreed there), then connects to the daemon
// (daemon/client.h: the hello, the shared arena, its rings) and posts every collective to the
// arena's submission ring; the daemon sums the host's trainers and runs the inter-host part with
// the job's other daemons. This file is the session's logic: where buffers go in the arena, how a
// large collective is cut, split, and the compressed allreduce's bookkeeping (set-up and split:
// daemon_session_setup.cc; the data path: daemon_session.cc; GW_TIMELINE's events of the
// trainer's side: daemon_session_trace.h).
//
// Buffers from mem_alloc() lie in the arena and are used in place; any other buffer is copied into
// arena staging and back. Every collective of the C ABI is supported: allreduce, iallreduce
// (several in flight, up to the ring's length), broadcast, allgather, reduce_scatter, alltoall,
// barrier, allreduce_compressed (the daemons compress what crosses hosts) and split (a new job on
// the same daemons). An allreduce or broadcast of more than GW_DAEMON_CHUNK bytes runs as chunks,
// several in flight, so a buffer larger than the arena works and staging overlaps the daemon's
// work; so do allgather, reduce_scatter and alltoall above two chunks, as slices of every
// rank's block. iallreduce and allreduce_compressed must fit the arena whole. CUDA device
// buffers (allreduce, broadcast, allgather, reduce_scatter, alltoall; capi/daemon_device.cc): each
// allocation is exported to the daemon once (CUDA IPC) and the submission names (allocation,
// offset), so the trainer copies nothing; memory that cannot be exported is staged through host
// memory and the arena (said once at INFO). The other calls' device buffers are staged by the
// front end (device_memory()); allreduce_compressed refuses them (kUnsupported). Every wait has the
// communicator's deadline, and a daemon that dies or cuts this client ends the call (and every
// later one) with kPeer. Reduce, gather, scatter and alltoallv are composed over these, and the
// other i-forms run on a worker in issue order (capi/daemon_calls.cc). Point-to-point
// (capi/daemon_session_p2p.cc) goes to the daemon as send and recv submissions that it matches
// among the job's trainers of this host, and with a peer on another host through the daemons.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "capi/session.h"
#include "collectives/async_queue.h"
#include "core/store.h"
#include "core/sys/time.h"
#include "daemon/client.h"

namespace gw::capi {

class DaemonSession final : public Session {
 public:
  // address: "unix:/path" (GW_DAEMON). Collective over options.world_size ranks.
  static Result<std::unique_ptr<Session>> create(const SessionOptions& options,
                                                 const std::string& address);
  ~DaemonSession() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Device memory (capi/daemon_device.cc): the five blocking collectives import it into
  // gradwired (device_collective); the other calls are staged by the front end through
  // device_memory(), as in direct mode.
  bool takes_device_memory() const override { return true; }
  Status device_collective(const coll::CollectiveCall& call) override;
  std::shared_ptr<DeviceMemory> device_memory() const override;

  Status allreduce(const void* sendbuf, void* recvbuf, size_t count, coll::DataType dtype,
                   coll::ReduceOp op) override;
  Status broadcast(void* buf, size_t count, coll::DataType dtype, int root) override;
  Status allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                   coll::DataType dtype) override;
  Status reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount, coll::DataType dtype,
                        coll::ReduceOp op) override;
  Status alltoall(const void* sendbuf, void* recvbuf, size_t count, coll::DataType dtype) override;
  Status barrier() override;
  Result<std::unique_ptr<SessionRequest>> iallreduce(const void* sendbuf, void* recvbuf,
                                                     size_t count, coll::DataType dtype,
                                                     coll::ReduceOp op) override;
  // capi/daemon_calls.cc: reduce, gather, scatter and alltoallv composed over the collectives
  // above; start() queues any call on a worker that runs them in issue order.
  Status run(const coll::CollectiveCall& call) override;
  Result<std::unique_ptr<SessionRequest>> start(const coll::CollectiveCall& call) override;
  // capi/daemon_session_p2p.cc: a send or receive posted to the daemon (the buffer in place when
  // it lies in the arena, else staged there); not ordered with the collectives.
  Result<std::unique_ptr<SessionRequest>> isend(const void* buf, size_t bytes, int peer,
                                                int tag) override;
  Result<std::unique_ptr<SessionRequest>> irecv(void* buf, size_t bytes, int peer,
                                                int tag) override;
  Status allreduce_compressed(void* buf, size_t count, coll::DataType dtype,
                              std::string_view codec_spec, std::string_view tensor_key) override;
  Result<gw_comm_stats_t> compression_stats() override;
  Status reset_compression_stats() override;
  Status release_compression() override;
  Result<void*> mem_alloc(size_t bytes) override;
  Status mem_free(void* ptr) override;
  std::string describe() const override;
  // gw_comm_describe's keys as direct mode has them, for daemon mode: transport "daemon" on the
  // daemon's socket; chunk the client's; allreduce how the daemons run it.
  std::map<std::string, std::string> resolved() const override;

  void abort() override;
  bool aborted() const override { return client_->aborted(); }

  Result<std::unique_ptr<Session>> split(int color, int key) override;

  // The parameter server (capi/kv.cc): the job's store, and the daemon's kv server (welcome).
  std::shared_ptr<Store> job_store() const override { return store_; }
  std::string store_host() const override { return hello_.store_host; }
  bool daemon_kv(std::string* address, std::string* token) const override {
    *address = client_->welcome().kv_address;
    *token = hello_.job_token;
    return true;
  }

 private:
  DaemonSession() = default;
  // Connects to the daemon at `address` with hello `h` (the job's layout worked out already).
  static Result<std::unique_ptr<DaemonSession>> connect(const daemon::Hello& h,
                                                        const std::string& address,
                                                        std::shared_ptr<Store> store,
                                                        std::vector<int> host_of_rank);
  // An elementwise collective of `bytes` run as chunks of at most chunk_bytes_ (every rank cuts
  // the same way: by size and the agreed chunk), up to kChunksInFlight posted at once.
  // post_chunk(offset, len) places and posts one chunk and returns its sequence number and
  // placements; finish_chunk copies a completed chunk out (when it succeeded) and frees its
  // placements. The caller holds mu_.
  struct Chunk {
    uint64_t seq = 0;
    size_t offset = 0, len = 0;
    uint64_t send_off = 0, recv_off = 0;
    bool send_staged = false, recv_staged = false;
  };
  static constexpr size_t kChunksInFlight = 4;
  // step: the bytes of a chunk (0: chunk_bytes_).
  Status run_chunks(size_t bytes, size_t elem, const char* what,
                    const std::function<Result<Chunk>(size_t offset, size_t len)>& post_chunk,
                    const std::function<void(const Chunk&, bool ok)>& finish_chunk,
                    size_t step = 0);
  // allgather, reduce_scatter or alltoall (opcode) of more than slice_bytes() (two chunks: a
  // staged alltoall's slice, both sides, fits half of the arena) in all, as
  // slices of at most that: slice k holds bytes [k x step, + len) of each rank's block of `block`
  // bytes (every rank cuts the same way: by size and the agreed chunk). The side with world_size
  // blocks is used in place, the blocks `block` apart (the submission's stride), when it lies in
  // the arena (for alltoall: both sides), and is otherwise staged packed, slice by slice.
  size_t slice_bytes() const { return chunk_bytes_ * 2; }
  // The job's chunk: the least of every rank's (published under the communicator's keys), into
  // *chunk. A rank whose join failed (`joined`, chunk null) publishes that instead, so the
  // others fail at once naming it; it returns `joined`. Rank 0 returns once every rank is done
  // with its store.
  static Status agree_chunk(Store& store, int rank, int size, const Status& joined, size_t* chunk,
                            sys::Deadline deadline);
  Status run_sliced(daemon::Opcode opcode, const void* sendbuf, void* recvbuf, size_t block,
                    coll::DataType dtype, coll::ReduceOp op, const char* what);

  // ---- capi/daemon_calls.cc ----
  // Before a call that posts to the daemon from the caller's thread: waits until the calls
  // queued by start() have ended (they were issued first). A no-op on the worker itself.
  void in_order();
  // Whether an iallreduce must queue behind start()'s calls instead of posting at once.
  bool behind_queue() const;
  // iallreduce when behind_queue(): start() of an allreduce (staged whole: any size).
  Result<std::unique_ptr<SessionRequest>> queue_iallreduce(const void* sendbuf, void* recvbuf,
                                                           size_t count, coll::DataType dtype,
                                                           coll::ReduceOp op);
  // Ends the queue: the running call is aborted, the queued ones end in kAborted unstarted.
  void stop_queue();
  // One collective of the daemon's whose receive side is arena scratch (the rooted calls on the
  // ranks that do not keep the result): send (null: broadcast, one buffer) copied in, `bytes`
  // cut by run_chunks with `step`, keep(offset, len, scratch) told every chunk that completed.
  struct ScratchCall {
    daemon::Opcode opcode = daemon::Opcode::kAllreduce;
    const char* what = "";
    const uint8_t* send = nullptr;
    size_t bytes = 0;  // the send side's (broadcast: the buffer's)
    coll::DataType dtype = coll::DataType::kU8;
    coll::ReduceOp op = coll::ReduceOp::kSum;
    int root = 0;
    size_t recv_blocks = 1;    // the receive side holds this many times a chunk
    bool in_place_ok = false;  // allreduce: a staged send copy may take the result
    size_t step = 0;           // run_chunks's (0: chunk_bytes_)
    std::function<void(size_t, size_t, const uint8_t*)> keep;
  };
  Status run_scratch(const ScratchCall& sc);
  size_t slice_step(size_t elem) const;  // run_sliced's slice of one block
  Status reduce_call(const coll::CollectiveCall& c);
  Status gather_call(const coll::CollectiveCall& c);
  Status scatter_call(const coll::CollectiveCall& c);
  Status alltoallv_call(const coll::CollectiveCall& c);

  // ---- device buffers (capi/daemon_device.cc) ----
  // Whether p is CUDA device memory (managed memory is host memory here: the CPU reads it).
  static bool is_device(const void* p);
  // A collective (opcode: allreduce, broadcast, allgather, reduce_scatter, alltoall) of which a
  // buffer is device memory: on imported allocations when both buffers are device memory that
  // the daemon imported, else staged through host copies and the host path. Takes mu_.
  Status device_call(daemon::Opcode opcode, const void* sendbuf, void* recvbuf, size_t count,
                     coll::DataType dtype, coll::ReduceOp op, int root);
  struct DevRef {
    uint32_t id = 0;  // 0: not imported (staged)
    uint64_t off = 0;
  };
  // Where device pointer p lies among the daemon's imports: its allocation imported on first use
  // (again when it was freed and another took its place); id 0 where it cannot be. Under mu_.
  Result<DevRef> device_ref(const void* p);
  Status release_import(uint32_t id);
  struct DeviceAlloc {
    uint32_t id = 0;  // 0: could not be exported or imported: staged
    size_t bytes = 0;
    uint64_t buffer_id = 0;  // CU_POINTER_ATTRIBUTE_BUFFER_ID: tells a reused address apart
  };
  std::map<uintptr_t, DeviceAlloc> dev_allocs_;  // by base address; under mu_
  mutable std::once_flag device_memory_once_;
  mutable std::shared_ptr<DeviceMemory> device_memory_;
  uint32_t next_alloc_id_ = 1;
  bool said_imported_ = false, said_staged_ = false;

  using Placed = daemon::Client::Placed;
  friend class DaemonRequest;
  friend class DaemonP2pRequest;
  Result<std::unique_ptr<SessionRequest>> post_p2p(bool send, void* buf, size_t bytes, int peer,
                                                   int tag);
  // The data region of the arena (client_->data()).
  uint8_t* data() const { return client_->data(); }

  int rank_ = 0;
  int size_ = 1;
  int64_t timeout_ms_ = 0;
  std::string address_;
  size_t chunk_bytes_ = 0;         // GW_DAEMON_CHUNK
  daemon::Hello hello_;            // what this trainer told the daemon (split derives from it)
  std::vector<int> host_of_rank_;  // host index of every rank
  // rank 0 hosts the job's store: the daemons meet there (a split's jobs too, so it holds it).
  std::shared_ptr<Store> store_;
  uint64_t splits_ = 0;  // split() calls so far (names the new jobs); under mu_

  // allreduce_compressed: the keys used (spec as given, count, dtype), checked before posting as
  // the direct mode's Compressor checks them; the counters of gw_comm_stats; the release epoch
  // (release_compression starts fresh keys: "<key>#<epoch>"). Under mu_.
  struct KeyUse {
    std::string spec;
    size_t count = 0;
    coll::DataType dtype = coll::DataType::kF32;
  };
  std::map<std::string, KeyUse, std::less<>> keys_;
  gw_comm_stats_t stats_{};
  uint64_t epoch_ = 0;

  std::mutex mu_;  // one call at a time
  // What an iallreduce request holds instead of the session: a request may outlive it
  // (gw_comm_destroy), and then reports the abort. Lock order: link's mu, then mu_.
  struct Link {
    std::mutex mu;
    DaemonSession* session = nullptr;
  };
  std::shared_ptr<Link> link_ = std::make_shared<Link>();
  std::unique_ptr<daemon::Client> client_;  // the connection, arena and rings; under mu_
  std::map<uint64_t, size_t> user_;         // gw_mem_alloc'd ranges (offset -> bytes)
  // start()'s calls: queued or running (in_order, behind_queue); the worker (stopped first).
  std::atomic<int> pending_{0};
  coll::AsyncQueue queue_;
};

}  // namespace gw::capi
