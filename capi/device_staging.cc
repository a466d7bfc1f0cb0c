#include "capi/device_staging.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "collectives/types.h"
#include "gpudirect/device_buffer.h"

namespace gw::capi {

namespace {

// One device range and its host copy.
struct Segment {
  void* device = nullptr;
  void* host = nullptr;
  size_t bytes = 0;
  int ordinal = -1;
};

// A call's host-side twin: the call on host pointers and what to copy each way.
class StagedCall {
 public:
  const coll::CollectiveCall& host_call() const { return host_; }

  static Result<StagedCall> prepare(DeviceMemory& dm, const coll::CollectiveCall& c,
                                    DeviceFlags dev, int rank, int size) {
    StagedCall s;
    s.host_ = c;
    const size_t es = coll::dtype_size(c.dtype);
    const auto p = static_cast<size_t>(size);
    const bool root = rank == c.root;
    size_t send_bytes = 0;
    size_t recv_bytes = 0;
    bool recv_in = false;
    bool recv_out = true;
    switch (c.kind) {
      case coll::CallKind::kAllreduce:
        send_bytes = recv_bytes = c.count * es;
        break;
      case coll::CallKind::kBroadcast:
        recv_bytes = c.count * es;
        recv_in = root;
        recv_out = !root;
        break;
      case coll::CallKind::kAllgather:
        send_bytes = c.count * es;
        recv_bytes = send_bytes * p;
        break;
      case coll::CallKind::kReduceScatter:
        recv_bytes = c.count * es;
        send_bytes = recv_bytes * p;
        break;
      case coll::CallKind::kAlltoall:
        send_bytes = recv_bytes = c.count * es * p;
        break;
      case coll::CallKind::kReduce:
        send_bytes = c.count * es;
        recv_bytes = root ? c.count * es : 0;
        break;
      case coll::CallKind::kGather:
        send_bytes = c.count * es;
        recv_bytes = root ? send_bytes * p : 0;
        break;
      case coll::CallKind::kScatter:
        recv_bytes = c.count * es;
        send_bytes = root ? recv_bytes * p : 0;
        break;
      case coll::CallKind::kAlltoallv:
        for (size_t i = 0; i < p; ++i) {
          send_bytes = std::max(send_bytes, (c.sdispls[i] + c.sendcounts[i]) * es);
          recv_bytes = std::max(recv_bytes, (c.rdispls[i] + c.recvcounts[i]) * es);
        }
        recv_in = true;
        break;
      default:
        return s;  // barrier: no buffers
    }
    const bool send_dev = dev.send && send_bytes > 0 && c.sendbuf != nullptr;
    const bool recv_dev = dev.recv && recv_bytes > 0 && c.recvbuf != nullptr;
    const auto sb = reinterpret_cast<uintptr_t>(c.sendbuf);
    const auto rb = reinterpret_cast<uintptr_t>(c.recvbuf);
    if (send_dev && recv_dev && sb < rb + recv_bytes && rb < sb + send_bytes) {
      // In place: one host copy of the union, so the host call sees the same overlap.
      const uintptr_t lo = std::min(sb, rb);
      const uintptr_t hi = std::max(sb + send_bytes, rb + recv_bytes);
      GW_ASSIGN_OR_RETURN(Segment u, s.stage(dm, reinterpret_cast<void*>(lo), hi - lo));
      s.in_.push_back(u);
      auto* h = static_cast<unsigned char*>(u.host);
      s.host_.sendbuf = h + (sb - lo);
      s.host_.recvbuf = h + (rb - lo);
      if (recv_out) s.out_.push_back({c.recvbuf, h + (rb - lo), recv_bytes, u.ordinal});
      return s;
    }
    if (send_dev) {
      GW_ASSIGN_OR_RETURN(Segment g, s.stage(dm, const_cast<void*>(c.sendbuf), send_bytes));
      s.in_.push_back(g);
      s.host_.sendbuf = g.host;
    }
    if (recv_dev) {
      GW_ASSIGN_OR_RETURN(Segment g, s.stage(dm, c.recvbuf, recv_bytes));
      if (recv_in) s.in_.push_back(g);
      if (recv_out) s.out_.push_back(g);
      s.host_.recvbuf = g.host;
    }
    return s;
  }

  // A point-to-point buffer: a send copies in, a receive copies out (what arrived).
  static Result<StagedCall> prepare_p2p(DeviceMemory& dm, bool send, void* buf, size_t bytes) {
    StagedCall s;
    s.p2p_host_ = buf;  // no bytes: never touched
    if (bytes == 0) return s;
    GW_ASSIGN_OR_RETURN(Segment g, s.stage(dm, buf, bytes));
    (send ? s.in_ : s.out_).push_back(g);
    s.p2p_host_ = g.host;
    return s;
  }
  void* p2p_host() const { return p2p_host_; }

  Status copy_in() const {
    for (const Segment& g : in_) {
      GW_RETURN_IF_ERROR(cuda::copy_to_host_on(g.ordinal, g.host, g.device, g.bytes));
    }
    return ok_status();
  }
  // At most `limit` bytes of each range (a receive's message length).
  Status copy_out(size_t limit = SIZE_MAX) const {
    for (const Segment& g : out_) {
      GW_RETURN_IF_ERROR(
          cuda::copy_to_device_on(g.ordinal, g.device, g.host, std::min(g.bytes, limit)));
    }
    return ok_status();
  }
  // Drops the host buffers' holds without giving them back to the pool: an operation that was
  // never seen to finish might still write them.
  void abandon() {
    for (auto& h : holds_) new std::shared_ptr<void>(std::move(h));  // NOLINT: leaked on purpose
    holds_.clear();
  }

