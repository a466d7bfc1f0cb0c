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

constexpr int kMaxChannels = 16;
// All-to-all steps run at once (each on its own peer's connection): p-1 of them, up to this many.
// On a 4-rank tcp job every rank then streams to its three peers together instead of one after
// the other, so no link idles while a step drains.
constexpr int kAlltoallInFlight = 8;

// What a communicator and the communicators split from it share: the options they were made
// with, resolved once.
struct CommSettings {
  std::string mode;         // auto or a registered backend
  std::string route_host;   // CommOptions::route_host
  config::Snapshot config;  // read at creation; handed to the transports
  int64_t timeout_ms = 0;
  TransportFactory factory;
  int64_t chunk_cfg = 0;  // GW_CHUNK_SIZE (0: per transport)
  int nchannels_cfg = 0;
  int64_t spin_us = 50;
  Algo forced_algo = Algo::kAuto;
  // GW_ALGO_BROADCAST, GW_ALGO_ALLGATHER, GW_ALGO_REDUCE_SCATTER, indexed by Collective.
  std::array<Algo, 3> forced_coll = {Algo::kAuto, Algo::kAuto, Algo::kAuto};
};

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
  return s;
}

ExecutorOptions executor_options(const CommSettings& s) {
  ExecutorOptions e;
  e.chunk_bytes = s.chunk_cfg > 0 ? static_cast<size_t>(std::max<int64_t>(4096, s.chunk_cfg))
                                  : size_t{512} * 1024;
  e.spin_us = s.spin_us;
  e.timeout_ms = s.timeout_ms;
  return e;
}

class CommImpl : public Communicator {
 public:
  CommImpl(Group group, CommSettings settings)
      : group_(std::move(group)),
        settings_(std::move(settings)),
        pool_(group_,
              PoolOptions{settings_.mode, settings_.factory, settings_.timeout_ms,
                          settings_.spin_us, settings_.config, settings_.route_host},
              &aborted_),
        exec_(&pool_, &aborted_, executor_options(settings_)) {}
  ~CommImpl() override;

  // set_up(), then, had it failed before the ranks compared outcomes (agree_cost_params), says so
  // to the others (agree_setup_outcome) so they fail at once naming this rank.
  Status init();

