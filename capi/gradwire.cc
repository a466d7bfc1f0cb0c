// The C ABI (include/gradwire/gradwire.h) over a Session (capi/session.h).
//
// Every entry point validates its arguments before touching anything, converts Status to
// gw_status_t (same numeric values) and keeps the message for gw_last_error(); no exception
// leaves it. Handles are slots of a table (capi/handle_table.h) checked without a lock, so a
// destroyed or foreign handle is reported instead of dereferenced (as long as its slot has not
// been reused by a newer handle). The checks that hold whatever runs the collectives (NULL
// pointers, dtype/op, sizes, overlaps, root) are made here, once; the Session does the rest.
#include "gradwire/gradwire.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "capi/capi_internal.h"
#include "capi/daemon_session.h"
#include "capi/direct_session.h"
#include "capi/fusion_session.h"
#include "capi/handle_table.h"
#include "capi/session.h"
#include "collectives/types.h"
#include "core/bootstrap.h"
#include "core/bootstrap_env.h"
#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/net_config.h"
#include "core/store_socket.h"
#include "core/sys/unix_socket.h"
#include "daemon/control.h"
#include "daemon/daemon_config.h"

#ifndef GW_VERSION_STRING
#error "GW_VERSION_STRING must be defined by the build (core/CMakeLists.txt)"
#endif
#ifdef GW_GIT_COMMIT
#define GW_COMMIT_SUFFIX " (commit " GW_GIT_COMMIT ")"
#else
#define GW_COMMIT_SUFFIX ""
#endif

namespace gw::capi {

using gw::Code;
using gw::Result;
using gw::Status;

constexpr uint64_t kCommMagic = 0x31436d6d6f437747ull;  // "GwCommC1"
// How long gw_comm_destroy waits for calls on other threads to notice its abort.
constexpr std::chrono::seconds kDestroyWait{5};

}  // namespace gw::capi

using namespace gw::capi;  // NOLINT: this file implements gw::capi

// A slot of the handle table (capi/handle_table.h). A call resolves its handle without a lock
// (lookup): it announces itself in `users`, then reads `magic`; gw_comm_destroy clears `magic`,
// then waits until `users` is 0 before it takes `session` away, so a call either sees the handle
// destroyed or holds the session (seq_cst on both sides).
struct gw_comm {
  std::atomic<uint64_t> magic{0};  // kCommMagic while the handle is live
  std::atomic<int> users{0};       // lookups between their check of magic and their copy
  std::shared_ptr<Session> session;
};

