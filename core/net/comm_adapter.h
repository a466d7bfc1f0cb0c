// SendCommAdapter / RecvCommAdapter: the SendComm and RecvComm of a backend whose two
// directions share one connection object (the "core"). They forward every Comm call to it, so a
// backend writes its connection once and the interface boilerplate exists only here.
//
// Core requirements (non-virtual members are enough):
//   Result<MemRegion*> reg_mr(void* data, size_t size, MemType type);
//   Status dereg_mr(MemRegion* mr);
//   Status test(Request* request, bool* done, size_t* size);
//   std::string peer_name() const;
//   Result<Request*> isend(const void*, size_t, int tag, MemRegion*);  // SendCommAdapter only
//   Result<Request*> irecv(void*, size_t, int tag, MemRegion*);        // RecvCommAdapter only
//   optional: bool wait_fds(std::vector<pollfd>* fds) const;  (absent: false, as in Comm)
// The adapter constructs its core in place from the constructor's arguments and destroys it with
// itself; the core never moves, so it may hand `this` to threads of its own. Each call keeps the
// core's guarantees (blocking, thread-safety) unchanged: see core/net/transport.h.
#pragma once

#include <poll.h>

#include <string>
#include <utility>
#include <vector>

#include "core/net/transport.h"

namespace gw::net {

template <typename Interface, typename Core>
class CommAdapterBase : public Interface {
 public:
  Result<MemRegion*> reg_mr(void* data, size_t size, MemType type) override {
    return core_.reg_mr(data, size, type);
  }
  Status dereg_mr(MemRegion* mr) override { return core_.dereg_mr(mr); }
  Status test(Request* request, bool* done, size_t* size) override {
    return core_.test(request, done, size);
  }
  std::string peer_name() const override { return core_.peer_name(); }
  bool wait_fds(std::vector<pollfd>* fds) const override {
    if constexpr (requires(const Core& c) { c.wait_fds(fds); }) {
      return core_.wait_fds(fds);
    } else {
      return false;
    }
  }

  Core& core() { return core_; }
  const Core& core() const { return core_; }

 protected:
  template <typename... Args>
  explicit CommAdapterBase(Args&&... args) : core_(std::forward<Args>(args)...) {}

  Core core_;
};

template <typename Core>
class SendCommAdapter final : public CommAdapterBase<SendComm, Core> {
 public:
  template <typename... Args>
  explicit SendCommAdapter(Args&&... args)
      : CommAdapterBase<SendComm, Core>(std::forward<Args>(args)...) {}
  Result<Request*> isend(const void* data, size_t size, int tag, MemRegion* mr) override {
    return this->core_.isend(data, size, tag, mr);
  }
};

template <typename Core>
class RecvCommAdapter final : public CommAdapterBase<RecvComm, Core> {
 public:
  template <typename... Args>
  explicit RecvCommAdapter(Args&&... args)
      : CommAdapterBase<RecvComm, Core>(std::forward<Args>(args)...) {}
  Result<Request*> irecv(void* data, size_t size, int tag, MemRegion* mr) override {
    return this->core_.irecv(data, size, tag, mr);
  }
};

}  // namespace gw::net
