// gradwirectl trace in gradwired (daemon/job_trace.h): the recording, what the job thread adds to
// it, and the serve loop's side of the control request (Server::Impl, daemon/server_impl.h).
#include "daemon/job_trace.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/log.h"
#include "core/sys/unix_socket.h"
#include "core/timeline.h"
#include "daemon/control_trace.h"
#include "daemon/job.h"
#include "daemon/server_impl.h"

namespace gw::daemon {

using nlohmann::json;

namespace {
// The pid of a daemon's trace: host index + this, a range of its own apart from the trainers'
// timelines (pid = rank), so that perf/merge_timeline.py lays both side by side.
constexpr int kDaemonPidBase = 1000000;
}  // namespace

JobTrace::JobTrace(std::string job, int host_index, int num_hosts, int local_size, double seconds)
    : job_(std::move(job)),
      host_index_(host_index),
      num_hosts_(num_hosts),
      local_size_(local_size),
      seconds_(seconds),
      start_us_(timeline::now_us()),
      end_us_(start_us_ + static_cast<int64_t>(std::llround(seconds * 1e6))) {}

void JobTrace::add(const TraceEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  staged_.push_back(e);
}

void JobTrace::commit() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const TraceEvent& e : staged_) {
    if (events_.size() >= kMaxTraceEvents) {
      ++dropped_;
    } else {
      events_.push_back(e);
    }
  }
  staged_.clear();
}

json JobTrace::result() const {
  std::lock_guard<std::mutex> lock(mu_);
  json events = json::array();
  auto meta = [&](const char* what, int tid, std::string name) {
    events.push_back({{"name", what},
                      {"ph", "M"},
                      {"pid", kDaemonPidBase + host_index_},
                      {"tid", tid},
                      {"args", {{"name", std::move(name)}}}});
  };
  meta("process_name", kTraceTidJob,
       fmt::format("gradwired host {} of {}, job {} (pid {})", host_index_, num_hosts_, job_,
                   ::getpid()));
  meta("thread_name", kTraceTidJob, "job thread");
  if (num_hosts_ > 1) meta("thread_name", kTraceTidInterHost, "inter-host pieces in flight");
  for (int l = 0; l < local_size_; ++l) {
    meta("thread_name", kTraceTidTrainer + l, fmt::format("local rank {}: queued", l));
  }
  for (const TraceEvent& e : events_) {
    json args = json::object();
    if (e.bytes > 0 || e.dtype != nullptr) args["bytes"] = e.bytes;
    if (e.dtype != nullptr) {
      args["tag"] = e.tag;
      args["seq"] = e.seq;
      args["count"] = e.count;
      args["dtype"] = e.dtype;
      if (e.op != nullptr) args["op"] = e.op;
      if (e.failed) args["failed"] = true;
    }
    events.push_back({{"name", e.name},
                      {"cat", e.cat},
                      {"ph", "X"},
                      {"ts", e.ts_us},
                      {"dur", std::max<int64_t>(e.dur_us, 0)},
                      {"pid", kDaemonPidBase + host_index_},
                      {"tid", e.tid},
                      {"args", std::move(args)}});
  }
  json r;
  r["traceEvents"] = std::move(events);
  r["displayTimeUnit"] = "ms";
  r["otherData"] = {{"job", job_},
                    {"host_index", host_index_},
                    {"seconds", seconds_},
                    {"events", static_cast<uint64_t>(events_.size())},
                    {"dropped", dropped_}};
  return r;
}

TracedPhases::TracedPhases(Job* job)
    : job_(job), clock_(job->counters), last_us_(job->trace_now ? timeline::now_us() : 0) {}

void TracedPhases::mark(Phase phase, const char* name, uint64_t bytes) {
  clock_.mark(phase);
  if (!job_->trace_now) return;
  const int64_t now = timeline::now_us();
  TraceEvent e;
  e.name = name != nullptr ? name : phase_name(phase);
  e.ts_us = last_us_;
  e.dur_us = now - last_us_;
  e.bytes = bytes;
  job_->trace_now->add(e);
  last_us_ = now;
}

// ---- the job's side --------------------------------------------------------------------------

Status Job::begin_trace(const std::shared_ptr<JobTrace>& t) {
  std::lock_guard<std::mutex> lock(trace_mu);
  if (auto cur = trace.lock(); cur && !cur->over(timeline::now_us())) {
    return invalid_arg(
        "job {} is already being traced (for {:.1f} s more): one trace of a job at a time",
        t->job(), static_cast<double>(cur->end_us() - timeline::now_us()) / 1e6);
  }
  trace = t;
  tracing.store(true, std::memory_order_relaxed);
  return ok_status();
}

