#include "perf/compress_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "collectives/coll_config.h"
#include "collectives/compress/codec.h"
#include "collectives/compress/codec_kernels.h"
#include "core/config.h"
#include "core/core_config.h"
#include "gradwire/gradwire.h"
#include "perf/rank_launcher.h"

namespace gw::perf {

namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

int iters_for(uint64_t bytes, int nranks, int forced) {
  if (forced > 0) return forced;
  const double it = 2e9 / static_cast<double>(std::max<uint64_t>(bytes, 1)) / std::max(nranks, 1);
  return static_cast<int>(std::clamp(it, 3.0, 50.0));
}

void add_size(CLI::App* app, const std::string& flags, uint64_t* target, const std::string& help) {
  app->add_option_function<std::string>(
         flags,
         [target](const std::string& text) {
           auto v = config::parse_size(text);
           if (!v.ok()) throw CLI::ValidationError(v.status().message());
           *target = *v;
         },
         help)
      ->type_name("SIZE");
}

}  // namespace

CLI::App* add_compress_command(CLI::App& app, CompressCmdConfig* c) {
  auto* sub = app.add_subcommand(
      "compress",
      "codec throughput on this CPU, one thread: encode (with error feedback) and decode GB/s of "
      "float32 input, and the compression ratio, per codec and size");
  sub->add_option("--codec", c->codecs,
                  "codec spec (repeatable; default fp16 bf16 topk:0.01 randomk:0.01 sign qsgd:16)")
      ->delimiter('\0');
  add_size(sub, "-b,--minbytes", &c->min_bytes, "smallest input in bytes (default 1M)");
  add_size(sub, "-e,--maxbytes", &c->max_bytes, "largest input in bytes (default 64M)");
  sub->add_option("-f,--stepfactor", c->factor, "size step factor")->capture_default_str();
  sub->add_option("-n,--iters", c->iters, "iterations per size (0: adaptive)")
      ->capture_default_str();
  return sub;
}

void add_codec_option(CLI::App* allreduce, std::vector<std::string>* codecs) {
  allreduce
      ->add_option(
          "--codec", *codecs,
          "run the compressed allreduce (gw_allreduce_compressed) with this codec spec, "
          "repeatable; an uncompressed float32 row and an ef-floor row (the memory passes of "
          "error feedback alone, no codec) are measured in the same run; adds a bytes_sent "
          "column")
      ->delimiter('\0');
}

int run_compress_command(const CompressCmdConfig& c) {
  std::vector<std::string> codecs = c.codecs;
  if (codecs.empty()) codecs = {"fp16", "bf16", "topk:0.01", "randomk:0.01", "sign", "qsgd:16"};
  if (c.min_bytes < 4 || c.min_bytes > c.max_bytes || c.factor < 2) {
    std::fprintf(stderr, "gradwire-perf compress: need 4 <= -b <= -e and -f >= 2\n");
    return 2;
  }
  std::printf(
      "# gradwire-perf compress: one thread, float32 input, error feedback as the spec "
      "says; kernels: %s\n",
      std::string(coll::codec_kernels::isa()).c_str());
  std::printf("# %-22s %12s %10s %12s %12s %8s\n", "codec", "size", "iters", "encode_GBps",
              "decode_GBps", "ratio");
  for (const auto& text : codecs) {
    auto spec = coll::parse_codec_spec(text);
    if (!spec.ok()) {
      std::fprintf(stderr, "gradwire-perf compress: %s\n", spec.status().to_string().c_str());
      return 2;
    }
    auto codec = coll::Codec::create(*spec);
    if (!codec.ok()) {
      std::fprintf(stderr, "gradwire-perf compress: %s: %s\n", text.c_str(),
                   codec.status().to_string().c_str());
      return 2;
    }
    for (uint64_t b = c.min_bytes; b <= c.max_bytes; b *= static_cast<uint64_t>(c.factor)) {
      const size_t n = b / 4;
      auto in = gaussian(n, 1);
      std::vector<float> residual(n, 0.0f), acc(n, 0.0f);
      const size_t e = (*codec)->encoded_size(n);
      std::vector<uint8_t> enc(e);
      const int iters = iters_for(b, 1, c.iters);
      float* res = spec->error_feedback ? residual.data() : nullptr;
      coll::CodecContext ctx{coll::fnv1a64("perf"), 0, 0};
      // One untimed pass (page faults), then the timed ones.
      Status st = (*codec)->encode(in.data(), res, n, enc.data(), e, ctx);
      double t_enc = 0, t_dec = 0;
      for (int i = 0; i < iters && st.ok(); ++i) {
        ctx.step = static_cast<uint64_t>(i + 1);
        auto t0 = Clock::now();
        st = (*codec)->encode(in.data(), res, n, enc.data(), e, ctx);
        auto t1 = Clock::now();
        if (st.ok()) st = (*codec)->decode_add(enc.data(), e, n, acc.data(), ctx);
        auto t2 = Clock::now();
        t_enc += std::chrono::duration<double>(t1 - t0).count();
        t_dec += std::chrono::duration<double>(t2 - t1).count();
      }
      if (!st.ok()) {
        std::fprintf(stderr, "gradwire-perf compress: %s: %s\n", text.c_str(),
                     st.to_string().c_str());
        return 2;
      }
      const double gb = static_cast<double>(b) * iters / 1e9;
      std::printf("  %-22s %12llu %10d %12.2f %12.2f %8.1f\n", text.c_str(),
                  static_cast<unsigned long long>(b), iters, gb / t_enc, gb / t_dec,
                  static_cast<double>(b) / static_cast<double>(e));
      std::fflush(stdout);
      if (b > c.max_bytes / static_cast<uint64_t>(c.factor)) break;
    }
  }
  return 0;
}

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

