// gradwired's counters (ServerStats, gradwired_* metrics): atomics bumped by the serve loop and
// the job threads, read by Server::stats(), gradwirectl status and the metrics exporter.
//
// Inter-host bytes are counted by the transport a job's daemons agreed on: one slot for every
// backend of the registry (core/net/backend_registry.h) as it stands when the Counters are made,
// and a last one for any other name.
//
// Thread-safe (relaxed atomics: each counter is exact, a snapshot is not one instant).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/sys/time.h"
#include "daemon/protocol.h"
#include "daemon/server.h"
#include "kv/server.h"

namespace gw::daemon {

class Counters {
 public:
  // transports: the names bytes are counted by (default: the registry's backends).
  explicit Counters(std::vector<std::string> transports);
  Counters();

  std::atomic<uint64_t> accepted{0}, refused{0}, live_clients{0}, live_arenas{0}, live_jobs{0},
      collectives{0}, failed{0};
  // Trainers' device allocations open in the daemon (daemon/device_import.h).
  std::atomic<uint64_t> live_imports{0};

  // The slot of a transport name for inter(): its own, or the last ("other").
  int transport_slot(const std::string& name) const;
  int other_slot() const { return static_cast<int>(transports_.size()); }

  // Bytes read from (in) and written into (out) the trainers' arenas; handed to (out) and got back
  // from (in) the inter-host collective.
  void arena(uint64_t in, uint64_t out) {
    arena_in_.fetch_add(in, std::memory_order_relaxed);
    arena_out_.fetch_add(out, std::memory_order_relaxed);
  }
  void inter(int slot, uint64_t in, uint64_t out) {
    inter_in_[slot].fetch_add(in, std::memory_order_relaxed);
    inter_out_[slot].fetch_add(out, std::memory_order_relaxed);
  }
  void error(ErrorKind kind) {
    errors_[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
  }
  void observe(Phase phase, int64_t ns);
  // A collective's end: by opcode, and its error's kind.
  void collective(Opcode op, const Status& s);

  // A job's parameter server, listed in stats.kv_stores while it lives (admission registers it;
  // any thread reads it).
  void add_kv(const std::string& job, int32_t host_index, const std::shared_ptr<kv::Server>& s);
  std::vector<KvStoreStats> kv_stores() const;

  // The NCCL plugin's daemon-mode jobs, by NCCL job id: each connection's job holds its NCCL
  // job's totals while it lives (the connections are their holders), and the bytes stay for the
  // daemon's life.
  struct NcclTotals {
    std::atomic<uint64_t> bytes{0};
  };
  std::shared_ptr<NcclTotals> nccl_totals(const std::string& nccl_job);
  std::vector<NcclJobStats> nccl_jobs() const;

  // Everything, for Server::stats(): `offered` (best first) are listed in stats.inter even
  // without bytes.
  ServerStats snapshot(const std::vector<std::string>& offered) const;

 private:
  struct Histogram {
    std::atomic<uint64_t> buckets[DurationHistogram::kBuckets] = {};
    std::atomic<uint64_t> count{0}, sum_ns{0};
  };
  std::atomic<uint64_t> by_opcode_[kNumOpcodes][2] = {};
  std::atomic<uint64_t> errors_[kNumErrorKinds] = {};
  std::atomic<uint64_t> collective_errors_[9] = {};
  std::atomic<uint64_t> arena_in_{0}, arena_out_{0};
  std::vector<std::string> transports_;
  // By transport_slot: transports_.size() + 1 each.
  std::unique_ptr<std::atomic<uint64_t>[]> inter_in_, inter_out_;
  Histogram phases_[kNumPhases];
  struct KvEntry {
    std::string job;
    int32_t host_index = 0;
    std::weak_ptr<kv::Server> server;
  };
  mutable std::mutex kv_mu_;
  mutable std::vector<KvEntry> kv_;  // entries whose server is gone are dropped when read
  mutable std::mutex nccl_mu_;
  std::map<std::string, std::shared_ptr<NcclTotals>> nccl_;
};

// A collective's phases for the metrics: each phase's time runs from the previous mark.
class PhaseClock {
 public:
  explicit PhaseClock(Counters* c) : counters_(c) {}
  void mark(Phase phase) {
    const int64_t now = sys::now_ns();
    counters_->observe(phase, now - last_ns_);
    last_ns_ = now;
  }

 private:
  Counters* counters_;
  int64_t last_ns_ = sys::now_ns();
};

}  // namespace gw::daemon
