#include "perf/coll_rank_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "collectives/coll_config.h"
#include "collectives/cost_model.h"
#include "core/config.h"
#include "core/config_snapshot.h"
#include "core/core_config.h"
#include "core/net/backend_registry.h"
#include "gradwire/gradwire.h"
#include "perf/coll_alltoallv.h"
#include "perf/coll_report.h"
#include "perf/cpu_meter.h"
#include "perf/rank_launcher.h"

namespace gw::perf {
namespace {

using json = nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

constexpr size_t kHostLen = 64;

// One buffer of the sweep: heap memory, or (--mem-alloc) memory from gw_mem_alloc, which belongs
// to the communicator and must be released before gw_comm_destroy. Not copyable.
class SweepBuffer {
 public:
  SweepBuffer() = default;
  SweepBuffer(const SweepBuffer&) = delete;
  SweepBuffer& operator=(const SweepBuffer&) = delete;
  ~SweepBuffer() { release(); }

  // Makes the buffer `bytes` (> 0) zeroed bytes: from gw_mem_alloc(comm) when mem_alloc, else
  // from the heap. Whatever it held before is released first. GW_OK or gw_mem_alloc's status.
  gw_status_t allocate(gw_comm_t comm, size_t bytes, bool mem_alloc) {
    release();
    if (mem_alloc) {
      void* p = nullptr;
      gw_status_t s = gw_mem_alloc(comm, bytes, &p);
      if (s != GW_OK) return s;
      comm_ = comm;
      data_ = static_cast<uint8_t*>(p);
    } else {
      heap_.assign(bytes, 0);
      data_ = heap_.data();
    }
    std::memset(data_, 0, bytes);
    return GW_OK;
  }

  // Frees gw_mem_alloc memory (gw_mem_free) or the heap memory; call it before the communicator
  // the memory came from is destroyed.
  void release() {
    if (comm_ != nullptr) gw_mem_free(comm_, data_);
    comm_ = nullptr;
    data_ = nullptr;
    heap_.clear();
    heap_.shrink_to_fit();
  }

  uint8_t* data() const { return data_; }

 private:
  gw_comm_t comm_ = nullptr;  // non-null: data_ came from gw_mem_alloc(comm_)
  uint8_t* data_ = nullptr;
  std::vector<uint8_t> heap_;
};

// One rank of the sweep. Rank 0 prints the table; in forked mode it also sends the JSON pieces to
// the parent ("config ...", "row ...", "summary ...", "error ..."), otherwise it writes the JSON
// file itself.
class RankRun {
 public:
  RankRun(const CollConfig& c, int msg_fd) : c_(c), msg_fd_(msg_fd) {}

  int run(const gw_config_t* explicit_config) {
    gw_status_t s =
        explicit_config ? gw_comm_init(&comm_, explicit_config) : gw_comm_init_from_env(&comm_);
    if (s != GW_OK) {
      comm_ = nullptr;
      return fail("communicator set-up (gw_comm_init)", s);
    }
    if ((s = gw_comm_rank(comm_, &rank_)) != GW_OK) return fail("gw_comm_rank", s);
    if ((s = gw_comm_size(comm_, &world_)) != GW_OK) return fail("gw_comm_size", s);
    if (is_rooted(c_.coll) && c_.root >= world_) {
      return fail_msg(fmt::format("--root {} is not a rank of this {}-rank job", c_.root, world_));
    }
    int rc = gather_hosts();
    if (rc != 0) return rc;
    if (rank_ == 0) start_report();
    rc = sweep();
    if (rc == 2) return rc;
    if (rank_ == 0) finish_report(rc);
    sendbuf_.release();
    recvbuf_.release();
    s = gw_comm_destroy(comm_);
    comm_ = nullptr;
    if (s != GW_OK) return fail("gw_comm_destroy", s);
    return rc;
  }

