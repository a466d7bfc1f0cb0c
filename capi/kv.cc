// The parameter server's C ABI (gw_kv_*, include/gradwire/gradwire.h) over kv/: the argument
// checks every entry point makes (as the rest of the C ABI: NULL, dtype, sizes, host memory,
// handles), the store's rendezvous through the job's store, and the i-forms as requests that
// gw_wait/gw_test complete.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "capi/capi_internal.h"
#include "capi/session.h"
#include "collectives/types.h"
#include "core/bootstrap_env.h"
#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/store.h"
#include "core/store_socket.h"
#include "gpudirect/cuda_driver.h"
#include "gradwire/gradwire.h"
#include "kv/client.h"
#include "kv/kv_config.h"
#include "kv/server.h"

using gw::Result;
using gw::Status;
using namespace gw::capi;  // NOLINT: this file implements gw::capi

namespace {

constexpr uint64_t kKvMagic = 0x3156764b77477747ull;  // "GwGwKvV1"
constexpr int64_t kJobProbeMs = 1000;  // gw_kv_serve: how long the job's store may take to answer

}  // namespace

struct gw_kv_s {
  uint64_t magic = kKvMagic;
  uint64_t id = 0;
  int64_t timeout_ms = 0;
  std::mutex mu;  // one destroy
  std::shared_ptr<gw::kv::Client> client;
  std::unique_ptr<gw::kv::Server> server;  // co-located (GW_KV_SERVERS=0)
};

