// The seam between the C ABI and whatever runs the collectives: a Session is one rank's
// membership in one communicator. capi/gradwire.cc checks arguments, keeps handles and maps
// Status to gw_status_t; a Session does the work. DirectSession (direct_session.h) runs a
// gw::coll::Communicator in this process; DaemonSession (daemon_session.h) is a client of the
// host's gradwired, so these signatures carry only plain and C types, nothing of collectives/'s
// internals.
//
// What every implementation may rely on (the C layer has checked it before calling): dtype and op
// are valid enumerators; the byte sizes of the buffers (count x dtype size, times size() where the
// call says so) fit in size_t; a buffer is non-NULL whenever it has bytes to transfer; distinct
// buffers do not overlap except in the in-place forms of the C header; root is in [0, size());
// codec specs and tensor keys are non-NULL. Calls on one Session come from the C layer in the
// order the caller made them; abort() and aborted() may come from any thread at any time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "collectives/call.h"
#include "collectives/types.h"
#include "core/status.h"
#include "core/store.h"
#include "gradwire/gradwire.h"

namespace gw::capi {

class DeviceMemory;  // capi/device_memory.h

// The resolved configuration of a new communicator: gw_config_t after the C layer has filled
// in what the caller left to the environment or the launcher, and checked it.
struct SessionOptions {
  int rank = 0;
  int world_size = 1;
  std::string store_host;  // "": no store (only for a world of one)
  int store_port = 0;
  std::string transport;   // a name the transport registry knows, or "auto"
  int64_t timeout_ms = 0;  // > 0
  std::string job_token;   // "": agree one through the store
  // Where the values came from, for the start-up log line only (never the token itself):
  std::string launcher;      // "torchrun", "Open MPI", "Slurm", "GW_*", "config"
  std::string store_source;  // "config.store_addr", "GW_STORE", "MASTER_ADDR/MASTER_PORT"
  std::string token_source;  // "config.job_token", "GW_JOB_TOKEN", "" (agreed via the store)
};

// An operation started by Session::iallreduce.
// May outlive its Session: gw_comm_destroy frees the Session while requests are outstanding, after
// aborting it; a request then reports how its operation ended (kAborted when the abort ended it).
class SessionRequest {
 public:
  virtual ~SessionRequest() = default;
  // Waits up to timeout_ms (-1: the communicator's own deadline). kTimeout when it is still
  // running then (it goes on; wait or test again).
  virtual Status wait(int64_t timeout_ms) = 0;
  // Sets *done; once done, returns the operation's final status.
  virtual Status test(bool* done) = 0;
  // Point-to-point requests (Session::isend/irecv): once done with OK, the bytes moved and the
  // source rank; false for other requests.
  virtual bool p2p_result(size_t* bytes, int* source) const { return false; }
};

class Session {
 public:
  virtual ~Session() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether allreduce, broadcast, allgather, reduce_scatter and alltoall take CUDA device memory
  // themselves: the front end, having found device memory in such a call (capi/host_memory.cc),
  // gives it to device_collective instead of staging it (daemon mode imports it into gradwired).
  virtual bool takes_device_memory() const { return false; }
  virtual Status device_collective(const coll::CollectiveCall& call) {
    return unsupported("this communicator does not take device memory itself");
  }