namespace {

using CommTable = HandleTable<gw_comm>;

// Creation and destruction of handles, one at a time (lookups do not take it).
std::mutex& comms_mu() {
  static std::mutex* mu = new std::mutex();
  return *mu;
}

Result<gw_comm_t> register_comm(std::shared_ptr<Session> session) {
  std::lock_guard<std::mutex> lock(comms_mu());
  gw_comm* h = CommTable::instance().acquire();
  if (h == nullptr) return gw::no_memory("too many communicators alive at once");
  h->session = std::move(session);
  h->magic.store(kCommMagic, std::memory_order_seq_cst);
  return h;
}

// The fields gw_comm_init cannot do without: a config shorter than this is refused.
constexpr size_t kConfigMinSize = offsetof(gw_config_t, world_size) + sizeof(int);

// The caller's config as this library's gw_config_t: the fields that lie wholly within the
// caller's config.size are copied, the rest (a caller built against an older header) keep the
// defaults of GW_CONFIG_INIT. Only config.size bytes of the caller's memory are read.
Result<gw_config_t> read_config(const gw_config_t* config) {
  const size_t size = config->size;
  if (size == 0) {
    return gw::invalid_arg("config.size is 0: initialise the config with GW_CONFIG_INIT");
  }
  if (size < kConfigMinSize) {
    return gw::invalid_arg(
        "config.size {} is too small: gw_comm_init needs at least {} bytes (up to world_size); "
        "initialise the config with GW_CONFIG_INIT",
        size, kConfigMinSize);
  }
  if (size > sizeof(gw_config_t)) {
    return gw::unsupported(
        "config.size {} is larger than this library's gw_config_t ({} bytes, gradwire {}): the "
        "program was built against a newer gradwire.h and its newer fields would be ignored",
        size, sizeof(gw_config_t), GW_VERSION_STRING);
  }
  gw_config_t cfg = GW_CONFIG_INIT;
  auto has = [size](size_t offset, size_t bytes) { return offset + bytes <= size; };
#define GW_TAKE_FIELD(f) \
  if (has(offsetof(gw_config_t, f), sizeof(cfg.f))) cfg.f = config->f
  GW_TAKE_FIELD(rank);
  GW_TAKE_FIELD(world_size);
  GW_TAKE_FIELD(store_addr);
  GW_TAKE_FIELD(transport);
  GW_TAKE_FIELD(timeout_ms);
  GW_TAKE_FIELD(job_token);
#undef GW_TAKE_FIELD
  static_assert(sizeof(gw_config_t) == offsetof(gw_config_t, job_token) + sizeof(const char*),
                "a field was added to gw_config_t: take it in read_config");
  return cfg;
}

// The configuration resolved against the launcher and the environment, and checked.
Result<SessionOptions> resolve(const gw_config_t& cfg) {
  if (cfg.rank < 0) return gw::invalid_arg("config.rank {} < 0", cfg.rank);
  if (cfg.world_size < 0) return gw::invalid_arg("config.world_size {} < 0", cfg.world_size);
  if (cfg.timeout_ms < 0) return gw::invalid_arg("config.timeout_ms {} < 0", cfg.timeout_ms);
  // The settings (gw::config::validate) are checked by the session's create(): a rank checks
  // them once it can say in the store why it refused them, so the other ranks do not wait for it.

  SessionOptions o;
  o.rank = cfg.rank;
  o.world_size = cfg.world_size;
  std::string pmix_token;  // rank 0's, when the launcher was PMIx and GW_JOB_TOKEN is unset
  if (o.world_size == 0) {
    // Rank and size from the launcher; the store address too unless given.
    GW_ASSIGN_OR_RETURN(gw::LaunchInfo info, gw::detect_launch());
    if (cfg.rank != 0) {
      return gw::invalid_arg("config.rank {} given without config.world_size", cfg.rank);
    }
    o.rank = info.rank;
    o.world_size = info.world_size;
    o.store_host = info.store_host;
    o.store_port = info.store_port;
    o.launcher = info.source;
    o.store_source = info.store_source;
    pmix_token = info.job_token;
  } else {
    o.launcher = "config";
    if (o.rank >= o.world_size) {
      return gw::invalid_arg("config.rank {} is out of range for config.world_size {}", o.rank,
                             o.world_size);
    }
    if (cfg.store_addr == nullptr && o.world_size > 1) {
      GW_ASSIGN_OR_RETURN(gw::StoreAddress a, gw::store_address_from_env());
      o.store_host = a.host;
      o.store_port = a.port;
      o.store_source = a.source;
    }
  }
  if (o.world_size == 1 && cfg.store_addr == nullptr) {
    // One rank talks to nobody: it reads no store address from the environment (above), and
    // drops one a launcher gave. A half-set MASTER_ADDR/MASTER_PORT (torch's own test suite sets
    // MASTER_ADDR alone, then makes groups of one rank) is no reason to refuse it; under
    // torchrun MASTER_PORT is torch's own TCPStore, which rank 0 could not host again.
    o.store_host.clear();
    o.store_port = 0;
    o.store_source.clear();
  }
  if (cfg.store_addr != nullptr) {
    Status s = gw::store_socket::parse_addr(cfg.store_addr, false, &o.store_host, &o.store_port);
    if (!s.ok()) return gw::invalid_arg("config.store_addr: {}", s.message());
    o.store_source = "config.store_addr";
  }
  o.timeout_ms =
      cfg.timeout_ms > 0 ? cfg.timeout_ms : gw::config::get_int(gw::core_config::kTimeoutMs);
  if (o.timeout_ms <= 0) {
    return gw::invalid_arg("GW_TIMEOUT_MS {} must be positive", o.timeout_ms);
  }
  o.job_token = cfg.job_token != nullptr ? std::string(cfg.job_token)
                                         : gw::config::get_string(gw::core_config::kJobToken);
  o.token_source = cfg.job_token != nullptr ? "config.job_token"
                   : o.job_token.empty()    ? ""
                                            : "GW_JOB_TOKEN";
  if (o.job_token.empty() && !pmix_token.empty()) {
    o.job_token = pmix_token;
    o.token_source = "PMIx (made by rank 0)";
  }
  o.transport = cfg.transport != nullptr ? std::string(cfg.transport)
                                         : gw::config::get_string(gw::net::net_config::kTransport);
  if (o.transport.empty()) return gw::invalid_arg("config.transport is empty");
  return o;
}

// The one INFO line a communicator logs when it is ready: what was chosen and where from.
std::string startup_line(const SessionOptions& o, const Session& session) {
  std::string store = "none (one rank)";
  if (!o.store_host.empty()) {
    store = fmt::format("{}:{} ({}{})", o.store_host, o.store_port,
                        o.store_source.empty() ? "launcher" : o.store_source,
                        o.rank == 0 ? ", hosted by this rank" : "");
  }
  std::string token = o.token_source.empty()
                          ? (o.world_size > 1 ? "made by rank 0 and shared through the store"
                                              : "none needed (one rank)")
                          : "from " + o.token_source;
  return fmt::format(
      "gradwire {}{}: communicator ready: rank {} of {}, launcher {}, store {}, "
      "job token {}, {}",
      GW_VERSION_STRING, GW_COMMIT_SUFFIX, o.rank, o.world_size, o.launcher, store, token,
      session.describe());
}

// GW_DAEMON as a session address: "" (direct mode) or "unix:PATH". "auto" is the daemon at
// GW_DAEMON_SOCKET when its control socket accepts a connection (a probe the daemon ignores
// silently), else direct mode, said once at INFO.
Result<std::string> daemon_address() {
  const std::string daemon = gw::config::get_string(gw::daemon_config::kDaemon);
  if (daemon != "auto") return daemon;
  const std::string path = gw::config::get_string(gw::daemon_config::kSocket);
  const std::string ctl = gw::daemon::control_socket_path(path);
  auto addr = gw::sys::UnixAddress::path(ctl);
  Status why = addr.status();
  if (addr.ok()) {
    auto probe = gw::sys::connect_unix(*addr, SOCK_STREAM);
    if (probe.ok()) return "unix:" + path;
    why = probe.status();
  }
  GW_LOG_INFO("GW_DAEMON=auto: no gradwired answers at {} ({}): direct mode", path, why.message());
  return std::string();
}

Status init(gw_comm_t* out, const gw_config_t& cfg) {
  if (out == nullptr) return gw::invalid_arg("argument comm (the output pointer) is NULL");
  GW_ASSIGN_OR_RETURN(SessionOptions o, resolve(cfg));
  gw::log::set_rank(o.rank);
  if (o.rank == 0) {  // once a process: a job's communicators share their store and its exposure
    static std::once_flag warned;
    const std::string why =
        gw::tokenless_job_warning(o.token_source, o.world_size, o.store_host, o.store_port);
    if (!why.empty()) std::call_once(warned, [&] { GW_LOG_WARN("gradwire: {}", why); });
  }
  GW_ASSIGN_OR_RETURN(const std::string daemon, daemon_address());
  std::unique_ptr<Session> session;
  if (!daemon.empty()) {
    GW_ASSIGN_OR_RETURN(session, DaemonSession::create(o, daemon));
  } else {
    GW_ASSIGN_OR_RETURN(session, DirectSession::create(o));
    session = with_fusion(std::move(session), o.timeout_ms);  // daemon mode: no fusion yet
  }
  GW_LOG_INFO("{}", startup_line(o, *session));
  GW_ASSIGN_OR_RETURN(*out, register_comm(std::move(session)));
  return gw::ok_status();
}

const char* status_text(int s) {
  switch (s) {
    case GW_OK:
      return "GW_OK: success";
    case GW_ERR_INVALID_ARG:
      return "GW_ERR_INVALID_ARG: bad argument (NULL pointer, unknown dtype/op, size overflow, "
             "...)";
    case GW_ERR_TIMEOUT:
      return "GW_ERR_TIMEOUT: a deadline (GW_TIMEOUT_MS) passed";
    case GW_ERR_PEER:
      return "GW_ERR_PEER: a peer closed, died or sent something unexpected";
    case GW_ERR_SYSTEM:
      return "GW_ERR_SYSTEM: a system call failed";
    case GW_ERR_UNSUPPORTED:
      return "GW_ERR_UNSUPPORTED: not available in this build or on this host";
    case GW_ERR_NO_MEMORY:
      return "GW_ERR_NO_MEMORY: out of memory";
    case GW_ERR_ABORTED:
      return "GW_ERR_ABORTED: the communicator was aborted (gw_comm_abort)";
    case GW_ERR_INTERNAL:
      return "GW_ERR_INTERNAL: a bug in gradwire: please report it with gw_last_error()";
  }
  return "GW_ERR_?: unknown gw_status_t value";
}

}  // namespace

