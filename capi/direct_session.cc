#include "capi/direct_session.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "capi/device_memory.h"
#include "capi/setup_checks.h"
#include "collectives/p2p.h"
#include "collectives/shared_host_memory.h"
#include "core/bootstrap.h"
#include "core/log.h"
#include "gpudirect/cuda_driver.h"
#include "gpudirect/device_compression.h"

namespace gw::capi {

namespace {

class DirectRequest final : public SessionRequest {
 public:
  explicit DirectRequest(std::unique_ptr<coll::AsyncOp> op) : op_(std::move(op)) {}
  Status wait(int64_t timeout_ms) override { return op_->wait(timeout_ms); }
  Status test(bool* done) override { return op_->test(done); }

 private:
  std::unique_ptr<coll::AsyncOp> op_;
};

// The TCP stores of this process's live communicators, by address, token and role. A second
// communicator of the same job (gw_comm_init_from_env called again) shares the first one's store
// instead of binding the server's port twice; each communicator still works under its own key
// prefix (collectives/group.cc numbers them per rank), so they do not see each other's keys.
// Rank 0's store (host_server) is never shared with a client of the same address in this process
// (ranks run as threads of one process in tests): the server must come from rank 0's own call.
class StoreCache {
 public:
  Result<std::shared_ptr<Store>> get(const TcpStoreOptions& so) {
    const std::string key = fmt::format("{}|{}|{}|{}", so.host, so.port,
                                        so.host_server ? "server" : "client", so.token);
    // Rank 0 holds the lock while it binds (quick, and two binds of one port must not race);
    // a client does not, since its connect waits for rank 0, possibly a thread of this process.
    std::unique_lock<std::mutex> lock(mu_);
    if (auto found = stores_[key].lock()) return found;
    if (!so.host_server) lock.unlock();
    auto tcp = TcpStore::create(so);
    if (!tcp.ok()) return tcp.status();
    std::shared_ptr<Store> made = std::move(*tcp);
    if (!so.host_server) lock.lock();
    if (auto raced = stores_[key].lock()) return raced;  // another thread's client won
    stores_[key] = made;
    return made;
  }

 private:
  std::mutex mu_;
  std::map<std::string, std::weak_ptr<Store>> stores_;
};

class DirectP2PRequest final : public SessionRequest {
 public:
  explicit DirectP2PRequest(std::shared_ptr<coll::P2PRequest> req) : req_(std::move(req)) {}
  Status wait(int64_t timeout_ms) override { return req_->wait(timeout_ms); }
  Status test(bool* done) override { return req_->test(done); }
  bool p2p_result(size_t* bytes, int* source) const override {
    *bytes = req_->bytes();
    *source = req_->source();
    return true;
  }