std::shared_ptr<JobTrace> Job::current_trace() {
  if (!tracing.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(trace_mu);
  std::shared_ptr<JobTrace> t = trace.lock();
  if (t && !t->over(timeline::now_us())) return t;
  // Over, or its gradwirectl went away: the next collectives cost one relaxed load again.
  trace.reset();
  tracing.store(false, std::memory_order_relaxed);
  return nullptr;
}

void Job::record_collective(const std::vector<Request>& reqs, int64_t t0_us, const Status& s) {
  const int64_t end = timeline::now_us();
  const Request& r = reqs[0];
  for (size_t i = 0; i < reqs.size() && i < members.size(); ++i) {
    if (!members[i]) continue;
    auto& q = members[i]->queued_us;
    auto at = q.find(reqs[i].seq);
    if (at != q.end() && at->second <= t0_us) {
      TraceEvent e;
      e.name = "queued";
      e.ts_us = at->second;
      e.dur_us = t0_us - at->second;
      e.tid = kTraceTidTrainer + static_cast<int>(i);
      e.seq = reqs[i].seq;
      trace_now->add(e);
    }
    q.erase(q.begin(), q.upper_bound(reqs[i].seq));  // this one and any settled before it
  }
  TraceEvent c;
  c.name = opcode_name(r.opcode);
  c.cat = "collective";
  c.ts_us = t0_us;
  c.dur_us = end - t0_us;
  c.bytes = r.opcode == Opcode::kReduceScatter ? r.recv_bytes : r.send_bytes;
  c.count = r.count;
  c.tag = done.load(std::memory_order_relaxed) + errors.load(std::memory_order_relaxed);
  c.seq = r.seq;
  c.dtype = coll::dtype_name(r.dtype).data();  // names of static storage
  const bool reducing = r.opcode == Opcode::kAllreduce || r.opcode == Opcode::kReduceScatter ||
                        r.opcode == Opcode::kAllreduceCompressed;
  c.op = reducing ? coll::op_name(r.op).data() : nullptr;
  c.failed = !s.ok();
  trace_now->add(c);
}

// ---- the serve loop's side -------------------------------------------------------------------

bool Server::Impl::start_trace(PendingConn& p, const uint8_t* body, size_t size) {
  auto req = decode_trace_request(body, size);
  std::shared_ptr<Job> job;
  Status why = req.status();
  if (req.ok()) {
    for (const auto& [key, j] : jobs) {
      if (job_name(j->first) == req->job && !j->finished.load()) job = j;
    }
    if (!job) {
      why = invalid_arg("trace: no job {} runs on this daemon (gradwirectl jobs lists them)",
                        req->job);
    }
  }
  std::shared_ptr<JobTrace> t;
  if (job) {
    const Hello& h = job->first;
    t = std::make_shared<JobTrace>(req->job, h.host_index, h.num_hosts, h.local_size, req->seconds);
    why = job->begin_trace(t);
  }
  if (!why.ok()) {
    GW_LOG_WARN("gradwired: control connection of pid {}: {}", p.pid, why.message());
    answer_control(p.sock, encode_control_error(why));
    return true;
  }
  GW_LOG_INFO("gradwired: tracing job {} for {} s (pid {} asked)", req->job, req->seconds, p.pid);
  p.trace = std::move(t);
  p.deadline = sys::deadline_after_ms(static_cast<int64_t>(std::ceil(req->seconds * 1000)));
  return false;  // answered at the deadline (expire_control), or dropped if the asker goes
}

bool Server::Impl::step_trace(PendingConn& p) {
  uint8_t tmp[64];
  std::vector<sys::Fd> fds;
  auto n = sys::recv_with_fds(p.sock.get(), tmp, sizeof(tmp), &fds, sys::kNoWait, "control");
  if (n.ok() && *n == 0) {
    GW_LOG_INFO("gradwired: the trace of job {} ends early: its gradwirectl went away",
                p.trace->job());
    return true;  // the job's trace expires with the last reference
  }
  if (!n.ok() && n.status().code() == Code::kTimeout) return false;
  const Status bad = n.ok() ? peer_error("bytes after the control request") : n.status();
  GW_LOG_WARN("gradwired: control connection of pid {}: {}", p.pid, bad.message());
  answer_control(p.sock, encode_control_error(bad));
  return true;
}

void Server::Impl::finish_trace(PendingConn& p) {
  std::string body = encode_control_result(ControlCommand::kTrace, p.trace->result());
  if (body.size() > kMaxControlResponseBytes) {  // kMaxTraceEvents keeps it well below
    body = encode_control_error(no_memory("trace of job {}: {} bytes of JSON (at most {})",
                                          p.trace->job(), body.size(), kMaxControlResponseBytes));
  }
  answer_control(p.sock, body);
  p.trace.reset();
}

}  // namespace gw::daemon
