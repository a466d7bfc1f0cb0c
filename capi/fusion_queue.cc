// Tensor fusion of small gw_iallreduce calls (capi/fusion_queue.h).
#include "capi/fusion_queue.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include "core/timeline.h"

namespace gw::capi {

using Clock = std::chrono::steady_clock;

// One queued call. Its batch and failure are guarded by the queue's mutex.
struct FusionEntry {
  const void* sendbuf = nullptr;
  void* recvbuf = nullptr;
  size_t bytes = 0;
  coll::DataType dtype = coll::DataType::kF32;
  coll::ReduceOp op = coll::ReduceOp::kSum;
  Clock::time_point queued_at;
  int64_t queued_us = -1;  // timeline time, when it is on

  std::shared_ptr<FusionBatch> batch;  // set once its round issued it
  bool failed = false;
  Status status;
};

// One fused allreduce: its buffer, where each member's slice goes, and the operation.
struct FusionBatch {
  struct Member {
    void* recvbuf;
    size_t offset;
    size_t bytes;
    int64_t queued_us;
  };

  std::mutex mu;  // one finisher at a time
  std::unique_ptr<SessionRequest> op;
  std::unique_ptr<uint8_t[]> buf;
  size_t bytes = 0;
  std::vector<Member> members;
  coll::DataType dtype = coll::DataType::kF32;
  coll::ReduceOp op_kind = coll::ReduceOp::kSum;
  uint64_t id = 0;
  int64_t negotiate_us = 0;            // how long the agreement took (timeline)
  int64_t issued_us = -1;              // timeline time of the issue
  std::atomic<bool> abandoned{false};  // the communicator was destroyed: no copy-back
  bool finished = false;
  Status result;

  // Waits for (poll: tests) the fused operation; the first to see it end copies every member's
  // slice back.
  Status finish(int64_t timeout_ms, bool poll, bool* done);
};

Status FusionBatch::finish(int64_t timeout_ms, bool poll, bool* done) {
  std::lock_guard<std::mutex> lock(mu);
  if (!finished) {
    Status s;
    if (poll) {
      bool d = false;
      s = op->test(&d);
      if (!d) {
        *done = false;
        return ok_status();
      }
    } else {
      s = op->wait(timeout_ms);
      if (s.code() == Code::kTimeout) {
        bool d = false;
        Status t = op->test(&d);
        if (!d) return s;
        s = t;
      }
    }
    if (s.ok() && abandoned.load()) {
      s = aborted_error(
          "the communicator was destroyed before this fused allreduce was copied back");
    }
    if (s.ok()) {
      for (const Member& m : members) std::memcpy(m.recvbuf, buf.get() + m.offset, m.bytes);
    }
    if (timeline::on() && issued_us >= 0) {
      const int64_t end = timeline::now_us();
      timeline::complete("fused_allreduce", "fusion", issued_us, end - issued_us,
                         fmt::format("\"batch\":{},\"tensors\":{},\"bytes\":{},\"dtype\":\"{}\","
                                     "\"op\":\"{}\",\"negotiate_us\":{},\"ok\":{}",
                                     id, members.size(), bytes, coll::dtype_name(dtype),
                                     coll::op_name(op_kind), negotiate_us, s.ok()));
      for (size_t i = 0; i < members.size(); ++i) {
        const Member& m = members[i];
        if (m.queued_us < 0) continue;
        timeline::complete("fusion_member", "fusion", m.queued_us, end - m.queued_us,
                           fmt::format("\"batch\":{},\"index\":{},\"bytes\":{},"
                                       "\"waited_for_batch_us\":{}",
                                       id, i, m.bytes, issued_us - m.queued_us));
      }
    }
    buf.reset();
    finished = true;
    result = s;
  }
  if (done != nullptr) *done = true;
  return result;
}

namespace {

class FusedRequest final : public SessionRequest {
 public:
  FusedRequest(std::shared_ptr<FusionQueue> q, std::shared_ptr<FusionEntry> e)
      : q_(std::move(q)), e_(std::move(e)) {}
  Status wait(int64_t timeout_ms) override { return q_->await(*e_, timeout_ms, false, nullptr); }
  Status test(bool* done) override { return q_->await(*e_, 0, true, done); }

