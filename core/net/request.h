// The one definition of gw::net::Request (forward-declared in transport.h) and the request table
// the tcp and shm comms share. Backends derive their request type from Request.
//
// RequestTable keeps at most kMaxRequests requests per comm. Requests get consecutive sequence
// numbers in posting order; the backend completes them in that order (complete_through), and
// test() may release any of them in any order. Not thread-safe: one comm, one thread at a time.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/net/transport.h"

namespace gw::net {

class Request {
 public:
  virtual ~Request() = default;
};

enum class RequestState : uint8_t { kFree, kActive, kDone };

// R derives from Request and has members `uint64_t seq` and `RequestState state`.
template <typename R>
class RequestTable {
 public:
  // A free slot with the next sequence number, or nullptr when all kMaxRequests are taken.
  R* post() {
    for (R& r : slots_) {
      if (r.state == RequestState::kFree) {
        r = R{};
        r.state = RequestState::kActive;
        r.seq = next_seq_++;
        by_seq_[r.seq % kMaxRequests] = &r;
        return &r;
      }
    }
    return nullptr;
  }

  // The request with sequence number `seq` when it is posted and not yet complete.
  R* active(uint64_t seq) const {
    if (seq < done_seq_ || seq >= next_seq_) return nullptr;
    return by_seq_[seq % kMaxRequests];
  }

  // Marks every request with seq < `seq` complete.
  void complete_through(uint64_t seq) {
    for (; done_seq_ < seq && done_seq_ < next_seq_; ++done_seq_) {
      by_seq_[done_seq_ % kMaxRequests]->state = RequestState::kDone;
    }
  }

  // The request behind a caller's pointer, or nullptr when it is not a live request of this table.
  R* find(Request* request) {
    for (R& r : slots_) {
      if (static_cast<Request*>(&r) == request && r.state != RequestState::kFree) return &r;
    }
    return nullptr;
  }

  void release(R* r) { r->state = RequestState::kFree; }

  uint64_t next_seq() const { return next_seq_; }  // sequence number of the next post()
  uint64_t done_seq() const { return done_seq_; }  // every seq below this one is complete
  bool idle() const { return done_seq_ == next_seq_; }

 private:
  std::array<R, kMaxRequests> slots_{};
  std::array<R*, kMaxRequests> by_seq_{};
  uint64_t next_seq_ = 0;
  uint64_t done_seq_ = 0;
};

// Arguments of isend/irecv: a buffer for any non-empty message, a tag >= 0 (receives may also
// use kAnyTag), and, when a registration is given, a buffer that lies inside it.
inline Status check_buffer(const char* op, const void* data, size_t size, int tag, bool any_tag_ok,
                           MemRegion* mr) {
  if (data == nullptr && size > 0) return invalid_arg("{}: null buffer of {} bytes", op, size);
  if (tag < 0 && !(any_tag_ok && tag == kAnyTag)) {
    return invalid_arg("{}: tag {} is negative{}", op, tag, any_tag_ok ? " (only kAnyTag)" : "");
  }
  if (mr != nullptr && size > 0) {
    auto begin = reinterpret_cast<uintptr_t>(data);
    auto base = reinterpret_cast<uintptr_t>(mr->base);
    if (begin < base || begin - base > mr->size || size > mr->size - (begin - base)) {
      return invalid_arg("{}: buffer of {} bytes lies outside its memory registration", op, size);
    }
  }
  return ok_status();
}

// Comm::test for tables whose R also has `size_t msg_size`: unless the request is done or the
// comm has failed, `progress` moves bytes first; then a done request reports its size and is
// freed, and a failed comm frees it and returns its sticky `error` (read after progress, which
// may set it).
template <typename R, typename Progress>
Status test_request(RequestTable<R>& reqs, const Status& error, const std::string& peer,
                    Request* request, bool* done, size_t* size, Progress&& progress) {
  if (done == nullptr) return invalid_arg("test: null done pointer");
  R* r = reqs.find(request);
  if (r == nullptr) {
    return invalid_arg("test: {} is not an outstanding request of the comm to {}",
                       static_cast<void*>(request), peer);
  }
  if (r->state != RequestState::kDone && error.ok()) (void)progress();
  if (r->state == RequestState::kDone) {
    *done = true;
    if (size != nullptr) *size = r->msg_size;
    reqs.release(r);
    return ok_status();
  }
  if (!error.ok()) {
    reqs.release(r);
    return error;
  }
  *done = false;
  return ok_status();
}

// Host-memory registrations for backends that need no keys (tcp, shm). reg/dereg are
// thread-safe, so they may race with isend/irecv/test as the contract allows.
class HostMrRegistry {
 public:
  Result<MemRegion*> reg(void* data, size_t size, MemType type, const char* backend) {
    if (data == nullptr && size > 0) return invalid_arg("reg_mr: null buffer of {} bytes", size);
    if (type != MemType::kHost) {
      return unsupported("reg_mr: the {} transport moves host memory only (got CUDA memory)",
                         backend);
    }
    auto mr = std::make_unique<MemRegion>();
    mr->base = data;
    mr->size = size;
    mr->type = type;
    std::lock_guard<std::mutex> lock(mu_);
    regions_.push_back(std::move(mr));
    return regions_.back().get();
  }

  Status dereg(MemRegion* mr) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [mr](const std::unique_ptr<MemRegion>& r) { return r.get() == mr; });
    if (mr == nullptr || it == regions_.end()) {
      return invalid_arg("dereg_mr: {} is not a registration of this comm", static_cast<void*>(mr));
    }
    regions_.erase(it);
    return ok_status();
  }

 private:
  std::mutex mu_;
  std::vector<std::unique_ptr<MemRegion>> regions_;
};

}  // namespace gw::net