  int rank() const override { return group_.rank(); }
  int size() const override { return group_.size(); }
  Status allreduce(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                   ReduceOp op) override;
  Status broadcast(void* buf, size_t count, DataType dtype, int root) override;
  Status allgather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype) override;
  Status reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount, DataType dtype,
                        ReduceOp op) override;
  Status barrier() override;
  Status alltoall(const void* sendbuf, void* recvbuf, size_t count, DataType dtype) override;
  Result<std::unique_ptr<AsyncOp>> iallreduce(const void* sendbuf, void* recvbuf, size_t count,
                                              DataType dtype, ReduceOp op) override;
  Result<std::shared_ptr<P2PRequest>> isend(const void* buf, size_t bytes, int peer,
                                            int tag) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->isend(buf, bytes, peer, tag);
  }
  Result<std::shared_ptr<P2PRequest>> irecv(void* buf, size_t bytes, int peer, int tag) override {
    GW_ASSIGN_OR_RETURN(PointToPoint * p, point_to_point());
    return p->irecv(buf, bytes, peer, tag);
  }
  void abort() override { aborted_.store(true); }
  bool aborted() const override { return aborted_.load(); }
  Algo choose_allreduce_algo(size_t bytes) const override {
    if (size() == 1)
      return settings_.forced_algo == Algo::kAuto ? Algo::kRing : settings_.forced_algo;
    auto c = choose_allreduce(group_, bytes, cost_, settings_.forced_algo);
    return c.ok() ? c->algorithm->algo : settings_.forced_algo;
  }
  Result<std::unique_ptr<Communicator>> split(int color, int key) override;
  std::string describe() const override { return summary_; }
  std::map<std::string, std::string> resolved() const override { return resolved_; }
  HostLayout host_layout() const override {
    return HostLayout{group_.host(), group_.nhosts(), group_.local_rank(), group_.local_size(),
                      uniform_hosts(group_.hosts())};
  }

 private:
  Status allreduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                          ReduceOp op);
  // What the ranks of one collective must agree on besides its count (the executor checks the
  // count exactly, from the sizes it receives, and names both sides' sizes): the kind, the dtype,
  // the op and the root. run_collective folds it into the sequence field of every tag of the
  // call (the executor tags each message with (sequence, step)), so a peer that disagrees on any
  // of them fails a receive with a tag mismatch, reported as the callers' error. No byte is added
  // to a message; two different signatures fold alike with a chance of 2^-19, as two calls 2^19
  // apart already share their tags.
  enum class CallKind { kAllreduce, kBroadcast, kAllgather, kReduceScatter, kBarrier, kAlltoall };
  struct CallSig {
    CallKind kind;
    DataType dtype = DataType::kU8;
    ReduceOp op = ReduceOp::kSum;
    bool reduces = false;  // whether op matters
    int root = -1;         // broadcast's
  };
  // Runs under exec_mu_: checks abort/broken state, numbers the collective (tag_seq_: the number
  // with `sig` folded in), and marks the communicator broken when `body` fails (its connections
  // are closed so peers fail fast too).
  template <typename F>
  Status run_collective(const char* name, const CallSig& sig, F&& body);
  Status check_usable(const char* name) const;
  void wait_async_idle() { queue_.wait_idle(); }
  int channels_for(size_t bytes) const;
  // The collective's algorithm for `bytes` (its GW_ALGO_* row or the cost model); requires
  // size() > 1. log_choice logs it at INFO once per algorithm and size class.
  Result<CollectiveChoice> choose(Collective kind, size_t bytes, size_t elem_bytes) const {
    return choose_collective(kind, group_, bytes, call_cost(elem_bytes),
                             settings_.forced_coll[static_cast<size_t>(kind)]);
  }
  // The agreed figures with this call's element size and the executor's chunk.
  CostParams call_cost(size_t elem_bytes) const {
    CostParams p = cost_;
    p.elem_bytes = elem_bytes;
    p.chunk_bytes = exec_.chunk_bytes();
    return p;
  }
  void log_choice(Collective kind, size_t bytes, const CollectiveChoice& choice, size_t nplans);
  // Rank 0 publishes cost_, the others replace theirs with it.
  Status agree_cost_params();
  Status set_up();
  bool outcome_said_ = false;  // agree_setup_outcome ran (agree_cost_params)
  // "transport tcp (eth0:10.0.0.1, 1 socket per connection, 0 I/O threads)".
  static std::string describe_transport(std::string_view level, const net::Properties& p);
  // describe()'s text, once the transports and the cost model are known.
  std::string make_summary(const std::string& transports);

  Group group_;
  CommSettings settings_;
  std::atomic<bool> aborted_{false};
  ConnectionPool pool_;
  Executor exec_;
  CostParams cost_;

  uint32_t seq_ = 0;
  uint32_t tag_seq_ = 0;  // seq_ with the call's signature folded in: what the tags carry
  Status broken_;
  // (collective, algo, size class); allreduce is -1.
  std::set<std::tuple<int, int, int>> logged_;
  // choose_allreduce's answers and the plans they build, by (bytes, element size, chunk):
  // training repeats the same calls every step, and evaluating the model (every entry's rule and
  // cost) and building the plans took most of a 4 KiB shm allreduce (3.5 us; 1.2 us without).
  // Emptied when it reaches kMaxCachedChoices. Under exec_mu_.
  static constexpr size_t kMaxCachedChoices = 256;
  struct CachedAllreduce {
    AllreduceChoice choice;
    std::vector<Plan> plans;  // this rank's, for bytes / element size elements
  };
  std::map<std::tuple<size_t, size_t, size_t>, CachedAllreduce> allreduce_choices_;
  Result<const CachedAllreduce*> allreduce_plans(size_t count, size_t elem_bytes);
  // The same for broadcast, allgather and reduce-scatter: the choice for `bytes` (the model's
  // size of the call) and the plans for `count` elements from `root`, on as many channels as the
  // algorithm takes for `channel_bytes` (0: one channel).
  struct CachedCollective {
    CollectiveChoice choice;
    std::vector<Plan> plans;
  };
  std::map<std::tuple<int, size_t, size_t, int, size_t, size_t>, CachedCollective>
      collective_choices_;
  Result<const CachedCollective*> collective_plans(Collective kind, size_t bytes, size_t count,
                                                   int root, size_t channel_bytes,
                                                   size_t elem_bytes);
  std::string summary_;                          // describe(), made by init()
  std::map<std::string, std::string> resolved_;  // resolved(), made by init()

  std::mutex exec_mu_;  // one collective at a time
  AsyncQueue queue_;    // iallreduce
  // Point-to-point (collectives/p2p.h), made on first use; connections of its own.
  std::mutex p2p_mu_;
  std::unique_ptr<PointToPoint> p2p_;
  Result<PointToPoint*> point_to_point() {
    std::lock_guard<std::mutex> lock(p2p_mu_);
    if (aborted()) return aborted_error("point-to-point: communicator aborted");
    if (!p2p_) {
      p2p_ = std::make_unique<PointToPoint>(
          group_,
          PoolOptions{settings_.mode, settings_.factory, settings_.timeout_ms, settings_.spin_us,
                      settings_.config, settings_.route_host},
          P2POptions{settings_.timeout_ms, settings_.spin_us, exec_.chunk_bytes()}, &aborted_);
    }
    return p2p_.get();
  }
};

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

