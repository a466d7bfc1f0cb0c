// The fusing Session (capi/fusion_session.h).
#include "capi/fusion_session.h"

#include <algorithm>
#include <string>
#include <utility>

#include "capi/fusion_queue.h"
#include "collectives/coll_config.h"
#include "core/config.h"

namespace gw::capi {
namespace {

class FusionSession final : public Session {
 public:
  FusionSession(std::unique_ptr<Session> inner, FusionOptions o)
      : inner_(std::move(inner)),
        timeout_ms_(o.timeout_ms),
        queue_(std::make_shared<FusionQueue>(inner_.get(), o)) {}
  ~FusionSession() override { queue_->stop(); }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  bool takes_device_memory() const override { return inner_->takes_device_memory(); }
  Status device_collective(const coll::CollectiveCall& call) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->device_collective(call);
  }

  Status allreduce(const void* sendbuf, void* recvbuf, size_t count, coll::DataType dtype,
                   coll::ReduceOp op) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->allreduce(sendbuf, recvbuf, count, dtype, op);
  }
  Status broadcast(void* buf, size_t count, coll::DataType dtype, int root) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->broadcast(buf, count, dtype, root);
  }
  Status allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                   coll::DataType dtype) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->allgather(sendbuf, recvbuf, sendcount, dtype);
  }
  Status reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount, coll::DataType dtype,
                        coll::ReduceOp op) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->reduce_scatter(sendbuf, recvbuf, recvcount, dtype, op);
  }
  Status alltoall(const void* sendbuf, void* recvbuf, size_t count, coll::DataType dtype) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->alltoall(sendbuf, recvbuf, count, dtype);
  }
  Status barrier() override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->barrier();
  }
  Result<std::unique_ptr<SessionRequest>> iallreduce(const void* sendbuf, void* recvbuf,
                                                     size_t count, coll::DataType dtype,
                                                     coll::ReduceOp op) override {
    if (queue_->fusible(count * coll::dtype_size(dtype))) {
      return queue_->submit(sendbuf, recvbuf, count, dtype, op);
    }
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->iallreduce(sendbuf, recvbuf, count, dtype, op);
  }
  Status run(const coll::CollectiveCall& call) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->run(call);
  }
  Result<std::unique_ptr<SessionRequest>> start(const coll::CollectiveCall& call) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->start(call);
  }
  // Point-to-point is not ordered with the collectives: nothing to drain.
  Result<std::unique_ptr<SessionRequest>> isend(const void* buf, size_t bytes, int peer,
                                                int tag) override {
    return inner_->isend(buf, bytes, peer, tag);
  }
  Result<std::unique_ptr<SessionRequest>> irecv(void* buf, size_t bytes, int peer,
                                                int tag) override {
    return inner_->irecv(buf, bytes, peer, tag);
  }

  Status allreduce_compressed(void* buf, size_t count, coll::DataType dtype,
                              std::string_view codec_spec, std::string_view tensor_key) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    return inner_->allreduce_compressed(buf, count, dtype, codec_spec, tensor_key);
  }
  Result<gw_comm_stats_t> compression_stats() override { return inner_->compression_stats(); }
  Status reset_compression_stats() override { return inner_->reset_compression_stats(); }
  Status release_compression() override { return inner_->release_compression(); }

  Result<void*> mem_alloc(size_t bytes) override { return inner_->mem_alloc(bytes); }
  Status mem_free(void* ptr) override { return inner_->mem_free(ptr); }
  std::shared_ptr<DeviceMemory> device_memory() const override { return inner_->device_memory(); }

  void abort() override {
    inner_->abort();  // first: a round waiting on its agreement ends
    queue_->abort();
  }
  bool aborted() const override { return inner_->aborted(); }

  Result<std::unique_ptr<Session>> split(int color, int key) override {
    GW_RETURN_IF_ERROR(queue_->drain());
    GW_ASSIGN_OR_RETURN(std::unique_ptr<Session> child, inner_->split(color, key));
    if (!child) return child;
    return with_fusion(std::move(child), timeout_ms_);
  }
  std::shared_ptr<Store> job_store() const override { return inner_->job_store(); }
  std::string store_host() const override { return inner_->store_host(); }
  bool daemon_kv(std::string* address, std::string* token) const override {
    return inner_->daemon_kv(address, token);
  }
  std::string describe() const override { return inner_->describe(); }
  std::map<std::string, std::string> resolved() const override { return inner_->resolved(); }

 private:
  std::unique_ptr<Session> inner_;
  const int64_t timeout_ms_;
  std::shared_ptr<FusionQueue> queue_;  // holds a pointer to *inner_; stopped before it goes
};

}  // namespace

std::unique_ptr<Session> with_fusion(std::unique_ptr<Session> inner, int64_t timeout_ms) {
  FusionOptions o;
  o.threshold = static_cast<size_t>(
      std::max<int64_t>(0, config::get_int(coll::coll_config::kFusionThreshold)));
  o.cycle_ms = std::max(0.0, config::get_double(coll::coll_config::kCycleTimeMs));
  o.timeout_ms = timeout_ms;
  o.world_size = inner->size();
  if (o.threshold == 0 || o.world_size <= 1) return inner;
  return std::make_unique<FusionSession>(std::move(inner), o);
}

}  // namespace gw::capi
