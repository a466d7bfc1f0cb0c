// gradwirectl trace in gradwired: one recording of a job's collectives for a few seconds, answered
// as a Chrome trace in the event format of direct mode's GW_TIMELINE (core/timeline.h): complete
// events ("ph":"X") in wall-clock microseconds, so perf/merge_timeline.py lays them beside the
// trainers' own timelines.
//
// pid is 1000000 + the daemon's host index in the job (the trainers' timelines have pid = rank);
// tid a lane (kTraceTid*): the job thread's collectives and their phases (local_reduce or copy_in,
// inter_host, copy_back), the pieces of a pipelined allreduce in flight among the daemons, and one
// lane per local trainer with its submissions queued in the daemon (from when the job thread read
// them to when their collective started).
//
// The serve loop makes a JobTrace for a control request (Server::Impl::start_trace) and hands it
// to the job (Job::begin_trace); the job thread appends to it while it lasts; the serve loop
// answers with it at its end. add(), commit() and result() are thread-safe.
#pragma once

#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon/counters.h"

namespace gw::daemon {

struct Job;

inline constexpr int kTraceTidJob = 0;        // the job thread
inline constexpr int kTraceTidInterHost = 1;  // pipelined pieces among the daemons
inline constexpr int kTraceTidTrainer = 10;   // + the trainer's local rank

// One event: names point at static strings.
struct TraceEvent {
  const char* name = "";
  const char* cat = "phase";
  int64_t ts_us = 0, dur_us = 0;
  int tid = kTraceTidJob;
  // A collective's (cat "collective") arguments; a phase's bytes (0: none).
  uint64_t bytes = 0, count = 0, tag = 0, seq = 0;
  const char* dtype = nullptr;
  const char* op = nullptr;
  bool failed = false;
};

class JobTrace {
 public:
  // From now for `seconds`; host_index is the pid; local_ranks names the trainers' lanes.
  JobTrace(std::string job, int host_index, int num_hosts, int local_size, double seconds);
  const std::string& job() const { return job_; }
  int64_t end_us() const { return end_us_; }
  bool over(int64_t now_us) const { return now_us >= end_us_; }
  // Stages the event of the collective the job thread runs; commit() keeps what was staged (up to
  // kMaxTraceEvents in all; then counts the rest as dropped). So an answer given while a
  // collective runs holds all of its events or none: never a phase without its collective.
  void add(const TraceEvent& e);
  void commit();
  // The answer (daemon/control_trace.h): the events with the lanes' names, and otherData.
  nlohmann::json result() const;

 private:
  const std::string job_;
  const int host_index_, num_hosts_, local_size_;
  const double seconds_;
  const int64_t start_us_, end_us_;
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  std::vector<TraceEvent> staged_;
  uint64_t dropped_ = 0;
};

// PhaseClock (daemon/counters.h) that also records each phase on the job thread's lane while the
// job's collective is being traced (Job::trace_now).
class TracedPhases {
 public:
  explicit TracedPhases(Job* job);
  // name: the event's name when it is not the phase's own (copy_in for a gather's first phase).
  void mark(Phase phase, const char* name = nullptr, uint64_t bytes = 0);

 private:
  Job* job_;
  PhaseClock clock_;
  int64_t last_us_;
};

}  // namespace gw::daemon