// ---- collectives ------------------------------------------------------------------------------

int CommImpl::channels_for(size_t bytes) const {
  if (settings_.nchannels_cfg > 0) return settings_.nchannels_cfg;
  // One channel until each would still carry several chunks per ring step.
  const size_t per_rank_step = bytes / static_cast<size_t>(size());
  const size_t chunk = exec_.chunk_bytes();
  if (per_rank_step >= 8 * chunk) return 4;
  if (per_rank_step >= 2 * chunk) return 2;
  return 1;
}

Status CommImpl::check_usable(const char* name) const {
  if (aborted()) return aborted_error("{}: communicator aborted", name);
  if (!broken_.ok()) {
    return Status(broken_.code(),
                  fmt::format("{}: communicator unusable after an earlier error: {}", name,
                              broken_.message()));
  }
  return ok_status();
}

namespace {

// The call's signature as the 19 bits of the tag's sequence field (splitmix64's finaliser over
// the fields side by side): a few nanoseconds per call.
uint32_t fold_signature(int kind, DataType dtype, ReduceOp op, bool reduces, int root) {
  uint64_t x = static_cast<uint64_t>(kind + 1) ^ (static_cast<uint64_t>(dtype) << 8) ^
               (static_cast<uint64_t>(reduces ? static_cast<int>(op) + 1 : 0) << 16) ^
               (static_cast<uint64_t>(static_cast<uint32_t>(root)) << 24);
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return static_cast<uint32_t>(x >> 45);
}

// Every transport words a receive whose tag differs from the send's as a "tag mismatch"
// (core/net/transport.h); in a collective that is a peer running another call.
bool tag_mismatch(const Status& s) {
  return s.code() == Code::kInternal && s.message().find("tag mismatch") != std::string::npos;
}

}  // namespace

template <typename F>
Status CommImpl::run_collective(const char* name, const CallSig& sig, F&& body) {
  GW_RETURN_IF_ERROR(check_usable(name));
  ++seq_;
  tag_seq_ =
      seq_ ^ fold_signature(static_cast<int>(sig.kind), sig.dtype, sig.op, sig.reduces, sig.root);
  Status s = body(deadline_after_ms(settings_.timeout_ms));
  if (tag_mismatch(s)) {
    // The header's promise: arguments that disagree are the callers' error.
    std::string mine = fmt::format("{} of {}", name, dtype_name(sig.dtype));
    if (sig.reduces) mine += fmt::format(", op {}", op_name(sig.op));
    if (sig.root >= 0) mine += fmt::format(", root {}", sig.root);
    s = invalid_arg(
        "{}: ranks disagree on the collective, its dtype, op or root, or on the order of calls: "
        "rank {} called {} as its collective #{} ({})",
        name, rank(), mine, seq_, s.message());
  }
  if (!s.ok() && s.code() != Code::kAborted) {
    // Close every connection: the peers' pending operations fail with kPeer at once instead of
    // waiting for their deadline, and this communicator refuses later calls.
    GW_LOG_ERROR("rank {}: {}", rank(), s.to_string());
    broken_ = s;
    pool_.close_all();
  }
  return s;
}

