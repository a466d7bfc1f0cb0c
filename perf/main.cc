// gradwire-perf: nccl-tests style collective sweeps and perftest style point-to-point numbers.
// See docs/perf.md for the columns, their formulas and how to compare against peers.
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cstdio>
#include <string>
#include <vector>

#include "collectives/compress/compress_config.h"
#include "core/config.h"
#include "core/config_snapshot.h"
#include "core/net/backend_registry.h"
#include "core/net/net_config.h"
#include "daemon/daemon_config.h"
#include "gradwire/gradwire.h"
#include "kv/kv_config.h"
#include "perf/coll_bench.h"
#include "perf/compress_cmd.h"
#include "perf/doctor.h"
#include "perf/p2p_bench.h"

namespace {

using gw::perf::Collective;

// Components whose settings the tool reads nowhere, linked and registered so that --dump-config
// lists every knob of libgradwire (the compressed allreduce's, the daemon client's,
// gradwired's and the parameter server's), as the plugin's rows compiled in beside it.
[[maybe_unused]] const bool kAllRowsRegistered = [] {
  gw::coll::compress_config::rows();
  gw::daemon_config::rows();
  gw::kv::kv_config::rows();
  return true;
}();

// A size option accepting K/M/G suffixes (powers of 1024), like nccl-tests' -b/-e.
std::string parse_size_into(const std::string& text, uint64_t* out) {
  auto v = gw::config::parse_size(text);
  if (!v.ok()) return v.status().message();
  *out = *v;
  return "";
}

// "auto" and every backend the registry knows (gw_backends registered them before main).
std::vector<std::string> transport_choices() {
  std::vector<std::string> names = gw::net::backend_names();
  names.insert(names.begin(), "auto");
  return names;
}

// --transport not given: GW_TRANSPORT (the environment or the config file) means what the flag
// would, and a bad value is refused naming where it came from. `auto_ok`: false for p2p, which
// measures one named transport (its default stays tcp).
bool transport_from_config(CLI::App* cmd, std::string* transport, bool auto_ok) {
  if (cmd->get_option("--transport")->count() > 0) return true;
  const gw::config::Value v = gw::config::resolve(gw::net::net_config::kTransport);
  if (v.source == gw::config::Source::kDefault) return true;
  const std::string where =
      fmt::format("{} ({})", v.source == gw::config::Source::kFile ? "transport" : "GW_TRANSPORT",
                  gw::config::source_text(v));
  if (v.text == "auto" && !auto_ok) {
    std::fprintf(stderr,
                 "gradwire-perf: %s=auto: p2p measures one named transport (%s); set one or "
                 "pass --transport\n",
                 where.c_str(),
                 fmt::format("{}", fmt::join(gw::net::backend_names(), ", ")).c_str());
    return false;
  }
  gw::Status s = gw::net::check_backend_name(v.text, where);
  if (!s.ok()) {
    std::fprintf(stderr, "gradwire-perf: %s\n", s.message().c_str());
    return false;
  }
  *transport = v.text;
  return true;
}

// nccl-tests' type names (-d float, half, double) as gradwire's.
std::string dtype_alias(const std::string& name) {
  if (name == "float") return "float32";
  if (name == "double") return "float64";
  if (name == "half") return "float16";
  return name;
}

void add_size_option(CLI::App* app, const std::string& flags, uint64_t* target,
                     const std::string& help) {
  auto* opt = app->add_option_function<std::string>(
      flags,
      [target](const std::string& text) {
        std::string err = parse_size_into(text, target);
        if (!err.empty()) throw CLI::ValidationError(err);
      },
      help);
  opt->type_name("SIZE");
}

// An integer option that may be given without its value (then `bare`), like nccl-tests' -c.
void add_count_option(CLI::App* app, const std::string& flags, int* target, int bare,
                      const std::string& help) {
  app->add_option_function<std::string>(
         flags,
         [target, bare, flags](const std::string& text) {
           if (text.empty()) {
             *target = bare;
             return;
           }
           int v = 0;
           auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
           if (ec != std::errc() || p != text.data() + text.size() || v < 0) {
             throw CLI::ValidationError(flags + " " + text + ": a count >= 0");
           }
           *target = v;
         },
         help)
      ->expected(0, 1)
      ->type_name("N");
}

struct CollCli {
  gw::perf::CollConfig config;
  std::string dtype = "float32";
  std::string op = "sum";
};

CLI::App* add_collective(CLI::App& app, const std::string& name, Collective coll,
                         const std::string& what, CollCli* cli) {
  cli->config.coll = coll;
  cli->config.name = name;
  auto* sub = app.add_subcommand(name, what);
  auto& c = cli->config;
  add_size_option(sub, "-b,--minbytes", &c.min_bytes,
                  "smallest size in bytes (K/M/G suffixes; default 1K)");
  add_size_option(sub, "-e,--maxbytes", &c.max_bytes, "largest size in bytes (default 256M)");
  auto* factor =
      sub->add_option("-f,--stepfactor", c.factor, "multiply the size by this between rows")
          ->capture_default_str();
  add_size_option(sub, "-i,--stepbytes", &c.step_bytes,
                  "add this many bytes between rows instead of multiplying (linear steps, K/M/G "
                  "suffixes)");
  sub->get_option("--stepbytes")->excludes(factor);
  sub->add_option("-d,--datatype", cli->dtype,
                  "float32, float64, float16, bfloat16, int32, int64, uint8 (or nccl-tests' "
                  "names: float, double, half)")
      ->capture_default_str();
  if (coll == Collective::kAllreduce || coll == Collective::kReduceScatter ||
      coll == Collective::kReduce) {
    sub->add_option("-o,--op", cli->op, "sum, prod, min, max, avg")->capture_default_str();
  }
  if (gw::perf::is_rooted(coll)) {
    sub->add_option("-r,--root", c.root, "root rank of the " + name)->capture_default_str();
  }
  sub->add_option("--np", c.np,
                  "fork this many ranks on this machine with a private store; without it the "
                  "ranks come from the launcher's environment (torchrun, mpirun, srun, GW_*)")
      ->check(CLI::Range(1, 256));
  sub->add_option("--transport", c.transport,
                  gw::net::describe_backends() +
                      " (dpdk: port from GW_DPDK_EAL_ARGS; one rank per host: run it under a "
                      "launcher); without it GW_TRANSPORT, else auto")
      ->check(CLI::IsMember(transport_choices()))
      ->capture_default_str();
  sub->add_option("--algo", c.algo,
                  "force the allreduce algorithm: auto, ring, rhd, host_ring, hier, hier_leader, "
                  "tree, bblocks, pair (sets GW_ALGO; one that does not apply to the ranks is an "
                  "error)");
  sub->add_option("-n,--iters", c.iters,
                  "timed iterations per size; 0 = adaptive clamp(2e9/size/ranks, 3, 50)")
      ->capture_default_str();
  sub->add_option("-w,--warmup", c.warmup, "untimed iterations per size")->capture_default_str();
  sub->add_option("--warmup-ms", c.warmup_ms,
                  "before the first size is timed, untimed calls of it until this many "
                  "milliseconds have passed on every rank (a transport's first frames can be "
                  "slower than the rest: over AF_XDP on a shadow-paged guest the first 2048 "
                  "received frames cost the kernel a page fault each); 0 = none")
      ->check(CLI::Range(int64_t{0}, int64_t{600000}))
      ->capture_default_str();
  add_count_option(sub, "-c,--check", &c.check_iters, 1,
                   "N checked calls per size, out of place and in place, each verified against a "
                   "rank- and index-dependent pattern (exact for integers, dtype rounding for "
                   "floats); -c alone: 1; default 0 (no check); exit status 1 if any element is "
                   "wrong");
  sub->add_option_function<std::string>(
         "-a,--average",
         [&c](const std::string& text) {
           int v = 1;
           if (!text.empty()) {
             if (text.size() != 1 || text[0] < '0' || text[0] > '3') {
               throw CLI::ValidationError("-a " + text +
                                          ": 0 (rank 0), 1 (mean), 2 (min), 3 (max)");
             }
             v = text[0] - '0';
           }
           c.average = static_cast<gw::perf::CollConfig::Average>(v);
         },
         "time across ranks as nccl-tests: 0 rank 0's, 1 the mean of the ranks' times (-a "
         "alone), 2 the fastest rank's, 3 the slowest rank's (default)")
      ->expected(0, 1)
      ->type_name("0-3");
  sub->add_option_function<std::string>(
         "-z,--blocking",
         [&c](const std::string& text) {
           if (text.empty() || text == "1") {
             c.blocking = true;
           } else if (text == "0") {
             c.blocking = false;
           } else {
             throw CLI::ValidationError("-z " + text + ": 0 or 1");
           }
         },
         "1 (default, or -z alone): blocking calls, each timed; 0 (allreduce only): every "
         "iteration issued with gw_iallreduce, then waited for, time = total / iterations "
         "(nccl-tests' default)")
      ->expected(0, 1)
      ->type_name("0|1");
  sub->add_option("-J,--json", c.json_path,
                  "write one JSON document (configuration, rows, and \"error\" on failure)");
  sub->add_flag(
      "--mem-alloc", c.mem_alloc,
      "take the send and receive buffers from gw_mem_alloc (freed with gw_mem_free): in "
      "daemon mode (GW_DAEMON) memory of the trainer's shared arena, so the daemon reads "
      "and writes them in place (zero-copy); in direct mode, ranks of one host over shm get "
      "shared memory they map into each other (no kernel copy in a large allreduce), "
      "others plain aligned host memory. "
      "Default: ordinary heap buffers (daemon mode copies them through the arena)");
  sub->add_flag("--cpu", c.cpu,
                "after each row, a '# cpu:' line: the whole machine's CPU time (/proc/stat: every "
                "rank, the kernel's network work) and rank 0's user and system time per GB of "
                "the buffer moved in the out-of-place timed iterations, and cycles per byte at "
                "the nominal clock; the machine figure means something only on an otherwise idle "
                "machine");
  sub->add_flag("--progress", c.progress, "progress lines on stderr (default: only on a tty)");
  sub->add_option("--timeout-ms", c.timeout_ms,
                  "deadline of every wait inside the library (default: GW_TIMEOUT_MS)");
  return sub;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gradwire-perf: collective bandwidth sweeps (nccl-tests columns) and point-to-point "
      "transport bandwidth/latency (perftest columns). Non-data lines start with '#'."};
  app.require_subcommand(0, 1);
  bool dump_config = false, toml = false, version = false;
  app.add_flag("--version", version, "print gradwire-perf's and libgradwire's versions, then exit");
  app.add_flag("--dump-config", dump_config,
               "print every GW_* tunable with its default and current value, then exit");
  app.add_flag("--toml", toml, "with --dump-config: print it as a TOML file");