namespace {

struct KvRegistry {
  std::mutex mu;
  std::unordered_set<gw_kv_s*> live;
};

KvRegistry& kv_registry() {
  static KvRegistry* r = new KvRegistry();  // never freed: used until the last call
  return *r;
}

Result<std::shared_ptr<gw::kv::Client>> client_of(gw_kv_t kv) {
  if (kv == nullptr) return gw::invalid_arg("kv is NULL");
  KvRegistry& reg = kv_registry();
  std::lock_guard<std::mutex> lock(reg.mu);
  if (reg.live.count(kv) == 0 || kv->magic != kKvMagic || !kv->client) {
    return gw::invalid_arg("kv was destroyed or is not a gradwire key-value store");
  }
  return kv->client;
}

constexpr size_t kKvConfigMinSize = offsetof(gw_kv_config_t, mode) + sizeof(gw_kv_mode_t);

// The caller's config, checked, as the servers' StoreConfig (workers filled in by the caller).
Result<gw::kv::StoreConfig> read_kv_config(const gw_kv_config_t* cfg, int workers) {
  if (cfg == nullptr) return gw::invalid_arg("cfg is NULL: pass a GW_KV_CONFIG_INIT config");
  const size_t size = cfg->size;
  if (size == 0) return gw::invalid_arg("cfg.size is 0: initialise cfg with GW_KV_CONFIG_INIT");
  if (size < kKvConfigMinSize) {
    return gw::invalid_arg("cfg.size {} is too small: initialise cfg with GW_KV_CONFIG_INIT", size);
  }
  if (size > sizeof(gw_kv_config_t)) {
    return gw::unsupported(
        "cfg.size {} is larger than this library's gw_kv_config_t ({} bytes): built against a "
        "newer gradwire.h",
        size, sizeof(gw_kv_config_t));
  }
  gw_kv_config_t c = GW_KV_CONFIG_INIT;
  std::memcpy(&c, cfg, size);  // fields beyond the caller's size keep their defaults
  c.size = sizeof(c);
  const int mode = raw_enum(c.mode), update = raw_enum(c.update);
  if (mode < GW_KV_BSP || mode > GW_KV_SYNC) {
    return gw::invalid_arg("cfg.mode {} is not a gw_kv_mode_t (GW_KV_BSP, _SSP, _ASP, _SYNC)",
                           mode);
  }
  if (update < GW_KV_UPDATE_SUM || update > GW_KV_UPDATE_SGD) {
    return gw::invalid_arg("cfg.update {} is not a gw_kv_update_t", update);
  }
  if (mode == GW_KV_SSP && c.staleness < 0) {
    return gw::invalid_arg("cfg.staleness {} < 0 (ssp:S needs S >= 0)", c.staleness);
  }
  if (mode == GW_KV_SYNC && (c.sync_k < 1 || c.sync_k > workers)) {
    return gw::invalid_arg("cfg.sync_k {} is out of range [1, {}] (the communicator's ranks)",
                           c.sync_k, workers);
  }
  if (update == GW_KV_UPDATE_SGD) {
    if (!(c.lr > 0 && c.lr < 1e300)) return gw::invalid_arg("cfg.lr {} must be > 0 for sgd", c.lr);
    if (!(c.momentum >= 0 && c.momentum < 1)) {
      return gw::invalid_arg("cfg.momentum {} must be in [0, 1)", c.momentum);
    }
  }
  std::string codec;  // canonical spec of the pushes' codec ("" none)
  if (c.codec != nullptr && c.codec[0] != '\0' && std::string_view(c.codec) != "none") {
    auto spec = gw::kv::check_codec_spec(c.codec);
    if (!spec.ok()) return spec.status().with_context(fmt::format("cfg.codec '{}'", c.codec));
    codec = gw::coll::format_codec_spec(*spec);
  }
  size_t part = c.partition_bytes;
  if (part == 0)
    part = static_cast<size_t>(gw::config::get_int(gw::kv::kv_config::kPartitionBytes));
  if (part < 64 || part > gw::kv::kMaxPartitionBytes) {
    return gw::invalid_arg("partition_bytes {} is out of range [64, {}]{}", part,
                           gw::kv::kMaxPartitionBytes,
                           c.partition_bytes == 0 ? " (GW_KV_PARTITION_BYTES)" : "");
  }
  gw::kv::StoreConfig s;
  s.workers = static_cast<uint32_t>(workers);
  s.mode = static_cast<uint32_t>(mode);
  s.staleness = mode == GW_KV_SSP ? c.staleness : 0;
  s.sync_k = mode == GW_KV_SYNC ? c.sync_k : 0;
  s.update = static_cast<uint32_t>(update);
  s.lr = update == GW_KV_UPDATE_SGD ? c.lr : 0;
  s.momentum = update == GW_KV_UPDATE_SGD ? c.momentum : 0;
  s.partition_bytes = part;
  s.codec = codec;
  return s;
}

bool is_server_role() { return gw::config::get_string(gw::kv::kv_config::kRole) == "server"; }

Status create(gw_comm_t comm, const gw_kv_config_t* cfg, gw_kv_t* out) {
  if (out == nullptr) return gw::invalid_arg("argument kv (the output pointer) is NULL");
  *out = nullptr;
  GW_ASSIGN_OR_RETURN(auto session, usable(comm));
  GW_ASSIGN_OR_RETURN(gw::kv::StoreConfig sc, read_kv_config(cfg, session->size()));
  if (is_server_role()) {
    return gw::invalid_arg(
        "GW_ROLE=server: this process is a kv server (gw_kv_serve), not a worker");
  }
  std::shared_ptr<gw::Store> store = session->job_store();
  std::string daemon_addr, daemon_token;
  const bool daemon = session->daemon_kv(&daemon_addr, &daemon_token);
  const int64_t servers_env = gw::config::get_int(gw::kv::kv_config::kServers);
  if (servers_env < 0 || servers_env > 65536) {
    return gw::invalid_arg("GW_KV_SERVERS {} is out of range [0, 65536]", servers_env);
  }
  if (daemon && servers_env != 0) {
    return gw::invalid_arg(
        "GW_KV_SERVERS={}: in daemon mode (GW_DAEMON) the job's daemons are its kv servers; unset "
        "GW_KV_SERVERS (or unset GW_DAEMON to use server processes)",
        servers_env);
  }
  if (daemon && daemon_addr.empty()) {
    return gw::unsupported(
        "gradwired has no kv server for this job (it could not start one: see its log)");
  }
  if (!store && !daemon) {
    return gw::unsupported("the parameter server needs the job's rendezvous store");
  }
  const int64_t timeout_ms = gw::config::get_int(gw::core_config::kTimeoutMs);
  const gw::sys::Deadline deadline = gw::sys::deadline_after_ms(timeout_ms);
  const int rank = session->rank(), size = session->size();

  // A job-wide store id: rank 0 draws it, the communicator's broadcast hands it out. A world of
  // one in daemon mode has no store: its job (and so its daemon's server) is its own.
  int64_t id = 0;
  if (!store) {
    static std::atomic<int64_t> solo_ids{0};
    id = ++solo_ids;
  } else if (rank == 0) {
    GW_ASSIGN_OR_RETURN(id, store->add("kv/next_store", 1, deadline));
  }
  GW_RETURN_IF_ERROR(session->broadcast(&id, 1, gw::coll::DataType::kI64, 0));

  auto h = std::make_unique<gw_kv_s>();
  h->id = static_cast<uint64_t>(id);
  h->timeout_ms = timeout_ms;
  const std::string token =
      daemon ? daemon_token : gw::config::get_string(gw::core_config::kJobToken);
  gw::kv::ClientOptions co;
  co.rank = static_cast<uint32_t>(rank);
  co.store_id = h->id;
  co.config = sc;
  co.token = token;
  co.timeout_ms = timeout_ms;
  if (daemon) {
    // Daemon mode: every daemon of the job serves a share of the keys. Each rank publishes its
    // daemon's server; the servers are the distinct addresses in rank order (the same list on
    // every rank: a daemon's index is the place of its lowest rank).
    std::vector<std::string> all;
    if (!store) {
      all.push_back(daemon_addr);
    } else {
      GW_RETURN_IF_ERROR(store->set(fmt::format("kv/{}/daemon/{}", id, rank),
                                    gw::Bytes(daemon_addr.begin(), daemon_addr.end()), deadline));
      for (int r = 0; r < size; ++r) {
        GW_ASSIGN_OR_RETURN(gw::Bytes b,
                            store->get(fmt::format("kv/{}/daemon/{}", id, r), deadline));
        all.emplace_back(b.begin(), b.end());
      }
    }
    for (const std::string& a : all) {
      if (std::find(co.servers.begin(), co.servers.end(), a) == co.servers.end()) {
        co.servers.push_back(a);
      }
    }
  } else if (servers_env == 0) {
    gw::kv::ServerOptions so;
    so.rank = rank;
    so.token = token;
    so.timeout_ms = timeout_ms;
    so.route_host = session->store_host();
    GW_ASSIGN_OR_RETURN(h->server, gw::kv::Server::start(so));
    const std::string mine = h->server->address();
    GW_RETURN_IF_ERROR(store->set(fmt::format("kv/{}/server/{}", id, rank),
                                  gw::Bytes(mine.begin(), mine.end()), deadline));
    for (int r = 0; r < size; ++r) {
      GW_ASSIGN_OR_RETURN(gw::Bytes b, store->get(fmt::format("kv/{}/server/{}", id, r), deadline));
      co.servers.emplace_back(b.begin(), b.end());
    }
  } else {
    for (int64_t i = 0; i < servers_env; ++i) {
      auto b = store->get(fmt::format("kv/server/{}", i), deadline);
      if (!b.ok()) {
        return gw::timeout_error(
            "kv server {} of GW_KV_SERVERS={} did not register in the job's store within "
            "GW_TIMEOUT_MS: start it with GW_ROLE=server GW_KV_SERVER_RANK={} (gw_kv_serve, "
            "gradwire-run --servers) ({})",
            i, servers_env, i, b.status().message());
      }
      co.servers.emplace_back(b->begin(), b->end());
    }
  }
  GW_ASSIGN_OR_RETURN(auto client, gw::kv::Client::connect(co));
  h->client = std::move(client);
  gw_kv_s* raw = h.release();
  {
    KvRegistry& reg = kv_registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.live.insert(raw);
  }
  *out = raw;
  return gw::ok_status();
}

// The parameter server reads and writes values with the CPU: CUDA device memory is refused by
// name (asked of the driver only when the process has it loaded, as capi/host_memory.cc does).
Status refuse_device_memory(const char* arg, const void* p) {
  if (gw::cuda::resident_memory_kind(p) != gw::cuda::MemoryKind::kDevice) return gw::ok_status();
  return gw::unsupported(
      "argument {} is CUDA device memory: the parameter server (gw_kv_*) takes host memory only "
      "(copy the tensor to host memory)",
      arg);
}

// The checks of one data call; the bytes of the value.
Status check_data(const char* call, uint64_t key, const void* value, const void* out, size_t count,
                  int dtype, bool pull_only) {
  (void)key;
  (void)call;
  GW_RETURN_IF_ERROR(check_dtype(dtype));
  if (count == 0) return gw::invalid_arg("count is 0: a key holds at least one element");
  GW_ASSIGN_OR_RETURN(size_t bytes, buffer_bytes("count", count, dtype));
  if (!pull_only) {
    GW_RETURN_IF_ERROR(check_buffer("value", value, bytes));
    GW_RETURN_IF_ERROR(refuse_device_memory("value", value));
  }
  if (out != nullptr || pull_only) {
    GW_RETURN_IF_ERROR(check_buffer("out", out, bytes));
    GW_RETURN_IF_ERROR(refuse_device_memory("out", out));
  }
  if (!pull_only && out != nullptr && out != value) {
    const auto* a = static_cast<const uint8_t*>(value);
    const auto* b = static_cast<const uint8_t*>(out);
    if (a < b + bytes && b < a + bytes) {
      return gw::invalid_arg("value and out overlap partially (in place: pass the same pointer)");
    }
  }
  return gw::ok_status();
}

class KvRequest final : public SessionRequest {
 public:
  explicit KvRequest(std::shared_ptr<gw::kv::Op> op) : op_(std::move(op)) {}
  Status wait(int64_t timeout_ms) override {
    if (timeout_ms < 0) return op_->wait(gw::sys::Deadline::max(), true);
    return op_->wait(gw::sys::deadline_after_ms(timeout_ms), false);
  }
  Status test(bool* done) override {
    *done = op_->done();
    return *done ? op_->result() : gw::ok_status();
  }

