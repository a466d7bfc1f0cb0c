#include "tests/support/inproc_transport.h"

#include <array>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "core/net/comm_adapter.h"
#include "core/net/request.h"
#include "core/store.h"

namespace gw::testing {
namespace {

constexpr char kMagic[8] = {'g', 'w', 'i', 'n', 'p', 'r', 'o', 'c'};

struct InReq : net::Request {
  bool in_use = false;
  bool is_send = false;
  const void* sdata = nullptr;
  void* rdata = nullptr;
  size_t size = 0;  // send size, or receive capacity
  int tag = 0;
  bool done = false;
  Status err;
  size_t got = 0;
};

// One one-way connection. Every field, and every request of both comms, is guarded by mu.
struct Pipe {
  std::mutex mu;
  std::deque<InReq*> sends;
  std::deque<InReq*> recvs;
  bool sender_closed = false;
  bool receiver_closed = false;
  int sender_rank = -1;
  int receiver_rank = -1;

  void match() {
    while (!sends.empty() && !recvs.empty()) {
      InReq* s = sends.front();
      InReq* r = recvs.front();
      sends.pop_front();
      recvs.pop_front();
      if (r->tag != net::kAnyTag && r->tag != s->tag) {
        r->err = internal_error("recv from rank {} via inproc: tag mismatch (expected {}, got {})",
                                sender_rank, r->tag, s->tag);
        s->err = internal_error("send to rank {} via inproc: tag mismatch (sent {}, expected {})",
                                receiver_rank, s->tag, r->tag);
      } else if (s->size > r->size) {
        r->err = truncated_error(
            "recv from rank {} via inproc: message truncated ({} bytes sent, {} "
            "bytes expected)",
            sender_rank, s->size, r->size);
        s->err = truncated_error(
            "send to rank {} via inproc: message truncated ({} bytes sent, {} "
            "bytes expected)",
            receiver_rank, s->size, r->size);
      } else {
        if (s->size) std::memcpy(r->rdata, s->sdata, s->size);
        r->got = s->got = s->size;
        r->done = s->done = true;
      }
    }
  }
};

// One end of a Pipe; the send and receive comms forward to it (core/net/comm_adapter.h).
class InprocComm {
 public:
  InprocComm(std::shared_ptr<Pipe> pipe, bool is_sender)
      : pipe_(std::move(pipe)), sender_(is_sender) {}

  ~InprocComm() {
    std::lock_guard<std::mutex> lock(pipe_->mu);
    // Abandon our queued requests; the peer's unmatched ones fail with kPeer.
    auto& mine = sender_ ? pipe_->sends : pipe_->recvs;
    auto& theirs = sender_ ? pipe_->recvs : pipe_->sends;
    mine.clear();
    for (InReq* r : theirs) {
      r->err = peer_error("{} rank {} via inproc: peer closed the connection",
                          sender_ ? "recv from" : "send to",
                          sender_ ? pipe_->sender_rank : pipe_->receiver_rank);
    }
    theirs.clear();
    (sender_ ? pipe_->sender_closed : pipe_->receiver_closed) = true;
  }

  std::string peer_name_locked() const {
    return fmt::format("rank {} via inproc", sender_ ? pipe_->receiver_rank : pipe_->sender_rank);
  }

  Result<net::Request*> post(const void* sdata, void* rdata, size_t size, int tag) {
    if (size > 0 && sdata == nullptr && rdata == nullptr) {
      return invalid_arg("{}: null buffer of {} bytes", sender_ ? "isend" : "irecv", size);
    }
    std::lock_guard<std::mutex> lock(pipe_->mu);
    InReq* req = nullptr;
    for (InReq& r : slots_) {
      if (!r.in_use) {
        req = &r;
        break;
      }
    }
    if (req == nullptr) return static_cast<net::Request*>(nullptr);
    *req = InReq{};
    req->in_use = true;
    req->is_send = sender_;
    req->sdata = sdata;
    req->rdata = rdata;
    req->size = size;
    req->tag = tag;
    const bool peer_gone = sender_ ? pipe_->receiver_closed : pipe_->sender_closed;
    if (peer_gone) {
      req->err = peer_error("{} {}: peer closed the connection", sender_ ? "send to" : "recv from",
                            peer_name_locked());
    } else {
      (sender_ ? pipe_->sends : pipe_->recvs).push_back(req);
      pipe_->match();
    }
    return static_cast<net::Request*>(req);
  }

  Status test(net::Request* request, bool* done, size_t* size) {
    std::lock_guard<std::mutex> lock(pipe_->mu);
    InReq* req = nullptr;
    for (InReq& r : slots_) {
      if (static_cast<net::Request*>(&r) == request && r.in_use) req = &r;
    }
    if (req == nullptr) return invalid_arg("test: not a live request of this comm");
    if (!req->err.ok()) {
      req->in_use = false;
      return req->err;
    }
    if (!req->done) {
      *done = false;
      return ok_status();
    }
    *done = true;
    *size = req->got;
    req->in_use = false;
    return ok_status();
  }

  std::string peer_name() const {
    std::lock_guard<std::mutex> lock(pipe_->mu);
    return peer_name_locked();
  }

