#include "core/pmix_bootstrap.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/socket_util.h"
#include "core/net/tcp_config.h"

#if defined(GW_HAVE_PMIX)
#include <pmix.h>
#endif

namespace gw {

bool in_pmix_job() {
  return std::getenv("PMIX_NAMESPACE") != nullptr && std::getenv("PMIX_RANK") != nullptr;
}

#if !defined(GW_HAVE_PMIX)

Result<PmixJob> pmix_bootstrap(int64_t) {
  return unsupported(
      "PMIx bootstrap not built (pmix.h was not found: apt-get install libpmix-dev)");
}

#else

namespace {

// The part of libpmix used here, loaded on first use.
struct PmixApi {
  decltype(&PMIx_Init) init = nullptr;
  decltype(&PMIx_Finalize) finalize = nullptr;
  decltype(&PMIx_Put) put = nullptr;
  decltype(&PMIx_Commit) commit = nullptr;
  decltype(&PMIx_Fence) fence = nullptr;
  decltype(&PMIx_Get) get = nullptr;
  decltype(&PMIx_Value_destruct) value_destruct = nullptr;
  decltype(&PMIx_Error_string) error_string = nullptr;
};

Result<const PmixApi*> load_pmix() {
  static PmixApi api;
  static std::string error;
  static std::once_flag once;
  std::call_once(once, [] {
    // RTLD_GLOBAL: PMIx's own plugins resolve its symbols against the library.
    void* h = dlopen("libpmix.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (h == nullptr) {
      const char* e = dlerror();
      error = std::string("cannot load libpmix.so.2: ") + (e != nullptr ? e : "unknown error");
      return;
    }
    auto sym = [&](const char* name, auto* out) {
      *out = reinterpret_cast<std::remove_pointer_t<decltype(out)> >(dlsym(h, name));
      if (*out == nullptr && error.empty()) error = std::string("libpmix.so.2 lacks ") + name;
    };
    sym("PMIx_Init", &api.init);
    sym("PMIx_Finalize", &api.finalize);
    sym("PMIx_Put", &api.put);
    sym("PMIx_Commit", &api.commit);
    sym("PMIx_Fence", &api.fence);
    sym("PMIx_Get", &api.get);
    sym("PMIx_Value_destruct", &api.value_destruct);
    sym("PMIx_Error_string", &api.error_string);
  });
  if (!error.empty()) return unsupported("PMIx bootstrap: {}", error);
  return &api;
}

void set_key(char* dst, const char* key) {
  std::memset(dst, 0, PMIX_MAX_KEYLEN + 1);
  std::strncpy(dst, key, PMIX_MAX_KEYLEN);
}

// One PMIx session: PMIx_Init on creation, PMIx_Finalize on destruction (PMIx counts them, so an
// MPI library's own session is unaffected).
class Session {
 public:
  explicit Session(const PmixApi& api) : api_(api) {}
  ~Session() {
    if (initialized_) api_.finalize(nullptr, 0);
  }
  Status init() {
    pmix_status_t rc = api_.init(&me_, nullptr, 0);
    if (rc != PMIX_SUCCESS) return unsupported("PMIx_Init failed: {}", api_.error_string(rc));
    initialized_ = true;
    return ok_status();
  }
  const pmix_proc_t& me() const { return me_; }
  std::string why(pmix_status_t rc) const { return api_.error_string(rc); }

  Status put_string(const std::string& key, const std::string& value) {
    pmix_value_t v;
    std::memset(&v, 0, sizeof(v));
    v.type = PMIX_STRING;
    v.data.string = const_cast<char*>(value.c_str());
    char k[PMIX_MAX_KEYLEN + 1];
    set_key(k, key.c_str());
    pmix_status_t rc = api_.put(PMIX_GLOBAL, k, &v);
    if (rc != PMIX_SUCCESS) return internal_error("PMIx_Put({}): {}", key, why(rc));
    return ok_status();
  }

  // Rank `rank`'s value of `key` (PMIX_RANK_WILDCARD: the job's), as a string or a number.
  Result<std::string> get(uint32_t rank, const char* key) {
    pmix_proc_t p;
    std::memset(&p, 0, sizeof(p));
    std::memcpy(p.nspace, me_.nspace, sizeof(p.nspace));
    p.rank = rank;
    pmix_value_t* v = nullptr;
    pmix_status_t rc = api_.get(&p, key, nullptr, 0, &v);
    if (rc != PMIX_SUCCESS || v == nullptr) {
      return internal_error("PMIx_Get({}) from rank {}: {}", key, rank, why(rc));
    }
    std::string out;
    switch (v->type) {
      case PMIX_STRING:
        out = v->data.string != nullptr ? v->data.string : "";
        break;
      case PMIX_UINT32:
        out = std::to_string(v->data.uint32);
        break;
      case PMIX_UINT16:
        out = std::to_string(v->data.uint16);
        break;
      case PMIX_INT:
        out = std::to_string(v->data.integer);
        break;
      case PMIX_PROC_RANK:
        out = std::to_string(v->data.rank);
        break;
      default:
        out.clear();
    }
    api_.value_destruct(v);
    std::free(v);
    if (out.empty()) return internal_error("PMIx_Get({}): unexpected type", key);
    return out;
  }