 private:
  std::shared_ptr<FusionQueue> q_;
  std::shared_ptr<FusionEntry> e_;
};

}  // namespace

FusionQueue::FusionQueue(Session* inner, FusionOptions options)
    : inner_(inner), options_(options) {}

FusionQueue::~FusionQueue() { stop(); }

Result<std::unique_ptr<SessionRequest>> FusionQueue::submit(const void* sendbuf, void* recvbuf,
                                                            size_t count, coll::DataType dtype,
                                                            coll::ReduceOp op) {
  auto e = std::make_shared<FusionEntry>();
  e->sendbuf = sendbuf;
  e->recvbuf = recvbuf;
  e->bytes = count * coll::dtype_size(dtype);
  e->dtype = dtype;
  e->op = op;
  e->queued_at = Clock::now();
  if (timeline::on()) e->queued_us = timeline::now_us();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_ || stopping_) {
      return aborted_error("the communicator was aborted; the allreduce was not queued");
    }
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    queue_.push_back(e);
    queued_bytes_ += e->bytes;
  }
  cv_.notify_all();
  return std::unique_ptr<SessionRequest>(new FusedRequest(shared_from_this(), std::move(e)));
}

Status FusionQueue::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  if (queue_.empty() && !round_running_) return ok_status();
  ++drainers_;
  cv_.notify_all();
  const auto deadline = Clock::now() + std::chrono::milliseconds(options_.timeout_ms + 1000);
  const bool drained = cv_.wait_until(
      lock, deadline, [&] { return (queue_.empty() && !round_running_) || stopping_; });
  --drainers_;
  if (!drained) {
    return timeout_error("{} queued fused allreduce calls were not issued within {} ms",
                         queue_.size(), options_.timeout_ms);
  }
  return ok_status();
}

void FusionQueue::fail_queued(const Status& s) {
  for (auto& e : queue_) {
    e->failed = true;
    e->status = s;
  }
  queue_.clear();
  queued_bytes_ = 0;
}

void FusionQueue::abort() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = true;
    fail_queued(aborted_error(
        "the communicator was aborted or destroyed while this allreduce was queued for fusion"));
  }
  cv_.notify_all();
}

void FusionQueue::stop() {
  abort();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  // Issued batches must not copy into callers' buffers once the communicator is gone.
  std::vector<std::shared_ptr<FusionBatch>> live;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : batches_) {
      if (auto b = w.lock()) live.push_back(std::move(b));
    }
    batches_.clear();
  }
  for (auto& b : live) {
    b->abandoned.store(true);
    std::lock_guard<std::mutex> held(b->mu);  // a copy-back in progress ends first
  }
}

Status FusionQueue::await(FusionEntry& e, int64_t timeout_ms, bool poll, bool* done) {
  // Waiting with -1 (the communicator's deadline) gives the round a second more, so that a failed
  // agreement reports its own cause.
  const int64_t budget = timeout_ms < 0 ? options_.timeout_ms + 1000 : timeout_ms;
  const auto deadline = Clock::now() + std::chrono::milliseconds(budget);
  std::shared_ptr<FusionBatch> b;
  {
    std::unique_lock<std::mutex> lock(mu_);
    while (e.batch == nullptr && !e.failed) {
      flush_ = true;
      cv_.notify_all();
      if (poll) {
        *done = false;
        return ok_status();
      }
      if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && e.batch == nullptr &&
          !e.failed) {
        return timeout_error("the allreduce is still queued for fusion after {} ms", budget);
      }
    }
    if (e.failed) {
      if (done != nullptr) *done = true;
      return e.status;
    }
    b = e.batch;
  }
  int64_t left = -1;
  if (timeout_ms >= 0) {
    left = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  }
  return b->finish(left, poll, done);
}