  ~RankRun() {
    if (comm_) {
      sendbuf_.release();  // gw_mem_alloc memory goes before its communicator
      recvbuf_.release();
      gw_comm_abort(comm_);
      gw_comm_destroy(comm_);
    }
  }

 private:
  int fail(const std::string& what, gw_status_t s) {
    // Before the communicator exists the library has not said which rank this is: name the one
    // the launcher's environment gives, if any.
    std::string who = rank_ >= 0 ? fmt::format("rank {}", rank_) : launcher_rank_text();
    if (who.empty()) who = "this process";
    std::string msg =
        fmt::format("{}: {} failed: {}: {}", who, what, gw_status_string(s), gw_last_error());
    return fail_msg(msg);
  }

  int fail_msg(const std::string& msg) {
    std::fprintf(stderr, "gradwire-perf: %s\n", msg.c_str());
    std::fflush(stderr);
    send_message(msg_fd_, "error " + json(msg).dump());
    if (rank_ <= 0 && msg_fd_ < 0 && !c_.json_path.empty()) {
      doc_["error"] = msg;
      if (!doc_.contains("config")) doc_["config"] = config_json(c_);
      if (!doc_.contains("rows")) doc_["rows"] = json::array();
      write_json_file(c_.json_path, doc_);
    }
    return 2;
  }

  int gather_hosts() {
    std::vector<uint8_t> mine(kHostLen, 0);
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    std::string me = fmt::format("{} pid {}", host, getpid());
    std::memcpy(mine.data(), me.data(), std::min(me.size(), kHostLen - 1));
    std::vector<uint8_t> all(kHostLen * static_cast<size_t>(world_));
    gw_status_t s = gw_allgather(comm_, mine.data(), all.data(), kHostLen, GW_UINT8);
    if (s != GW_OK) return fail("allgather of host names", s);
    for (int r = 0; r < world_; ++r) {
      const char* p = reinterpret_cast<const char*>(all.data() + kHostLen * static_cast<size_t>(r));
      hosts_.emplace_back(p, strnlen(p, kHostLen));
    }
    return 0;
  }