constexpr const char* kFloorRow = "ef-floor";

// residual += g, then g = 0 written with streaming stores (the output, written without being
// read): the least memory traffic of an error-feedback codec's call, done with plain kernels.
void memory_floor(float* g, float* residual, size_t n) {
  coll::codec_kernels::add_f32(g, n, residual);
  constexpr size_t kBlock = 4096;
  static const std::vector<float> zeros(kBlock, 0.0f);
  for (size_t off = 0; off < n; off += kBlock) {
    coll::codec_kernels::store_stream_f32(zeros.data(), std::min(kBlock, n - off), g + off);
  }
}

// The request, as the --json document's "config" (rank 0 adds what the communicator resolved).
json codec_config_json(const CodecAllreduceConfig& c, const std::vector<std::string>& codecs) {
  json j;
  j["collective"] = "allreduce";
  j["codecs"] = codecs;
  j["ranks_requested"] = c.np;
  j["transport_requested"] = c.requested_transport.empty() ? c.transport : c.requested_transport;
  j["algorithm_requested"] = c.algo.empty() ? config::get_string(coll::coll_config::kAlgo) : c.algo;
  j["dtype"] = "float32";
  j["op"] = "sum";
  j["min_bytes"] = c.min_bytes;
  j["max_bytes"] = c.max_bytes;
  j["step_factor"] = c.factor;
  j["iters"] = c.iters > 0 ? json(c.iters) : json("adaptive");
  j["warmup"] = c.warmup;
  j["time"] = "median over iterations of the slowest rank's time; codecs take turns";
  j["gradwire_version"] = gw_version();
  return j;
}

// On a failed run: the document rank 0 wrote gets "error" (unless rank 0 recorded one), or a
// new document with no rows when rank 0 wrote nothing.
void record_run_error(const CodecAllreduceConfig& c, const std::vector<std::string>& codecs,
                      const std::string& msg) {
  if (c.json_path.empty()) return;
  std::ifstream f(c.json_path);
  std::stringstream ss;
  ss << f.rdbuf();
  json doc = json::parse(ss.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    doc = {{"config", codec_config_json(c, codecs)}, {"rows", json::array()}};
  }
  if (!doc.contains("error")) doc["error"] = msg;
  write_json_text(c.json_path, doc.dump(2));
}