 private:
  std::shared_ptr<coll::P2PRequest> req_;
};

StoreCache& store_cache() {
  static StoreCache* cache = new StoreCache();  // never freed: used until the last session goes
  return *cache;
}

}  // namespace

Result<std::shared_ptr<Store>> open_job_store(const SessionOptions& options) {
  if (options.store_host.empty()) {
    if (options.world_size > 1) {
      return invalid_arg(
          "no store address for {} ranks: set config.store_addr, GW_STORE or "
          "MASTER_ADDR/MASTER_PORT",
          options.world_size);
    }
    return make_memory_store();  // a world of one talks to nobody
  }
  TcpStoreOptions so;
  so.host = options.store_host;
  so.port = options.store_port;
  so.host_server = options.rank == 0;
  so.token = options.job_token;
  so.connect_timeout_ms = options.timeout_ms;
  auto shared = store_cache().get(so);
  if (!shared.ok()) return shared.status().with_context("rendezvous store");
  return std::move(*shared);
}

Result<std::unique_ptr<Session>> DirectSession::create(const SessionOptions& options) {
  coll::CommOptions co;
  co.rank = options.rank;
  co.world_size = options.world_size;
  co.transport = options.transport;
  co.timeout_ms = options.timeout_ms;
  co.job_token = options.job_token;
  co.route_host = options.store_host;
  co.mode = "direct";
  co.launcher = options.launcher;
  // Every setting this rank can check alone is checked before the rendezvous; a refused one is
  // still said in the store (rank 0 hosts it for that), so the other ranks fail at once naming
  // this rank instead of waiting out GW_TIMEOUT_MS.
  const Status local = coll::Communicator::check_options(co);
  if (!local.ok()) return fail_before_rendezvous(options, local);
  GW_ASSIGN_OR_RETURN(std::shared_ptr<Store> store, open_job_store(options));
  co.store = store;
  GW_ASSIGN_OR_RETURN(auto comm, coll::Communicator::create(co));
  return std::unique_ptr<Session>(
      new DirectSession(std::move(store), std::move(comm), options.store_host));
}

DirectSession::DirectSession(std::shared_ptr<Store> store, std::unique_ptr<coll::Communicator> comm,
                             std::string store_host)
    : store_(std::move(store)),
      comm_(std::move(comm)),
      rank_(comm_->rank()),
      size_(comm_->size()),
      store_host_(std::move(store_host)) {
  const auto r = comm_->resolved();
  const auto t = r.find("transport");
  device_memory_ =
      std::make_shared<DeviceMemory>(rank_, t == r.end() ? std::string("local") : t->second);
}

std::map<std::string, std::string> DirectSession::resolved() const {
  std::map<std::string, std::string> r = comm_->resolved();
  r["device_memory"] = device_memory_->path();
  const DeviceMemory::Counters c = device_memory_->counters();
  r["device_memory_stats"] = fmt::format(
      "staged_ranges={} pool_allocations={} registered_hits={} stale_registrations={} "
      "cache_hits={} cache_invalidations={} registrations={}",
      c.staged_ranges, c.pool_allocations, c.registered_hits, c.stale_registrations, c.cache_hits,
      c.cache_invalidations, c.registrations);
  return r;
}

// Out of line: DeviceCompression is complete only here.
DirectSession::~DirectSession() {
  for (void* p : mem_) {
    if (!coll::shared_host_memory::release(p)) std::free(p);
  }
}

// Shared host memory when the communicator's allreduce maps its peers' buffers (one host, shm:
// collectives/shm_direct.h); heap memory otherwise, or when the kernel refuses a region.
Result<void*> DirectSession::mem_alloc(size_t bytes) {
  constexpr size_t kAlign = 64;
  if (bytes > SIZE_MAX - kAlign) return no_memory("gw_mem_alloc of {} bytes", bytes);
  void* p = nullptr;
  if (comm_->wants_shared_host_memory()) {
    Result<void*> shared = coll::shared_host_memory::allocate(bytes);
    if (shared.ok()) {
      p = shared.value();
    } else {
      GW_LOG_DEBUG("gw_mem_alloc: no shared region of {} bytes ({}); heap memory instead", bytes,
                   shared.status().message());
    }
  }
  if (p == nullptr) p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (p == nullptr) return no_memory("gw_mem_alloc of {} bytes", bytes);
  std::lock_guard<std::mutex> lock(mem_mu_);
  mem_.insert(p);
  return p;
}

Status DirectSession::mem_free(void* ptr) {
  std::lock_guard<std::mutex> lock(mem_mu_);
  if (mem_.erase(ptr) == 0) {
    return invalid_arg("pointer {} was not returned by gw_mem_alloc on this communicator", ptr);
  }
  if (!coll::shared_host_memory::release(ptr)) std::free(ptr);
  return ok_status();
}

Status DirectSession::allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                coll::DataType dtype, coll::ReduceOp op) {
  return comm_->allreduce(sendbuf, recvbuf, count, dtype, op);
}

Status DirectSession::broadcast(void* buf, size_t count, coll::DataType dtype, int root) {
  return comm_->broadcast(buf, count, dtype, root);
}

Status DirectSession::allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                coll::DataType dtype) {
  return comm_->allgather(sendbuf, recvbuf, sendcount, dtype);
}