namespace gw::capi {

thread_local std::string t_last_error;

gw_status_t fail(const char* call, const Status& s) {
  const std::string& m = s.message();
  if (m.rfind(call, 0) == 0) {
    t_last_error = m;
  } else {
    t_last_error = fmt::format("{}: {}", call, m);
  }
  return static_cast<gw_status_t>(static_cast<int>(s.code()));
}

Status check_dtype(int v) {
  if (!gw::coll::valid_dtype(v)) {
    return gw::invalid_arg("argument dtype: unknown gw_dtype_t value {}", v);
  }
  return gw::ok_status();
}

Status check_op(int v) {
  if (!gw::coll::valid_op(v)) return gw::invalid_arg("argument op: unknown gw_op_t value {}", v);
  return gw::ok_status();
}

Result<size_t> buffer_bytes(const char* arg, size_t count, int dtype, size_t blocks) {
  size_t elem = gw::coll::dtype_size(static_cast<gw::coll::DataType>(dtype));
  size_t elems = 0;
  size_t bytes = 0;
  if (__builtin_mul_overflow(count, blocks, &elems) ||
      __builtin_mul_overflow(elems, elem, &bytes)) {
    return gw::invalid_arg("argument {}: {} x {} elements of {} bytes overflow size_t", arg, count,
                           blocks, elem);
  }
  if (bytes > kMaxBufferBytes) {
    return gw::invalid_arg(
        "argument {}: {} x {} elements of {} bytes ({} bytes) are more than any buffer of this "
        "process can hold ({} bytes)",
        arg, count, blocks, elem, bytes, kMaxBufferBytes);
  }
  return bytes;
}

Status check_buffer(const char* name, const void* p, size_t bytes) {
  if (p == nullptr && bytes > 0) {
    return gw::invalid_arg("argument {} is NULL with {} bytes to transfer", name, bytes);
  }
  const uint64_t start = reinterpret_cast<uintptr_t>(p);
  if (bytes > kMaxBufferBytes || start > kMaxBufferBytes - bytes) {
    return gw::invalid_arg("argument {}: {} bytes from {} pass the end of the address space", name,
                           bytes, p);
  }
  return gw::ok_status();
}

Result<std::shared_ptr<Session>> lookup(gw_comm_t comm) {
  if (comm == nullptr) return gw::invalid_arg("comm is NULL");
  // No lock: the table tells its slots from other pointers; a slot is read only through its
  // atomics until magic says it is live, and destroy waits for users to leave.
  if (!CommTable::instance().contains(comm)) {
    return gw::invalid_arg("comm was destroyed or is not a gradwire communicator");
  }
  comm->users.fetch_add(1, std::memory_order_seq_cst);
  std::shared_ptr<Session> session;
  if (comm->magic.load(std::memory_order_seq_cst) == kCommMagic) session = comm->session;
  comm->users.fetch_sub(1, std::memory_order_release);
  if (!session) return gw::invalid_arg("comm was destroyed or is not a gradwire communicator");
  return session;
}

// A live communicator that has not been aborted.
Result<std::shared_ptr<Session>> usable(gw_comm_t comm) {
  GW_ASSIGN_OR_RETURN(auto session, lookup(comm));
  if (session->aborted()) {
    return gw::aborted_error("comm was aborted (gw_comm_abort); destroy it and create a new one");
  }
  return session;
}

}  // namespace gw::capi