// One rank of the compressed allreduce sweep (cfg: a forked rank's, or the launcher's with
// world_size 0); rank 0 prints the rows. 0 on success.
// The codecs take turns within every iteration (none, codec 1, codec 2, ..., then again), so a
// change of load on a shared machine hits every codec alike; a row's time is the median over the
// iterations of the slowest rank's time, and speedup compares medians of the same run.
int codec_rank(const CodecAllreduceConfig& c, const std::vector<std::string>& codecs,
               const gw_config_t& cfg) {
  gw_comm_t comm = nullptr;
  if (gw_comm_init(&comm, &cfg) != GW_OK) {
    const std::string msg = fmt::format("rank {}: gw_comm_init: {}", cfg.rank, gw_last_error());
    std::fprintf(stderr, "%s\n", msg.c_str());
    // Rank 0 of forked ranks, or a launcher's rank 0 (or the one that has not learnt its rank).
    if (!c.json_path.empty() && cfg.rank == 0) {
      json doc = {
          {"config", codec_config_json(c, codecs)}, {"rows", json::array()}, {"error", msg}};
      write_json_text(c.json_path, doc.dump(2));
    }
    return 2;
  }
  int rank = 0, np = 1;
  gw_comm_rank(comm, &rank);
  gw_comm_size(comm, &np);
  json doc;
  if (rank == 0) {
    doc["config"] = codec_config_json(c, codecs);
    doc["config"]["ranks"] = np;
    // What the communicator resolved (the requested transport may be "auto").
    for (const char* key : {"transport", "interface", "channels", "chunk"}) {
      doc["config"][key] = comm_describe(comm, key);
    }
    doc["config"]["allreduce_algorithms"] = comm_describe(comm, "allreduce");
    doc["rows"] = json::array();
    if (!c.json_path.empty()) write_json_text(c.json_path, doc.dump(2));
  }
  // On an error, rank 0 records it in the document before returning.
  auto record_error = [&](const std::string& msg) {
    if (rank == 0 && !c.json_path.empty()) {
      doc["error"] = msg;
      write_json_text(c.json_path, doc.dump(2));
    }
  };
  const bool progress = rank == 0 && (c.progress || isatty(STDERR_FILENO));
  const auto started = Clock::now();
  if (rank == 0) {
    const std::string iface = comm_describe(comm, "interface");
    std::printf(
        "# gradwire-perf allreduce --codec: %d ranks, transport %s%s, float32 sum of a "
        "gradient (encode, exchange, decode and error feedback all timed)\n",
        np, comm_describe(comm, "transport").c_str(),
        iface.empty() ? "" : fmt::format(" ({})", iface).c_str());
    std::printf("# channels: %s  chunk: %s  allreduce (the none row): %s\n",
                comm_describe(comm, "channels").c_str(), comm_describe(comm, "chunk").c_str(),
                comm_describe(comm, "allreduce").c_str());
    std::printf(
        "# codecs take turns within each iteration; time = median over iterations of the slowest "
        "rank; busbw uses the uncompressed size; bytes_sent = per rank per call (gw_comm_stats); "
        "speedup = median time of none / median time of the codec, same run\n"
        "# %s: no codec, the memory passes any error-feedback codec makes (read gradient and "
        "residual, write residual, write output) on every rank at once: the floor of a codec's "
        "time on this machine\n",
        kFloorRow);
    std::printf("# %-16s %12s %12s %6s %11s %10s %10s %14s %8s\n", "codec", "size", "count",
                "iters", "time_us", "algbw", "busbw", "bytes_sent", "speedup");
  }
  int rc = 0;
  for (uint64_t b = c.min_bytes; b <= c.max_bytes && rc == 0;
       b *= static_cast<uint64_t>(c.factor)) {
    const size_t n = b / 4;
    const auto src = gaussian(n, 7 + static_cast<uint32_t>(rank));
    std::vector<float> buf(n);
    const int iters = iters_for(b, np, c.iters);
    // The last row, kFloorRow, is no codec: the memory passes any error-feedback codec must make
    // (read the gradient and the residual, write the residual, write the output), on every rank
    // at once, with no compute and no exchange. No codec's row can go below it on this machine.
    const size_t nc = codecs.size() + 1;
    std::vector<float> floor_residual(n, 0.0f);
    std::vector<std::vector<double>> times(nc);
    std::vector<uint64_t> sent(nc, 0);
    for (int i = -c.warmup; i < iters && rc == 0; ++i) {
      for (size_t ci = 0; ci < nc && rc == 0; ++ci) {
        const bool floor = ci == nc - 1;
        const std::string& codec = floor ? kFloorRow : codecs[ci];
        const std::string key = codec + "@" + std::to_string(b);
        std::memcpy(buf.data(), src.data(), n * 4);
        gw_comm_stats_t before{}, after{};
        if (gw_barrier(comm) != GW_OK || gw_comm_stats(comm, &before) != GW_OK) {
          const std::string msg = fmt::format("rank {}: barrier: {}", rank, gw_last_error());
          std::fprintf(stderr, "%s\n", msg.c_str());
          record_error(msg);
          rc = 2;
          break;
        }
        auto t0 = Clock::now();
        if (floor) {
          memory_floor(buf.data(), floor_residual.data(), n);
        } else if (gw_allreduce_compressed(comm, buf.data(), n, GW_FLOAT32, codec.c_str(),
                                           key.c_str()) != GW_OK) {
          const std::string msg =
              fmt::format("rank {}: {} {} B: {}", rank, codec, b, gw_last_error());
          std::fprintf(stderr, "%s\n", msg.c_str());
          record_error(msg);
          rc = 2;
          break;
        }
        const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
        gw_comm_stats(comm, &after);
        if (i >= 0) {
          times[ci].push_back(dt);
          sent[ci] += after.bytes_sent - before.bytes_sent;
        }
      }
    }
    if (rc != 0) break;
    double base_us = 0;
    for (size_t ci = 0; ci < nc; ++ci) {
      std::vector<double> worst(times[ci].size());
      if (gw_allreduce(comm, times[ci].data(), worst.data(), worst.size(), GW_FLOAT64, GW_MAX) !=
          GW_OK) {
        const std::string msg =
            fmt::format("rank {}: allreduce of the times: {}", rank, gw_last_error());
        std::fprintf(stderr, "%s\n", msg.c_str());
        record_error(msg);
        rc = 2;
        break;
      }
      const double us = median(worst) * 1e6;
      if (ci == 0) base_us = us;  // codecs[0] is "none"
      if (rank == 0) {
        const double algbw = static_cast<double>(b) / (us * 1e-6) / 1e9;
        const double busbw = algbw * 2.0 * (np - 1) / np;
        std::printf("  %-16s %12llu %12zu %6d %11.1f %10.3f %10.3f %14.0f %8.2f\n",
                    ci == nc - 1 ? kFloorRow : codecs[ci].c_str(),
                    static_cast<unsigned long long>(b), n, iters, us, algbw, busbw,
                    static_cast<double>(sent[ci]) / iters, base_us / us);
        std::fflush(stdout);
        doc["rows"].push_back({{"codec", ci == nc - 1 ? kFloorRow : codecs[ci]},
                               {"size_bytes", b},
                               {"count", n},
                               {"iters", iters},
                               {"time_us", us},
                               {"algbw_gbps", algbw},
                               {"busbw_gbps", busbw},
                               {"bytes_sent", static_cast<double>(sent[ci]) / iters},
                               {"speedup", base_us / us}});
      }
    }
    if (rank == 0 && rc == 0) {
      if (!c.json_path.empty()) write_json_text(c.json_path, doc.dump(2));
      if (progress) {
        std::fprintf(stderr, "# progress: %llu B done, %.1f s elapsed\n",
                     static_cast<unsigned long long>(b),
                     std::chrono::duration<double>(Clock::now() - started).count());
      }
    }
    if (b > c.max_bytes / static_cast<uint64_t>(c.factor)) break;
  }
  gw_comm_release_compression(comm);
  gw_comm_destroy(comm);
  return rc;
}

}  // namespace

