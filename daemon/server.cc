// gradwired's engine (daemon/server.h): creation, the serve loop and the stats. The rest of
// Server::Impl (daemon/server_impl.h) is in admission.cc and control_server.cc; the jobs are in
// job.cc and job_collectives.cc.
#include "daemon/server.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <thread>
#include <utility>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/log.h"
#include "core/net/backend_registry.h"
#include "core/net/transport.h"
#include "daemon/ring.h"
#include "daemon/server_impl.h"

namespace gw::daemon {

namespace {

// Steps every connection of `conns` that poll saw (pfds from `first` on), then expires every one
// past its deadline, whether or not it sent something this round (a trickler that sends a byte
// at a time is dropped at its deadline all the same), and forgets those finished with.
template <typename Step, typename Expire>
void step_all(std::vector<PendingConn>& conns, const std::vector<pollfd>& pfds, size_t first,
              Step step, Expire expire) {
  std::vector<bool> done(conns.size(), false);
  for (size_t i = 0; i < conns.size(); ++i) {
    if (pfds[first + i].revents != 0) done[i] = step(conns[i]);
    if (!done[i] && sys::expired(conns[i].deadline)) {
      expire(conns[i]);
      done[i] = true;
    }
  }
  size_t kept = 0;
  for (size_t i = 0; i < conns.size(); ++i) {
    if (done[i]) continue;
    if (kept != i) conns[kept] = std::move(conns[i]);
    ++kept;
  }
  conns.resize(kept);
}

// Milliseconds until the first of the connections' deadlines, at most `cap` (poll wakes for it).
int until_first_deadline(const std::vector<PendingConn>& conns, int cap) {
  int ms = cap;
  for (const auto& p : conns) ms = std::min(ms, sys::ms_until(p.deadline));
  return std::max(ms, 0);
}

// Milliseconds until the oldest connection's grace period ends (at least 1: poll wakes after it).
int until_evictable(const std::vector<PendingConn>& conns) {
  return std::max(1, sys::ms_until(conns.front().evictable));
}

// A daemon given a DPDK port owns it from its start, as a DPDK application does: EAL and the
// port (0.2 s for a net_memif port on a 2-core VM; more with hugepages or a NIC) come up once,
// before any job, instead of inside the first cross-host job's connect deadline. In the background,
// so that the sockets answer at once; a job that needs the port meanwhile waits for it (the backend
// makes its engine once per process, under a lock). A port that does not come up is said at WARN
// now. With `fallback` (auto offered dpdk among others) the jobs that start from then on are
// offered the rest (Impl::job_offer); a job that started before, or a daemon told dpdk by name,
// fails with the same reason if its daemons agree on dpdk.
std::jthread start_dpdk_port(std::shared_ptr<Server::Impl::PortState> state, bool fallback) {
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->text = "starting";
  }
  return std::jthread([state, fallback] {
    const int64_t t0 = sys::now_ns();
    net::TransportOptions o;
    o.job_token = "gradwired-port-start";
    o.timeout_ms = 10000;  // no connection is made: any positive value
    auto t = net::make_transport("dpdk", o);
    const int64_t ms = (sys::now_ns() - t0) / 1'000'000;
    std::string text = t.ok() ? fmt::format("open: {} in {} ms", (*t)->properties().interfaces, ms)
                              : fmt::format("failed: {}", t.status().message());
    {
      std::lock_guard<std::mutex> lock(state->mu);
      state->text = text;
      state->drop_dpdk = !t.ok() && fallback;
    }
    if (t.ok()) {
      GW_LOG_INFO("gradwired: DPDK port open at start ({} ms): {}", ms,
                  (*t)->properties().interfaces);
    } else if (fallback) {
      GW_LOG_WARN(
          "gradwired: the DPDK port did not come up ({} ms): {}; jobs starting from now are "
          "offered the rest of auto's offer, without dpdk",
          ms, t.status().message());
    } else {
      GW_LOG_WARN(
          "gradwired: the DPDK port did not come up ({} ms): {}; a job whose daemons agree on "
          "dpdk fails with this",
          ms, t.status().message());
    }
  });
}

}  // namespace