Status DirectSession::reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                     coll::DataType dtype, coll::ReduceOp op) {
  return comm_->reduce_scatter(sendbuf, recvbuf, recvcount, dtype, op);
}

Status DirectSession::alltoall(const void* sendbuf, void* recvbuf, size_t count,
                               coll::DataType dtype) {
  return comm_->alltoall(sendbuf, recvbuf, count, dtype);
}

Status DirectSession::barrier() { return comm_->barrier(); }

Result<std::unique_ptr<SessionRequest>> DirectSession::iallreduce(const void* sendbuf,
                                                                  void* recvbuf, size_t count,
                                                                  coll::DataType dtype,
                                                                  coll::ReduceOp op) {
  GW_ASSIGN_OR_RETURN(auto op_handle, comm_->iallreduce(sendbuf, recvbuf, count, dtype, op));
  if (!op_handle) return internal_error("iallreduce returned no operation");
  return std::unique_ptr<SessionRequest>(new DirectRequest(std::move(op_handle)));
}

coll::Compressor& DirectSession::compressor() {
  if (!compressor_) compressor_ = std::make_unique<coll::Compressor>(comm_.get());
  return *compressor_;
}

Status DirectSession::allreduce_compressed(void* buf, size_t count, coll::DataType dtype,
                                           std::string_view codec_spec,
                                           std::string_view tensor_key) {
  std::lock_guard<std::mutex> lock(compress_mu_);
  if (count > 0 && cuda::is_device_pointer(buf)) {
    if (!device_compression_) device_compression_ = std::make_shared<cuda::DeviceCompression>();
    return device_compression_->allreduce(compressor(), buf, count, dtype, codec_spec, tensor_key);
  }
  return compressor().allreduce(buf, count, dtype, codec_spec, tensor_key);
}

Result<gw_comm_stats_t> DirectSession::compression_stats() {
  std::lock_guard<std::mutex> lock(compress_mu_);
  const coll::CompressStats s = compressor().stats();
  gw_comm_stats_t out{};
  out.bytes_sent = s.bytes_sent;
  out.bytes_uncompressed = s.bytes_uncompressed;
  out.calls = s.calls;
  return out;
}

Status DirectSession::reset_compression_stats() {
  std::lock_guard<std::mutex> lock(compress_mu_);
  compressor().reset_stats();
  return ok_status();
}

Status DirectSession::release_compression() {
  std::lock_guard<std::mutex> lock(compress_mu_);
  compressor_.reset();
  device_compression_.reset();
  return ok_status();
}

Result<std::unique_ptr<Session>> DirectSession::split(int color, int key) {
  GW_ASSIGN_OR_RETURN(std::unique_ptr<coll::Communicator> child, comm_->split(color, key));
  if (!child) return std::unique_ptr<Session>();  // color < 0: joins none
  // The child shares the store: rank 0's server must outlive every communicator that uses it.
  return std::unique_ptr<Session>(new DirectSession(store_, std::move(child), store_host_));
}

Result<std::unique_ptr<SessionRequest>> DirectSession::start(const coll::CollectiveCall& call) {
  GW_ASSIGN_OR_RETURN(auto op_handle, comm_->start(call));
  if (!op_handle) return internal_error("{}: no operation", coll::call_name(call.kind));
  return std::unique_ptr<SessionRequest>(new DirectRequest(std::move(op_handle)));
}

Result<std::unique_ptr<SessionRequest>> DirectSession::isend(const void* buf, size_t bytes,
                                                             int peer, int tag) {
  GW_ASSIGN_OR_RETURN(auto req, comm_->isend(buf, bytes, peer, tag));
  return std::unique_ptr<SessionRequest>(new DirectP2PRequest(std::move(req)));
}

Result<std::unique_ptr<SessionRequest>> DirectSession::irecv(void* buf, size_t bytes, int peer,
                                                             int tag) {
  GW_ASSIGN_OR_RETURN(auto req, comm_->irecv(buf, bytes, peer, tag));
  return std::unique_ptr<SessionRequest>(new DirectP2PRequest(std::move(req)));
}

}  // namespace gw::capi
