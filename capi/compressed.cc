// The compression part of the C ABI: gw_allreduce_compressed, gw_comm_stats,
// gw_comm_reset_stats, gw_comm_release_compression.
//
// The compressed allreduce (collectives/compress.h) needs only allreduce and allgather, so it runs
// on a Communicator adapter over the public gw_allreduce / gw_allgather of the same handle: the
// argument checks, abort handling and deadlines of those calls apply unchanged, and this file does
// not depend on capi/gradwire.cc's internals. The per-communicator state (a Compressor: residuals
// per tensor key, counters) lives in a side table keyed by the handle, freed by
// gw_comm_release_compression or at exit.
//
// Until capi/gradwire.cc offers the two hooks below, (1) a message of an error found here (bad
// spec, key reuse) reaches gw_last_error() only through gw_capi_set_last_error when it is defined,
// and is logged at warn level otherwise; (2) gw_comm_destroy does not release the state itself.
#include <fmt/format.h>

#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <unordered_map>

#include "collectives/communicator.h"
#include "collectives/compress.h"
#include "core/log.h"
#include "gradwire/gradwire.h"

#define GW_EXPORT extern "C" __attribute__((visibility("default")))

// Optional hook of capi/gradwire.cc: stores a message for gw_last_error() on this thread.
extern "C" void gw_capi_set_last_error(const char* message)
    __attribute__((weak, visibility("hidden")));

namespace {

using gw::Status;
using gw::coll::DataType;
using gw::coll::ReduceOp;

Status from_c(gw_status_t s, const char* what) {
  if (s == GW_OK) return gw::ok_status();
  return Status(static_cast<gw::Code>(static_cast<int>(s)),
                fmt::format("{}: {}", what, gw_last_error()));
}

// A Communicator over the C ABI handle (only what the compressed allreduce uses).
class CapiComm final : public gw::coll::Communicator {
 public:
  CapiComm(gw_comm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status allreduce(const void* send, void* recv, size_t count, DataType dtype,
                   ReduceOp op) override {
    return from_c(gw_allreduce(comm_, send, recv, count, static_cast<gw_dtype_t>(dtype),
                               static_cast<gw_op_t>(op)),
                  "allreduce");
  }
  Status allgather(const void* send, void* recv, size_t count, DataType dtype) override {
    return from_c(gw_allgather(comm_, send, recv, count, static_cast<gw_dtype_t>(dtype)),
                  "allgather");
  }
  Status broadcast(void* buf, size_t count, DataType dtype, int root) override {
    return from_c(gw_broadcast(comm_, buf, count, static_cast<gw_dtype_t>(dtype), root),
                  "broadcast");
  }
  Status reduce_scatter(const void* send, void* recv, size_t count, DataType dtype,
                        ReduceOp op) override {
    return from_c(gw_reduce_scatter(comm_, send, recv, count, static_cast<gw_dtype_t>(dtype),
                                    static_cast<gw_op_t>(op)),
                  "reduce_scatter");
  }
  Status barrier() override { return from_c(gw_barrier(comm_), "barrier"); }
  gw::Result<std::unique_ptr<gw::coll::AsyncOp>> iallreduce(const void*, void*, size_t, DataType,
                                                            ReduceOp) override {
    return gw::unsupported("iallreduce is not used by the compressed allreduce");
  }
  void abort() override { gw_comm_abort(comm_); }
  bool aborted() const override { return false; }
  gw::coll::Algo choose_allreduce_algo(size_t) const override { return gw::coll::Algo::kAuto; }

 private:
  gw_comm_t comm_;
  int rank_;
  int size_;
};

struct Entry {
  std::unique_ptr<CapiComm> comm;
  std::unique_ptr<gw::coll::Compressor> compressor;
  int rank = -1;
  int size = -1;
};

struct Table {
  std::mutex mu;
  std::unordered_map<gw_comm_t, std::shared_ptr<Entry>> entries;
};

Table& table() {
  static Table t;
  return t;
}

gw_status_t fail(const char* call, const Status& s, bool from_inner) {
  if (!from_inner) {
    const std::string msg = fmt::format("{}: {}", call, s.message());
    if (gw_capi_set_last_error) {
      gw_capi_set_last_error(msg.c_str());
    } else {
      GW_LOG_WARN("{}", msg);
    }
  }
  return static_cast<gw_status_t>(static_cast<int>(s.code()));
}

// The entry of a live handle, created on first use. A handle that the library rejects (NULL,
// destroyed) is reported by gw_comm_rank's own message; its stale entry is dropped.
gw_status_t entry_for(gw_comm_t comm, std::shared_ptr<Entry>* out) {
  int rank = -1, size = -1;
  gw_status_t s = gw_comm_rank(comm, &rank);
  if (s == GW_OK) s = gw_comm_size(comm, &size);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  auto it = t.entries.find(comm);
  if (s != GW_OK) {
    if (it != t.entries.end()) t.entries.erase(it);
    return s;
  }
  if (it != t.entries.end() && it->second->rank == rank && it->second->size == size) {
    *out = it->second;
    return GW_OK;
  }
  auto e = std::make_shared<Entry>();
  e->comm = std::make_unique<CapiComm>(comm, rank, size);
  e->compressor = std::make_unique<gw::coll::Compressor>(e->comm.get());
  e->rank = rank;
  e->size = size;
  t.entries[comm] = e;
  *out = std::move(e);
  return GW_OK;
}

template <typename F>
gw_status_t guarded(const char* call, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return fail(call, gw::no_memory("out of memory"), false);
  } catch (const std::exception& e) {
    return fail(call, gw::internal_error("unexpected exception: {}", e.what()), false);
  }
}

}  // namespace