  void start_report() {
    doc_["config"] = config_json(c_);
    doc_["config"]["ranks"] = world_;
    doc_["config"]["hosts"] = hosts_;
    for (const char* key :
         {"transport", "transport_within_hosts", "interface", "channels", "chunk"}) {
      doc_["config"][key] = comm_describe(comm_, key);
    }
    doc_["config"]["allreduce_algorithms"] = comm_describe(comm_, "allreduce");
    doc_["rows"] = json::array();
    send_message(msg_fd_, "config " + doc_["config"].dump());

    std::string iters =
        c_.iters > 0 ? std::to_string(c_.iters) : "adaptive clamp(2e9/size/ranks, 3, 50)";
    std::string env;
    for (const auto& [row, v] : config::Snapshot::capture().entries()) {
      if (v.source != config::Source::kDefault) {
        env += fmt::format(" {}={}", row->name, config::shown(*row, v));
      }
    }
    if (env.empty()) env = " none";
    std::string out;
    out += fmt::format("# gradwire-perf {} (gradwire {})\n", c_.name, gw_version());
    out += fmt::format("# ranks: {} ({})\n", world_,
                       c_.np > 0 ? fmt::format("forked --np {}, private store", c_.np)
                                 : std::string("from the launcher's environment"));
    // What the communicator resolved (never "auto"), then what was asked.
    const std::string transport = comm_describe(comm_, "transport");
    const std::string within = comm_describe(comm_, "transport_within_hosts");
    const std::string iface = comm_describe(comm_, "interface");
    out +=
        fmt::format("# transport: {}{}{} (asked: {})  channels: {}  chunk: {}\n", transport,
                    iface.empty() ? "" : fmt::format(" on {}", iface),
                    within != transport ? fmt::format(", {} within hosts", within) : "",
                    c_.transport, comm_describe(comm_, "channels"), comm_describe(comm_, "chunk"));
    out += fmt::format("# allreduce algorithm by size: {} (asked: {})\n",
                       comm_describe(comm_, "allreduce"),
                       c_.algo.empty() ? config::get_string(coll::coll_config::kAlgo) : c_.algo);
    out += fmt::format("# dtype: {}  op: {}  root: {}\n", coll::dtype_name(c_.dtype),
                       has_op(c_.coll) ? coll::op_name(c_.op) : "none",
                       is_rooted(c_.coll) ? c_.root : -1);
    out += fmt::format(
        "# sizes: {} .. {} bytes, {}  iters: {}  warmup: {}{}  check: {}\n", c_.min_bytes,
        c_.max_bytes,
        c_.step_bytes > 0 ? fmt::format("increment {}", c_.step_bytes)
                          : fmt::format("factor {}", c_.factor),
        iters, c_.warmup,
        c_.warmup_ms > 0 ? fmt::format(" (and {} ms before the first size)", c_.warmup_ms)
                         : std::string(),
        c_.check_iters > 0
            ? fmt::format("{} iteration{}", c_.check_iters, c_.check_iters == 1 ? "" : "s")
            : std::string("off"));
    if (c_.coll == Collective::kAlltoallv) {
      // The weights of the split rule (perf/coll_alltoallv.h), so a peer can be compared.
      for (int s = 0; s < world_; ++s) {
        out += fmt::format("# alltoallv weights (seed {}) rank {}:", kAlltoallvSeed, s);
        for (uint64_t w : alltoallv_weights(world_, s)) {
          out += fmt::format(" {}", w);
        }
        out += "\n";
      }
    }
    out += fmt::format("# time: {}, out-of-place and in-place\n", time_rule(c_));
    out += fmt::format("# buffers: {}\n",
                       c_.mem_alloc ? "gw_mem_alloc (--mem-alloc; in daemon mode the arena: "
                                      "zero-copy)"
                                    : "heap (daemon mode copies them through the arena)");
    out +=
        fmt::format("# algbw = size / time, busbw = {} (GB/s = 1e9 B/s)\n", busbw_formula(c_.coll));
    out += fmt::format("# GW_* set:{}\n", env);
    out += "# hosts:\n";
    for (int r = 0; r < world_; ++r) {
      out += fmt::format("#   rank {:>3}: {}\n", r, hosts_[static_cast<size_t>(r)]);
    }
    out += "#\n";
    // nccl-tests' columns and names: size count type redop root, then time algbw busbw #wrong
    // out of place and in place; units on a line of their own.
    out += fmt::format("# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:^44}  {:^44}", "", "", "", "", "",
                       "out-of-place", "in-place");
    out.erase(out.find_last_not_of(' ') + 1);
    out += "\n";
    const std::string row_format =
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>10}  {:>11}  {:>11}  {:>6}  {:>10}  {:>11}  "
        "{:>11}  {:>6}";
    std::string names =
        fmt::format(fmt::runtime(row_format), "size", "count", "type", "redop", "root", "time",
                    "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
    std::string units = fmt::format(fmt::runtime(row_format), "(B)", "(elements)", "", "", "",
                                    "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
    units.erase(units.find_last_not_of(' ') + 1);
    out += names + "\n" + units + "\n";
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }

  // One size's arguments: the element counts and where each placement reads and writes.
  struct Shape {
    size_t total = 0;      // elements of the size column
    size_t arg_count = 0;  // the count argument of the call
    size_t send_count = 0;
    size_t recv_count = 0;
  };

  Shape shape_for(uint64_t bytes) const {
    Shape sh;
    sh.total = count_for_size(c_.coll, bytes, c_.dtype, world_);
    sh.arg_count = sh.total;
    const bool gathers = c_.coll == Collective::kAllgather || c_.coll == Collective::kGather;
    const bool scatters = c_.coll == Collective::kReduceScatter || c_.coll == Collective::kScatter;
    if (gathers || scatters || c_.coll == Collective::kAlltoall) {
      sh.arg_count = sh.total / static_cast<size_t>(world_);
    }
    sh.send_count = gathers ? sh.arg_count : sh.total;
    sh.recv_count = scatters ? sh.arg_count : sh.total;
    // alltoallv: receives differ by rank; every rank's buffer holds the largest receive.
    if (c_.coll == Collective::kAlltoallv) sh.recv_count = alltoallv_max_recv(sh.total, world_);
    return sh;
  }

  // The buffers of one call. In place, the data lives in one buffer as the C header defines it:
  // allreduce, alltoall and reduce sendbuf == recvbuf; allgather's and gather's input is this
  // rank's block of recvbuf; reduce_scatter's and scatter's output is this rank's block of
  // sendbuf; broadcast has one buffer anyway.
  struct Bufs {
    void* send = nullptr;
    void* recv = nullptr;
    void* out = nullptr;  // where count_wrong looks
  };

  Bufs bufs_for(bool in_place, const Shape& sh) {
    const size_t esz = coll::dtype_size(c_.dtype);
    Bufs b;
    if (!in_place) {
      b.send = sendbuf_.data();
      b.recv = recvbuf_.data();
      b.out = recvbuf_.data();
      return b;
    }
    const size_t own = static_cast<size_t>(rank_) * sh.arg_count * esz;
    switch (c_.coll) {
      case Collective::kAllreduce:
      case Collective::kAlltoall:
      case Collective::kAlltoallv:
      case Collective::kBroadcast:
      case Collective::kReduce:
        b.send = b.recv = b.out = recvbuf_.data();
        break;
      case Collective::kAllgather:
      case Collective::kGather:
        b.recv = b.out = recvbuf_.data();
        b.send = recvbuf_.data() + own;
        break;
      case Collective::kReduceScatter:
      case Collective::kScatter:
        b.send = sendbuf_.data();
        b.recv = b.out = sendbuf_.data() + own;
        break;
    }
    return b;
  }

  // Writes the inputs of one call (in place, the input was overwritten by the previous call).
  void fill_inputs(bool in_place, const Shape& sh, const Bufs& b) {
    if (c_.coll == Collective::kBroadcast) {
      fill_pattern(b.recv, sh.total, c_.dtype, c_.op, world_, rank_, 0);
      return;
    }
    if (!in_place) return;  // out of place, sendbuf keeps the pattern of the size
    fill_send(b.send, sh);
  }

  // This rank's input of one size: the pattern of check_pattern.h, or alltoallv's blocks.
  void fill_send(void* buf, const Shape& sh) {
    if (c_.coll == Collective::kAlltoallv) {
      alltoallv_fill(buf, layout_, c_.dtype, rank_);
    } else {
      fill_pattern(buf, sh.send_count, c_.dtype, c_.op, world_, rank_, 0);
    }
  }

  // The per-iteration times of one placement, combined across ranks as -a says. Returns 2 on error.
  int time_calls(bool in_place, const Shape& sh, int iters, std::vector<double>* times) {
    const size_t bytes = sh.total * coll::dtype_size(c_.dtype);
    const char* where = in_place ? "in-place" : "out-of-place";
    const Bufs b = bufs_for(in_place, sh);
    if (in_place) fill_inputs(true, sh, b);
    if (!started_ && c_.warmup_ms > 0) {
      // The start-up warm-up (--warmup-ms): calls until every rank has spent the time, agreed on
      // after each call (an 8-byte allreduce of "done" flags, minimum), so all make as many.
      started_ = true;
      const auto t0 = SteadyClock::now();
      for (int32_t all_done = 0; all_done == 0;) {
        gw_status_t s = call(sh.arg_count, b.send, b.recv);
        if (s != GW_OK) return fail(what(bytes, fmt::format("{} start-up warm-up", where)), s);
        const int32_t done = SteadyClock::now() - t0 >= std::chrono::milliseconds(c_.warmup_ms);
        s = gw_allreduce(comm_, &done, &all_done, 1, GW_INT32, GW_MIN);
        if (s != GW_OK) return fail("the start-up warm-up's agreement (8-byte allreduce)", s);
        heartbeat();
      }
    }
    for (int w = 0; w < c_.warmup; ++w) {
      gw_status_t s = call(sh.arg_count, b.send, b.recv);
      if (s != GW_OK) return fail(what(bytes, fmt::format("{} warm-up", where)), s);
      heartbeat();
    }
    gw_status_t s = gw_barrier(comm_);
    if (s != GW_OK) return fail("barrier before timing", s);
    if (!in_place) cpu_before_ = cpu_sample();
    if (!c_.blocking) {
      // nccl-tests' default: every iteration issued, then one wait; time = total / iters.
      std::vector<gw_request_t> reqs(static_cast<size_t>(iters), nullptr);
      auto t0 = SteadyClock::now();
      for (auto& r : reqs) {
        s = gw_iallreduce(comm_, b.send, b.recv, sh.arg_count, static_cast<gw_dtype_t>(c_.dtype),
                          static_cast<gw_op_t>(c_.op), &r);
        if (s != GW_OK) return fail(what(bytes, fmt::format("{} gw_iallreduce", where)), s);
      }
      for (auto& r : reqs) {
        s = gw_wait(r, -1);
        if (s != GW_OK) return fail(what(bytes, fmt::format("{} gw_wait", where)), s);
      }
      auto t1 = SteadyClock::now();
      heartbeat();
      times->assign(1, std::chrono::duration<double>(t1 - t0).count() / iters);
    } else {
      times->assign(static_cast<size_t>(iters), 0.0);
      for (int i = 0; i < iters; ++i) {
        auto t0 = SteadyClock::now();
        s = call(sh.arg_count, b.send, b.recv);
        auto t1 = SteadyClock::now();
        if (s != GW_OK) return fail(what(bytes, fmt::format("{} timed iteration", where)), s);
        (*times)[static_cast<size_t>(i)] = std::chrono::duration<double>(t1 - t0).count();
        heartbeat();
      }
    }
    if (!in_place) cpu_after_ = cpu_sample();
    return combine_times(times);
  }

  // -a: rank 0's times, the mean, the fastest or the slowest rank's, element by element.
  int combine_times(std::vector<double>* times) {
    gw_status_t s = GW_OK;
    double* t = times->data();
    const size_t n = times->size();
    switch (c_.average) {
      case CollConfig::Average::kRank0:
        s = gw_broadcast(comm_, t, n, GW_FLOAT64, 0);
        break;
      case CollConfig::Average::kMean:
        s = gw_allreduce(comm_, t, t, n, GW_FLOAT64, GW_AVG);
        break;
      case CollConfig::Average::kMin:
        s = gw_allreduce(comm_, t, t, n, GW_FLOAT64, GW_MIN);
        break;
      case CollConfig::Average::kMax:
        s = gw_allreduce(comm_, t, t, n, GW_FLOAT64, GW_MAX);
        break;
    }
    if (s != GW_OK) return fail("combining the iteration times across ranks (-a)", s);
    return 0;
  }

  // -c N: N checked calls of one placement; the wrong elements summed over calls and ranks into
  // *wrong. Returns 2 on error.
  int check_calls(bool in_place, const Shape& sh, int64_t* wrong) {
    const size_t bytes = sh.total * coll::dtype_size(c_.dtype);
    const Bufs b = bufs_for(in_place, sh);
    int64_t mine = 0;
    for (int k = 0; k < c_.check_iters; ++k) {
      if (c_.coll == Collective::kBroadcast) {
        if (rank_ == c_.root) {
          fill_inputs(in_place, sh, b);
        } else {
          fill_sentinel(b.recv, sh.total, c_.dtype);
        }
      } else {
        if (in_place) {
          // The input first, then the output's part of it not used as input gets the sentinel.
          fill_inputs(true, sh, b);
          if (c_.coll == Collective::kAllgather || c_.coll == Collective::kGather) {
            const size_t esz = coll::dtype_size(c_.dtype);
            fill_sentinel(recvbuf_.data(), static_cast<size_t>(rank_) * sh.arg_count, c_.dtype);
            const size_t after = static_cast<size_t>(rank_ + 1) * sh.arg_count;
            fill_sentinel(recvbuf_.data() + after * esz, sh.total - after, c_.dtype);
          }
        } else {
          fill_sentinel(b.recv, sh.recv_count, c_.dtype);
        }
      }
      gw_status_t s = call(sh.arg_count, b.send, b.recv);
      if (s != GW_OK) {
        return fail(what(bytes, in_place ? "in-place checked run" : "checked run"), s);
      }
      mine += static_cast<int64_t>(
          c_.coll == Collective::kAlltoallv
              ? alltoallv_wrong(b.out, layout_, c_.dtype, rank_)
              : count_wrong(c_.coll, b.out, sh.arg_count, c_.dtype, c_.op, world_, rank_, c_.root));
    }
    gw_status_t s = gw_allreduce(comm_, &mine, wrong, 1, GW_INT64, GW_SUM);
    if (s != GW_OK) return fail("allreduce(sum) of the wrong-element counts", s);
    return 0;
  }

  // Returns 0, 1 (some element wrong) or 2 (error, already reported).
  int sweep() {
    const size_t esz = coll::dtype_size(c_.dtype);
    const Shape biggest = shape_for(c_.max_bytes);
    // Buffers sized for the largest row; sendbuf/recvbuf hold the whole gathered/scattered data
    // (alltoall: both hold the whole per-rank buffer, size blocks of count).
    size_t recv_bytes = biggest.recv_count * esz;
    if (c_.coll == Collective::kAllgather || c_.coll == Collective::kAlltoall ||
        c_.coll == Collective::kAlltoallv || c_.coll == Collective::kGather) {
      // In place, the whole gathered / exchanged buffer lives in recvbuf.
      recv_bytes = std::max(recv_bytes, biggest.total * esz);
    }
    for (auto [buf, bytes, name] : {std::tuple{&sendbuf_, biggest.send_count * esz, "send"},
                                    std::tuple{&recvbuf_, recv_bytes, "receive"}}) {
      gw_status_t s = buf->allocate(comm_, std::max<size_t>(bytes, 1), c_.mem_alloc);
      if (s != GW_OK) {
        return fail(fmt::format("gw_mem_alloc of the {} buffer ({} B; --mem-alloc)", name,
                                std::max<size_t>(bytes, 1)),
                    s);
      }
    }
    const std::vector<uint64_t> sizes = sweep_sizes(c_);
    bool progress = rank_ == 0 && (c_.progress || isatty(STDERR_FILENO));
    auto t_start = SteadyClock::now();
    int result = 0;
    uint64_t last_total = UINT64_MAX;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const Shape sh = shape_for(sizes[k]);
      // Sizes round down to whole elements: -b 0 steps 0, 1, 8, ... and 1 byte is 0 floats, the
      // row before again (every rank skips alike).
      if (sh.total == last_total) continue;
      last_total = sh.total;
      if (c_.coll == Collective::kAlltoallv) layout_ = alltoallv_layout(sh.total, world_, rank_);
      fill_send(sendbuf_.data(), sh);
      fill_inputs(false, sh, bufs_for(false, sh));
      const int iters = c_.iters > 0 ? c_.iters : adaptive_iters(sh.total * esz, world_);
      Placement oop, ip;
      for (bool in_place : {false, true}) {
        Placement& p = in_place ? ip : oop;
        if (time_calls(in_place, sh, iters, &p.times) != 0) return 2;
        if (c_.check_iters > 0) {
          if (check_calls(in_place, sh, &p.wrong) != 0) return 2;
          if (p.wrong > 0) result = 1;
        }
      }
      if (rank_ == 0) {
        report_row(sh.total * esz, sh.total, iters, oop, ip);
        if (progress) {
          double el = std::chrono::duration<double>(SteadyClock::now() - t_start).count();
          std::fprintf(stderr, "# progress: %zu/%zu sizes, %llu B done, %.1f s elapsed\n", k + 1,
                       sizes.size(), static_cast<unsigned long long>(sh.total * esz), el);
          std::fflush(stderr);
        }
      } else {
        send_message(msg_fd_, "alive");
      }
    }
    return result;
  }