  // The collectives of the C header, with its semantics (in place, count 0, matching across ranks).
  virtual Status allreduce(const void* sendbuf, void* recvbuf, size_t count, coll::DataType dtype,
                           coll::ReduceOp op) = 0;
  virtual Status broadcast(void* buf, size_t count, coll::DataType dtype, int root) = 0;
  virtual Status allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                           coll::DataType dtype) = 0;
  virtual Status reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                coll::DataType dtype, coll::ReduceOp op) = 0;
  virtual Status alltoall(const void* sendbuf, void* recvbuf, size_t count,
                          coll::DataType dtype) = 0;
  virtual Status barrier() = 0;
  // Never returns a null request on success. The Session must outlive the request.
  virtual Result<std::unique_ptr<SessionRequest>> iallreduce(const void* sendbuf, void* recvbuf,
                                                             size_t count, coll::DataType dtype,
                                                             coll::ReduceOp op) = 0;

  // Any collective as data (collectives/call.h): the blocking calls gw_reduce, gw_gather,
  // gw_scatter, gw_alltoallv (run) and every i-form but gw_iallreduce (start: queued behind the
  // pending ones, in issue order, ended by abort/destroy like iallreduce's). The C layer has
  // checked the call (coll::check_call and its own checks). The defaults: run() takes the
  // symmetric kinds to the methods above and refuses the others, start() refuses. Both modes
  // override them (daemon mode: capi/daemon_calls.cc).
  virtual Status run(const coll::CollectiveCall& call) {
    switch (call.kind) {
      case coll::CallKind::kAllreduce:
        return allreduce(call.sendbuf, call.recvbuf, call.count, call.dtype, call.op);
      case coll::CallKind::kBroadcast:
        return broadcast(call.recvbuf, call.count, call.dtype, call.root);
      case coll::CallKind::kAllgather:
        return allgather(call.sendbuf, call.recvbuf, call.count, call.dtype);
      case coll::CallKind::kReduceScatter:
        return reduce_scatter(call.sendbuf, call.recvbuf, call.count, call.dtype, call.op);
      case coll::CallKind::kAlltoall:
        return alltoall(call.sendbuf, call.recvbuf, call.count, call.dtype);
      case coll::CallKind::kBarrier:
        return barrier();
      default:
        return Status(Code::kUnsupported, collective_unsupported(call.kind, false));
    }
  }
  virtual Result<std::unique_ptr<SessionRequest>> start(const coll::CollectiveCall& call) {
    return Status(Code::kUnsupported, collective_unsupported(call.kind, true));
  }

  // Point-to-point (gw_isend / gw_irecv, the header's rules): not collective, thread-safe.
  // The C layer has checked peer (a rank; irecv: or GW_ANY_SOURCE) and tag (>= 0). The default
  // refuses with kUnsupported (both modes override it).
  virtual Result<std::unique_ptr<SessionRequest>> isend(const void* buf, size_t bytes, int peer,
                                                        int tag) {
    return Status(Code::kUnsupported, p2p_unsupported());
  }
  virtual Result<std::unique_ptr<SessionRequest>> irecv(void* buf, size_t bytes, int peer,
                                                        int tag) {
    return Status(Code::kUnsupported, p2p_unsupported());
  }

  // gw_allreduce_compressed: buf may be host or GPU memory; count may be 0.
  virtual Status allreduce_compressed(void* buf, size_t count, coll::DataType dtype,
                                      std::string_view codec_spec, std::string_view tensor_key) = 0;
  // Counters of the compressed calls on this rank; safe while a compressed call runs on another
  // thread (waits for it), like reset_compression_stats and release_compression.
  virtual Result<gw_comm_stats_t> compression_stats() = 0;
  virtual Status reset_compression_stats() = 0;
  // Frees the residuals and codec state of every tensor key.
  virtual Status release_compression() = 0;

  // gw_mem_alloc / gw_mem_free: memory the collectives of this Session use best (the daemon's
  // arena in daemon mode: zero-copy). bytes > 0. mem_free refuses (kInvalidArg) a pointer that
  // mem_alloc of this Session did not return or that was freed already.
  virtual Result<void*> mem_alloc(size_t bytes) = 0;
  virtual Status mem_free(void* ptr) = 0;

  // Whether the collectives take CUDA device memory: the object that stages it (direct mode), or
  // null where this mode refuses it (the C layer then fails the call with kUnsupported naming the
  // argument). Shared: a staged request holds it until it completes.
  virtual std::shared_ptr<DeviceMemory> device_memory() const { return nullptr; }

  // Thread-safe, idempotent, never blocks: every pending and later collective ends in kAborted.
  virtual void abort() = 0;
  virtual bool aborted() const = 0;

  // Collective over this Session's ranks: those passing the same color >= 0 form a new
  // communicator, ranked by key and then by rank here. A rank passing color < 0 joins none and
  // gets a null Session. The new Session is independent of this one (either may be destroyed
  // first) and may be used beside it from the same thread.
  virtual Result<std::unique_ptr<Session>> split(int color, int key) = 0;

  // The job's rendezvous store and its host, for the parameter server's rendezvous (capi/kv.cc);
  // nullptr for a world of one in daemon mode.
  virtual std::shared_ptr<Store> job_store() const { return nullptr; }
  virtual std::string store_host() const { return ""; }
  // Daemon mode: true, with the address of the job's parameter server in this rank's daemon ("":
  // the daemon has none) and the job token its Hellos carry. Direct mode: false.
  virtual bool daemon_kv(std::string* address, std::string* token) const { return false; }

  // What the session resolved (transport, channels, algorithms...) for the start-up log line.
  virtual std::string describe() const { return ""; }
  // describe()'s parts by name, for gw_comm_describe (see Communicator::resolved).
  virtual std::map<std::string, std::string> resolved() const { return {{"summary", describe()}}; }

 private:
  static std::string collective_unsupported(coll::CallKind kind, bool nonblocking) {
    const bool has_blocking = kind < coll::CallKind::kAlltoallv;
    return std::string("daemon mode (GW_DAEMON) does not have ") +
           (nonblocking ? "the non-blocking form of " : "") + coll::call_name(kind) +
           " yet; use direct mode (GW_DAEMON unset) for it" +
           (nonblocking && has_blocking ? ", or the blocking call" : "");
  }
  // The default for sessions without point-to-point: direct and daemon mode both have it and
  // override isend/irecv, so only a mode added without it says this.
  static const char* p2p_unsupported() {
    return "this communicator's mode has no point-to-point (gw_send/gw_recv/gw_isend/gw_irecv)";
  }
};

}  // namespace gw::capi