GW_EXPORT gw_status_t gw_allreduce_compressed(gw_comm_t comm, void* buf, size_t count,
                                              gw_dtype_t dtype, const char* codec_spec,
                                              const char* tensor_key) {
  const char* call = "gw_allreduce_compressed";
  return guarded(call, [&]() -> gw_status_t {
    std::shared_ptr<Entry> e;
    gw_status_t s = entry_for(comm, &e);
    if (s != GW_OK) return s;
    if (codec_spec == nullptr)
      return fail(call, gw::invalid_arg("argument codec_spec is NULL"), false);
    if (tensor_key == nullptr)
      return fail(call, gw::invalid_arg("argument tensor_key is NULL"), false);
    const int d = static_cast<int>(dtype);
    if (!gw::coll::valid_dtype(d)) {
      return fail(call, gw::invalid_arg("argument dtype: unknown gw_dtype_t value {}", d), false);
    }
    if (count > SIZE_MAX / 4) {
      return fail(call, gw::invalid_arg("argument count {} overflows the buffer size", count),
                  false);
    }
    Status st =
        e->compressor->allreduce(buf, count, static_cast<DataType>(d), codec_spec, tensor_key);
    if (st.ok()) return GW_OK;
    // Errors of the inner gw_allreduce / gw_allgather already set gw_last_error().
    const bool inner = st.message().find("allreduce: ") != std::string::npos ||
                       st.message().find("allgather: ") != std::string::npos;
    return fail(call, st, inner && st.code() != gw::Code::kInvalidArg);
  });
}

GW_EXPORT gw_status_t gw_comm_stats(gw_comm_t comm, gw_comm_stats_t* out) {
  return guarded("gw_comm_stats", [&]() -> gw_status_t {
    std::shared_ptr<Entry> e;
    gw_status_t s = entry_for(comm, &e);
    if (s != GW_OK) return s;
    if (out == nullptr) {
      return fail("gw_comm_stats", gw::invalid_arg("argument out (the output pointer) is NULL"),
                  false);
    }
    const gw::coll::CompressStats st = e->compressor->stats();
    out->bytes_sent = st.bytes_sent;
    out->bytes_uncompressed = st.bytes_uncompressed;
    out->calls = st.calls;
    return GW_OK;
  });
}

GW_EXPORT gw_status_t gw_comm_reset_stats(gw_comm_t comm) {
  return guarded("gw_comm_reset_stats", [&]() -> gw_status_t {
    std::shared_ptr<Entry> e;
    gw_status_t s = entry_for(comm, &e);
    if (s != GW_OK) return s;
    e->compressor->reset_stats();
    return GW_OK;
  });
}

GW_EXPORT gw_status_t gw_comm_release_compression(gw_comm_t comm) {
  return guarded("gw_comm_release_compression", [&]() -> gw_status_t {
    Table& t = table();
    std::shared_ptr<Entry> dropped;  // freed outside the lock
    {
      std::lock_guard<std::mutex> lock(t.mu);
      auto it = t.entries.find(comm);
      if (it != t.entries.end()) {
        dropped = std::move(it->second);
        t.entries.erase(it);
      }
    }
    if (comm == nullptr) {
      return fail("gw_comm_release_compression", gw::invalid_arg("comm is NULL"), false);
    }
    return GW_OK;
  });
}