  // Tells the supervising parent (forked mode) that this rank is alive, at most once a second:
  // the parent kills a run only when nothing was heard for longer than the library's deadline.
  void heartbeat() {
    auto now = SteadyClock::now();
    if (msg_fd_ >= 0 && now - last_beat_ > std::chrono::seconds(1)) {
      send_message(msg_fd_, "alive");
      last_beat_ = now;
    }
  }

  std::string what(size_t bytes, std::string_view phase) const {
    return fmt::format("{} of {} B ({})", c_.name, bytes, phase);
  }

  gw_status_t call(size_t count, const void* send, void* recv) {
    auto dt = static_cast<gw_dtype_t>(c_.dtype);
    auto op = static_cast<gw_op_t>(c_.op);
    switch (c_.coll) {
      case Collective::kAllreduce:
        return gw_allreduce(comm_, send, recv, count, dt, op);
      case Collective::kAllgather:
        return gw_allgather(comm_, send, recv, count, dt);
      case Collective::kReduceScatter:
        return gw_reduce_scatter(comm_, send, recv, count, dt, op);
      case Collective::kBroadcast:
        return gw_broadcast(comm_, recv, count, dt, c_.root);
      case Collective::kAlltoall:
        return gw_alltoall(comm_, send, recv, count, dt);
      case Collective::kAlltoallv:
        return gw_alltoallv(comm_, send, layout_.sendcounts.data(), layout_.sdispls.data(), recv,
                            layout_.recvcounts.data(), layout_.rdispls.data(), dt);
      case Collective::kReduce:
        return gw_reduce(comm_, send, recv, count, dt, op, c_.root);
      case Collective::kGather:
        return gw_gather(comm_, send, recv, count, dt, c_.root);
      case Collective::kScatter:
        return gw_scatter(comm_, send, recv, count, dt, c_.root);
    }
    return GW_ERR_INVALID_ARG;
  }