  CollCli allreduce, allgather, reduce_scatter, broadcast, alltoall, alltoallv, reduce, gather,
      scatter;
  std::vector<std::pair<CLI::App*, CollCli*>> colls = {
      {add_collective(app, "allreduce", Collective::kAllreduce,
                      "allreduce sweep; busbw = algbw * 2(n-1)/n", &allreduce),
       &allreduce},
      {add_collective(app, "allgather", Collective::kAllgather,
                      "allgather sweep (size = the whole gathered buffer); busbw = algbw * (n-1)/n",
                      &allgather),
       &allgather},
      {add_collective(
           app, "reduce_scatter", Collective::kReduceScatter,
           "reduce-scatter sweep (size = the whole input buffer); busbw = algbw * (n-1)/n",
           &reduce_scatter),
       &reduce_scatter},
      {add_collective(app, "broadcast", Collective::kBroadcast, "broadcast sweep; busbw = algbw",
                      &broadcast),
       &broadcast},
      {add_collective(app, "alltoall", Collective::kAlltoall,
                      "all-to-all sweep (size = the whole send buffer of a rank, size/n to each "
                      "rank); busbw = algbw * (n-1)/n",
                      &alltoall),
       &alltoall},
      {add_collective(app, "alltoallv", Collective::kAlltoallv,
                      "all-to-all-v sweep (gw_alltoallv): size = the whole send buffer of a rank, "
                      "split unevenly by a fixed-seed rule (weights 1..8 per destination, seed 29; "
                      "perf/coll_alltoallv.h); busbw = algbw * (n-1)/n",
                      &alltoallv),
       &alltoallv},
      {add_collective(app, "reduce", Collective::kReduce,
                      "reduce sweep (gw_reduce: the sum lands at --root only); busbw = algbw",
                      &reduce),
       &reduce},
      {add_collective(app, "gather", Collective::kGather,
                      "gather sweep (gw_gather; size = the whole gathered buffer at --root); busbw "
                      "= algbw * (n-1)/n",
                      &gather),
       &gather},
      {add_collective(app, "scatter", Collective::kScatter,
                      "scatter sweep (gw_scatter; size = the whole buffer --root scatters); busbw "
                      "= algbw * (n-1)/n",
                      &scatter),
       &scatter},
  };