void FusionQueue::run() {
  const auto cycle = std::chrono::microseconds(static_cast<int64_t>(options_.cycle_ms * 1000));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    if (queue_.empty()) {
      flush_ = false;
      cv_.wait(lock);
      continue;
    }
    const bool due = flush_ || drainers_ > 0 || queued_bytes_ >= options_.threshold;
    const auto ripe = queue_.front()->queued_at + cycle;
    if (!due && Clock::now() < ripe) {
      cv_.wait_until(lock, ripe);
      continue;
    }
    round_running_ = true;
    const auto offered = static_cast<int64_t>(queue_.size());
    lock.unlock();
    Status s = round(offered);
    lock.lock();
    round_running_ = false;
    if (!s.ok()) fail_queued(s);
    cv_.notify_all();
  }
}

Status FusionQueue::round(int64_t offered) {
  int64_t agreed = offered;
  int64_t negotiate_us = 0;
  if (options_.world_size > 1) {
    const int64_t t0 = timeline::on() ? timeline::now_us() : -1;
    int64_t mine = offered;
    int64_t least = 0;
    GW_ASSIGN_OR_RETURN(
        auto req, inner_->iallreduce(&mine, &least, 1, coll::DataType::kI64, coll::ReduceOp::kMin));
    Status w = req->wait(options_.timeout_ms);
    if (!w.ok()) {
      return Status(w.code(),
                    "fusion: the ranks' agreement on which queued allreduce calls to "
                    "fuse failed: " +
                        w.message());
    }
    if (least < 1 || least > offered) {
      return internal_error("fusion: the ranks agreed on {} queued calls but this rank offered {}",
                            least, offered);
    }
    agreed = least;
    if (t0 >= 0) {
      negotiate_us = timeline::now_us() - t0;
      timeline::complete("fusion_negotiate", "fusion", t0, negotiate_us,
                         fmt::format("\"offered\":{},\"agreed\":{}", offered, agreed));
    }
  }
  auto b = std::make_shared<FusionBatch>();
  std::vector<std::shared_ptr<FusionEntry>> taken;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) return ok_status();  // aborted meanwhile: the entries have failed
    const FusionEntry& head = *queue_.front();
    b->dtype = head.dtype;
    b->op_kind = head.op;
    size_t bytes = 0;
    while (!queue_.empty() && static_cast<int64_t>(taken.size()) < agreed) {
      const FusionEntry& e = *queue_.front();
      if (e.dtype != head.dtype || e.op != head.op) break;
      if (!taken.empty() && bytes + e.bytes > options_.threshold) break;
      b->members.push_back({e.recvbuf, bytes, e.bytes, e.queued_us});
      bytes += e.bytes;
      queued_bytes_ -= e.bytes;
      taken.push_back(queue_.front());
      queue_.pop_front();
    }
    b->bytes = bytes;
    b->id = next_batch_++;
    // Forget the finished batches now and then.
    std::erase_if(batches_, [](const std::weak_ptr<FusionBatch>& w) { return w.expired(); });
    batches_.push_back(b);
  }
  b->negotiate_us = negotiate_us;
  Status s;
  try {
    b->buf.reset(new uint8_t[b->bytes]);
  } catch (const std::bad_alloc&) {
    s = no_memory("fusion: cannot allocate a fusion buffer of {} bytes", b->bytes);
  }
  if (s.ok()) {
    for (size_t i = 0; i < taken.size(); ++i) {
      std::memcpy(b->buf.get() + b->members[i].offset, taken[i]->sendbuf, taken[i]->bytes);
    }
    if (timeline::on()) b->issued_us = timeline::now_us();
    const size_t count = b->bytes / coll::dtype_size(b->dtype);
    auto op = inner_->iallreduce(b->buf.get(), b->buf.get(), count, b->dtype, b->op_kind);
    if (op.ok()) {
      b->op = std::move(*op);
    } else {
      s = op.status();
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : taken) {
      if (s.ok()) {
        e->batch = b;
      } else {
        e->failed = true;
        e->status = s;
      }
    }
  }
  return s;
}

}  // namespace gw::capi