  struct Placement {
    std::vector<double> times;
    int64_t wrong = -1;  // -1: not checked
  };

  // time (median), min, max, algbw, busbw of one placement.
  struct Figures {
    double med = 0, min = 0, max = 0, algbw = 0, busbw = 0;
  };

  Figures figures(size_t bytes, std::vector<double> times) const {
    Figures f;
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    f.med = n % 2 ? times[n / 2] : (times[n / 2 - 1] + times[n / 2]) / 2;
    f.min = times.front();
    f.max = times.back();
    f.algbw = f.med > 0 ? static_cast<double>(bytes) / f.med / 1e9 : 0.0;
    f.busbw = f.algbw * busbw_factor(c_.coll, world_);
    return f;
  }

  void report_row(size_t bytes, size_t count, int iters, const Placement& oop,
                  const Placement& ip) {
    const Figures o = figures(bytes, oop.times);
    const Figures i = figures(bytes, ip.times);
    busbw_sum_ += o.busbw;
    ++rows_;
    auto wrong_s = [](int64_t w) { return w < 0 ? std::string("N/A") : std::to_string(w); };
    const int root = is_rooted(c_.coll) ? c_.root : -1;  // nccl-tests: -1 unrooted
    std::printf(
        "  %10zu  %12zu  %8s  %6s  %6d  %10.1f  %11.3f  %11.3f  %6s  %10.1f  %11.3f  %11.3f  "
        "%6s\n",
        bytes, count, table_type(c_.dtype).c_str(),
        has_op(c_.coll) ? std::string(coll::op_name(c_.op)).c_str() : "none", root, o.med * 1e6,
        o.algbw, o.busbw, wrong_s(oop.wrong).c_str(), i.med * 1e6, i.algbw, i.busbw,
        wrong_s(ip.wrong).c_str());
    std::fflush(stdout);
    json row = {{"size_bytes", bytes},
                {"count", count},
                {"type", std::string(coll::dtype_name(c_.dtype))},
                {"redop", has_op(c_.coll) ? std::string(coll::op_name(c_.op)) : "none"},
                {"root", root},
                {"iters", iters},
                {"time_us", o.med * 1e6},
                {"time_min_us", o.min * 1e6},
                {"time_max_us", o.max * 1e6},
                {"algbw_gbps", o.algbw},
                {"busbw_gbps", o.busbw},
                {"wrong", oop.wrong < 0 ? json(nullptr) : json(oop.wrong)},
                {"in_place",
                 {{"time_us", i.med * 1e6},
                  {"time_min_us", i.min * 1e6},
                  {"time_max_us", i.max * 1e6},
                  {"algbw_gbps", i.algbw},
                  {"busbw_gbps", i.busbw},
                  {"wrong", ip.wrong < 0 ? json(nullptr) : json(ip.wrong)}}}};
    if (c_.cpu) {
      const double gb = static_cast<double>(bytes) * iters / 1e9;
      // A zero-byte row moves no GB: no line (cpu_line says nothing for it).
      const std::string line = cpu_line(bytes, gb, cpu_before_, cpu_after_);
      if (!line.empty()) {
        std::printf("%s\n", line.c_str());
        std::fflush(stdout);
      }
      const CpuPerGb c = cpu_per_gb(gb, cpu_before_, cpu_after_);
      if (gb > 0 && c.machine >= 0) {
        row["cpu"] = {{"machine_cpu_s_per_gb", c.machine},
                      {"rank_user_s_per_gb", c.rank_user},
                      {"rank_sys_s_per_gb", c.rank_sys}};
      }
    }
    doc_["rows"].push_back(row);
    send_message(msg_fd_, "row " + row.dump());
  }