 private:
  std::shared_ptr<gw::kv::Op> op_;
};

using Kind = gw::kv::Client::Kind;

Status start(const char* call, gw_kv_t kv, Kind kind, uint64_t key, const void* value, void* out,
             size_t count, int dtype, int priority, gw_request_t* req) {
  GW_ASSIGN_OR_RETURN(auto client, client_of(kv));
  GW_RETURN_IF_ERROR(check_data(call, key, kind == Kind::kPull ? nullptr : value,
                                kind == Kind::kPull || kind == Kind::kPushPull ? out : nullptr,
                                count, dtype, kind == Kind::kPull));
  if (req != nullptr) *req = nullptr;
  GW_ASSIGN_OR_RETURN(auto op, client->start(kind, key, value, out, count,
                                             static_cast<gw::coll::DataType>(dtype), priority));
  if (req == nullptr) return op->wait(gw::sys::Deadline::max(), true);
  *req = register_request(std::make_unique<KvRequest>(std::move(op)), 0);
  return gw::ok_status();
}

Status istart(const char* call, gw_kv_t kv, Kind kind, uint64_t key, const void* value, void* out,
              size_t count, int dtype, int priority, gw_request_t* req) {
  if (req == nullptr) return gw::invalid_arg("argument req (the output pointer) is NULL");
  *req = nullptr;
  return start(call, kv, kind, key, value, out, count, dtype, priority, req);
}

Status serve(const gw_config_t* cfg) {
  gw_config_t c = GW_CONFIG_INIT;
  if (cfg != nullptr) {
    if (cfg->size == 0 || cfg->size > sizeof(gw_config_t)) {
      return gw::invalid_arg("config.size {} is not this library's gw_config_t: use GW_CONFIG_INIT",
                             cfg->size);
    }
    std::memcpy(&c, cfg, cfg->size);
  }
  std::string host;
  int port = 0;
  if (c.store_addr != nullptr) {
    Status s = gw::store_socket::parse_addr(c.store_addr, false, &host, &port);
    if (!s.ok()) return gw::invalid_arg("config.store_addr: {}", s.message());
  } else {
    GW_ASSIGN_OR_RETURN(gw::StoreAddress a, gw::store_address_from_env());
    host = a.host;
    port = a.port;
  }
  if (host.empty()) {
    return gw::invalid_arg(
        "no store address: set MASTER_ADDR/MASTER_PORT or GW_STORE (the workers' rank 0 hosts it)");
  }
  const int64_t servers = gw::config::get_int(gw::kv::kv_config::kServers);
  const int64_t rank = gw::config::get_int(gw::kv::kv_config::kServerRank);
  if (servers < 1) {
    return gw::invalid_arg(
        "GW_KV_SERVERS is {}: a server process needs the number of servers (>= 1)", servers);
  }
  if (rank < 0 || rank >= servers) {
    return gw::invalid_arg("GW_KV_SERVER_RANK {} is out of range [0, {}) (GW_KV_SERVERS)", rank,
                           servers);
  }
  const int64_t timeout_ms =
      c.timeout_ms > 0 ? c.timeout_ms : gw::config::get_int(gw::core_config::kTimeoutMs);
  if (timeout_ms <= 0) return gw::invalid_arg("GW_TIMEOUT_MS {} must be positive", timeout_ms);
  const std::string token = c.job_token != nullptr
                                ? std::string(c.job_token)
                                : gw::config::get_string(gw::core_config::kJobToken);
  gw::kv::ServerOptions so;
  so.rank = static_cast<int>(rank);
  so.token = token;
  so.timeout_ms = timeout_ms;
  so.route_host = host;
  GW_ASSIGN_OR_RETURN(auto server, gw::kv::Server::start(so));
  gw::TcpStoreOptions to;
  to.host = host;
  to.port = port;
  to.token = token;
  to.connect_timeout_ms = timeout_ms;
  auto store = gw::TcpStore::create(to);
  if (!store.ok()) return store.status().with_context("kv server: the job's store");
  const std::string addr = server->address();
  const std::string key = fmt::format("kv/server/{}", rank);
  GW_RETURN_IF_ERROR((*store)->set(key, gw::Bytes(addr.begin(), addr.end()),
                                   gw::sys::deadline_after_ms(timeout_ms)));
  GW_LOG_INFO("gradwire kv server {} of {} serving at {} (store {}:{})", rank, servers,
              server->address(), host, port);
  // The job is there as long as its rendezvous store (rank 0) answers.
  std::shared_ptr<gw::TcpStore> job = *store;
  Status s =
      server->serve([&] { return job->get(key, gw::sys::deadline_after_ms(kJobProbeMs)).ok(); });
  server->stop();
  return s;
}

}  // namespace