  gw::perf::CompressCmdConfig compress;  // gradwire-perf compress, allreduce --codec
  auto* compress_cmd = gw::perf::add_compress_command(app, &compress);
  std::vector<std::string> codecs;
  gw::perf::add_codec_option(colls[0].first, &codecs);

  gw::perf::P2pConfig p2p;
  auto* p2p_cmd = app.add_subcommand(
      "p2p",
      "point-to-point over one transport between 2 ranks: bandwidth sweep with a window of "
      "outstanding sends (ib_write_bw columns), then ping-pong latency (ib_send_lat). Across hosts "
      "as perftest: `p2p --transport tcp` on one host waits for a client, `p2p --transport tcp "
      "HOST` on the other connects and prints; --np 2 (and shm) forks both ranks here; under a "
      "launcher, its 2 ranks");
  p2p_cmd
      ->add_option("--transport", p2p.transport,
                   fmt::format("{} (dpdk with --np 2: a net_memif pair unless GW_DPDK_EAL_ARGS "
                               "is set; server/client or under a launcher: each host's "
                               "GW_DPDK_EAL_ARGS and GW_DPDK_IP); without it GW_TRANSPORT, "
                               "else tcp",
                               fmt::join(gw::net::backend_names(), ", ")))
      ->capture_default_str();
  p2p_cmd->add_option("HOST", p2p.peer_host,
                      "the server's host: run as the client (sends, prints the results); "
                      "without it (and without --np or a launcher) this process is the server");
  p2p_cmd->add_option("-p,--port", p2p.port, "the server's rendezvous port")->capture_default_str();
  add_size_option(p2p_cmd, "--minbytes", &p2p.min_bytes, "smallest size (default 1)");
  add_size_option(p2p_cmd, "-e,--maxbytes", &p2p.max_bytes, "largest size (default 64M)");
  add_size_option(p2p_cmd, "-s,--size", &p2p.size, "one size only (perftest's -s)");
  p2p_cmd->add_flag("-a,--all", p2p.all_sizes,
                    "all sizes from 2 B to 8 MiB, doubling (perftest's -a)");
  p2p_cmd
      ->add_option("-D,--duration", p2p.duration_s,
                   "stream each size for this many seconds instead of --iters messages")
      ->type_name("SECONDS");
  p2p_cmd->add_flag("--report_gbits", p2p.report_gbits, "bandwidth in Gb/s instead of MB/s");
  p2p_cmd->add_flag("-b,--bidirectional", p2p.bidirectional,
                    "both ranks send at once; the bandwidth is the sum of both directions");
  p2p_cmd->add_option("-f,--stepfactor", p2p.factor, "size step factor")->capture_default_str();
  p2p_cmd
      ->add_option("-n,--iters", p2p.iters,
                   "messages per size; 0 = adaptive clamp(2e9/size, 20, 1000)")
      ->capture_default_str();
  p2p_cmd->add_option("--window", p2p.window, "outstanding sends while streaming")
      ->capture_default_str();
  add_size_option(p2p_cmd, "--lat-size", &p2p.lat_bytes, "ping-pong message size (default 8)");
  p2p_cmd->add_option("--lat-iters", p2p.lat_iters, "ping-pong round trips")->capture_default_str();
  p2p_cmd->add_option("--np", p2p.np,
                      "2: fork both ranks here; without it the ranks come from the launcher's "
                      "environment (GW_RANK/GW_WORLD_SIZE/GW_STORE, torchrun, mpirun, srun: one "
                      "per host, world size 2) when it names a rank, else both are forked here");
  p2p_cmd->add_option("-J,--json", p2p.json_path, "write one JSON document");
  p2p_cmd->add_option("--timeout-ms", p2p.timeout_ms,
                      "deadline of every wait (default: GW_TIMEOUT_MS)");
  p2p_cmd->add_flag("--capi", p2p.capi,
                    "through the C ABI (gw_isend/gw_irecv bandwidth, gw_send/gw_recv ping-pong "
                    "latency) between 2 ranks forked here (or a launcher's 2), instead of the "
                    "bare transport; the bandwidth clock stops on the receiver's reply after "
                    "its last receive");