Status validate_buffers(const char* name, const void* a, const void* b, size_t count,
                        DataType dtype, size_t a_elems, size_t b_elems) {
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("{}: invalid dtype {}", name, static_cast<int>(dtype));
  }
  if (count > 0 && (a == nullptr || b == nullptr)) {
    return invalid_arg("{}: null buffer with count {}", name, count);
  }
  const size_t es = dtype_size(dtype);
  if (count > (SIZE_MAX / 64) / es) return invalid_arg("{}: count {} too large", name, count);
  if (a != b && count > 0) {
    auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
    if (pa < pb + b_elems * es && pb < pa + a_elems * es) {
      return invalid_arg("{}: send and receive buffers overlap without being the same buffer",
                         name);
    }
  }
  return ok_status();
}

Status CommImpl::allreduce(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                           ReduceOp op) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  return allreduce_locked(sendbuf, recvbuf, count, dtype, op);
}

Result<const CommImpl::CachedAllreduce*> CommImpl::allreduce_plans(size_t count,
                                                                   size_t elem_bytes) {
  const size_t bytes = count * elem_bytes;
  const auto key = std::make_tuple(bytes, elem_bytes, exec_.chunk_bytes());
  auto it = allreduce_choices_.find(key);
  if (it != allreduce_choices_.end()) return &it->second;
  CachedAllreduce c;
  GW_ASSIGN_OR_RETURN(
      c.choice, choose_allreduce(group_, bytes, call_cost(elem_bytes), settings_.forced_algo));
  const AllreduceAlgorithm& algo = *c.choice.algorithm;
  const int nch = std::min(algo.max_channels, channels_for(bytes));
  c.plans = algo.build(group_, count, nch, std::max<size_t>(1, exec_.chunk_bytes() / elem_bytes));
  if (allreduce_choices_.size() >= kMaxCachedChoices) allreduce_choices_.clear();
  return &allreduce_choices_.emplace(key, std::move(c)).first->second;
}

Result<const CommImpl::CachedCollective*> CommImpl::collective_plans(Collective kind, size_t bytes,
                                                                     size_t count, int root,
                                                                     size_t channel_bytes,
                                                                     size_t elem_bytes) {
  const auto key =
      std::make_tuple(static_cast<int>(kind), bytes, count, root, elem_bytes, exec_.chunk_bytes());
  auto it = collective_choices_.find(key);
  if (it != collective_choices_.end()) return &it->second;
  CachedCollective c;
  GW_ASSIGN_OR_RETURN(c.choice, choose(kind, bytes, elem_bytes));
  const CollectiveAlgorithm& algo = *c.choice.algorithm;
  const int nch = channel_bytes ? std::min(algo.max_channels, channels_for(channel_bytes)) : 1;
  c.plans =
      algo.build(group_, count, root, nch, std::max<size_t>(1, exec_.chunk_bytes() / elem_bytes));
  if (collective_choices_.size() >= kMaxCachedChoices) collective_choices_.clear();
  return &collective_choices_.emplace(key, std::move(c)).first->second;
}

Status CommImpl::allreduce_locked(const void* sendbuf, void* recvbuf, size_t count, DataType dtype,
                                  ReduceOp op) {
  GW_RETURN_IF_ERROR(validate_buffers("allreduce", sendbuf, recvbuf, count, dtype, count, count));
  if (!valid_op(static_cast<int>(op))) {
    return invalid_arg("allreduce: invalid op {}", static_cast<int>(op));
  }
  const CallSig sig{CallKind::kAllreduce, dtype, op, true};
  return run_collective("allreduce", sig, [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(dtype);
    const size_t bytes = count * es;
    auto* out = static_cast<uint8_t*>(recvbuf);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    if (size() == 1) {
      if (in != out && bytes) std::memcpy(out, in, bytes);
      return ok_status();
    }
    GW_ASSIGN_OR_RETURN(const CachedAllreduce* cached, allreduce_plans(count, es));
    const AllreduceChoice& choice = cached->choice;
    const AllreduceAlgorithm& algo = *choice.algorithm;
    const std::vector<Plan>& plans = cached->plans;
    if (algo.algo == Algo::kPair && in == out && bytes) {
      // pair sends its input while it reduces into its output over the same range: in place,
      // the send reads a copy (schedule.h).
      uint8_t* copy = exec_.scratch(bytes);
      std::memcpy(copy, in, bytes);
      in = copy;
    }
    if (logged_.insert({-1, static_cast<int>(algo.algo), size_class(bytes)}).second) {
      GW_LOG_INFO("{}", describe_choice(bytes, choice, static_cast<int>(plans.size())));
    }
    GW_RETURN_IF_ERROR(exec_.run("allreduce", tag_seq_, plans, in, out, dtype, op, deadline));
    if (op == ReduceOp::kAvg) finalize_avg(dtype, out, count, size());
    return ok_status();
  });
}