GW_EXPORT gw_status_t gw_kv_create(gw_comm_t comm, const gw_kv_config_t* cfg, gw_kv_t* kv) {
  return guarded("gw_kv_create", [&] { return create(comm, cfg, kv); });
}

GW_EXPORT gw_status_t gw_kv_init(gw_kv_t kv, uint64_t key, const void* value, size_t count,
                                 gw_dtype_t dtype) {
  return guarded("gw_kv_init", [&] {
    return start("gw_kv_init", kv, Kind::kInit, key, value, nullptr, count, raw_enum(dtype), 0,
                 nullptr);
  });
}

GW_EXPORT gw_status_t gw_kv_push(gw_kv_t kv, uint64_t key, const void* value, size_t count,
                                 gw_dtype_t dtype, int priority) {
  return guarded("gw_kv_push", [&] {
    return start("gw_kv_push", kv, Kind::kPush, key, value, nullptr, count, raw_enum(dtype),
                 priority, nullptr);
  });
}

GW_EXPORT gw_status_t gw_kv_pull(gw_kv_t kv, uint64_t key, void* out, size_t count,
                                 gw_dtype_t dtype, int priority) {
  return guarded("gw_kv_pull", [&] {
    return start("gw_kv_pull", kv, Kind::kPull, key, nullptr, out, count, raw_enum(dtype), priority,
                 nullptr);
  });
}

