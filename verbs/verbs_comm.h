// The verbs backend's queue pairs and its two comms (see verbs/verbs_transport.h for the
// protocol). Internal to verbs/.
#pragma once

#include <infiniband/verbs.h>

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/net/request.h"
#include "core/net/socket_util.h"
#include "core/sys/fd.h"
#include "verbs/verbs_config.h"
#include "verbs/verbs_device.h"
#include "verbs/verbs_wire.h"

namespace gw::verbs {

// A connection's RC queue pairs and their one completion queue.
class QpSet {
 public:
  // Creates `nqps` QPs in INIT taking remote `access` (default: remote writes); a receiving side
  // also posts its receives.
  static Result<std::unique_ptr<QpSet>> create(std::shared_ptr<VerbsDevice> device,
                                               const VerbsConfig& config, int nqps, bool receiver,
                                               int access = IBV_ACCESS_REMOTE_WRITE |
                                                            IBV_ACCESS_LOCAL_WRITE);
  ~QpSet();
  // INIT -> RTR -> RTS towards the peer's QPs (same count).
  Status connect(const PortWire& remote, const uint32_t* remote_qpns);
  PortWire local_port() const;

  const std::shared_ptr<VerbsDevice>& device() const { return device_; }
  const std::vector<ibv_qp*>& qps() const { return qps_; }
  ibv_cq* cq() const { return cq_; }
  int nqps() const { return static_cast<int>(qps_.size()); }
  uint32_t max_inline() const { return max_inline_; }
  int mtu() const { return mtu_; }  // ibv_mtu after connect()
  const VerbsConfig& config() const { return config_; }
  // Index of the QP with this number, or -1.
  int index_of(uint32_t qp_num) const;
  Status post_receives(int qp_index, int count);

  static constexpr int kSendDepth = 256;
  static constexpr int kRecvDepth = 64;

 private:
  QpSet() = default;
  std::shared_ptr<VerbsDevice> device_;
  VerbsConfig config_;
  std::vector<ibv_qp*> qps_;
  ibv_cq* cq_ = nullptr;
  uint32_t max_inline_ = 0;
  int mtu_ = 0;
};

// Explicit registrations of a comm (reg_mr / dereg_mr).
struct VerbsMr : net::MemRegion {
  VerbsDevice::Registration* reg = nullptr;
};

// What both comms share: the QPs, the set-up socket kept for liveness, the sticky error.
class VerbsCommCore {
 public:
  VerbsCommCore(std::unique_ptr<QpSet> qps, sys::Fd socket, std::string peer);
  ~VerbsCommCore();

  Result<net::MemRegion*> reg_mr(void* data, size_t size, net::MemType type);
  Result<net::MemRegion*> reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd);
  Status dereg_mr(net::MemRegion* mr);
  // Failures found outside the CQ: async events and a closed set-up socket (the socket at most
  // every millisecond). Does not touch `error`. `*closed` tells a failure of the socket (the
  // peer closed or lost it) from a failure of the device or QPs.
  Status health(bool* closed);
  Status fail_from_wc(const ibv_wc& wc);

  QpSet& qps() { return *qps_; }
  VerbsDevice& device() { return *device_; }
  const std::string& peer() const { return peer_; }
  Status error;

 private:
  std::shared_ptr<VerbsDevice> device_;
  std::unique_ptr<QpSet> qps_;
  sys::Fd socket_;
  std::string peer_;
  int64_t next_check_ns_ = 0;
  uint64_t event_gen_ = 0;
  std::mutex mr_mu_;
  std::vector<std::unique_ptr<VerbsMr>> mrs_;
};

