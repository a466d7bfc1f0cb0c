// Daemon mode's set-up (capi/daemon_session.h): the rank's checks and the job's rendezvous in the
// store, the connection to gradwired, the job's chunk agreed by every rank, what the session
// describes of itself, and split (a new job on the same daemons).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "capi/daemon_session.h"
#include "capi/direct_session.h"
#include "capi/setup_checks.h"
#include "collectives/compress/codec.h"
#include "collectives/cost_model.h"
#include "core/bootstrap.h"
#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/handshake.h"
#include "core/sys/time.h"
#include "core/timeline.h"
#include "daemon/daemon_config.h"
#include "gpudirect/cuda_driver.h"

namespace gw::capi {

using daemon::Opcode;
using daemon::SqEntry;

// ---- set-up ------------------------------------------------------------------------------------

namespace {

std::string solo_token() {
  std::random_device rd;
  return fmt::format("solo-{}-{:08x}{:08x}", ::getpid(), rd(), rd());
}

}  // namespace

Result<std::unique_ptr<Session>> DaemonSession::create(const SessionOptions& options,
                                                       const std::string& address) {
  // What this rank can check alone is checked before it meets the others, who learn at once
  // why it will not come (as direct mode's settings are).
  Status local = check_daemon_locally(address);
  // GW_TIMELINE: this trainer's side of its calls (capi/daemon_session_trace.h), one file per rank.
  if (local.ok()) local = timeline::open(config::get_string(core_config::kTimeline), options.rank);
  if (!local.ok()) return fail_before_rendezvous(options, local);
  const sys::Deadline deadline = sys::deadline_after_ms(options.timeout_ms);
  daemon::Hello h;
  h.rank = options.rank;
  h.world_size = options.world_size;
  h.timeout_ms = options.timeout_ms;
  h.arena_bytes = static_cast<uint64_t>(config::get_int(daemon_config::kArena));
  h.host_id = host_identity();
  h.store_token = options.job_token;
  std::shared_ptr<Store> store;
  std::unique_ptr<Store> agreed;  // under this communicator's own key prefix
  std::vector<int> host_of_rank(1, 0);
  if (options.world_size > 1) {
    GW_ASSIGN_OR_RETURN(store, open_job_store(options));
    // The keys a direct-mode communicator agrees its token and host map under: a job whose ranks
    // run some in daemon mode and some directly meets there, and the modes exchanged with the
    // host map fail it at once on every rank.
    auto prefix = next_communicator_prefix(*store, options.rank, deadline);
    if (!prefix.ok()) return prefix.status().with_context("rendezvous store");
    agreed = make_prefix_store(store, *prefix);
    if (!options.job_token.empty()) {
      h.job_token = options.job_token;
    } else {
      GW_ASSIGN_OR_RETURN(h.job_token, agree_job_token(*agreed, options.rank, deadline));
    }
    GW_ASSIGN_OR_RETURN(
        HostMap map, exchange_hosts(*agreed, options.rank, options.world_size, deadline, "daemon"));
    h.host_index = map.my_host;
    h.num_hosts = static_cast<int32_t>(map.ranks_of_host.size());
    h.local_rank = map.local_rank;
    h.local_size = static_cast<int32_t>(map.ranks_of_host[map.my_host].size());
    h.store_host = options.store_host;
    h.store_port = static_cast<uint16_t>(options.store_port);
    host_of_rank = map.host_of_rank;
  } else {
    h.job_token = options.job_token.empty() ? solo_token() : options.job_token;
  }
  auto s = connect(h, address, std::move(store), std::move(host_of_rank));
  if (agreed) {
    GW_RETURN_IF_ERROR(agree_chunk(*agreed, options.rank, options.world_size, s.status(),
                                   s.ok() ? &(*s)->chunk_bytes_ : nullptr, deadline));
  }
  if (!s.ok()) return s.status();
  return std::unique_ptr<Session>(std::move(*s));
}

Status DaemonSession::agree_chunk(Store& store, int rank, int size, const Status& joined,
                                  size_t* chunk, sys::Deadline deadline) {
  // Every rank must cut chunks and slices alike (the daemons pair them up one by one), and each
  // rank's chunk comes from its own GW_DAEMON_CHUNK and arena: the job takes the least of them.
  // This is the set-up's last use of the store, so it ends with store_release_host.
  auto key_of = [](int r) { return fmt::format("daemon_chunk/{}", r); };
  const std::string release_key = "daemon_chunk_read";
  constexpr std::string_view kFailed = "failed: ";
  if (!joined.ok()) {
    // Best effort: the others learn at once why this rank is missing instead of waiting out
    // their deadline, and rank 0 keeps its store until they have read it.
    const std::string why = std::string(kFailed) + joined.message();
    if (store.set(key_of(rank), Bytes(why.begin(), why.end()), deadline).ok()) {
      (void)store_release_host(store, release_key, rank, size, deadline);
    }
    return joined;
  }
  const size_t own = *chunk;
  const std::string mine = std::to_string(own);
  GW_RETURN_IF_ERROR(store.set(key_of(rank), Bytes(mine.begin(), mine.end()), deadline)
                         .with_context("daemon mode: publishing this rank's chunk"));
  GW_ASSIGN_OR_RETURN(auto all, gather_joined(store, size, key_of, deadline));
  // Read everything first: a rank's failure is the error to report, even when the release that
  // follows times out (a rank that died since it published).
  Status failed;
  size_t least = own;
  size_t whose = static_cast<size_t>(rank);
  for (size_t r = 0; r < all.size() && failed.ok(); ++r) {
    const std::string text(all[r].begin(), all[r].end());
    size_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (text.rfind(kFailed, 0) == 0) {
      failed = peer_error("daemon mode: rank {} could not join its daemon: {}", r,
                          text.substr(kFailed.size()));
    } else if (ec != std::errc() || end != text.data() + text.size() || v < 4096) {
      failed = peer_error("daemon mode: rank {} published a chunk of '{}' bytes", r, text);
    } else if (v < least) {
      least = v;
      whose = r;
    }
  }
  Status released = store_release_host(store, release_key, rank, size, deadline)
                        .with_context("daemon mode: the end of the set-up");
  if (!failed.ok()) return failed;
  GW_RETURN_IF_ERROR(released);
  if (least < own) {
    GW_LOG_INFO("daemon mode: chunks of {} (rank {}'s), not {}: every rank of the job cuts alike",
                coll::format_bytes(least), whose, coll::format_bytes(own));
    *chunk = least;
  }
  return ok_status();
}

Result<std::unique_ptr<DaemonSession>> DaemonSession::connect(const daemon::Hello& h,
                                                              const std::string& address,
                                                              std::shared_ptr<Store> store,
                                                              std::vector<int> host_of_rank) {
  std::unique_ptr<DaemonSession> s(new DaemonSession());
  s->link_->session = s.get();
  s->rank_ = h.rank;
  s->size_ = h.world_size;
  s->timeout_ms_ = h.timeout_ms;
  s->address_ = address;
  s->hello_ = h;
  s->store_ = std::move(store);
  s->host_of_rank_ = std::move(host_of_rank);

  const int64_t spin_ns = std::max<int64_t>(0, config::get_int(daemon_config::kSpinUs)) * 1000;
  GW_ASSIGN_OR_RETURN(s->client_, daemon::Client::connect(address.substr(5), h, spin_ns));
  const daemon::Welcome& geo = s->client_->welcome();
  // Chunks of GW_DAEMON_CHUNK, or less where the arena could not stage a few in flight: the
  // largest power of two within an eighth of the data region (ranks with the same
  // GW_DAEMON_ARENA and GW_DAEMON_CHUNK cut the same way).
  size_t fit = 4096;
  while (fit * 2 <= geo.data_bytes / 8) fit *= 2;
  s->chunk_bytes_ = std::min(
      fit, static_cast<size_t>(std::max<int64_t>(4096, config::get_int(daemon_config::kChunk))));
  GW_LOG_INFO("daemon mode: rank {} of {} on host {} of {} (local {} of {}), {} arena", h.rank,
              h.world_size, h.host_index, h.num_hosts, h.local_rank, h.local_size, geo.arena_bytes);
  return s;
}

std::string DaemonSession::describe() const {
  return fmt::format("daemon mode ({}; {} host{}, {} trainer{} here, {} among the daemons)",
                     address_, hello_.num_hosts, hello_.num_hosts == 1 ? "" : "s",
                     hello_.local_size, hello_.local_size == 1 ? "" : "s",
                     client_->welcome().transport.empty() ? "?" : client_->welcome().transport);
}

std::map<std::string, std::string> DaemonSession::resolved() const {
  const std::string among = hello_.num_hosts == 1
                                ? std::string("local sum in gradwired (one host)")
                                : fmt::format("local sum in gradwired, then {} among {} daemons",
                                              client_->welcome().transport, hello_.num_hosts);
  return {{"summary", describe()},
          {"transport", "daemon"},
          {"transport_within_hosts", "daemon"},
          {"interface", address_.substr(5)},
          {"daemon_transport", client_->welcome().transport},
          {"channels", "the daemon's"},
          {"chunk", coll::format_bytes(chunk_bytes_)},
          {"device_memory", "imported into gradwired (CUDA IPC), else staged through the arena"},
          {"allreduce", among}};
}

DaemonSession::~DaemonSession() {
  stop_queue();  // the worker's calls use the connection
  // Requests still outstanding no longer reach this session (its arena goes with it): nothing
  // is copied into a caller's buffer after this.
  std::lock_guard<std::mutex> lock(link_->mu);
  link_->session = nullptr;
}

Result<std::unique_ptr<Session>> DaemonSession::split(int color, int key) {
  // Every rank learns every rank's (color, key) through the daemon, then the ranks of one color
  // join the daemons as a job of their own: its token derived from this job's (HMAC, so only
  // those who hold this one know it), its host layout from this one's, the same store.
  const int32_t mine[2] = {color, key};
  std::vector<int32_t> all(2 * static_cast<size_t>(size_));
  GW_RETURN_IF_ERROR(allgather(mine, all.data(), 2, coll::DataType::kI32).with_context("split"));
  uint64_t seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++splits_;
  }
  if (color < 0) return std::unique_ptr<Session>();
  std::vector<int> members;  // parent ranks of the new communicator, in new-rank order
  for (int r = 0; r < size_; ++r) {
    if (all[2 * static_cast<size_t>(r)] == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return all[2 * static_cast<size_t>(a) + 1] < all[2 * static_cast<size_t>(b) + 1];
  });
  std::vector<int> hosts;  // parent host indexes of the members, ascending
  for (int r : members) hosts.push_back(host_of_rank_[static_cast<size_t>(r)]);
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  auto new_host = [&](int parent_rank) {
    const int h = host_of_rank_[static_cast<size_t>(parent_rank)];
    return static_cast<int>(std::lower_bound(hosts.begin(), hosts.end(), h) - hosts.begin());
  };
  daemon::Hello h = hello_;
  h.world_size = static_cast<int32_t>(members.size());
  h.num_hosts = static_cast<int32_t>(hosts.size());
  h.host_index = new_host(rank_);
  h.local_rank = 0;
  h.local_size = 0;
  std::vector<int> child_hosts;
  for (size_t c = 0; c < members.size(); ++c) {
    const int host = new_host(members[c]);
    child_hosts.push_back(host);
    if (members[c] == rank_) {
      h.rank = static_cast<int32_t>(c);
      h.local_rank = h.local_size;
    }
    if (host == h.host_index) ++h.local_size;
  }
  const std::string label = fmt::format("gradwire split {} color {}", seq, color);
  const net::handshake::Mac tag = net::handshake::hmac_sha256(
      hello_.job_token, reinterpret_cast<const uint8_t*>(label.data()), label.size());
  h.job_token = to_hex(tag.data(), tag.size());
  if (h.num_hosts == 1) {  // the new job's daemons need not meet
    h.store_host.clear();
    h.store_port = 0;
  }
  GW_ASSIGN_OR_RETURN(auto child, connect(h, address_, store_, std::move(child_hosts)));
  // The parent's chunk is the job's least, and no rank's own is smaller: all cut alike again.
  child->chunk_bytes_ = std::min(child->chunk_bytes_, chunk_bytes_);
  return std::unique_ptr<Session>(std::move(child));
}

}  // namespace gw::capi