GW_EXPORT gw_status_t gw_kv_pushpull(gw_kv_t kv, uint64_t key, const void* value, void* out,
                                     size_t count, gw_dtype_t dtype, int priority) {
  return guarded("gw_kv_pushpull", [&] {
    if (out == nullptr) return gw::invalid_arg("argument out is NULL");
    return start("gw_kv_pushpull", kv, Kind::kPushPull, key, value, out, count, raw_enum(dtype),
                 priority, nullptr);
  });
}

GW_EXPORT gw_status_t gw_kv_ipush(gw_kv_t kv, uint64_t key, const void* value, size_t count,
                                  gw_dtype_t dtype, int priority, gw_request_t* req) {
  return guarded("gw_kv_ipush", [&] {
    return istart("gw_kv_ipush", kv, Kind::kPush, key, value, nullptr, count, raw_enum(dtype),
                  priority, req);
  });
}

GW_EXPORT gw_status_t gw_kv_ipull(gw_kv_t kv, uint64_t key, void* out, size_t count,
                                  gw_dtype_t dtype, int priority, gw_request_t* req) {
  return guarded("gw_kv_ipull", [&] {
    return istart("gw_kv_ipull", kv, Kind::kPull, key, nullptr, out, count, raw_enum(dtype),
                  priority, req);
  });
}