 private:
  Result<Segment> stage(DeviceMemory& dm, void* device, size_t bytes) {
    GW_ASSIGN_OR_RETURN(cuda::Allocation a, dm.resolve(device, bytes));
    GW_ASSIGN_OR_RETURN(StagingBuffer b, dm.stage(device, bytes, a));
    holds_.push_back(std::move(b.hold));
    return Segment{device, b.host, bytes, a.device};
  }

  coll::CollectiveCall host_;
  std::vector<Segment> in_, out_;
  std::vector<std::shared_ptr<void>> holds_;
  void* p2p_host_ = nullptr;
};

// A started host operation whose results go back to device memory once it is done.
class StagedRequest final : public SessionRequest {
 public:
  StagedRequest(StagedCall staged, std::shared_ptr<DeviceMemory> dm, bool p2p_recv)
      : staged_(std::move(staged)), dm_(std::move(dm)), p2p_recv_(p2p_recv) {}
  ~StagedRequest() override {
    const bool started = inner_ != nullptr;
    inner_.reset();
    if (started && !finished_) staged_.abandon();
  }
  void set_inner(std::unique_ptr<SessionRequest> inner) { inner_ = std::move(inner); }

  Status wait(int64_t timeout_ms) override {
    if (finished_) return final_;
    Status s = inner_->wait(timeout_ms);
    // kTimeout may mean "still running": the C layer asks test() then, which finishes it.
    if (s.code() == Code::kTimeout) return s;
    return finish(std::move(s));
  }
  Status test(bool* done) override {
    if (finished_) {
      *done = true;
      return final_;
    }
    Status s = inner_->test(done);
    if (!*done) return s;
    return finish(std::move(s));
  }
  bool p2p_result(size_t* bytes, int* source) const override {
    return inner_->p2p_result(bytes, source);
  }

 private:
  Status finish(Status s) {
    finished_ = true;
    if (s.ok()) {
      size_t limit = SIZE_MAX;
      int source = -1;
      if (p2p_recv_ && !inner_->p2p_result(&limit, &source)) limit = SIZE_MAX;
      s = staged_.copy_out(limit);
    }
    final_ = s;
    return s;
  }

  StagedCall staged_;
  std::shared_ptr<DeviceMemory> dm_;  // the pool the host buffers go back to
  const bool p2p_recv_;
  std::unique_ptr<SessionRequest> inner_;  // destroyed before the buffers it may use
  bool finished_ = false;
  Status final_;
};

Result<std::shared_ptr<DeviceMemory>> device_memory_of(Session& st) {
  std::shared_ptr<DeviceMemory> dm = st.device_memory();
  if (!dm) return unsupported("this communicator does not take CUDA device memory");
  return dm;
}

}  // namespace

Status run_staged(Session& st, const coll::CollectiveCall& call, DeviceFlags dev) {
  GW_ASSIGN_OR_RETURN(auto dm, device_memory_of(st));
  GW_ASSIGN_OR_RETURN(StagedCall s, StagedCall::prepare(*dm, call, dev, st.rank(), st.size()));
  GW_RETURN_IF_ERROR(s.copy_in());
  GW_RETURN_IF_ERROR(st.run(s.host_call()));
  return s.copy_out();
}

Result<std::unique_ptr<SessionRequest>> start_staged(Session& st, const coll::CollectiveCall& call,
                                                     DeviceFlags dev, bool iallreduce) {
  GW_ASSIGN_OR_RETURN(auto dm, device_memory_of(st));
  GW_ASSIGN_OR_RETURN(StagedCall s, StagedCall::prepare(*dm, call, dev, st.rank(), st.size()));
  GW_RETURN_IF_ERROR(s.copy_in());
  const coll::CollectiveCall h = s.host_call();
  auto req = std::make_unique<StagedRequest>(std::move(s), dm, false);
  std::unique_ptr<SessionRequest> inner;
  if (iallreduce) {
    GW_ASSIGN_OR_RETURN(inner, st.iallreduce(h.sendbuf, h.recvbuf, h.count, h.dtype, h.op));
  } else {
    GW_ASSIGN_OR_RETURN(inner, st.start(h));
  }
  if (!inner) return internal_error("{}: no operation", coll::call_name(call.kind));
  req->set_inner(std::move(inner));
  return std::unique_ptr<SessionRequest>(std::move(req));
}

Result<std::unique_ptr<SessionRequest>> p2p_staged(Session& st, bool send, void* buf, size_t bytes,
                                                   int peer, int tag) {
  GW_ASSIGN_OR_RETURN(auto dm, device_memory_of(st));
  GW_ASSIGN_OR_RETURN(StagedCall s, StagedCall::prepare_p2p(*dm, send, buf, bytes));
  GW_RETURN_IF_ERROR(s.copy_in());
  void* host = s.p2p_host();
  auto req = std::make_unique<StagedRequest>(std::move(s), dm, !send);
  std::unique_ptr<SessionRequest> inner;
  if (send) {
    GW_ASSIGN_OR_RETURN(inner, st.isend(host, bytes, peer, tag));
  } else {
    GW_ASSIGN_OR_RETURN(inner, st.irecv(host, bytes, peer, tag));
  }
  if (!inner) return internal_error("point-to-point call returned no operation");
  req->set_inner(std::move(inner));
  return std::unique_ptr<SessionRequest>(std::move(req));
}

}  // namespace gw::capi
