// The Communicator: a Group's ranks running collectives. It ties together the group (ranks, hosts,
// store), the connection pool, the schedule executor, the allreduce algorithm table with its cost
// model, and the queue of asynchronous operations.
#include "collectives/communicator.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>
#include <utility>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/async_queue.h"
#include "collectives/coll_config.h"
#include "collectives/comm_impl.h"
#include "collectives/communicator_impl.h"
#include "collectives/connection_pool.h"
#include "collectives/cost_model.h"
#include "collectives/executor.h"
#include "collectives/group.h"
#include "collectives/p2p.h"
#include "collectives/reduce.h"
#include "collectives/schedule.h"
#include "core/bootstrap.h"
#include "core/config.h"
#include "core/core_config.h"
#include "core/log.h"
#include "core/net/auto_backend.h"
#include "core/net/backend_registry.h"
#include "core/timeline.h"

namespace gw::coll {
namespace {

// GW_COST_CPUS, or the CPUs this process may run on (its affinity mask); 0 when not considered.
int cost_cpus() {
  const int64_t v = config::get_int(coll_config::kCostCpus);
  if (v < 0) return 0;
  if (v > 0) return static_cast<int>(std::min<int64_t>(v, 1 << 20));
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

constexpr std::array<Collective, 3> kCollectives = {Collective::kBroadcast, Collective::kAllgather,
                                                    Collective::kReduceScatter};
const config::Row& algo_row(Collective kind) {
  switch (kind) {
    case Collective::kBroadcast:
      return coll_config::kAlgoBroadcast;
    case Collective::kAllgather:
      return coll_config::kAlgoAllgather;
    case Collective::kReduceScatter:
      return coll_config::kAlgoReduceScatter;
  }
  return coll_config::kAlgoBroadcast;
}

Result<CommSettings> settings_from(const CommOptions& o, const CommInternalOptions& internal) {
  GW_RETURN_IF_ERROR(net::check_backend_name(o.transport, "communicator: transport"));
  CommSettings s;
  s.config = o.config.empty() ? config::Snapshot::capture() : o.config;
  GW_RETURN_IF_ERROR(s.config.validate());
  const config::Snapshot& c = s.config;
  s.mode = o.transport;
  s.route_host = o.route_host;
  s.timeout_ms = o.timeout_ms >= 0 ? o.timeout_ms : c.get_int(core_config::kTimeoutMs);
  if (s.timeout_ms <= 0) {
    return invalid_arg("communicator: timeout {} ms must be > 0", s.timeout_ms);
  }
  s.factory = internal.transport_factory;
  if (!s.factory) s.factory = &net::make_transport;
  GW_ASSIGN_OR_RETURN(s.forced_algo, parse_algo(c.get_string(coll_config::kAlgo)));
  for (Collective kind : kCollectives) {
    GW_ASSIGN_OR_RETURN(s.forced_coll[static_cast<size_t>(kind)],
                        parse_collective_algo(kind, c.get_string(algo_row(kind))));
  }
  s.chunk_cfg = c.get_int(coll_config::kChunkSize);
  s.nchannels_cfg =
      static_cast<int>(std::clamp<int64_t>(c.get_int(coll_config::kNchannels), 0, kMaxChannels));
  s.spin_us = std::max<int64_t>(0, c.get_int(coll_config::kSpinUs));
  s.stall_warn_s = c.get_double(coll_config::kStallWarnS);
  return s;
}

}  // namespace

ExecutorOptions executor_options(const CommSettings& s, const Group& g) {
  ExecutorOptions e;
  e.stall = StallOptions{g.store(), g.rank(), g.size(), s.stall_warn_s};
  e.chunk_bytes = s.chunk_cfg > 0 ? static_cast<size_t>(std::max<int64_t>(4096, s.chunk_cfg))
                                  : size_t{512} * 1024;
  e.spin_us = s.spin_us;
  e.timeout_ms = s.timeout_ms;
  return e;
}

// ---- set-up -----------------------------------------------------------------------------------

Status CommImpl::init() {
  Status s = set_up();
  if (!s.ok() && !outcome_said_) {
    (void)agree_setup_outcome(*group_.store(), rank(), size(), s,
                              deadline_after_ms(settings_.timeout_ms));
  }
  return s;
}

Status CommImpl::set_up() {
  const int world = size(), me = rank();
  GW_RETURN_IF_ERROR(timeline::open(settings_.config.get_string(core_config::kTimeline), me));
  // A forced algorithm that cannot run here is refused now rather than at the first call.
  if (world > 1 && settings_.forced_algo != Algo::kAuto) {
    const AllreduceAlgorithm* a = find_allreduce_algorithm(settings_.forced_algo);
    Status why = a == nullptr ? internal_error("no such algorithm") : a->applies(group_, 0);
    if (!why.ok()) {
      return invalid_arg("communicator: GW_ALGO={} does not apply: {}",
                         algo_name(settings_.forced_algo), why.message());
    }
  }
  for (Collective kind : kCollectives) {
    const Algo forced = settings_.forced_coll[static_cast<size_t>(kind)];
    if (world <= 1 || forced == Algo::kAuto) continue;
    const CollectiveAlgorithm* a = find_collective_algorithm(kind, forced);
    Status why = a == nullptr ? internal_error("no such algorithm") : a->applies(group_, 0);
    if (!why.ok()) {
      return invalid_arg("communicator: {}={} does not apply: {}", collective_algo_row(kind),
                         algo_name(forced), why.message());
    }
  }
  const bool multi_host = group_.multi_host();
  if (settings_.mode == "shm" && multi_host) {
    for (int r = 0; r < world; ++r) {
      if (!group_.same_host(r)) {
        return invalid_arg(
            "communicator: transport shm was forced but rank {} is on another host than rank {} "
            "(shared memory works within one host; use tcp or auto)",
            r, me);
      }
    }
  }
  // Cost model figures: each level's from the transport that carries it, the flat ones from the
  // transport most links use (the inter-host one on several hosts). Every rank then takes rank
  // 0's figures, so that all choose the same algorithm even when their links differ.
  std::string main = settings_.mode;
  if (settings_.mode == "auto") {
    auto choice = net::choose_auto_backend(!multi_host, {});
    if (choice.ok()) main = choice->name;
  }
  std::string transports;  // for describe()
  if (world > 1) {
    LinkFigures intra, inter;
    auto figures = [](const net::Transport* t) {
      const auto& props = t->properties();
      return LinkFigures{props.name, props.latency_us, props.bandwidth_gbps};
    };
    if (group_.max_local_size() > 1) {
      GW_ASSIGN_OR_RETURN(net::Transport * t, pool_.transport_for_link(true));
      intra = figures(t);
      transports = describe_transport(multi_host ? "within hosts " : "", t->properties());
      resolved_["transport_within_hosts"] = resolved_["transport"] = t->properties().name;
      resolved_["interface"] = t->properties().interfaces;
    }
    if (multi_host) {
      GW_ASSIGN_OR_RETURN(net::Transport * t, pool_.transport_for_link(false));
      inter = figures(t);
      resolved_["transport"] = t->properties().name;
      if (!resolved_.count("transport_within_hosts")) {
        resolved_["transport_within_hosts"] = t->properties().name;
      }
      resolved_["interface"] = t->properties().interfaces;
      if (!transports.empty()) transports += "; ";
      transports +=
          describe_transport(group_.max_local_size() > 1 ? "across hosts " : "", t->properties());
    }
    if (!multi_host) inter = intra;
    if (group_.max_local_size() == 1) intra = inter;
    const LinkFigures& flat = multi_host ? inter : intra;
    main = std::string(flat.transport);
    cost_ = cost_params_for_levels(flat, intra, inter);
    cost_.kernel_hosts = group_.max_hosts_per_kernel();
    cost_.cpus = cost_cpus();
    // Before the last exchange of the set-up: a peer that waits on this rank later can then tell
    // that it has gone (best effort; without it that peer waits out its deadline as before).
    (void)pool_.announce(deadline_after_ms(settings_.timeout_ms));
    GW_RETURN_IF_ERROR(agree_cost_params());
    const double contention = crossing_contention(cost_, group_.max_local_size());
    if (multi_host && contention > 1) {
      GW_LOG_INFO(
          "cost model: {} rank(s) per host{} on {} CPUs: with every rank crossing hosts at once, "
          "an inter-host message costs {:.1f}x (GW_COST_CPUS)",
          group_.max_local_size(),
          cost_.kernel_hosts > 1
              ? fmt::format(", {} hosts sharing one machine's kernel", cost_.kernel_hosts)
              : std::string(),
          cost_.cpus, contention);
    }
  } else {
    cost_ = cost_params_for(main, 0, 0);
  }
  // Auto chunk: shared memory wants chunks whose staging stays in cache (docs/perf.md, "Why the
  // defaults"); sockets want fewer, larger calls (512K).
  if (settings_.chunk_cfg <= 0 && main == "shm") exec_.set_chunk_bytes(size_t{128} * 1024);
  // One host, shm between every pair: large allreduces, allgathers, reduce-scatters, broadcasts
  // and alltoalls may read the peers' buffers directly (collectives/shm_direct.h), each unless
  // its GW_ALGO* knob forces an algorithm.
  direct_.set_eligible(world > 1 && !multi_host && resolved_["transport_within_hosts"] == "shm");
  GW_LOG_DEBUG("communicator rank {}/{}: transport {}, chunk {}, channels {}, algo {}", me, world,
               main, format_bytes(exec_.chunk_bytes()), settings_.nchannels_cfg,
               algo_name(settings_.forced_algo));
  summary_ = make_summary(transports);
  resolved_["summary"] = summary_;
  return ok_status();
}

std::string CommImpl::describe_transport(std::string_view level, const net::Properties& p) {
  std::string s = fmt::format("transport {}{}", level, p.name);
  std::string detail = p.interfaces.empty() ? "" : p.interfaces + ", ";
  if (p.name == "tcp") {
    detail +=
        fmt::format("{} socket{} per connection, {} I/O thread{}", p.sockets_per_conn,
                    p.sockets_per_conn == 1 ? "" : "s", p.io_threads, p.io_threads == 1 ? "" : "s");
  } else if (!detail.empty()) {
    detail.resize(detail.size() - 2);
  }
  if (!detail.empty()) s += fmt::format(" ({})", detail);
  return s;
}

std::string CommImpl::make_summary(const std::string& transports) {
  if (size() == 1) {
    resolved_ = {{"transport", "none"}, {"transport_within_hosts", "none"},
                 {"interface", ""},     {"channels", "none"},
                 {"chunk", "none"},     {"allreduce", "none"}};
    return "one rank: no transport, no algorithm";
  }
  std::string channels;
  if (settings_.nchannels_cfg > 0) {
    channels = fmt::format("channels {}", settings_.nchannels_cfg);
  } else {
    // channels_for(): 2 once each rank's ring step holds 2 chunks, 4 once it holds 8.
    const size_t step = exec_.chunk_bytes() * static_cast<size_t>(size());
    channels = fmt::format("channels auto (1, 2 from {}, 4 from {})", format_bytes(2 * step),
                           format_bytes(8 * step));
  }
  // The algorithm table's choice at each power of two from 1 KiB to 1 GiB, as runs.
  std::string algos;
  std::string_view run_name;
  size_t run_from = 0;
  auto close_run = [&](size_t upto) {
    if (run_name.empty()) return;
    if (!algos.empty()) algos += ", ";
    algos += upto == 0
                 ? fmt::format("from {} {}", format_bytes(run_from), run_name)
                 : fmt::format("{}-{} {}", format_bytes(run_from), format_bytes(upto), run_name);
  };
  constexpr size_t kFrom = size_t{1} << 10, kTo = size_t{1} << 30;
  size_t prev = 0;
  for (size_t bytes = kFrom; bytes <= kTo; bytes *= 2) {
    auto c = choose_allreduce(group_, bytes, cost_, settings_.forced_algo);
    const std::string_view name = c.ok() ? c->algorithm->name : std::string_view("none");
    if (name != run_name) {
      close_run(prev);
      run_name = name;
      run_from = bytes;
    }
    prev = bytes;
  }
  close_run(0);
  if (algos.find(", ") == std::string::npos) algos = fmt::format("{} at every size", run_name);
  resolved_["channels"] = channels.substr(std::string_view("channels ").size());
  resolved_["chunk"] = format_bytes(exec_.chunk_bytes());
  resolved_["allreduce"] =
      settings_.forced_algo == Algo::kAuto ? algos : fmt::format("{} (GW_ALGO)", algos);
  return fmt::format("{}, {}, chunk {}, allreduce{} {}", transports, channels,
                     format_bytes(exec_.chunk_bytes()),
                     settings_.forced_algo == Algo::kAuto ? "" : " (GW_ALGO)", algos);
}

Status CommImpl::agree_cost_params() {
  const Deadline deadline = deadline_after_ms(settings_.timeout_ms);
  Store& store = *group_.store();
  const std::string key = "cost_params";
  // The figures are the last the ranks read from the store while they set up: rank 0 (which
  // hosts the store, where the job uses its own) returns only once every rank has read them, so
  // destroying its communicator at once cannot leave another rank's set-up without its store.
  // Not store_barrier: there every rank but the last waits on a "done" key, and rank 0 could take
  // the store away while another rank still waits on it; store_release_host waits on rank 0 only.
  const std::string read_key = "cost_params_read";
  outcome_said_ = true;
  GW_RETURN_IF_ERROR(agree_setup_outcome(store, rank(), size(), ok_status(), deadline));
  if (rank() == 0) {
    const std::string v =
        fmt::format("{:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {:.17g} {} {}", cost_.alpha_us,
                    cost_.bw_gbps, cost_.reduce_gbps, cost_.intra_alpha_us, cost_.intra_bw_gbps,
                    cost_.inter_alpha_us, cost_.inter_bw_gbps, cost_.cpus, cost_.kernel_hosts);
    GW_RETURN_IF_ERROR(store.set(key, Bytes(v.begin(), v.end()), deadline)
                           .with_context("communicator: publishing the cost model's figures"));
    return store_release_host(store, read_key, 0, size(), deadline)
        .with_context("communicator: waiting for every rank to read the cost figures");
  }
  auto v = store.get(key, deadline);
  if (!v.ok()) return v.status().with_context("communicator: waiting for rank 0's cost figures");
  GW_RETURN_IF_ERROR(store_release_host(store, read_key, rank(), size(), deadline)
                         .with_context("communicator: saying this rank is set up"));
  CostParams p;
  std::istringstream in(std::string(v->begin(), v->end()));
  in >> p.alpha_us >> p.bw_gbps >> p.reduce_gbps >> p.intra_alpha_us >> p.intra_bw_gbps >>
      p.inter_alpha_us >> p.inter_bw_gbps >> p.cpus >> p.kernel_hosts;
  if (!in || p.cpus < 0 || p.kernel_hosts < 1) {
    return peer_error("communicator: rank 0 published malformed cost figures");
  }
  cost_ = p;
  return ok_status();
}

CommImpl::~CommImpl() {
  // A communicator destroyed with ops pending ends them: the running one sees the abort flag,
  // the queued ones never start.
  queue_.shutdown([this] { aborted_.store(true); });
  {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    p2p_.reset();  // ends its pending ops; none writes a buffer after this
  }
  std::lock_guard<std::mutex> lock(exec_mu_);
  pool_.close_all();
}

Result<std::unique_ptr<Communicator>> CommImpl::split(int color, int key) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  GW_RETURN_IF_ERROR(check_usable("split"));
  auto child = group_.split(color, key, deadline_after_ms(settings_.timeout_ms));
  if (!child.ok()) return child.status().with_context(fmt::format("rank {}", rank()));
  if (!child->has_value()) return std::unique_ptr<Communicator>();
  auto comm = std::make_unique<CommImpl>(std::move(**child), settings_);
  GW_RETURN_IF_ERROR(comm->init().with_context("split"));
  return std::unique_ptr<Communicator>(std::move(comm));
}

HostLayout Communicator::host_layout() const { return HostLayout{0, 1, rank(), size(), true}; }

std::string Communicator::describe() const { return fmt::format("rank {} of {}", rank(), size()); }

std::map<std::string, std::string> Communicator::resolved() const {
  return {{"summary", describe()}};
}

Result<std::unique_ptr<Communicator>> Communicator::split(int, int) {
  return unsupported("split: this communicator cannot be split");
}

Result<std::unique_ptr<Communicator>> create_communicator(const CommOptions& options,
                                                          const CommInternalOptions& internal) {
  GW_ASSIGN_OR_RETURN(CommSettings settings, settings_from(options, internal));
  GroupOptions g;
  g.rank = options.rank;
  g.world_size = options.world_size;
  g.store = options.store;
  g.job_token = options.job_token;
  g.host_id = options.host_id;
  g.mode = options.mode;
  g.launcher = options.launcher;
  GW_ASSIGN_OR_RETURN(Group group, Group::create(g, deadline_after_ms(settings.timeout_ms)));
  auto comm = std::make_unique<CommImpl>(std::move(group), std::move(settings));
  GW_RETURN_IF_ERROR(comm->init());
  return std::unique_ptr<Communicator>(std::move(comm));
}

Result<std::unique_ptr<Communicator>> Communicator::create(const CommOptions& options) {
  return create_communicator(options, CommInternalOptions{});
}

Status Communicator::check_options(const CommOptions& options) {
  GW_RETURN_IF_ERROR(settings_from(options, CommInternalOptions{}).status());
  // A transport asked for by name that this process cannot use (its probe: no RDMA device, not
  // built) would fail only once the transports are made, after the rendezvous.
  if (options.transport != "auto") {
    Status usable = net::backend_status(options.transport);
    if (!usable.ok()) {
      return invalid_arg("communicator: transport {} cannot run in this process: {}",
                         options.transport, usable.message());
    }
  }
  return ok_status();
}

}  // namespace gw::coll