  // Commits this rank's values and waits for every rank's (collected), within `timeout_ms`.
  Status commit_and_fence(int64_t timeout_ms) {
    pmix_status_t rc = api_.commit();
    if (rc != PMIX_SUCCESS) return internal_error("PMIx_Commit: {}", why(rc));
    pmix_proc_t all;
    std::memset(&all, 0, sizeof(all));
    std::memcpy(all.nspace, me_.nspace, sizeof(all.nspace));
    all.rank = PMIX_RANK_WILDCARD;
    pmix_info_t info[2];
    std::memset(info, 0, sizeof(info));
    set_key(info[0].key, PMIX_COLLECT_DATA);
    info[0].value.type = PMIX_BOOL;
    info[0].value.data.flag = true;
    set_key(info[1].key, PMIX_TIMEOUT);
    info[1].value.type = PMIX_INT;
    info[1].value.data.integer = static_cast<int>(std::max<int64_t>(1, (timeout_ms + 999) / 1000));
    rc = api_.fence(&all, 1, info, 2);
    if (rc == PMIX_ERR_TIMEOUT) {
      return timeout_error("PMIx_Fence: not every rank arrived within {} ms", timeout_ms);
    }
    if (rc != PMIX_SUCCESS) return peer_error("PMIx_Fence: {}", why(rc));
    return ok_status();
  }

 private:
  const PmixApi& api_;
  pmix_proc_t me_{};
  bool initialized_ = false;
};

Result<int> to_int(Result<std::string> s, const char* what) {
  if (!s.ok()) return s.status();
  char* end = nullptr;
  long v = std::strtol(s->c_str(), &end, 10);
  if (end == s->c_str() || *end != '\0' || v < 0 || v > (1 << 30)) {
    return internal_error("PMIx {} '{}' is not a count", what, *s);
  }
  return static_cast<int>(v);
}

// Rank 0's choice of the store's address: loopback when the whole job is on this node, else the
// address GW_SOCKET_IFNAME selects (by default the first interface that is up and not loopback,
// docker* or veth*), with a port the kernel has free now.
Result<std::pair<std::string, int> > choose_store_address(bool all_local) {
  std::string host = "127.0.0.1";
  if (!all_local) {
    GW_ASSIGN_OR_RETURN(std::vector<net::Interface> all, net::list_interfaces());
    GW_ASSIGN_OR_RETURN(
        net::Interface i,
        net::select_interface(config::get_string(net::tcp_config::kSocketIfname), all, nullptr));
    if (i.addr.ss_family != AF_INET) {
      return unsupported("PMIx bootstrap: interface {} has no IPv4 address for the store", i.name);
    }
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&i.addr)->sin_addr, buf, sizeof(buf));
    host = buf;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return system_error("PMIx bootstrap: socket", errno);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  inet_pton(AF_INET, host.c_str(), &a.sin_addr);
  socklen_t len = sizeof(a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    int err = errno;
    close(fd);
    return system_error("PMIx bootstrap: choosing a store port on " + host, err);
  }
  close(fd);
  return std::make_pair(host, static_cast<int>(ntohs(a.sin_port)));
}

Result<PmixJob> exchange(int64_t timeout_ms) {
  GW_ASSIGN_OR_RETURN(const PmixApi* api, load_pmix());
  Session s(*api);
  GW_RETURN_IF_ERROR(s.init());
  PmixJob job;
  job.rank = static_cast<int>(s.me().rank);
  GW_ASSIGN_OR_RETURN(job.world_size, to_int(s.get(PMIX_RANK_WILDCARD, PMIX_JOB_SIZE), "job size"));
  if (auto lr = to_int(s.get(s.me().rank, PMIX_LOCAL_RANK), "local rank"); lr.ok()) {
    job.local_rank = *lr;
  }
  if (auto ls = to_int(s.get(PMIX_RANK_WILDCARD, PMIX_LOCAL_SIZE), "local size"); ls.ok()) {
    job.local_world_size = *ls;
  }
  if (job.rank < 0 || job.rank >= job.world_size) {
    return internal_error("PMIx gives rank {} of a job of {}", job.rank, job.world_size);
  }
  const bool need_token = config::get_string(core_config::kJobToken).empty();
  if (job.rank == 0) {
    GW_ASSIGN_OR_RETURN(auto addr, choose_store_address(job.local_world_size == job.world_size));
    GW_RETURN_IF_ERROR(
        s.put_string("gradwire.store", fmt::format("{}:{}", addr.first, addr.second)));
    if (need_token) {
      // A secret: from the CSPRNG, never a fallback (a failure ends the bootstrap).
      GW_ASSIGN_OR_RETURN(std::string token, fresh_job_token());
      GW_RETURN_IF_ERROR(s.put_string("gradwire.token", token));
    }
  }
  GW_RETURN_IF_ERROR(s.commit_and_fence(timeout_ms));
  GW_ASSIGN_OR_RETURN(std::string store, s.get(0, "gradwire.store"));
  const size_t colon = store.rfind(':');
  if (colon == std::string::npos) return internal_error("PMIx: rank 0's store '{}'", store);
  job.store_host = store.substr(0, colon);
  job.store_port = std::atoi(store.c_str() + colon + 1);
  if (need_token) {
    GW_ASSIGN_OR_RETURN(job.job_token, s.get(0, "gradwire.token"));
  }
  GW_LOG_INFO("bootstrap: PMIx namespace {} rank {} of {}: store {} from rank 0{}", s.me().nspace,
              job.rank, job.world_size, store, need_token ? ", job token from rank 0" : "");
  return job;
}

}  // namespace

Result<PmixJob> pmix_bootstrap(int64_t timeout_ms) {
  static std::mutex mu;
  static std::optional<PmixJob> kept;
  std::lock_guard<std::mutex> lock(mu);
  if (kept) return *kept;
  GW_ASSIGN_OR_RETURN(PmixJob job, exchange(timeout_ms));
  kept = job;
  return job;
}

#endif

}  // namespace gw