Result<std::unique_ptr<Server>> Server::create(const ServerOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->opt = options;
  impl->pool = std::make_unique<ReducePool>(options.reduce_threads);
  if (options.socket_path.empty()) return invalid_arg("gradwired: no socket path");
  if (options.max_arena_bytes < kMinArenaBytes) {
    return invalid_arg("gradwired: max arena {} bytes is below the protocol's minimum {}",
                       options.max_arena_bytes, kMinArenaBytes);
  }
  GW_RETURN_IF_ERROR(arena_geometry(kMinArenaBytes, options.ring_entries).status());
  impl->host_id = options.host_id.empty() ? host_identity() : options.host_id;
  {
    const config::Row* eal = config::find("GW_DPDK_EAL_ARGS");
    const bool dpdk_port = eal != nullptr && !config::get_string(*eal).empty();
    GW_ASSIGN_OR_RETURN(impl->offer,
                        offer_transports(options.transport.empty() ? "auto" : options.transport,
                                         &net::backend_status, dpdk_port));
    impl->device_buffers = device_buffers_verdict(impl->offer, [] {
      // The verbs device the jobs' communicators open (VerbsDevice caches it per process), asked
      // with no CUDA driver: the NIC's own dma-buf probe.
      DeviceBuffers d;
      net::TransportOptions o;
      o.job_token = "gradwired-dmabuf-probe";
      auto t = net::make_transport("verbs", o);
      if (!t.ok()) {
        d.why = fmt::format("the verbs device does not open ({})", t.status().message());
        return d;
      }
      const net::Transport::NicDmabuf n = (*t)->nic_dmabuf();
      d.yes = n.ok;
      d.why = n.why;
      return d;
    });
    GW_LOG_INFO("gradwired: trainers' device buffers (dma-bufs) through this daemon: {}",
                impl->device_buffers.why);
  }
  GW_ASSIGN_OR_RETURN(impl->listen, bind_listener(options.socket_path));
  impl->ctl_path = control_socket_path(options.socket_path);
  auto ctl = bind_listener(impl->ctl_path);
  if (!ctl.ok()) {
    ::unlink(options.socket_path.c_str());
    return ctl.status().with_context("gradwired: the control socket");
  }
  impl->ctl_listen = std::move(*ctl);
  if (!options.group.empty()) {
    auto gid = resolve_group(options.group);
    Status shared = gid.status();
    if (gid.ok()) shared = share_with_group(options.socket_path, *gid, options.group);
    if (shared.ok()) shared = share_with_group(impl->ctl_path, *gid, options.group);
    if (!shared.ok()) {
      ::unlink(options.socket_path.c_str());
      ::unlink(impl->ctl_path.c_str());
      return shared;
    }
    impl->has_group = true;
    impl->group_gid = *gid;
  }
  GW_ASSIGN_OR_RETURN(impl->stop_efd, make_eventfd());
  GW_ASSIGN_OR_RETURN(impl->wake_efd, make_eventfd());
  // Only once nothing can refuse the start (a live daemon's socket above): that one owns the port.
  const auto& names = impl->offer.names;
  if (std::find(names.begin(), names.end(), "dpdk") != names.end()) {
    const bool fallback =
        (options.transport.empty() || options.transport == "auto") && names.size() > 1;
    impl->port_start = start_dpdk_port(impl->dpdk_port, fallback);
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  impl_->reap_jobs(true);
  ::unlink(impl_->opt.socket_path.c_str());
  ::unlink(impl_->ctl_path.c_str());
}

void Server::stop() { (void)signal_eventfd(impl_->stop_efd.get()); }

const std::string& Server::socket_path() const { return impl_->opt.socket_path; }
const std::string& Server::host_id() const { return impl_->host_id; }
const std::string& Server::transport_note() const { return impl_->offer.reason; }

ServerStats Server::stats() const { return impl_->counters.snapshot(impl_->offer.names); }

Status Server::run() { return impl_->serve(); }

std::vector<std::string> Server::Impl::job_offer() const {
  std::vector<std::string> names = offer.names;
  std::lock_guard<std::mutex> lock(dpdk_port->mu);
  if (dpdk_port->drop_dpdk) std::erase(names, std::string("dpdk"));
  return names;
}

Status Server::Impl::serve() {
  std::vector<pollfd> pfds;
  std::vector<uint64_t> ids;
  for (;;) {
    pfds.clear();
    ids.clear();
    pfds.push_back({stop_efd.get(), POLLIN, 0});
    pfds.push_back({wake_efd.get(), POLLIN, 0});
    // A listener whose places are all in their grace period is not polled until the oldest's
    // grace ends (newcomers wait in its backlog).
    const bool hellos_full = full_of_young(pending, kMaxPendingHellos);
    const bool control_full = full_of_young(ctl_pending, kMaxControlConns);
    pfds.push_back({hellos_full ? -1 : listen.get(), POLLIN, 0});
    pfds.push_back({control_full ? -1 : ctl_listen.get(), POLLIN, 0});
    for (const auto& p : pending) pfds.push_back({p.sock.get(), POLLIN, 0});
    for (const auto& p : ctl_pending) pfds.push_back({p.sock.get(), POLLIN, 0});
    for (const auto& [id, c] : clients) {
      pfds.push_back({c->sock.get(), POLLIN, 0});
      ids.push_back(id);
    }
    constexpr size_t kFixed = 4;  // stop, wake, listen, control listen
    int timeout_ms =
        opt.tick_ms > 0 ? static_cast<int>(std::clamp<int64_t>(opt.tick_ms, 1, 200)) : 200;
    timeout_ms = until_first_deadline(pending, timeout_ms);
    timeout_ms = until_first_deadline(ctl_pending, timeout_ms);
    if (hellos_full) timeout_ms = std::min(timeout_ms, until_evictable(pending));
    if (control_full) timeout_ms = std::min(timeout_ms, until_evictable(ctl_pending));
    int rc = ::poll(pfds.data(), pfds.size(), timeout_ms);
    if (opt.on_tick) opt.on_tick();
    if (rc < 0 && errno != EINTR) return system_error("gradwired: poll", errno);
    if (pfds[0].revents & POLLIN) break;
    if (pfds[1].revents & POLLIN) drain_eventfd(wake_efd.get());
    const size_t first_ctl = kFixed + pending.size();
    const size_t first_client = first_ctl + ctl_pending.size();
    poll_clients(pfds, first_client, ids);
    // Hellos in progress, then control connections (their indices still line up: pending may
    // have shrunk, but first_ctl was taken before).
    step_all(
        pending, pfds, kFixed, [&](PendingConn& p) { return step_pending(p); },
        [&](PendingConn& p) { expire_pending(p); });
    step_all(
        ctl_pending, pfds, first_ctl, [&](PendingConn& p) { return step_control(p); },
        [&](PendingConn& p) { expire_control(p); });
    if (pfds[2].revents & POLLIN) accept_all();
    if (pfds[3].revents & POLLIN) accept_control();
    reap_jobs(false);
  }
  GW_LOG_INFO("gradwired: stopping");
  if (opt.on_stopping) opt.on_stopping();
  reap_jobs(true);
  return ok_status();
}

}  // namespace gw::daemon