GW_EXPORT gw_status_t gw_comm_init_from_env(gw_comm_t* comm) {
  return guarded("gw_comm_init_from_env", [&] {
    const gw_config_t cfg = GW_CONFIG_INIT;
    return init(comm, cfg);
  });
}

GW_EXPORT gw_status_t gw_comm_init(gw_comm_t* comm, const gw_config_t* config) {
  return guarded("gw_comm_init", [&] {
    if (config == nullptr) return gw::invalid_arg("argument config is NULL");
    GW_ASSIGN_OR_RETURN(gw_config_t cfg, read_config(config));
    return init(comm, cfg);
  });
}

GW_EXPORT gw_status_t gw_comm_destroy(gw_comm_t comm) {
  return guarded("gw_comm_destroy", [&]() -> Status {
    if (comm == nullptr) return gw::ok_status();
    std::shared_ptr<Session> session;
    {
      std::lock_guard<std::mutex> lock(comms_mu());
      if (!CommTable::instance().contains(comm) ||
          comm->magic.load(std::memory_order_seq_cst) != kCommMagic) {
        return gw::invalid_arg("comm was destroyed or is not a gradwire communicator");
      }
      comm->magic.store(0, std::memory_order_seq_cst);
      // A lookup that saw the handle live is copying the session: a few instructions.
      while (comm->users.load(std::memory_order_seq_cst) != 0) std::this_thread::yield();
      session = std::move(comm->session);
      CommTable::instance().release(comm);
    }
    // Pending work ends now: an iallreduce in flight and calls blocked on other threads end in
    // GW_ERR_ABORTED, and this returns only once none of them can still touch a caller's buffer.
    // Calls on other threads hold the session while they run; the abort ends them promptly.
    session->abort();
    const auto deadline = std::chrono::steady_clock::now() + kDestroyWait;
    while (session.use_count() > 1) {
      if (std::chrono::steady_clock::now() >= deadline) {
        return gw::timeout_error(
            "a call on another thread did not return within {} ms of the abort; the "
            "communicator is freed when it returns",
            std::chrono::duration_cast<std::chrono::milliseconds>(kDestroyWait).count());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    session.reset();  // ends the iallreduce thread and closes the connections
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_abort(gw_comm_t comm) {
  return guarded("gw_comm_abort", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, lookup(comm));
    session->abort();
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_split(gw_comm_t comm, int color, int key, gw_comm_t* newcomm) {
  return guarded("gw_comm_split", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, usable(comm));
    if (newcomm == nullptr) {
      return gw::invalid_arg("argument newcomm (the output pointer) is NULL");
    }
    GW_ASSIGN_OR_RETURN(std::unique_ptr<Session> child, session->split(color, key));
    if (color < 0) {
      if (child) return gw::internal_error("split with color {} returned a communicator", color);
      *newcomm = nullptr;
      return gw::ok_status();
    }
    if (!child) return gw::internal_error("split with color {} returned no communicator", color);
    GW_ASSIGN_OR_RETURN(*newcomm, register_comm(std::move(child)));
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_rank(gw_comm_t comm, int* rank) {
  return guarded("gw_comm_rank", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, lookup(comm));
    if (rank == nullptr) return gw::invalid_arg("argument rank (the output pointer) is NULL");
    *rank = session->rank();
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_size(gw_comm_t comm, int* size) {
  return guarded("gw_comm_size", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, lookup(comm));
    if (size == nullptr) return gw::invalid_arg("argument size (the output pointer) is NULL");
    *size = session->size();
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_describe(gw_comm_t comm, const char* key, char* buf, size_t len,
                                       size_t* needed) {
  return guarded("gw_comm_describe", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, lookup(comm));
    if (key == nullptr) return gw::invalid_arg("argument key is NULL");
    if (buf == nullptr && len > 0) return gw::invalid_arg("argument buf is NULL with len {}", len);
    const std::map<std::string, std::string> all = session->resolved();
    auto it = all.find(key);
    if (it == all.end()) {
      std::string keys;
      for (const auto& [k, v] : all) keys += (keys.empty() ? "" : ", ") + k;
      return gw::invalid_arg("key \"{}\": this communicator describes {}", key, keys);
    }
    const std::string& v = it->second;
    if (needed != nullptr) *needed = v.size() + 1;
    if (len > 0) {
      const size_t n = std::min(v.size(), len - 1);
      std::memcpy(buf, v.data(), n);
      buf[n] = '\0';
    }
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_config_set(const char* name, const char* value) {
  return guarded("gw_config_set", [&]() -> Status {
    if (name == nullptr) return gw::invalid_arg("argument name is NULL");
    const gw::config::Row* row = gw::config::find(name);
    if (row == nullptr) return gw::invalid_arg("unknown setting '{}'", name);
    if (value == nullptr) {
      gw::config::clear(*row);
      return gw::ok_status();
    }
    return gw::config::set(*row, value);
  });
}

GW_EXPORT gw_status_t gw_mem_alloc(gw_comm_t comm, size_t bytes, void** ptr) {
  return guarded("gw_mem_alloc", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    if (ptr == nullptr) return gw::invalid_arg("argument ptr (the output pointer) is NULL");
    if (bytes == 0) return gw::invalid_arg("argument bytes is 0");
    GW_ASSIGN_OR_RETURN(void* p, st->mem_alloc(bytes));
    *ptr = p;
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_mem_free(gw_comm_t comm, void* ptr) {
  return guarded("gw_mem_free", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, lookup(comm));
    if (ptr == nullptr) return gw::ok_status();
    return st->mem_free(ptr);
  });
}

GW_EXPORT const char* gw_status_string(gw_status_t status) { return status_text(raw_enum(status)); }

GW_EXPORT const char* gw_last_error(void) { return t_last_error.c_str(); }

GW_EXPORT const char* gw_version(void) { return GW_VERSION_STRING; }