class VerbsSendComm final : public net::SendComm {
 public:
  // `fifo` is the registered CTS FIFO the receiver writes into (kFifoDepth records).
  VerbsSendComm(std::unique_ptr<QpSet> qps, sys::Fd socket, std::string peer,
                std::unique_ptr<CtsWire[]> fifo, VerbsDevice::Registration* fifo_reg);
  ~VerbsSendComm() override;
  Result<net::MemRegion*> reg_mr(void* data, size_t size, net::MemType type) override {
    return core_->reg_mr(data, size, type);
  }
  Result<net::MemRegion*> reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd) override {
    return core_->reg_mr_dmabuf(data, size, offset, fd);
  }
  Status dereg_mr(net::MemRegion* mr) override { return core_->dereg_mr(mr); }
  Result<net::Request*> isend(const void* data, size_t size, int tag, net::MemRegion* mr) override;
  Status test(net::Request* request, bool* done, size_t* size) override;
  std::string peer_name() const override { return core_->peer(); }

 private:
  struct Req : net::Request {
    uint64_t seq = 0;
    net::RequestState state = net::RequestState::kFree;
    size_t msg_size = 0;
    const uint8_t* data = nullptr;
    size_t size = 0;
    int tag = 0;
    VerbsDevice::Registration* reg = nullptr;
    int pending = 0;  // signaled WRs not yet completed
    bool issued = false;
  };
  void progress();
  void poll();
  void issue();
  // After the peer closed: fails the comm once no posted write awaits its completion, or at the
  // grace deadline.
  void settle_after_close();

  std::unique_ptr<VerbsCommCore> core_;
  // The peer's close, once seen; nothing is issued after it.
  Status peer_closed_;
  int64_t close_deadline_ns_ = 0;
  std::unique_ptr<CtsWire[]> fifo_;
  VerbsDevice::Registration* fifo_reg_;
  net::RequestTable<Req> reqs_;
  uint64_t issue_seq_ = 0;
};

class VerbsRecvComm final : public net::RecvComm {
 public:
  VerbsRecvComm(std::unique_ptr<QpSet> qps, sys::Fd socket, std::string peer, uint64_t fifo_addr,
                uint32_t fifo_rkey, bool use_inline);
  ~VerbsRecvComm() override;
  Status init();
  Result<net::MemRegion*> reg_mr(void* data, size_t size, net::MemType type) override {
    return core_->reg_mr(data, size, type);
  }
  Result<net::MemRegion*> reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd) override {
    return core_->reg_mr_dmabuf(data, size, offset, fd);
  }
  Status dereg_mr(net::MemRegion* mr) override { return core_->dereg_mr(mr); }
  Result<net::Request*> irecv(void* data, size_t size, int tag, net::MemRegion* mr) override;
  // The GDR flush: for device memory registered by this comm, an RDMA READ of the buffer's first
  // byte on a QP connected to itself (created on first use); its completion orders every earlier
  // write of the NIC into that memory before what the GPU reads next. At most kFlushSlots at once.
  Result<net::Request*> iflush(void* data, size_t size, net::MemRegion* mr) override;
  Status test(net::Request* request, bool* done, size_t* size) override;
  std::string peer_name() const override { return core_->peer(); }

  static constexpr int kFlushSlots = 8;  // NCCL keeps at most NCCL_STEPS (8) in flight

 private:
  struct Flush : net::Request {
    bool busy = false;
    bool done = false;
    Status status;
  };
  Status start_flush_qp();
  void poll_flushes();
  Status test_flush(Flush* f, bool* done, size_t* size);

  struct Req : net::Request {
    uint64_t seq = 0;
    net::RequestState state = net::RequestState::kFree;
    size_t msg_size = 0;
    uint8_t* data = nullptr;
    size_t capacity = 0;
    int tag = 0;
    VerbsDevice::Registration* reg = nullptr;
    int arrived = 0;
    uint64_t got = 0;
    uint32_t verdict = 0;
  };
  void progress();
  void poll();
  void advertise();

  std::unique_ptr<VerbsCommCore> core_;
  uint64_t fifo_addr_;
  uint32_t fifo_rkey_;
  bool use_inline_;
  std::unique_ptr<CtsWire[]> cts_;  // local copies of the records written to the sender
  VerbsDevice::Registration* cts_reg_ = nullptr;
  net::RequestTable<Req> reqs_;
  std::vector<uint64_t> recv_count_;  // per QP: immediates received so far
  uint64_t cts_seq_ = 0;              // next request to advertise
  uint64_t cts_posted_ = 0;           // CTS writes posted (for selective signaling)
  // The GDR flush's loopback QP, the host bytes its READs land in, and its requests.
  std::unique_ptr<QpSet> flush_qps_;
  std::unique_ptr<uint8_t[]> flush_buf_;
  VerbsDevice::Registration* flush_reg_ = nullptr;
  std::array<Flush, kFlushSlots> flushes_{};
};

}  // namespace gw::verbs