GW_EXPORT gw_status_t gw_kv_ipushpull(gw_kv_t kv, uint64_t key, const void* value, void* out,
                                      size_t count, gw_dtype_t dtype, int priority,
                                      gw_request_t* req) {
  return guarded("gw_kv_ipushpull", [&] {
    if (out == nullptr) return gw::invalid_arg("argument out is NULL");
    return istart("gw_kv_ipushpull", kv, Kind::kPushPull, key, value, out, count, raw_enum(dtype),
                  priority, req);
  });
}

GW_EXPORT gw_status_t gw_kv_clock(gw_kv_t kv) {
  return guarded("gw_kv_clock", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto client, client_of(kv));
    return client->clock();
  });
}

GW_EXPORT gw_status_t gw_kv_stats(gw_kv_t kv, gw_kv_stats_t* out) {
  return guarded("gw_kv_stats", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto client, client_of(kv));
    if (out == nullptr) return gw::invalid_arg("argument out is NULL");
    const size_t size = out->size;
    if (size < offsetof(gw_kv_stats_t, clock) + sizeof(uint64_t)) {
      return gw::invalid_arg("out->size {} is too small: set it to sizeof(gw_kv_stats_t)", size);
    }
    const gw::kv::ClientStats s = client->stats();
    gw_kv_stats_t full{sizeof(gw_kv_stats_t), s.clock, s.min_clock, s.dropped, s.lost};
    std::memcpy(out, &full, std::min(size, sizeof(full)));
    out->size = std::min(size, sizeof(full));
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_kv_destroy(gw_kv_t kv) {
  return guarded("gw_kv_destroy", [&]() -> Status {
    if (kv == nullptr) return gw::invalid_arg("kv is NULL");
    {
      KvRegistry& reg = kv_registry();
      std::lock_guard<std::mutex> lock(reg.mu);
      if (reg.live.erase(kv) == 0 || kv->magic != kKvMagic) {
        return gw::invalid_arg("kv was destroyed or is not a gradwire key-value store");
      }
    }
    std::unique_ptr<gw_kv_s> h(kv);
    h->magic = 0;
    (void)h->client->close();
    Status s;
    if (h->server) {
      // Co-located: the other workers may still use this worker's server until they destroy too.
      s = h->server->wait_finished(h->id, gw::sys::deadline_after_ms(h->timeout_ms));
      h->server->stop();
    }
    return s;
  });
}

GW_EXPORT gw_status_t gw_kv_serve(const gw_config_t* cfg) {
  return guarded("gw_kv_serve", [&] { return serve(cfg); });
}
