// One store's state on one server and the consistency rules (docs/wire-kv.md): keys -> partitions
// -> values, per-clock accumulation, the workers' clocks and the pulls waiting for the rule to
// allow them. Pure logic: no sockets, no threads, no clock of its own (the caller serialises the
// calls), so tests script any order of frames (tests/unit/kv_rules_test.cc).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "kv/wire.h"

namespace gw::kv {

// An answer's payload, immutable and shared: the replies that carry one partition's value (every
// worker's pull of a clock that just closed) hold one copy of it, not one each.
class Bytes {
 public:
  Bytes() = default;
  explicit Bytes(std::shared_ptr<const std::vector<uint8_t>> p) : p_(std::move(p)) {}
  template <typename It>
  void assign(It first, It last) {
    p_ = std::make_shared<const std::vector<uint8_t>>(first, last);
  }
  size_t size() const { return p_ ? p_->size() : 0; }
  bool empty() const { return size() == 0; }
  const uint8_t* data() const { return p_ ? p_->data() : nullptr; }
  const uint8_t* begin() const { return data(); }
  const uint8_t* end() const { return data() + size(); }
  const std::shared_ptr<const std::vector<uint8_t>>& shared() const { return p_; }

 private:
  std::shared_ptr<const std::vector<uint8_t>> p_;
};

// One frame for worker `worker`: a Reply (pulls: the partition's value as payload) or an Error
// (aux: the gw::Code, payload: the message).
struct Answer {
  uint32_t worker = 0;
  Header reply;
  Bytes payload;
};

// What an operator sees of one store on one server (gradwirectl kv, gradwired's /metrics).
struct StoreSummary {
  StoreConfig config;
  uint64_t keys = 0;        // distinct keys with a partition here
  uint64_t partitions = 0;  // partitions held here
  uint64_t bytes = 0;       // their values' bytes (0 once the store finished: freed)
  uint64_t min_clock = 0;   // over the live workers (every worker's once none is live)
  uint64_t max_clock = 0;   // over every worker
  uint64_t dropped = 0;
  uint32_t lost = 0;
  uint32_t live = 0;  // workers alive that have not said goodbye
  bool failed = false;
  bool finished = false;
};

class StoreRules {
 public:
  StoreRules(const StoreConfig& config, int server_rank);

  const StoreConfig& config() const { return config_; }
  // A checked frame (check_request) of worker h.worker with its payload; answers go to *out, the
  // request's own and those of pulls it released. Init/Push/Clock answer at once; Pull/PushPull
  // when the mode allows.
  void on_frame(const Header& h, const uint8_t* payload, std::vector<Answer>* out);
  // The worker said goodbye: it sends nothing more and counts as done.
  void on_bye(uint32_t worker, std::vector<Answer>* out);
  // The worker's connection ended without a goodbye. bsp (and sync below K live workers): the
  // store fails and every waiting pull with it; else the worker is lost and counted.
  void on_dead(uint32_t worker, const std::string& why, std::vector<Answer>* out);

  // Not OK once the store failed (every later request is answered with it).
  const Status& failed() const { return failed_; }
  // Every worker has said goodbye or died.
  bool finished() const;
  bool said_bye(uint32_t worker) const { return workers_[worker].bye; }
  bool alive(uint32_t worker) const { return workers_[worker].alive; }
  uint64_t min_clock() const;
  uint64_t dropped() const { return dropped_; }
  uint32_t lost() const { return lost_; }
  size_t waiting() const { return waiting_.size(); }
  StoreSummary summary() const;

 private:
  struct Round {
    std::vector<uint8_t> acc;
    uint32_t pushes = 0;
    std::vector<bool> pushed;
  };
  struct Partition {
    uint8_t dtype = 0;
    uint64_t count = 0;
    uint64_t total = 0;
    std::vector<uint8_t> value;
    // A copy of value that answers share until value changes (null: none made since; every
    // change of value resets it).
    std::shared_ptr<const std::vector<uint8_t>> snapshot;
    std::vector<double> velocity;
    uint64_t next_clock = 0;  // bsp/sync: clocks below it are closed and applied
    std::map<uint64_t, Round> rounds;
  };
  struct Worker {
    bool alive = true;
    bool bye = false;
    uint64_t clock = 0;
  };
  struct Waiting {
    Header head;
  };
  using PartKey = std::pair<uint64_t, uint32_t>;

  Status check_shape(const Partition& p, const Header& h) const;
  Status push(Partition& p, const Header& h, const uint8_t* payload);
  void apply(Partition& p, const uint8_t* contribution, uint32_t pushes);
  // Closes every closable clock of p (bsp/sync).
  void close_rounds(Partition& p);
  void close_all();
  bool may_pull(const Partition& p, const Header& h) const;
  Answer answer(const Header& h, Partition* p, bool with_value) const;
  Answer error(const Header& h, const Status& s) const;
  // Answers the waiting pulls that the rule now allows.
  void release(std::vector<Answer>* out);
  void fail(Status s, std::vector<Answer>* out);
  // Once every worker said goodbye or died: frees the values (summary().bytes becomes 0).
  void drop_values_if_finished();
  uint32_t live() const;

  const StoreConfig config_;
  const int server_rank_;
  std::vector<Worker> workers_;
  std::map<PartKey, Partition> parts_;
  std::vector<Waiting> waiting_;
  uint64_t dropped_ = 0;
  uint32_t lost_ = 0;
  Status failed_;
};

}  // namespace gw::kv