int run_codec_allreduce(const CodecAllreduceConfig& c) {
  std::vector<std::string> codecs = {"none"};
  for (const auto& s : c.codecs) {
    auto spec = coll::parse_codec_spec(s);
    if (!spec.ok()) {
      const std::string msg = "--codec " + spec.status().to_string();
      std::fprintf(stderr, "gradwire-perf: %s\n", msg.c_str());
      record_run_error(c, c.codecs, msg);
      return 2;
    }
    if (s != "none") codecs.push_back(s);
  }
  if (c.np < 0 || c.min_bytes < 4 || c.min_bytes > c.max_bytes || c.factor < 2) {
    const std::string msg = "--codec needs --np >= 1, 4 <= -b <= -e, -f >= 2";
    std::fprintf(stderr, "gradwire-perf: %s\n", msg.c_str());
    record_run_error(c, codecs, msg);
    return 2;
  }
  if (!c.json_path.empty()) std::remove(c.json_path.c_str());  // a stale one is not this run's
  if (c.np == 0) {
    // One rank of the launcher's job: rank, size and store from its environment, as plain runs.
    gw_config_t cfg = GW_CONFIG_INIT;
    cfg.transport = c.transport.c_str();
    cfg.timeout_ms = static_cast<int>(c.timeout_ms);
    std::fflush(stdout);
    return codec_rank(c, codecs, cfg);
  }
  auto port = reserve_loopback_port();
  if (!port.ok()) {
    std::fprintf(stderr, "gradwire-perf: %s\n", port.status().to_string().c_str());
    return 2;
  }
  const std::string store = fmt::format("127.0.0.1:{}", *port);
  std::fflush(stdout);
  ForkOptions fo;
  fo.nranks = c.np;
  const int64_t timeout =
      c.timeout_ms > 0 ? c.timeout_ms : config::get_int(core_config::kTimeoutMs);
  fo.idle_timeout_ms = timeout + 600000;  // rows print from rank 0 directly, not as messages
  Status st = run_forked(
      fo,
      [&](int rank, int) {
        gw_config_t cfg = GW_CONFIG_INIT;
        cfg.rank = rank;
        cfg.world_size = c.np;
        cfg.store_addr = store.c_str();
        cfg.transport = c.transport.c_str();
        cfg.timeout_ms = static_cast<int>(c.timeout_ms);
        return codec_rank(c, codecs, cfg);
      },
      [](int, const std::string&) {});
  if (!st.ok()) {
    std::fprintf(stderr, "gradwire-perf: run failed: %s\n", st.message().c_str());
    record_run_error(c, codecs, st.to_string());
    return 2;
  }
  return 0;
}