Status CommImpl::broadcast(void* buf, size_t count, DataType dtype, int root) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  GW_RETURN_IF_ERROR(validate_buffers("broadcast", buf, buf, count, dtype, count, count));
  if (root < 0 || root >= size()) {
    return invalid_arg("broadcast: root {} out of range 0..{}", root, size() - 1);
  }
  const CallSig sig{CallKind::kBroadcast, dtype, ReduceOp::kSum, false, root};
  return run_collective("broadcast", sig, [&](Deadline deadline) -> Status {
    if (size() == 1) return ok_status();
    const size_t es = dtype_size(dtype);
    GW_ASSIGN_OR_RETURN(const CachedCollective* c,
                        collective_plans(Collective::kBroadcast, count * es, count, root,
                                         count * es * static_cast<size_t>(size()) / 2, es));
    const std::vector<Plan>& plans = c->plans;
    log_choice(Collective::kBroadcast, count * es, c->choice, plans.size());
    auto* p = static_cast<uint8_t*>(buf);
    return exec_.run("broadcast", tag_seq_, plans, p, p, dtype, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::allgather(const void* sendbuf, void* recvbuf, size_t sendcount, DataType dtype) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("allgather: invalid dtype {}", static_cast<int>(dtype));
  }
  if (sendcount > 0 && (sendbuf == nullptr || recvbuf == nullptr)) {
    return invalid_arg("allgather: null buffer with count {}", sendcount);
  }
  const CallSig sig{CallKind::kAllgather, dtype};
  return run_collective("allgather", sig, [&](Deadline deadline) -> Status {
    const size_t blk = sendcount * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recvbuf);
    // memmove: "in place" callers pass sendbuf inside recvbuf (at their own block or at 0).
    if (blk && sendbuf != out + rank() * blk) std::memmove(out + rank() * blk, sendbuf, blk);
    if (size() == 1) return ok_status();
    const size_t es = dtype_size(dtype);
    const size_t bytes = blk * static_cast<size_t>(size());
    GW_ASSIGN_OR_RETURN(const CachedCollective* c,
                        collective_plans(Collective::kAllgather, bytes, sendcount, 0, 0, es));
    const std::vector<Plan>& plans = c->plans;
    log_choice(Collective::kAllgather, bytes, c->choice, plans.size());
    return exec_.run("allgather", tag_seq_, plans, out, out, dtype, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                DataType dtype, ReduceOp op) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  if (!valid_dtype(static_cast<int>(dtype)) || !valid_op(static_cast<int>(op))) {
    return invalid_arg("reduce_scatter: invalid dtype {} or op {}", static_cast<int>(dtype),
                       static_cast<int>(op));
  }
  if (recvcount > 0 && (sendbuf == nullptr || recvbuf == nullptr)) {
    return invalid_arg("reduce_scatter: null buffer with count {}", recvcount);
  }
  const CallSig sig{CallKind::kReduceScatter, dtype, op, true};
  return run_collective("reduce_scatter", sig, [&](Deadline deadline) -> Status {
    const size_t es = dtype_size(dtype);
    const size_t total = recvcount * static_cast<size_t>(size());
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    uint8_t* work = size() == 1 ? nullptr : exec_.scratch(total * es);
    if (size() > 1) {
      GW_ASSIGN_OR_RETURN(
          const CachedCollective* c,
          collective_plans(Collective::kReduceScatter, total * es, recvcount, 0, 0, es));
      const std::vector<Plan>& plans = c->plans;
      log_choice(Collective::kReduceScatter, total * es, c->choice, plans.size());
      GW_RETURN_IF_ERROR(
          exec_.run("reduce_scatter", tag_seq_, plans, in, work, dtype, op, deadline));
    }
    const uint8_t* mine = size() == 1 ? in : work + rank() * recvcount * es;
    if (recvcount) std::memmove(recvbuf, mine, recvcount * es);
    if (op == ReduceOp::kAvg) finalize_avg(dtype, recvbuf, recvcount, size());
    return ok_status();
  });
}

void CommImpl::log_choice(Collective kind, size_t bytes, const CollectiveChoice& choice,
                          size_t nplans) {
  const auto key = std::make_tuple(static_cast<int>(kind), static_cast<int>(choice.algorithm->algo),
                                   size_class(bytes));
  if (logged_.insert(key).second) {
    GW_LOG_INFO("{}", describe_choice(kind, bytes, choice, static_cast<int>(nplans)));
  }
}

Status CommImpl::barrier() {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  const CallSig sig{CallKind::kBarrier};
  return run_collective("barrier", sig, [&](Deadline deadline) -> Status {
    if (size() == 1) return ok_status();
    // A ring allgather of one byte per rank: after p-1 steps every rank has heard, directly or
    // through its neighbours, from every other rank.
    uint8_t* buf = exec_.scratch(static_cast<size_t>(size()));
    buf[rank()] = 1;
    std::vector<Plan> plans(1);
    plans[0].sched = ring_allgather(rank(), size(), 1);
    return exec_.run("barrier", tag_seq_, plans, buf, buf, DataType::kU8, ReduceOp::kSum, deadline);
  });
}

Status CommImpl::alltoall(const void* sendbuf, void* recvbuf, size_t count, DataType dtype) {
  wait_async_idle();
  std::lock_guard<std::mutex> lock(exec_mu_);
  if (!valid_dtype(static_cast<int>(dtype))) {
    return invalid_arg("alltoall: invalid dtype {}", static_cast<int>(dtype));
  }
  const size_t p = static_cast<size_t>(size());
  if (count > (SIZE_MAX / 64) / dtype_size(dtype) / p) {
    return invalid_arg("alltoall: count {} too large for {} ranks", count, size());
  }
  GW_RETURN_IF_ERROR(
      validate_buffers("alltoall", sendbuf, recvbuf, count, dtype, p * count, p * count));
  const CallSig sig{CallKind::kAlltoall, dtype};
  return run_collective("alltoall", sig, [&](Deadline deadline) -> Status {
    const size_t blk = count * dtype_size(dtype);
    auto* out = static_cast<uint8_t*>(recvbuf);
    const auto* in = static_cast<const uint8_t*>(sendbuf);
    if (in == out && size() > 1 && blk > 0) {
      // Step k overwrites block (me-k) of the output before step p-k has sent that block of the
      // input: in place needs a copy of the input.
      uint8_t* copy = exec_.scratch(p * blk);
      std::memcpy(copy, in, p * blk);
      in = copy;
    }
    if (in != out && blk > 0) std::memcpy(out + rank() * blk, in + rank() * blk, blk);
    if (size() == 1) return ok_status();
    // The steps are independent: deal them round-robin to up to kAlltoallInFlight plans that run
    // together. Each step talks to a different peer, so no two plans share a connection.
    Schedule all = pairwise_alltoall(rank(), size(), count);
    const size_t nplans = std::min<size_t>(all.size(), kAlltoallInFlight);
    std::vector<Plan> plans(nplans);
    for (size_t i = 0; i < all.size(); ++i) plans[i % nplans].sched.push_back(all[i]);
    return exec_.run("alltoall", tag_seq_, plans, in, out, dtype, ReduceOp::kSum, deadline);
  });
}

Result<std::unique_ptr<AsyncOp>> CommImpl::iallreduce(const void* sendbuf, void* recvbuf,
                                                      size_t count, DataType dtype, ReduceOp op) {
  GW_RETURN_IF_ERROR(validate_buffers("iallreduce", sendbuf, recvbuf, count, dtype, count, count));
  if (!valid_op(static_cast<int>(op))) {
    return invalid_arg("iallreduce: invalid op {}", static_cast<int>(op));
  }
  GW_RETURN_IF_ERROR(check_usable("iallreduce"));
  // Ops queue behind each other, so "wait forever" means a few deadlines at most.
  return queue_.push(
      "iallreduce",
      [this, sendbuf, recvbuf, count, dtype, op] {
        std::lock_guard<std::mutex> elock(exec_mu_);
        return allreduce_locked(sendbuf, recvbuf, count, dtype, op);
      },
      settings_.timeout_ms);
}

}  // namespace

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
