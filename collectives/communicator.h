// A Communicator: a group of ranks that run collectives over core/net transports.
//
// Collective calls must be made by every rank in the same order with matching arguments
// (count, dtype, op, root). Arguments that disagree across ranks are detected where the bytes
// show it (message sizes are checked at every step; every range ends with a short, possibly
// empty, message, so a count mismatch always shows in some size) and end in an error on every
// rank, never a hang and never an ok with partial data (broadcast passes a closing token round
// the ring so that the ranks upstream of a mismatch learn it too).
//
// Threading: collective calls on one Communicator are serialised (one at a time; a blocking call
// made while async operations are pending waits for them first, keeping the issue order). abort()
// may be called from any thread at any time: every pending and later call returns kAborted.
// Every wait has the deadline GW_TIMEOUT_MS (or CommOptions::timeout_ms).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "collectives/call.h"
#include "collectives/types.h"
#include "core/config_snapshot.h"
#include "core/net/transport.h"
#include "core/status.h"
#include "core/store.h"

namespace gw::coll {

class P2PRequest;  // collectives/p2p.h

// Algorithms (collectives/algorithms.h says when each applies): every allreduce one (GW_ALGO
// names them); broadcast, allgather and reduce-scatter have kRing and kHier (GW_ALGO_BROADCAST,
// GW_ALGO_ALLGATHER, GW_ALGO_REDUCE_SCATTER).
enum class Algo { kAuto, kRing, kRhd, kHostRing, kHier, kHierLeader, kTree, kBblocks, kPair };

struct CommOptions {
  int rank = -1;
  int world_size = -1;
  std::shared_ptr<Store> store;  // required; the communicator uses keys under its own prefix
  // "auto" (core/net/auto_backend.h) or a name in the backend registry.
  std::string transport = "auto";
  int64_t timeout_ms = -1;  // -1: GW_TIMEOUT_MS
  std::string job_token;    // "" : agree one through the store (GW_JOB_TOKEN wins if set)
  std::string host_id;      // "" : bootstrap host_identity()
  std::string mode;         // GroupOptions::mode: the C ABI's "direct"
  std::string launcher;     // GroupOptions::launcher
  // The store's host: tcp's default interface is the one the routing table uses to reach it
  // (GW_SOCKET_IFNAME unset). "": the first interface that is up.
  std::string route_host;
  config::Snapshot config;  // the settings it reads; empty: captured at creation
};

// Where this rank runs relative to the others (the host map every rank agreed at creation).
// host: this rank's host, 0..num_hosts-1 in order of first appearance by rank; local_rank: its
// index among its host's ranks (by rank); local_size: ranks on its host; uniform: every host has
// local_size ranks.
struct HostLayout {
  int host = 0;
  int num_hosts = 1;
  int local_rank = 0;
  int local_size = 1;
  bool uniform = true;
};

// Handle of an asynchronous collective (iallreduce). Owned by the caller; wait() or test() until
// done, then destroy. Destroying an unfinished request waits for it (bounded by the deadline).
class AsyncOp {
 public:
  virtual ~AsyncOp() = default;
  // Waits up to timeout_ms (-1: forever, bounded by the communicator's own deadline).
  // Returns kTimeout if it is still running at that point (the op continues).
  virtual Status wait(int64_t timeout_ms) = 0;
  // Sets *done; when done, returns the op's final status.
  virtual Status test(bool* done) = 0;
};

class Communicator {
 public:
  static Result<std::unique_ptr<Communicator>> create(const CommOptions& options);
  // The settings create() checks before it meets the other ranks (the transport's name, the
  // configuration, the timeout, forced algorithms' names), checked alone, and whether a transport
  // named here can run in this process (its registry probe): a caller that hosts or reaches the
  // store first can then say why in it (publish_setup_failure, core/bootstrap.h).
  static Status check_options(const CommOptions& options);
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // sendbuf == recvbuf means in place. count may be 0. Buffers must not overlap otherwise.
  virtual Status allreduce(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                           ReduceOp op) = 0;
  virtual Status broadcast(void* buf, size_t count, DataType dtype, int root) = 0;
  // recvbuf holds size()*sendcount elements, rank r's block at r*sendcount.
  virtual Status allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                           DataType dtype) = 0;
  // sendbuf holds size()*recvcount elements; rank r receives the reduction of block r.
  virtual Status reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                DataType dtype, ReduceOp op) = 0;
  virtual Status barrier() = 0;
  // sendbuf holds size()*count elements, block j (at j*count) goes to rank j; recvbuf (size()*count
  // elements) receives rank j's block for this rank at j*count. Every rank must pass the same
  // count: a rank whose count differs from a peer's fails with kInvalidArg ("ranks disagree on
  // count"), and so does that peer, whatever the sizes. sendbuf == recvbuf is supported (in place:
  // the input is copied to internal scratch first, one extra pass); other overlaps are kInvalidArg.
  // count may be 0. Pairwise exchange over direct connections to every peer, several steps in
  // flight, each step chunked and pipelined.
  virtual Status alltoall(const void* sendbuf, void* recvbuf, size_t count, DataType dtype) = 0;

  // Any collective as data (collectives/call.h), among them the ones that have no method above:
  // reduce, gather, scatter and all-to-all-v (collectives/rooted_schedule.h has their algorithms),
  // with the C header's semantics (gw_reduce, gw_gather, gw_scatter, gw_alltoallv; ranks that
  // disagree all fail, kInvalidArg where a rank sees it, kPeer where a peer's failure ended the
  // call). run() blocks like the call of that kind;
  // start() queues it behind the pending asynchronous ones and returns at once (the i-forms: the
  // buffers must stay valid until the op is done; the vectors are copied). Calls of any kinds
  // may be pending together; they run one after the other in issue order, and every rank must
  // issue them in the same order. Destroying or aborting the communicator ends the pending ones
  // (kAborted). The defaults: run() takes the symmetric kinds to the methods above and refuses
  // the rest, start() refuses (kUnsupported).
  virtual Status run(const CollectiveCall& call);
  virtual Result<std::unique_ptr<AsyncOp>> start(const CollectiveCall& call);

  // Starts an allreduce that runs on the communicator's progress thread. Buffers must stay
  // valid until the op is done.
  virtual Result<std::unique_ptr<AsyncOp>> iallreduce(const void* sendbuf, void* recvbuf,
                                                      size_t count, DataType dtype,
                                                      ReduceOp op) = 0;

  // Point-to-point (collectives/p2p.h has the rules): not collective, thread-safe, independent of
  // the collectives' order. peer is a rank (irecv: or -1, any source), tag >= 0, bytes > 0 needs a
  // buffer that stays valid until the request is done. The default: kUnsupported.
  virtual Result<std::shared_ptr<P2PRequest>> isend(const void* buf, size_t bytes, int peer,
                                                    int tag);
  virtual Result<std::shared_ptr<P2PRequest>> irecv(void* buf, size_t bytes, int peer, int tag);
  // A dma-buf registered on the point-to-point data connection with `peer` (PointToPoint::
  // reg_dmabuf has the rules), and its release. The default: kUnsupported.
  virtual Result<net::MemRegion*> reg_dmabuf(int peer, bool send, void* iova, size_t bytes,
                                             uint64_t offset, int fd, Deadline deadline);
  virtual Status dereg_dmabuf(int peer, bool send, net::MemRegion* mr);
  // PointToPoint::flush_dmabuf. The default: kUnsupported.
  virtual Result<bool> flush_dmabuf(int peer, void* iova, size_t bytes, net::MemRegion* mr,
                                    Deadline deadline);
  // isend / irecv of a device buffer registered with reg_dmabuf (PointToPoint::isend's `mr`
  // has the rules). The default: kUnsupported.
  virtual Result<std::shared_ptr<P2PRequest>> isend_registered(const void* buf, size_t bytes,
                                                               int peer, int tag,
                                                               net::MemRegion* mr);
  virtual Result<std::shared_ptr<P2PRequest>> irecv_registered(void* buf, size_t bytes, int peer,
                                                               int tag, net::MemRegion* mr);

  // Thread-safe, idempotent, never blocks.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;

  // This rank's place in the host layout. The default (for communicators that do not know
  // their hosts) puts every rank on one host.
  virtual HostLayout host_layout() const;

  // Whether host memory from gw_mem_alloc should be shared host memory (collectives/
  // shared_host_memory.h), because this communicator's allreduce maps its peers' buffers when
  // they lie in it. Fixed at creation; thread-safe. The default: false.
  virtual bool wants_shared_host_memory() const { return false; }

  // Which algorithm allreduce would use for this many bytes (cost model + GW_ALGO).
  virtual Algo choose_allreduce_algo(size_t bytes) const = 0;

  // What this communicator resolved at creation, for the start-up log line: the transport of
  // each link level (never "auto") with its interface, sockets and I/O threads, the channels,
  // the chunk, and the allreduce algorithm per size class ("transport tcp (eth0:10.0.0.1, 1
  // socket, 0 threads), channels auto (1-4 by size), chunk 512 KiB, allreduce <=32 KiB rhd,
  // >32 KiB ring"). The default names only rank and size.
  virtual std::string describe() const;
  // describe()'s parts by name (gw_comm_describe): "transport" (the transport of the links across
  // hosts, or of every link when all ranks share a host; never "auto"; "none" for one rank),
  // "transport_within_hosts" (the links between ranks of one host when there are several hosts,
  // else the same as "transport"), "interface" (tcp's "eth0:10.0.0.1", "" for other transports),
  // "channels", "chunk", "allreduce" (the algorithm table's choice by size) and "summary"
  // (describe()). The default has "summary" only.
  virtual std::map<std::string, std::string> resolved() const;

  // Collective over this communicator (every rank calls it, in the same order relative to its
  // other collectives): ranks passing the same color form a new communicator, ranked by key and
  // then by their rank here. A rank passing color < 0 joins none and gets nullptr (OK). The new
  // communicator shares this one's store (under a key prefix of its own), job token, host map,
  // transport and timeout, has its own connections, and lives on its own: either may be
  // destroyed first, and both may be used side by side from one thread. Blocks until every rank
  // has called it, or the deadline (kTimeout); kAborted when aborted.
  virtual Result<std::unique_ptr<Communicator>> split(int color, int key);
};

}  // namespace gw::coll