  Result<net::MemRegion*> reg_mr(void* data, size_t size, net::MemType type) {
    return mrs_.reg(data, size, type, "inproc");
  }
  Status dereg_mr(net::MemRegion* mr) { return mrs_.dereg(mr); }
  Result<net::Request*> isend(const void* data, size_t size, int tag, net::MemRegion*) {
    return post(data, nullptr, size, tag);
  }
  Result<net::Request*> irecv(void* data, size_t size, int tag, net::MemRegion*) {
    return post(nullptr, data, size, tag);
  }

 private:
  net::HostMrRegistry mrs_;
  std::shared_ptr<Pipe> pipe_;
  bool sender_;
  std::array<InReq, net::kMaxRequests> slots_{};
};

// The sender's end is built with is_sender = true, the receiver's with false.
using InprocSendComm = net::SendCommAdapter<InprocComm>;
using InprocRecvComm = net::RecvCommAdapter<InprocComm>;

struct ListenerState {
  std::string token;
  int rank = -1;
  std::deque<std::shared_ptr<Pipe>> pending;
};

// Process-wide: handles name listeners by id. Guarded by its mutex.
struct Registry {
  std::mutex mu;
  uint64_t next_id = 1;
  std::map<uint64_t, std::shared_ptr<ListenerState>> listeners;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: threads may outlive static teardown
  return *r;
}

class InprocListener : public net::Listener {
 public:
  InprocListener(uint64_t id, std::shared_ptr<ListenerState> st) : id_(id), st_(std::move(st)) {}
  ~InprocListener() override {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    reg.listeners.erase(id_);
    for (auto& pipe : st_->pending) {
      std::lock_guard<std::mutex> plock(pipe->mu);
      pipe->receiver_closed = true;
      for (InReq* r : pipe->sends)
        r->err =
            peer_error("send to rank {} via inproc: listener closed before accepting", st_->rank);
      pipe->sends.clear();
    }
  }
  Result<std::unique_ptr<net::RecvComm>> accept() override {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    if (st_->pending.empty()) return std::unique_ptr<net::RecvComm>();
    auto pipe = std::move(st_->pending.front());
    st_->pending.pop_front();
    return std::unique_ptr<net::RecvComm>(std::make_unique<InprocRecvComm>(std::move(pipe), false));
  }

 private:
  uint64_t id_;
  std::shared_ptr<ListenerState> st_;
};

class InprocConnector : public net::Connector {
 public:
  InprocConnector(uint64_t id, net::TransportOptions opts)
      : id_(id), opts_(std::move(opts)), deadline_(deadline_after_ms(opts_.timeout_ms)) {}
  Result<std::unique_ptr<net::SendComm>> poll() override {
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    auto it = reg.listeners.find(id_);
    if (it == reg.listeners.end()) {
      if (Clock::now() > deadline_) {
        return timeout_error("connect via inproc to listener {}: no answer within {} ms", id_,
                             opts_.timeout_ms);
      }
      return std::unique_ptr<net::SendComm>();
    }
    if (it->second->token != opts_.job_token) {
      return peer_error("connect to rank {} via inproc: job token refused", it->second->rank);
    }
    auto pipe = std::make_shared<Pipe>();
    pipe->sender_rank = opts_.rank;
    pipe->receiver_rank = it->second->rank;
    it->second->pending.push_back(pipe);
    return std::unique_ptr<net::SendComm>(std::make_unique<InprocSendComm>(std::move(pipe), true));
  }

 private:
  uint64_t id_;
  net::TransportOptions opts_;
  Deadline deadline_;
};

class InprocTransport : public net::Transport {
 public:
  explicit InprocTransport(net::TransportOptions opts) : opts_(std::move(opts)) {
    props_.name = "inproc";
    props_.latency_us = 1.0;
    props_.bandwidth_gbps = 8.0;
  }
  const net::Properties& properties() const override { return props_; }
  Result<std::unique_ptr<net::Listener>> listen(net::Handle* handle) override {
    if (handle == nullptr) return invalid_arg("listen: null handle");
    Registry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mu);
    const uint64_t id = reg.next_id++;
    auto st = std::make_shared<ListenerState>();
    st->token = opts_.job_token;
    st->rank = opts_.rank;
    reg.listeners[id] = st;
    *handle = net::Handle{};
    std::memcpy(handle->bytes.data(), kMagic, sizeof(kMagic));
    std::memcpy(handle->bytes.data() + sizeof(kMagic), &id, sizeof(id));
    return std::unique_ptr<net::Listener>(std::make_unique<InprocListener>(id, std::move(st)));
  }
  Result<std::unique_ptr<net::Connector>> connect(const net::Handle& handle) override {
    if (std::memcmp(handle.bytes.data(), kMagic, sizeof(kMagic)) != 0) {
      return invalid_arg("connect via inproc: the handle was not made by an inproc listener");
    }
    uint64_t id;
    std::memcpy(&id, handle.bytes.data() + sizeof(kMagic), sizeof(id));
    return std::unique_ptr<net::Connector>(std::make_unique<InprocConnector>(id, opts_));
  }

 private:
  net::TransportOptions opts_;
  net::Properties props_;
};

}  // namespace

std::unique_ptr<net::Transport> make_inproc_transport(const net::TransportOptions& options) {
  return std::make_unique<InprocTransport>(options);
}

}  // namespace gw::testing