  void finish_report(int rc) {
    double avg = rows_ > 0 ? busbw_sum_ / rows_ : 0.0;
    if (c_.check_iters > 0) {
      std::printf("# Out of bounds values : %s\n", rc == 0 ? "0 OK" : "FAILED");
    }
    std::printf("# Avg bus bandwidth : %.4f (out-of-place)\n", avg);
    std::printf("#\n");
    std::fflush(stdout);
    doc_["avg_busbw_gbps"] = avg;
    doc_["check_passed"] = c_.check_iters > 0 ? json(rc == 0) : json(nullptr);
    send_message(msg_fd_, "summary " + json({{"avg_busbw_gbps", avg}}).dump());
    if (msg_fd_ < 0 && !c_.json_path.empty()) write_json_file(c_.json_path, doc_);
  }

  const CollConfig& c_;
  int msg_fd_;
  gw_comm_t comm_ = nullptr;
  int rank_ = -1;
  int world_ = 0;
  std::vector<std::string> hosts_;
  json doc_ = json::object();
  double busbw_sum_ = 0;
  int rows_ = 0;
  bool started_ = false;  // the start-up warm-up (--warmup-ms) ran
  SteadyClock::time_point last_beat_ = SteadyClock::now();
  CpuSample cpu_before_, cpu_after_;  // around the last out-of-place timed iterations (--cpu)
  SweepBuffer sendbuf_;
  SweepBuffer recvbuf_;
  AlltoallvLayout layout_;  // alltoallv: this rank's counts and displacements of the current size
};

}  // namespace

int run_coll_rank(const CollConfig& c, int msg_fd, const gw_config_t* config) {
  RankRun run(c, msg_fd);
  return run.run(config);
}

}  // namespace gw::perf
