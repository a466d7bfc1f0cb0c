// One opened RDMA device port of this process: context, protection domain, the chosen port and
// GID, the memory-registration cache and the async-event thread. Shared by every transport and
// comm of the process that selects the same device (VerbsDevice::open caches it per process).
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "verbs/ibv_table.h"
#include "verbs/verbs_config.h"

namespace gw::verbs {

class VerbsDevice {
 public:
  // Opens (or returns this process's already opened) first device port that GW_IB_HCA selects
  // and that is ACTIVE. kUnsupported says why none can be used.
  static Result<std::shared_ptr<VerbsDevice>> open(const VerbsConfig& config);
  ~VerbsDevice();

  const IbvTable& ibv() const { return *ibv_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }
  uint8_t port() const { return port_; }
  const ibv_port_attr& port_attr() const { return port_attr_; }
  const ibv_device_attr& device_attr() const { return device_attr_; }
  bool ethernet() const { return port_attr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  const std::string& name() const { return name_; }
  // "gwemu0:1 RoCE v2 GID 3 (::ffff:127.0.0.1), MTU 4096" for INFO lines and peer names.
  std::string describe() const;

  // ---- memory-registration cache ----
  // A registration covering [addr, addr+size) with `access`, shared and reference-counted: a
  // range inside an existing registration with the same access reuses it. release() drops one
  // reference; the last one deregisters. Thread-safe.
  struct Registration {
    uintptr_t begin = 0, end = 0;
    int access = 0;
    ibv_mr* mr = nullptr;
    int refs = 0;
  };
  Result<Registration*> acquire(const void* addr, size_t size, int access);
  // The same for CUDA device memory (GPUDirect RDMA), as `config.gpudirect` allows: through
  // dma-buf (cuMemGetHandleForAddressRange, then ibv_reg_dmabuf_mr), else ibv_reg_mr on the device
  // pointer where nvidia-peermem is loaded; kUnsupported saying why when neither can be used (the
  // caller then stages through host memory). The first choice is logged at INFO.
  Result<Registration*> acquire_device(const void* addr, size_t size, int access,
                                       const VerbsConfig& config);
  // Registers [addr, addr+size), `offset` bytes into the dma-buf `fd` (not kept), uncached.
  Result<Registration*> acquire_dmabuf(const void* addr, size_t size, uint64_t offset, int fd,
                                       int access);
  // What this process can do for CUDA memory here (probed on every call: the CUDA driver may be
  // loaded later, and the probe is one failing ibv_reg_dmabuf_mr).
  struct GpuDirectSupport {
    bool dmabuf = false;   // the NIC takes dma-bufs and the driver exports them
    bool peermem = false;  // nvidia-peermem (or nv_peer_mem) is loaded
    std::string why;       // what was found, for INFO lines and errors
  };
  GpuDirectSupport gpudirect_support(const VerbsConfig& config);
  // Whether this device's NIC and kernel driver take dma-buf registrations at all, asked of the
  // NIC alone (no CUDA driver needed: the daemon, which never exports a dma-buf itself, asks it).
  // The probe is one ibv_reg_dmabuf_mr of fd -1: EBADF where the kernel would look the fd up (the
  // method exists and the driver implements it), EOPNOTSUPP / ENOSYS / EPROTONOSUPPORT where
  // rdma-core's provider or the kernel lack it. Anything else (a registration, another errno)
  // is a "no" that names what came back. Not cached; thread-safe.
  struct DmabufProbe {
    bool ok = false;
    std::string why;  // one line: what the probe found
  };
  DmabufProbe dmabuf_probe() const;
  void release(Registration* r);
  size_t cached_registrations() const;

  // ---- async events ----
  // Bumped whenever a fatal async event arrives; comms compare it cheaply on every call.
  uint64_t event_generation() const { return event_gen_.load(std::memory_order_acquire); }
  // The first fatal event that names `qp` or `cq`, or a device-wide one; ok when none.
  Status async_error(const std::vector<ibv_qp*>& qps, ibv_cq* cq) const;
  // Drops the events recorded for `qps` and `cq`; requires that they were destroyed. The next QP
  // or CQ may be allocated at the same address and must not inherit their errors.
  void forget_errors(const std::vector<ibv_qp*>& qps, ibv_cq* cq);

 private:
  VerbsDevice() = default;
  void async_loop();
  // A registration covering [begin, end) with `access`, its count raised; null when none. mu_ held.
  Registration* reuse_locked(uintptr_t begin, uintptr_t end, int access);

  const IbvTable* ibv_ = nullptr;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  uint8_t port_ = 1;
  ibv_port_attr port_attr_{};
  ibv_device_attr device_attr_{};
  int gid_index_ = 0;
  ibv_gid gid_{};
  std::string gid_type_;
  std::string gid_why_;
  std::string name_;

  mutable std::mutex mu_;
  std::multimap<uintptr_t, std::unique_ptr<Registration>> regs_;  // by begin
  std::map<const void*, std::string> object_errors_;              // qp or cq -> event
  std::string device_error_;
  std::atomic<uint64_t> event_gen_{0};
  bool gdr_logged_ = false;
  std::atomic<bool> stop_{false};
  std::thread async_thread_;
};

}  // namespace gw::verbs