int run_codec_allreduce(const CollConfig& base, const std::vector<std::string>& codecs) {
  CodecAllreduceConfig c;
  c.codecs = codecs;
  c.min_bytes = base.min_bytes;
  c.max_bytes = base.max_bytes;
  c.factor = base.factor;
  // Without --np: the launcher's ranks when its environment names one (its transport choice as
  // plain runs make it), else 4 forked ranks over tcp.
  const bool launched = base.np == 0 && launched_by_launcher();
  c.np = base.np > 0 ? base.np : launched ? 0 : 4;
  c.transport = base.transport == "auto" && !launched ? "tcp" : base.transport;
  c.iters = base.iters;
  c.warmup = base.warmup;
  c.timeout_ms = base.timeout_ms;
  c.algo = base.algo;
  c.requested_transport = base.transport;
  c.json_path = base.json_path;
  c.progress = base.progress;
  auto refuse = [&](const std::string& msg) {
    std::fprintf(stderr, "gradwire-perf: %s\n", msg.c_str());
    record_run_error(c, codecs, msg);
    return 2;
  };
  // The codec table has its own columns: these options have no meaning there.
  std::string refused;
  if (base.check_iters > 0) refused = "-c/--check";
  if (base.average != CollConfig::Average::kMax) refused = "-a/--average";
  if (!base.blocking) refused = "-z 0";
  if (base.step_bytes > 0) refused = "-i/--stepbytes";
  if (base.mem_alloc) refused = "--mem-alloc";
  if (!refused.empty()) {
    return refuse(fmt::format(
        "{} does not apply to --codec (its table times each codec's gw_allreduce_compressed; "
        "run it without --codec)",
        refused));
  }
  if (base.dtype != coll::DataType::kF32 || base.op != coll::ReduceOp::kSum) {
    return refuse("--codec runs a float32 sum only (-d float32 -o sum)");
  }
  // The checks of plain runs (--transport, --algo, --timeout-ms, the GW_* variables).
  CollConfig checked = base;
  checked.min_bytes = std::min(base.min_bytes, base.max_bytes);
  Status s = validate(checked);
  // --algo and --timeout-ms are settings of the API layer, here and in libgradwire, as in plain
  // runs: forked ranks inherit them, a launcher's rank applies them to its communicator.
  if (s.ok() && !c.algo.empty()) s = set_api_value(coll::coll_config::kAlgo, c.algo);
  if (s.ok() && c.np == 0 && c.timeout_ms > 0) {
    s = set_api_value(core_config::kTimeoutMs, std::to_string(c.timeout_ms));
  }
  if (!s.ok()) return refuse(s.to_string());
  return run_codec_allreduce(c);
}

}  // namespace gw::perf
