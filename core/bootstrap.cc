#include "core/bootstrap.h"

#include <arpa/inet.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string_view>
#include <thread>

#include "core/bootstrap_env.h"
#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/pmix_bootstrap.h"
#include "core/store_socket.h"

namespace gw {

namespace {

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

// Names of one launcher's variables. local_size may be null (the launcher has none we trust).
struct Launcher {
  const char* source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

constexpr Launcher kTorchrun{"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"};
constexpr Launcher kOpenMpi{"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"};
constexpr Launcher kSlurm{"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr};

Result<int> required_int(const char* name, const std::optional<std::string>& value,
                         const char* source) {
  if (!value) return invalid_arg("{} is not set ({} launch needs it)", name, source);
  return parse_env_int(name, *value);
}

Result<int> optional_int(const char* name) {
  if (name == nullptr) return -1;
  auto v = env(name);
  if (!v) return -1;
  return parse_env_int(name, *v);
}

Status check_rank(const char* rank_name, int rank, const char* size_name, int size) {
  if (size < 1) return invalid_arg("{}={} must be at least 1", size_name, size);
  if (rank < 0 || rank >= size) {
    return invalid_arg("{}={} is out of range for {}={} (want 0..{})", rank_name, rank, size_name,
                       size, size - 1);
  }
  return ok_status();
}

std::string read_first_line(const char* path) {
  std::ifstream f(path);
  std::string line;
  if (f) std::getline(f, line);
  return line;
}

constexpr const char* kTokenKey = "gw/job_token";

// A set-up failure as published under a key the others read (publish_setup_failure).
constexpr std::string_view kSetupFailed = "failed: ";
// The release key of a failed set-up: the ranks other than 0 say there that they know, and rank 0
// keeps its store until they all have (kFailureNoticeMs at most).
constexpr const char* kFailureSeenKey = "gw/setup_failure_seen";
constexpr int64_t kFailureNoticeMs = 2000;

std::optional<std::string> setup_failure_in(const Bytes& v) {
  if (v.size() < kSetupFailed.size() || std::string_view(reinterpret_cast<const char*>(v.data()),
                                                         kSetupFailed.size()) != kSetupFailed) {
    return std::nullopt;
  }
  return std::string(v.begin() + static_cast<std::ptrdiff_t>(kSetupFailed.size()), v.end());
}

// This rank knows the set-up failed (its own error or another's): rank 0 keeps the store up until
// every other rank says it knows too, or kFailureNoticeMs; the others say so and go. Not
// store_release_host: with world sizes that disagree, only rank 0's count is the one to reach.
void release_after_failure(Store& store, int rank, int world, Deadline deadline) {
  const Deadline until = std::min(deadline, deadline_after_ms(kFailureNoticeMs));
  if (rank != 0) {
    (void)store.add(kFailureSeenKey, 1, until);
    return;
  }
  while (Clock::now() < until) {
    auto seen = store.add(kFailureSeenKey, 0, until);
    if (!seen.ok() || *seen >= world - 1) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

std::string to_hex(const uint8_t* p, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    s.push_back(kDigits[p[i] >> 4]);
    s.push_back(kDigits[p[i] & 15]);
  }
  return s;
}

Result<std::string> fresh_job_token() {
  uint8_t bits[16];
  size_t got = 0;
  while (got < sizeof(bits)) {
    ssize_t n = getrandom(bits + got, sizeof(bits) - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return system_error("job token: getrandom", errno);
    }
    got += static_cast<size_t>(n);
  }
  return to_hex(bits, sizeof(bits));
}

Result<int> parse_env_int(const char* name, const std::string& value) {
  int v = 0;
  const char* b = value.data();
  const char* e = b + value.size();
  auto [ptr, ec] = std::from_chars(b, e, v);
  if (value.empty() || ec != std::errc() || ptr != e) {
    return invalid_arg("{}='{}' is not an integer", name, value);
  }
  return v;
}

Result<StoreAddress> store_address_from_env() {
  StoreAddress a;
  std::string gw_store = config::get_string(core_config::kStore);
  if (!gw_store.empty()) {
    Status s = store_socket::parse_addr(gw_store, false, &a.host, &a.port);
    if (!s.ok()) return invalid_arg("GW_STORE: {}", s.message());
    a.source = "GW_STORE";
    return a;
  }
  auto addr = env("MASTER_ADDR");
  auto port = env("MASTER_PORT");
  if (!addr && !port) return a;
  if (!addr || addr->empty()) return invalid_arg("MASTER_PORT is set but MASTER_ADDR is not");
  if (!port) return invalid_arg("MASTER_ADDR is set but MASTER_PORT is not");
  GW_ASSIGN_OR_RETURN(int p, parse_env_int("MASTER_PORT", *port));
  if (p < 1 || p > 65535) return invalid_arg("MASTER_PORT={} is outside 1..65535", p);
  a.host = *addr;
  // MASTER_ADDR may be a bracketed IPv6 literal.
  if (a.host.size() > 2 && a.host.front() == '[' && a.host.back() == ']') {
    a.host = a.host.substr(1, a.host.size() - 2);
  }
  a.port = p;
  a.source = "MASTER_ADDR/MASTER_PORT";
  return a;
}

// Rank, size and store address (and a job token) through PMIx; `info` keeps what the
// environment said about the local rank when PMIx does not say.
static Result<LaunchInfo> from_pmix(LaunchInfo info) {
  const int64_t timeout_ms = config::get_int(core_config::kTimeoutMs);
  auto job = pmix_bootstrap(timeout_ms > 0 ? timeout_ms : 300000);
  if (!job.ok()) {
    return job.status().with_context(
        "no store address (GW_STORE, MASTER_ADDR/MASTER_PORT) and the PMIx bootstrap failed");
  }
  if (info.source.empty()) info.source = "PMIx";
  info.rank = job->rank;
  info.world_size = job->world_size;
  if (job->local_rank >= 0) info.local_rank = job->local_rank;
  if (job->local_world_size >= 1) info.local_world_size = job->local_world_size;
  info.store_host = job->store_host;
  info.store_port = job->store_port;
  info.store_source = "PMIx";
  info.job_token = job->job_token;
  return info;
}

Result<LaunchInfo> detect_launch() {
  LaunchInfo info;
  auto gw_rank = config::raw(core_config::kRank);
  auto gw_size = config::raw(core_config::kWorldSize);
  if (gw_rank || gw_size) {
    // GW_* set explicitly wins, and half of it is a mistake rather than a reason to look further.
    info.source = "GW_*";
    GW_ASSIGN_OR_RETURN(info.rank, required_int("GW_RANK", gw_rank, "GW_*"));
    GW_ASSIGN_OR_RETURN(info.world_size, required_int("GW_WORLD_SIZE", gw_size, "GW_*"));
    GW_RETURN_IF_ERROR(check_rank("GW_RANK", info.rank, "GW_WORLD_SIZE", info.world_size));
    // A launcher underneath may still say where this rank sits on its host.
    for (const Launcher* l : {&kTorchrun, &kOpenMpi, &kSlurm}) {
      if (!env(l->local_rank)) continue;
      GW_ASSIGN_OR_RETURN(info.local_rank, optional_int(l->local_rank));
      GW_ASSIGN_OR_RETURN(info.local_world_size, optional_int(l->local_size));
      break;
    }
  } else {
    const Launcher* found = nullptr;
    for (const Launcher* l : {&kTorchrun, &kOpenMpi, &kSlurm}) {
      if (env(l->rank)) {
        found = l;
        break;
      }
    }
    if (found == nullptr && in_pmix_job()) {
      GW_ASSIGN_OR_RETURN(StoreAddress addr, store_address_from_env());
      if (addr.host.empty()) return from_pmix(std::move(info));
    }
    if (found == nullptr) {
      return invalid_arg(
          "no launcher environment: set GW_RANK, GW_WORLD_SIZE and GW_STORE=host:port (rank 0 "
          "hosts the store there) on every rank, or start the job with torchrun (RANK, "
          "WORLD_SIZE, MASTER_ADDR, MASTER_PORT), mpirun (OMPI_COMM_WORLD_RANK) or srun "
          "(SLURM_PROCID)");
    }
    info.source = found->source;
    GW_ASSIGN_OR_RETURN(info.rank, required_int(found->rank, env(found->rank), found->source));
    GW_ASSIGN_OR_RETURN(info.world_size,
                        required_int(found->size, env(found->size), found->source));
    GW_RETURN_IF_ERROR(check_rank(found->rank, info.rank, found->size, info.world_size));
    GW_ASSIGN_OR_RETURN(info.local_rank, optional_int(found->local_rank));
    GW_ASSIGN_OR_RETURN(info.local_world_size, optional_int(found->local_size));
  }
  if (info.local_world_size != -1 && info.local_world_size < 1) {
    return invalid_arg("local world size {} from the {} environment must be at least 1",
                       info.local_world_size, info.source);
  }
  if (info.local_world_size > info.world_size) {
    return invalid_arg("local world size {} exceeds the world size {} ({} environment)",
                       info.local_world_size, info.world_size, info.source);
  }
  if (info.local_rank != -1 &&
      (info.local_rank < 0 ||
       (info.local_world_size > 0 && info.local_rank >= info.local_world_size) ||
       info.local_rank >= info.world_size)) {
    return invalid_arg("local rank {} from the {} environment is out of range (local size {})",
                       info.local_rank, info.source, info.local_world_size);
  }

  GW_ASSIGN_OR_RETURN(StoreAddress addr, store_address_from_env());
  info.store_source = addr.source;
  if (addr.host.empty() && info.world_size > 1 && in_pmix_job()) {
    LaunchInfo pmix = info;
    auto r = from_pmix(std::move(pmix));
    if (!r.ok()) return r.status();
    if (r->rank != info.rank || r->world_size != info.world_size) {
      return invalid_arg("PMIx says rank {} of {}, the {} environment rank {} of {}", r->rank,
                         r->world_size, info.source, info.rank, info.world_size);
    }
    info.store_host = r->store_host;
    info.store_port = r->store_port;
    info.store_source = r->store_source;
    info.job_token = r->job_token;
    return info;
  }
  if (addr.host.empty() && info.world_size > 1) {
    return invalid_arg(
        "no store address for a job of {} ranks: set GW_STORE=host:port or MASTER_ADDR and "
        "MASTER_PORT",
        info.world_size);
  }
  info.store_host = addr.host;
  info.store_port = addr.port;
  return info;
}

std::string host_identity() {
  std::string id = config::get_string(core_config::kHostId);
  if (!id.empty()) return id;
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::string boot = read_first_line("/proc/sys/kernel/random/boot_id");
  struct stat st {};
  unsigned long long netns = 0;
  if (stat("/proc/self/ns/net", &st) == 0) netns = static_cast<unsigned long long>(st.st_ino);
  return fmt::format("{}/{}/netns:{}", host, boot, netns);
}

std::string kernel_of_host_id(const std::string& host_id) {
  const size_t at = host_id.rfind("/netns:");
  if (at == std::string::npos || at + 7 >= host_id.size() || host_id.find('/') == at) {
    return host_id;  // not "hostname/boot_id/netns:N"
  }
  for (size_t i = at + 7; i < host_id.size(); ++i) {
    if (host_id[i] < '0' || host_id[i] > '9') return host_id;
  }
  return host_id.substr(0, at);
}

Result<HostMap> exchange_hosts(Store& store, int rank, int world, Deadline deadline,
                               const std::string& mode, const std::string& launcher) {
  if (world < 1) return invalid_arg("exchange_hosts: world size {} < 1", world);
  if (rank < 0 || rank >= world) {
    return invalid_arg("exchange_hosts: rank {} out of range 0..{}", rank, world - 1);
  }
  // "identity\nmode", the mode empty for a rank that gives none (the C++ API): the last '\n'
  // separates them, whatever the identity holds. Every rank reads the others' modes, its own
  // given or not, so a rank without one in a job of C ABI ranks fails there too.
  // After the mode, on a line of its own: "world=N launcher=L", compared as each entry is read.
  const std::string agreed = fmt::format("world={} launcher={}", world, launcher);
  std::string mine = host_identity() + "\n" + mode + "\n" + agreed;
  Status s = store.set(fmt::format("gw/host/{}", rank), Bytes(mine.begin(), mine.end()), deadline);
  if (!s.ok()) return s.with_context(fmt::format("exchange_hosts: rank {} publishing", rank));
  HostMap map;
  map.host_of_rank.assign(world, -1);
  std::map<std::string, int> index;
  const auto check = [&](int r, const Bytes& v) -> Status {
    if (auto why = setup_failure_in(v)) {
      return peer_error("rank {} failed to set up: {}", r, *why);
    }
    const std::string text(v.begin(), v.end());
    const size_t at = text.rfind('\n');
    const std::string theirs = at == std::string::npos ? std::string() : text.substr(at + 1);
    // An entry without the line (a library before it) has nothing to compare.
    if (theirs == agreed || theirs.rfind("world=", 0) != 0) return ok_status();
    int their_world = -1;
    std::string their_launcher;
    const size_t sp = theirs.find(" launcher=");
    (void)std::from_chars(theirs.data() + 6, theirs.data() + std::min(sp, theirs.size()),
                          their_world);
    if (sp != std::string::npos) their_launcher = theirs.substr(sp + 10);
    if (their_world != world) {
      return invalid_arg(
          "rank {} was started for a world of {} ranks, this rank (rank {}) for {}: every rank "
          "must be given the same world size (GW_WORLD_SIZE, WORLD_SIZE, the launcher's -n)",
          r, their_world, rank, world);
    }
    if (!launcher.empty() && !their_launcher.empty() && their_launcher != launcher) {
      return invalid_arg(
          "rank {} was started by {} (its rank and size from that launcher's variables), this "
          "rank (rank {}) by {}: start every rank of a job the same way",
          r, their_launcher, rank, launcher);
    }
    return ok_status();
  };
  auto gathered = gather_joined(
      store, world, [](int r) { return fmt::format("gw/host/{}", r); }, deadline, check);
  if (!gathered.ok()) {
    const Code code = gathered.status().code();
    if (code == Code::kPeer || code == Code::kInvalidArg) {
      release_after_failure(store, rank, world, deadline);
    }
    return gathered.status();
  }
  std::vector<Bytes>& ids = *gathered;
  std::map<std::string, std::vector<int>> ranks_of_mode;
  for (int r = 0; r < world; ++r) {
    const Bytes& v = ids[static_cast<size_t>(r)];
    std::string id(v.begin(), v.end());
    const size_t last = id.rfind('\n');
    if (last != std::string::npos && id.compare(last + 1, 6, "world=") == 0) {
      id.resize(last);  // the world and launcher line, checked above
    }
    const size_t at = id.rfind('\n');
    const std::string m = at == std::string::npos ? "an unknown" : id.substr(at + 1);
    ranks_of_mode[m.empty() ? "an unnamed" : m].push_back(r);
    if (at != std::string::npos) id.resize(at);
    auto [it, inserted] = index.emplace(id, static_cast<int>(map.ranks_of_host.size()));
    if (inserted) {
      map.ranks_of_host.emplace_back();
      map.host_ids.push_back(id);
    }
    map.host_of_rank[r] = it->second;
    map.ranks_of_host[it->second].push_back(r);
  }
  if (ranks_of_mode.size() > 1) {
    // At most 8 ranks named per mode: the line stays readable.
    std::vector<std::string> parts;
    for (const auto& [m, ranks] : ranks_of_mode) {
      const std::vector<int> shown(ranks.begin(),
                                   ranks.begin() + std::min<size_t>(ranks.size(), 8));
      parts.push_back(fmt::format("rank{} {}{} in {} mode", ranks.size() == 1 ? "" : "s",
                                  fmt::join(shown, ", "), ranks.size() > 8 ? ", ..." : "", m));
    }
    Status error = invalid_arg(
        "the job's ranks do not run the same way ({}): every rank must use the same GW_DAEMON "
        "(a daemon on each host, or none)",
        fmt::join(parts, "; "));
    // Rank 0 hosts the store: it leaves once every rank has read the modes (2 s at most), so
    // each fails with this error rather than with a closed store.
    auto seen = [](int r) { return fmt::format("gw/mode_seen/{}", r); };
    (void)store.set(seen(rank), Bytes{1}, deadline);
    if (rank == 0) {
      (void)gather_joined(store, world, seen, std::min(deadline, deadline_after_ms(2000)));
    }
    return error;
  }
  map.my_host = map.host_of_rank[rank];
  const auto& peers = map.ranks_of_host[map.my_host];
  for (size_t i = 0; i < peers.size(); ++i) {
    if (peers[i] == rank) map.local_rank = static_cast<int>(i);
  }
  return map;
}

Result<std::vector<Bytes>> gather_joined(Store& store, int world,
                                         const std::function<std::string(int)>& key_of,
                                         Deadline deadline,
                                         const std::function<Status(int, const Bytes&)>& check) {
  // A probe asks whether a key is there without waiting for it: one round trip.
  constexpr int64_t kProbeMs = 20;
  // Probes stop after this many missing ranks: the line stays readable, the probes short.
  constexpr size_t kMaxNamed = 32;
  const int64_t every = config::get_int(core_config::kJoinReportMs);
  const auto start = Clock::now();
  auto report_at = every > 0 ? start + std::chrono::milliseconds(every) : Deadline::max();
  std::vector<Bytes> out(static_cast<size_t>(world));
  std::vector<bool> have(static_cast<size_t>(world), false);
  int next = 0;  // the lowest rank not read yet
  while (next < world) {
    if (have[next]) {
      ++next;
      continue;
    }
    auto v = store.get(key_of(next), std::min(deadline, report_at));
    if (v.ok()) {
      if (check) GW_RETURN_IF_ERROR(check(next, *v));
      out[next] = std::move(*v);
      have[next] = true;
      continue;
    }
    if (v.status().code() != Code::kTimeout || Clock::now() >= deadline) {
      return v.status().with_context(fmt::format("waiting for rank {} to join", next));
    }
    // Time to say who is missing: probe every rank not read yet.
    std::vector<int> missing;
    bool all_probed = true;
    for (int r = next; r < world; ++r) {
      if (have[r]) continue;
      if (missing.size() == kMaxNamed) {
        all_probed = false;
        break;
      }
      auto p = store.get(key_of(r), std::min(deadline, deadline_after_ms(kProbeMs)));
      if (p.ok()) {
        if (check) GW_RETURN_IF_ERROR(check(r, *p));
        out[r] = std::move(*p);
        have[r] = true;
      } else if (p.status().code() == Code::kTimeout) {
        missing.push_back(r);
      } else {
        return p.status().with_context(fmt::format("waiting for rank {} to join", r));
      }
    }
    const auto now = Clock::now();
    if (!missing.empty()) {
      const auto secs = [](auto d) {
        return std::chrono::duration_cast<std::chrono::seconds>(d).count();
      };
      const std::string joined =
          all_probed
              ? fmt::format("{} of {} joined", world - static_cast<int>(missing.size()), world)
              : fmt::format("{} ranks, more missing", world);
      GW_LOG_INFO("communicator: waiting for rank{} {} to join ({}, {} s of the {} s deadline)",
                  missing.size() == 1 ? "" : "s", fmt::join(missing, ", "), joined,
                  secs(now - start), secs(deadline - start));
    }
    report_at = now + std::chrono::milliseconds(every);
  }
  return out;
}

Result<std::string> next_communicator_prefix(Store& store, int rank, Deadline deadline) {
  auto gen = store.add(fmt::format("gw/comm_gen/{}", rank), 1, deadline);
  if (!gen.ok()) return gen.status().with_context("numbering communicators on the store");
  return fmt::format("gw/comm{}/", *gen);
}

Status publish_setup_failure(Store& store, int rank, int world, const Status& why,
                             Deadline deadline) {
  if (world <= 1 || rank < 0 || rank >= world) return ok_status();
  auto prefix = next_communicator_prefix(store, rank, deadline);
  if (!prefix.ok()) return prefix.status();
  auto mine = make_prefix_store(std::shared_ptr<Store>(std::shared_ptr<Store>(), &store),
                                *prefix);  // not owned
  const std::string text = std::string(kSetupFailed) + why.message();
  const Bytes value(text.begin(), text.end());
  Status s = mine->set(fmt::format("gw/host/{}", rank), value, deadline);
  if (rank == 0 && s.ok()) s = mine->set(kTokenKey, value, deadline);
  if (s.ok()) release_after_failure(*mine, rank, world, deadline);
  return s;
}

Status agree_setup_outcome(Store& store, int rank, int world, const Status& mine,
                           Deadline deadline) {
  if (world <= 1 || rank < 0 || rank >= world) return mine;
  const auto key_of = [](int r) { return fmt::format("gw/setup/{}", r); };
  const std::string text =
      mine.ok() ? std::string("ok") : std::string(kSetupFailed) + mine.message();
  Status s = store.set(key_of(rank), Bytes(text.begin(), text.end()), deadline);
  if (!mine.ok()) {
    // Best effort: this rank's own error is the one to return, whatever the store says.
    if (s.ok()) release_after_failure(store, rank, world, deadline);
    return mine;
  }
  if (!s.ok()) return s.with_context("communicator: saying this rank is set up");
  const auto check = [](int r, const Bytes& v) -> Status {
    if (auto why = setup_failure_in(v)) {
      return peer_error("rank {} failed to set up: {}", r, *why);
    }
    return ok_status();
  };
  auto all = gather_joined(store, world, key_of, deadline, check);
  if (!all.ok() && all.status().code() == Code::kPeer) {
    release_after_failure(store, rank, world, deadline);
  }
  return all.status();
}

Result<std::string> agree_job_token(Store& store, int rank, Deadline deadline, int world) {
  std::string configured = config::get_string(core_config::kJobToken);
  if (!configured.empty()) return configured;
  if (rank < 0) return invalid_arg("agree_job_token: rank {} < 0", rank);
  if (rank == 0) {
    GW_ASSIGN_OR_RETURN(std::string token, fresh_job_token());
    Status s = store.set(kTokenKey, Bytes(token.begin(), token.end()), deadline);
    if (!s.ok()) return s.with_context("agree_job_token: rank 0 publishing the token");
    return token;
  }
  auto v = store.get(kTokenKey, deadline);
  if (!v.ok()) return v.status().with_context("agree_job_token: waiting for rank 0's token");
  if (auto why = setup_failure_in(*v)) {
    if (world > 1) release_after_failure(store, rank, world, deadline);
    return peer_error("rank 0 failed to set up: {}", *why);
  }
  if (v->size() != 32) {
    return peer_error("agree_job_token: rank 0 published a token of {} bytes, expected 32",
                      v->size());
  }
  return std::string(v->begin(), v->end());
}

bool is_loopback_host(const std::string& host) {
  if (host.empty()) return false;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || res == nullptr) return false;
  bool all_loopback = true;
  for (const addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const auto* a = reinterpret_cast<const sockaddr_in*>(ai->ai_addr);
      all_loopback &= (ntohl(a->sin_addr.s_addr) >> 24) == 127;
    } else if (ai->ai_family == AF_INET6) {
      const auto* a = reinterpret_cast<const sockaddr_in6*>(ai->ai_addr);
      all_loopback &= IN6_IS_ADDR_LOOPBACK(&a->sin6_addr) != 0;
    } else {
      all_loopback = false;
    }
  }
  ::freeaddrinfo(res);
  return all_loopback;
}

std::string tokenless_job_warning(const std::string& token_source, int world_size,
                                  const std::string& store_host, int store_port) {
  if (!token_source.empty() || world_size <= 1 || is_loopback_host(store_host)) return "";
  return fmt::format(
      "this job has no job token (GW_JOB_TOKEN) and its store {}:{} can be reached from other "
      "hosts: any process that reaches it can read the token rank 0 made, join as a rank that "
      "has not arrived yet, receive its neighbours' gradients and send the job its own, while the "
      "real rank times out. Set the same GW_JOB_TOKEN on every rank (e.g. `export "
      "GW_JOB_TOKEN=$(openssl rand -hex 16)` in the job script, passed to every rank), or launch "
      "with gradwire-run, which makes one per job (docs/security.md)",
      store_host, store_port);
}

}  // namespace gw
