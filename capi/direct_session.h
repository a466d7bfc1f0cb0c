// The in-process Session: a gw::coll::Communicator of this process, its rendezvous store and the
// compression state of gw_allreduce_compressed (host residuals in a Compressor, GPU residuals and
// staging in gpudirect/device_compression.h's DeviceCompression), all freed with the Session.
#pragma once

#include <memory>
#include <mutex>
#include <unordered_set>

#include "capi/session.h"
#include "collectives/communicator.h"
#include "collectives/compress/compress.h"
#include "core/store.h"

namespace gw::cuda {
class DeviceCompression;  // gpudirect/device_compression.h
}  // namespace gw::cuda

namespace gw::capi {

// The job's rendezvous store, opened the same way by both session kinds: the TCP store at the
// options' address (rank 0 hosts it), shared by this process's sessions of the same address,
// token and role (a second communicator of a job must not bind the port twice); a world of one
// without an address gets a memory store. kInvalidArg for several ranks without an address.
Result<std::shared_ptr<Store>> open_job_store(const SessionOptions& options);

class DirectSession final : public Session {
 public:
  // Connects to (rank 0: hosts) the store and joins the communicator; collective over
  // options.world_size ranks, bounded by options.timeout_ms.
  static Result<std::unique_ptr<Session>> create(const SessionOptions& options);

  DirectSession(std::shared_ptr<Store> store, std::unique_ptr<coll::Communicator> comm);
  ~DirectSession() override;
  DirectSession(const DirectSession&) = delete;
  DirectSession& operator=(const DirectSession&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

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
  Status run(const coll::CollectiveCall& call) override { return comm_->run(call); }
  Result<std::unique_ptr<SessionRequest>> start(const coll::CollectiveCall& call) override;
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

  void abort() override { comm_->abort(); }
  bool aborted() const override { return comm_->aborted(); }

  std::shared_ptr<DeviceMemory> device_memory() const override { return device_memory_; }

  Result<std::unique_ptr<Session>> split(int color, int key) override;
  std::string describe() const override { return comm_->describe(); }
  // The communicator's, and "device_memory" / "device_memory_stats" (capi/device_memory.h).
  std::map<std::string, std::string> resolved() const override;

 private:
  // The comm's compressor, created on first use. Callers hold compress_mu_.
  coll::Compressor& compressor();

  // Declared in this order so that the compression state goes before the communicator it runs on,
  // and the communicator before the store (rank 0's TcpStore hosts the server).
  std::shared_ptr<Store> store_;
  std::unique_ptr<coll::Communicator> comm_;
  const int rank_;
  const int size_;

  std::mutex compress_mu_;  // one compressed call (or stats/reset/release) at a time
  std::unique_ptr<coll::Compressor> compressor_;
  std::shared_ptr<cuda::DeviceCompression> device_compression_;

  std::shared_ptr<DeviceMemory> device_memory_;  // staging of device buffers (never null)

  std::mutex mem_mu_;
  std::unordered_set<void*> mem_;  // gw_mem_alloc'd, freed with the Session
};

}  // namespace gw::capi