  auto* doctor_cmd = app.add_subcommand(
      "doctor",
      "read this host's RDMA and network set-up (RDMA devices and ports, link layer, LID, RoCE v2 "
      "GIDs and their netdev's MTU, ulimit -l, hugepages, GPUs, GPUDirect RDMA, NUMA of GPUs and "
      "NICs, the receive queues of GW_DPDK_EAL_ARGS's AF_XDP interfaces) and print findings, each "
      "with what to change; exit 1 when one is an error");
  bool doctor_json = false;
  std::string doctor_root;
  doctor_cmd->add_flag("--json", doctor_json, "print the findings as one JSON document");
  doctor_cmd->add_option("--sysfs-root", doctor_root,
                         "the sysfs tree to read (default: GW_IB_SYSFS_ROOT, /sys)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (version) {
    std::printf("gradwire-perf %s (libgradwire %s)\n", GW_VERSION_STRING, gw_version());
    return 0;
  }
  if (dump_config) {
    // What a run would refuse is reported, not dumped as the defaults it reads as.
    const gw::config::Snapshot snapshot = gw::config::Snapshot::capture();
    if (gw::Status valid = snapshot.validate(); !valid.ok()) {
      std::fprintf(stderr, "gradwire-perf: %s\n", valid.message().c_str());
      return 2;
    }
    std::fputs(snapshot.dump(toml).c_str(), stdout);
    return 0;
  }
  if (toml) {
    std::fprintf(stderr, "gradwire-perf: --toml only makes sense with --dump-config\n");
    return 2;
  }
  if (compress_cmd->parsed()) return gw::perf::run_compress_command(compress);
  if (doctor_cmd->parsed()) {
    gw::perf::DoctorInputs in = gw::perf::host_inputs();
    if (doctor_root.empty()) {
      const gw::config::Row* row = gw::config::find("GW_IB_SYSFS_ROOT");
      doctor_root = row != nullptr ? gw::config::get_string(*row) : "/sys";
    }
    in.root = doctor_root;
    if (const gw::config::Row* row = gw::config::find("GW_DPDK_EAL_ARGS")) {
      in.dpdk_eal_args = gw::config::get_string(*row);  // the environment or a config file
    }
    const auto findings = gw::perf::run_doctor(in);
    const std::string text =
        doctor_json ? gw::perf::findings_json(findings) : gw::perf::format_findings(findings);
    std::fputs(text.c_str(), stdout);
    for (const auto& f : findings) {
      if (f.severity == gw::perf::Severity::kError) return 1;
    }
    return 0;
  }
  for (auto& [cmd, cli] : colls) {
    if (!cmd->parsed()) continue;
    if (!transport_from_config(cmd, &cli->config.transport, true)) return 2;
    auto dt = gw::coll::parse_dtype(dtype_alias(cli->dtype));
    if (!dt) {
      std::fprintf(stderr,
                   "gradwire-perf: -d %s: unknown datatype (float32, float64, float16, bfloat16, "
                   "int32, int64, uint8)\n",
                   cli->dtype.c_str());
      return 2;
    }
    auto op = gw::coll::parse_op(cli->op);
    if (!op) {
      std::fprintf(stderr, "gradwire-perf: -o %s: unknown op (sum, prod, min, max, avg)\n",
                   cli->op.c_str());
      return 2;
    }
    cli->config.dtype = *dt;
    cli->config.op = *op;
    if (!codecs.empty()) {
      return gw::perf::run_codec_allreduce(cli->config, codecs);
    }
    return gw::perf::run_collective(cli->config);
  }
  if (p2p_cmd->parsed()) {
    if (!transport_from_config(p2p_cmd, &p2p.transport, false)) return 2;
    return p2p.capi ? gw::perf::run_p2p_capi(p2p) : gw::perf::run_p2p(p2p);
  }
  std::fputs(app.help().c_str(), stdout);
  return 2;
}
