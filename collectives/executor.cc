#include "collectives/executor.h"

#include <algorithm>
#include <deque>
#include <string>

#include "collectives/backoff.h"
#include "collectives/reduce.h"
#include "core/timeline.h"

namespace gw::coll {
namespace {

// Tag = (collective sequence number, step id): a rank that runs a different collective or a
// different step than its peer fails the receive with a tag mismatch instead of mixing data.
int make_tag(uint32_t seq, int step) {
  return static_cast<int>(((seq & 0x7FFFFu) << 12) | (static_cast<uint32_t>(step) & 0xFFFu));
}

// The timeline's events of one run (only when the timeline is on): the call, and its phases:
// connecting (when it took 100 us or more), waiting for the first chunk from a peer, and the
// transfer after it, whose chunk reductions are events of their own.
struct CallTrace {
  static constexpr int64_t kConnectShownUs = 100;
  const char* name;
  uint32_t seq;
  const std::vector<Plan>& plans;
  DataType dtype;
  const int64_t& first_recv;
  const int64_t& reduce_us;
  int64_t t0 = timeline::on() ? timeline::now_us() : -1;
  int64_t connected = -1;

  ~CallTrace() {
    if (t0 < 0) return;
    const int64_t end = timeline::now_us();
    const int64_t from = connected >= 0 ? connected : t0;
    const int64_t first = first_recv >= 0 ? first_recv : end;
    timeline::complete(name, "collective", t0, end - t0,
                       fmt::format("\"bytes\":{},\"tag\":{},\"reduce_us\":{}",
                                   extent_bytes(plans, dtype), seq, reduce_us));
    // Connections already up cost microseconds: shown only where connecting took time.
    if (connected - t0 >= kConnectShownUs) {
      timeline::complete("connect", "phase", t0, connected - t0);
    }
    timeline::complete("wait for peers", "phase", from, first - from);
    if (first < end) timeline::complete("transfer", "phase", first, end - first);
  }
};

}  // namespace

struct Executor::ChanRun {
  const Plan* plan = nullptr;
  size_t step = 0;
  bool started = false;
  net::SendComm* sc = nullptr;
  net::RecvComm* rc = nullptr;
  size_t chunk_elems = 1;
  size_t ns = 0, nr = 0;  // chunks to send / receive in this step
  size_t s_posted = 0, s_done = 0, r_posted = 0, r_done = 0;
  std::deque<std::pair<net::Request*, size_t>> sreqs, rreqs;
  uint8_t* stage = nullptr;
  bool finished() const { return step >= plan->sched.size(); }
};

Executor::Executor(ConnectionPool* pool, const std::atomic<bool>* aborted, ExecutorOptions options)
    : pool_(pool), aborted_(aborted), options_(options) {}

uint8_t* Executor::staging(int plan) {
  if (staging_.size() <= static_cast<size_t>(plan)) staging_.resize(plan + 1);
  auto& s = staging_[plan];
  if (s.size() < kWindow * options_.chunk_bytes) s.resize(kWindow * options_.chunk_bytes);
  return s.data();
}

uint8_t* Executor::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

Status Executor::progress(const char* name, uint32_t seq, ChanRun& c,
                          const std::vector<ChanRun>* runs, const uint8_t* in, uint8_t* out,
                          DataType dtype, ReduceOp op, bool* progressed) {
  const size_t es = dtype_size(dtype);
  const Step& st = c.plan->sched[c.step];
  // Always a short last chunk (schedule.h): one more, empty message only when the range is a
  // whole number of chunks, so that a count mismatch always shows as a size mismatch.
  auto nchunks = [&](size_t count) { return count / c.chunk_elems + 1; };
  auto chunk = [&](const Range& r, size_t i) {
    const size_t off = i * c.chunk_elems;
    return Range{c.plan->base + r.offset + off,
                 std::min(c.chunk_elems, r.count - std::min(off, r.count))};
  };
  if (!c.started) {
    // A step that waits for another plan (Step::after_plan) starts once that plan is far enough.
    if (st.after_plan >= 0 && (*runs)[static_cast<size_t>(st.after_plan)].step < st.after_steps) {
      return ok_status();
    }
    c.started = true;
    c.ns = st.send_to >= 0 ? nchunks(st.send.count) : 0;
    c.nr = st.recv_from >= 0 ? nchunks(st.recv.count) : 0;
    c.s_posted = c.s_done = c.r_posted = c.r_done = 0;
    c.sc = st.send_to >= 0 ? pool_->send_comm(st.send_to, c.plan->chan) : nullptr;
    c.rc = st.recv_from >= 0 ? pool_->recv_comm(st.recv_from, c.plan->chan) : nullptr;
  }
  const int tag = make_tag(seq, st.id);
  auto where = [&](bool send) {
    return fmt::format("{} step {}: {} rank {}", name, st.id, send ? "send to" : "recv from",
                       send ? st.send_to : st.recv_from);
  };
  // Post receives: straight into the output for copies, into the staging ring for reductions.
  while (c.r_posted < c.nr && c.r_posted < c.r_done + kWindow) {
    Range r = chunk(st.recv, c.r_posted);
    uint8_t* dst = st.action == RecvAction::kReduce
                       ? c.stage + (c.r_posted % kWindow) * options_.chunk_bytes
                       : out + r.offset * es;
    auto req = c.rc->irecv(dst, r.count * es, tag, nullptr);
    if (!req.ok()) {
      if (req.status().truncated()) {
        return invalid_arg("{}: ranks disagree on count: rank {} sent more than expected ({})",
                           where(false), st.recv_from, req.status().message());
      }
      return req.status().with_context(where(false));
    }
    if (*req == nullptr) break;
    c.rreqs.emplace_back(*req, c.r_posted++);
    *progressed = true;
  }
  while (c.s_posted < c.ns && c.s_posted < c.s_done + kWindow &&
         (!st.forward || c.s_posted < c.r_done)) {
    Range r = chunk(st.send, c.s_posted);
    const uint8_t* src = (st.send_from_input ? in : out) + r.offset * es;
    auto req = c.sc->isend(src, r.count * es, tag, nullptr);
    if (!req.ok()) {
      // tcp reports the receiver's truncation notice on whatever call comes next, isend too.
      if (req.status().truncated()) {
        return invalid_arg("{}: ranks disagree on count: rank {} expected fewer bytes ({})",
                           where(true), st.send_to, req.status().message());
      }
      return req.status().with_context(where(true));
    }
    if (*req == nullptr) break;
    c.sreqs.emplace_back(*req, c.s_posted++);
    *progressed = true;
  }
  // Requests of one comm complete in order: test the oldest only.
  while (!c.rreqs.empty()) {
    auto [req, idx] = c.rreqs.front();
    bool done = false;
    size_t got = 0;
    Status s = c.rc->test(req, &done, &got);
    if (!s.ok()) {
      c.rreqs.pop_front();
      if (s.truncated()) {
        return invalid_arg(
            "{}: ranks disagree on count: rank {} sent more than the {} bytes "
            "expected ({})",
            where(false), st.recv_from, chunk(st.recv, idx).count * es, s.message());
      }
      return s.with_context(where(false));
    }
    if (!done) break;
    c.rreqs.pop_front();
    Range r = chunk(st.recv, idx);
    if (got != r.count * es) {
      return invalid_arg("{}: ranks disagree on count: rank {} sent {} bytes, expected {}",
                         where(false), st.recv_from, got, r.count * es);
    }
    const int64_t t = timeline::on() ? timeline::now_us() : -1;
    if (t >= 0 && first_recv_us_ < 0) first_recv_us_ = t;
    if (st.action == RecvAction::kReduce) {
      const uint8_t* local = (st.reduce_with_input ? in : out) + r.offset * es;
      reduce(dtype, op, local, c.stage + (idx % kWindow) * options_.chunk_bytes,
             out + r.offset * es, r.count);
      if (t >= 0) {
        const int64_t d = timeline::now_us() - t;
        reduce_us_ += d;
        timeline::complete("reduce", "phase", t, d);
      }
    }
    ++c.r_done;
    *progressed = true;
  }
  while (!c.sreqs.empty()) {
    bool done = false;
    size_t got = 0;
    Status s = c.sc->test(c.sreqs.front().first, &done, &got);
    if (!s.ok()) {
      c.sreqs.pop_front();
      if (s.truncated()) {
        return invalid_arg("{}: ranks disagree on count: rank {} expected fewer bytes ({})",
                           where(true), st.send_to, s.message());
      }
      return s.with_context(where(true));
    }
    if (!done) break;
    c.sreqs.pop_front();
    ++c.s_done;
    *progressed = true;
  }
  if (c.r_done == c.nr && c.s_done == c.ns) {
    ++c.step;
    c.started = false;
    *progressed = true;
  }
  return ok_status();
}

Status Executor::run(const char* name, uint32_t seq, const std::vector<Plan>& plans,
                     const uint8_t* in, uint8_t* out, DataType dtype, ReduceOp op,
                     Deadline deadline) {
  first_recv_us_ = -1;
  reduce_us_ = 0;
  CallTrace trace{name, seq, plans, dtype, first_recv_us_, reduce_us_};
  GW_RETURN_IF_ERROR(pool_->connect_all(name, plans, deadline));
  if (trace.t0 >= 0) trace.connected = timeline::now_us();
  std::vector<ChanRun> runs(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    bool reduces = false;
    for (const Step& st : plans[i].sched) {
      reduces |= st.recv_from >= 0 && st.action == RecvAction::kReduce;
      if (st.after_plan < 0) continue;
      const auto other = static_cast<size_t>(st.after_plan);
      if (other >= plans.size() || other == i || st.after_steps > plans[other].sched.size()) {
        return internal_error("{} step {}: waits for {} steps of plan {} (plan {} of {})", name,
                              st.id, st.after_steps, st.after_plan, i, plans.size());
      }
    }
    runs[i].plan = &plans[i];
    runs[i].chunk_elems = std::max<size_t>(1, options_.chunk_bytes / dtype_size(dtype));
    // Staging per plan, not per channel: plans of one channel may reduce at the same time.
    if (reduces) runs[i].stage = staging(static_cast<int>(i));
  }
  Backoff backoff(options_.spin_us);
  StallWatch stall(options_.stall, name, seq, plans, dtype);
  while (true) {
    bool any = false, all_done = true;
    for (auto& c : runs) {
      while (!c.finished()) {
        bool progressed = false;
        GW_RETURN_IF_ERROR(progress(name, seq, c, &runs, in, out, dtype, op, &progressed));
        any |= progressed;
        if (!progressed) break;
      }
      all_done &= c.finished();
    }
    if (all_done) return ok_status();
    if (aborted_->load()) return aborted_error("{}: communicator aborted", name);
    if (Clock::now() >= deadline) {
      for (auto& c : runs) {
        if (c.finished()) continue;
        const Step& st = c.plan->sched[c.step];
        // A plan waiting for another is not the one stuck: that other plan is.
        if (!c.started && st.after_plan >= 0) continue;
        const bool on_recv = c.r_done < c.nr;
        return timeout_error("{} step {}: {} rank {}: no progress within {} ms", name, st.id,
                             on_recv ? "recv from" : "send to", on_recv ? st.recv_from : st.send_to,
                             options_.timeout_ms);
      }
      return timeout_error("{}: no progress within {} ms: every plan left waits for another", name,
                           options_.timeout_ms);
    }
    if (any) {
      backoff.reset();
    } else {
      stall.idle();
      backoff.idle([&runs](std::vector<pollfd>* fds) {
        for (const auto& c : runs) {
          if (c.finished()) continue;
          if (c.r_done < c.nr && (c.rc == nullptr || !c.rc->wait_fds(fds))) return false;
          if (c.s_done < c.ns && (c.sc == nullptr || !c.sc->wait_fds(fds))) return false;
        }
        return true;
      });
    }
  }
}

}  // namespace gw::coll
