#include "verbs/verbs_device.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/log.h"
#include "gpudirect/cuda_driver.h"
#include "verbs/device_select.h"

namespace gw::verbs {
namespace {

constexpr uintptr_t kPage = 4096;

bool fatal_event(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_CQ_ERR:
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_DEVICE_FATAL:
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_SRQ_ERR:
    case IBV_EVENT_GID_CHANGE:
      return true;
    default:
      return false;
  }
}

const char* event_name(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_CQ_ERR:
      return "IBV_EVENT_CQ_ERR (completion queue overrun)";
    case IBV_EVENT_QP_FATAL:
      return "IBV_EVENT_QP_FATAL";
    case IBV_EVENT_QP_REQ_ERR:
      return "IBV_EVENT_QP_REQ_ERR";
    case IBV_EVENT_QP_ACCESS_ERR:
      return "IBV_EVENT_QP_ACCESS_ERR";
    case IBV_EVENT_DEVICE_FATAL:
      return "IBV_EVENT_DEVICE_FATAL";
    case IBV_EVENT_PORT_ERR:
      return "IBV_EVENT_PORT_ERR (port went down)";
    case IBV_EVENT_SRQ_ERR:
      return "IBV_EVENT_SRQ_ERR";
    case IBV_EVENT_GID_CHANGE:
      return "IBV_EVENT_GID_CHANGE";
    default:
      return "async event";
  }
}

struct Cache {
  std::mutex mu;
  pid_t pid = 0;
  std::map<std::string, std::shared_ptr<VerbsDevice>> devices;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: devices live as long as the process
  return *c;
}

}  // namespace

Result<std::shared_ptr<VerbsDevice>> VerbsDevice::open(const VerbsConfig& config) {
  Result<const IbvTable*> table = ibv_table(config.emulate);
  if (!table.ok()) return table.status().with_context("verbs unavailable");
  const IbvTable* ibv = *table;
  GW_ASSIGN_OR_RETURN(HcaSpec spec, HcaSpec::parse(config.hca));
  const std::string key =
      fmt::format("{}|{}|{}|{}", ibv->provider, config.hca, config.gid_index, config.addr_family);
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.pid != getpid()) {
    // A forked child cannot use its parent's device objects: start over (the old ones leak,
    // as they must; closing them could disturb the parent's hardware state).
    for (auto& [k, d] : c.devices) new std::shared_ptr<VerbsDevice>(std::move(d));
    c.devices.clear();
    c.pid = getpid();
  }
  auto it = c.devices.find(key);
  if (it != c.devices.end()) return it->second;

  static std::once_flag fork_once;
  std::call_once(fork_once, [ibv] {
    // Registered pages must not be shared copy-on-write with a forked child.
    if (int err = ibv->fork_init(); err != 0) {
      GW_LOG_WARN("verbs: ibv_fork_init failed ({}); fork() while memory is registered is unsafe",
                  strerror(err));
    }
  });
  if (Status s = rdma_devices_present(*ibv); !s.ok()) return s.with_context("verbs unavailable");
  int num = 0;
  ibv_device** list = ibv->get_device_list(&num);
  if (list == nullptr || num == 0) {
    if (list != nullptr) ibv->free_device_list(list);
    return unsupported("verbs unavailable: the RDMA devices went away");
  }
  std::string tried;
  std::shared_ptr<VerbsDevice> found;
  for (int i = 0; i < num && !found; ++i) {
    std::string name = ibv->get_device_name(list[i]);
    ibv_context* ctx = ibv->open_device(list[i]);
    if (ctx == nullptr) {
      tried += fmt::format(" {}: cannot open ({});", name, strerror(errno));
      continue;
    }
    ibv_device_attr dattr{};
    if (ibv->query_device(ctx, &dattr) != 0) {
      tried += fmt::format(" {}: query_device failed;", name);
      ibv->close_device(ctx);
      continue;
    }
    for (int p = 1; p <= dattr.phys_port_cnt && !found; ++p) {
      ibv_port_attr pattr{};
      if (!spec.selects(name, p)) {
        tried += fmt::format(" {}:{} not selected by GW_IB_HCA;", name, p);
        continue;
      }
      if (ibv->query_port(ctx, static_cast<uint8_t>(p), &pattr) != 0) continue;
      if (pattr.state != IBV_PORT_ACTIVE) {
        tried += fmt::format(" {}:{} is not ACTIVE;", name, p);
        continue;
      }
      std::vector<GidInfo> table;
      for (int g = 0; g < pattr.gid_tbl_len && g < 256; ++g) {
        GidInfo info;
        info.index = g;
        info.query_err = ibv->query_gid(ctx, static_cast<uint8_t>(p), g, &info.gid);
        char type[32] = {};
        info.type_err = ibv->query_gid_type(ctx, static_cast<uint8_t>(p), g, type, sizeof(type));
        info.type = type;
        table.push_back(info);
      }
      std::string why;
      Result<int> gid = choose_gid_index(pattr.link_layer == IBV_LINK_LAYER_ETHERNET,
                                         config.gid_index, config.addr_family, table, &why);
      if (!gid.ok()) {
        tried += fmt::format(" {}:{}: {};", name, p, gid.status().message());
        continue;
      }
      ibv_pd* pd = ibv->alloc_pd(ctx);
      if (pd == nullptr) {
        tried += fmt::format(" {}: alloc_pd failed ({});", name, strerror(errno));
        continue;
      }
      auto d = std::shared_ptr<VerbsDevice>(new VerbsDevice());
      d->ibv_ = ibv;
      d->context_ = ctx;
      d->pd_ = pd;
      d->port_ = static_cast<uint8_t>(p);
      d->port_attr_ = pattr;
      d->device_attr_ = dattr;
      d->gid_index_ = *gid;
      d->gid_why_ = why;
      d->name_ = name;
      for (const GidInfo& g : table) {
        if (g.index == *gid) {
          d->gid_ = g.gid;
          d->gid_type_ = g.type_err == 0 ? g.type : "type unknown";
        }
      }
      found = d;
    }
    if (!found) ibv->close_device(ctx);
  }
  ibv->free_device_list(list);
  if (!found) return unsupported("verbs unavailable: no usable RDMA port:{}", tried);
  int fl = fcntl(found->context_->async_fd, F_GETFL);
  if (fl >= 0) fcntl(found->context_->async_fd, F_SETFL, fl | O_NONBLOCK);
  VerbsDevice* raw = found.get();
  found->async_thread_ = std::thread([raw] { raw->async_loop(); });
  GW_LOG_INFO("NET/gradwire verbs: device {} ({}; GID chosen: {}) via {}", found->describe(),
              found->ethernet() ? "RoCE" : "InfiniBand", found->gid_why_, ibv->provider);
  c.devices[key] = found;
  return found;
}

VerbsDevice::~VerbsDevice() {
  stop_ = true;
  if (async_thread_.joinable()) async_thread_.join();
}

std::string VerbsDevice::describe() const {
  return fmt::format("{}:{} {} GID {} ({}, {}), LID {}, active MTU {}", name_, port_,
                     ethernet() ? "RoCE" : "IB", gid_index_, format_gid(gid_), gid_type_,
                     port_attr_.lid, mtu_bytes(port_attr_.active_mtu));
}

void VerbsDevice::async_loop() {
  while (!stop_.load()) {
    pollfd p{context_->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ibv_async_event ev{};
    while (ibv_->get_async_event(context_, &ev) == 0) {
      if (fatal_event(ev.event_type)) {
        std::lock_guard<std::mutex> lock(mu_);
        std::string what = fmt::format("{} on {}", event_name(ev.event_type), describe());
        GW_LOG_WARN("verbs: {}", what);
        switch (ev.event_type) {
          case IBV_EVENT_CQ_ERR:
            object_errors_.emplace(ev.element.cq, what);
            break;
          case IBV_EVENT_QP_FATAL:
          case IBV_EVENT_QP_REQ_ERR:
          case IBV_EVENT_QP_ACCESS_ERR:
            object_errors_.emplace(ev.element.qp, what);
            break;
          default:
            if (device_error_.empty()) device_error_ = what;
        }
        event_gen_.fetch_add(1, std::memory_order_release);
      } else {
        GW_LOG_DEBUG("verbs: async event {} on {}", static_cast<int>(ev.event_type), name_);
      }
      ibv_->ack_async_event(&ev);
    }
  }
}

Status VerbsDevice::async_error(const std::vector<ibv_qp*>& qps, ibv_cq* cq) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!device_error_.empty()) return peer_error("{}", device_error_);
  auto it = object_errors_.find(cq);
  if (it != object_errors_.end()) return peer_error("{}", it->second);
  for (ibv_qp* qp : qps) {
    it = object_errors_.find(qp);
    if (it != object_errors_.end()) return peer_error("{}", it->second);
  }
  return ok_status();
}

void VerbsDevice::forget_errors(const std::vector<ibv_qp*>& qps, ibv_cq* cq) {
  std::lock_guard<std::mutex> lock(mu_);
  for (ibv_qp* qp : qps) object_errors_.erase(qp);
  object_errors_.erase(cq);
}

VerbsDevice::Registration* VerbsDevice::reuse_locked(uintptr_t begin, uintptr_t end, int access) {
  // Any registration starting at or before `begin` may cover the range.
  for (auto it = regs_.begin(); it != regs_.end() && it->first <= begin; ++it) {
    Registration* r = it->second.get();
    if (r->end >= end && (r->access & access) == access) {
      ++r->refs;
      return r;
    }
  }
  return nullptr;
}

Result<VerbsDevice::Registration*> VerbsDevice::acquire(const void* addr, size_t size, int access) {
  auto a = reinterpret_cast<uintptr_t>(addr);
  uintptr_t begin = a & ~(kPage - 1);
  uintptr_t end = (a + size + kPage - 1) & ~(kPage - 1);
  std::lock_guard<std::mutex> lock(mu_);
  if (Registration* r = reuse_locked(begin, end, access)) return r;
  ibv_mr* mr = ibv_->reg_mr(pd_, reinterpret_cast<void*>(begin), end - begin, access);
  if (mr == nullptr) {
    int err = errno;
    return system_error(
        fmt::format("ibv_reg_mr of {} bytes at {:#x} on {}", end - begin, begin, name_), err);
  }
  auto r = std::make_unique<Registration>();
  r->begin = begin;
  r->end = end;
  r->access = access;
  r->mr = mr;
  r->refs = 1;
  Registration* raw = r.get();
  regs_.emplace(begin, std::move(r));
  return raw;
}

VerbsDevice::DmabufProbe VerbsDevice::dmabuf_probe() const {
  DmabufProbe p;
  if (ibv_->reg_dmabuf_mr == nullptr) {
    p.why = "libibverbs lacks ibv_reg_dmabuf_mr (rdma-core < 34)";
    return p;
  }
  // The probe NCCL uses too: with fd -1 the kernel fails the lookup of the descriptor (EBADF) only
  // once it has accepted the call; a provider without the verb answers EOPNOTSUPP (rdma-core's
  // dummy op; some releases ENOSYS), a kernel without the ioctl method EPROTONOSUPPORT.
  errno = 0;
  ibv_mr* mr = ibv_->reg_dmabuf_mr(pd_, 0, 0, 0, -1, 0);
  const int err = errno;
  if (mr != nullptr) {
    (void)ibv_->dereg_mr(mr);
    p.why = fmt::format("{}: ibv_reg_dmabuf_mr of fd -1 registered (a broken driver?)", name_);
  } else if (err == EBADF) {
    p.ok = true;
    p.why = fmt::format("{} takes dma-bufs (ibv_reg_dmabuf_mr probe: EBADF)", name_);
  } else if (err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT) {
    p.why =
        fmt::format("{} does not take dma-bufs (ibv_reg_dmabuf_mr: {})", name_, std::strerror(err));
  } else {
    p.why = fmt::format("{}: the dma-buf probe answered {} (EBADF expected where supported)", name_,
                        err == 0 ? std::string("no errno") : std::strerror(err));
  }
  return p;
}

VerbsDevice::GpuDirectSupport VerbsDevice::gpudirect_support(const VerbsConfig& config) {
  // Not cached: the application may load the driver later, and the probe costs one failing call.
  GpuDirectSupport gdr;
  const cuda::Driver* d = cuda::resident_driver();
  if (d == nullptr) {
    gdr.why = "no CUDA driver in this process";
    return gdr;
  }
  const DmabufProbe nic = dmabuf_probe();
  if (!nic.ok) {
    gdr.why = nic.why;
  } else if (d->cuMemGetHandleForAddressRange == nullptr || d->cuMemGetAddressRange == nullptr) {
    gdr.why = fmt::format("the CUDA driver ({}) cannot export dma-bufs", d->version);
  } else {
    gdr.dmabuf = true;
    gdr.why = "the NIC takes dma-bufs and the CUDA driver exports them";
  }
  std::error_code ec;
  const std::filesystem::path root(config.sysfs_root);
  gdr.peermem = std::filesystem::exists(root / "module/nvidia_peermem", ec) ||
                std::filesystem::exists(root / "kernel/mm/memory_peers/nv_mem/version", ec);
  if (!gdr.dmabuf) {
    gdr.why += gdr.peermem ? "; nvidia-peermem is loaded" : "; nvidia-peermem is not loaded";
  }
  return gdr;
}

Result<VerbsDevice::Registration*> VerbsDevice::acquire_device(const void* addr, size_t size,
                                                               int access,
                                                               const VerbsConfig& config) {
  using Mode = VerbsConfig::GpuDirect;
  if (config.gpudirect == Mode::kOff) {
    return unsupported(
        "GPUDirect RDMA is off (GW_IB_GPUDIRECT=off): stage CUDA memory through host memory");
  }
  const GpuDirectSupport gdr = gpudirect_support(config);
  const bool want_dmabuf = config.gpudirect == Mode::kAuto || config.gpudirect == Mode::kDmabuf;
  const bool want_peermem = config.gpudirect == Mode::kAuto || config.gpudirect == Mode::kPeermem;
  auto log_choice = [&](const char* how) {
    std::lock_guard<std::mutex> lock(mu_);
    if (gdr_logged_) return;
    gdr_logged_ = true;
    GW_LOG_INFO("NET/gradwire verbs: GPUDirect RDMA on {} via {} ({})", name_, how, gdr.why);
  };
  {
    // A range inside an existing registration (of either kind) reuses it.
    const auto a = reinterpret_cast<uintptr_t>(addr);
    std::lock_guard<std::mutex> lock(mu_);
    if (Registration* r = reuse_locked(a, a + size, access)) return r;
  }
  if (want_dmabuf && gdr.dmabuf) {
    const cuda::Driver* d = cuda::resident_driver();
    const auto ptr = reinterpret_cast<cuda::CUdeviceptr>(addr);
    cuda::CUdeviceptr base = 0;
    size_t alloc = 0;
    if (cuda::CUresult r = d->cuMemGetAddressRange(&base, &alloc, ptr); r != cuda::kCudaSuccess) {
      return cuda::cuda_error(*d, r, fmt::format("cuMemGetAddressRange({:#x})", ptr));
    }
    if (ptr < base || size > alloc || ptr - base > alloc - size) {
      return invalid_arg("GPUDirect: [{:#x}, +{}) is not inside one CUDA allocation ({:#x}, +{})",
                         ptr, size, base, alloc);
    }
    // The export covers whole pages of the allocation; the registration, the pages of the range.
    const size_t export_size = (alloc + kPage - 1) & ~(kPage - 1);
    int fd = -1;
    if (cuda::CUresult r = d->cuMemGetHandleForAddressRange(&fd, base, export_size,
                                                            cuda::kMemRangeHandleDmaBufFd, 0);
        r != cuda::kCudaSuccess) {
      return cuda::cuda_error(*d, r, "cuMemGetHandleForAddressRange(DMA_BUF_FD)");
    }
    uintptr_t begin = std::max<uintptr_t>(ptr & ~(kPage - 1), base);
    uintptr_t end =
        std::min<uintptr_t>((ptr + size + kPage - 1) & ~(kPage - 1), base + export_size);
    Result<Registration*> reg =
        acquire_dmabuf(reinterpret_cast<const void*>(begin), end - begin, begin - base, fd, access);
    close(fd);  // the registration holds the buffer, not the descriptor
    if (reg.ok()) log_choice("dma-buf");
    return reg;
  }
  if (want_peermem && gdr.peermem) {
    GW_ASSIGN_OR_RETURN(Registration * reg, acquire(addr, size, access));
    log_choice("nvidia-peermem");
    return reg;
  }
  return unsupported(
      "GPUDirect RDMA unavailable on {} (GW_IB_GPUDIRECT={}): {}; stage CUDA memory through host "
      "memory",
      name_,
      config.gpudirect == Mode::kAuto     ? "auto"
      : config.gpudirect == Mode::kDmabuf ? "dmabuf"
                                          : "peermem",
      gdr.why);
}

Result<VerbsDevice::Registration*> VerbsDevice::acquire_dmabuf(const void* addr, size_t size,
                                                               uint64_t offset, int fd,
                                                               int access) {
  if (ibv_->reg_dmabuf_mr == nullptr) {
    return unsupported("dma-buf registration: libibverbs lacks ibv_reg_dmabuf_mr (rdma-core < 34)");
  }
  if (addr == nullptr || size == 0 || fd < 0) {
    return invalid_arg("dma-buf registration of {} bytes at {} from fd {}", size, addr, fd);
  }
  const auto a = reinterpret_cast<uintptr_t>(addr);
  ibv_mr* mr = ibv_->reg_dmabuf_mr(pd_, offset, size, a, fd, access);
  if (mr == nullptr) {
    int err = errno;
    return system_error(
        fmt::format("ibv_reg_dmabuf_mr of {} bytes at {:#x} (fd {}, offset {}) on {}", size, a, fd,
                    offset, name_),
        err);
  }
  auto r = std::make_unique<Registration>();
  r->begin = a;
  r->end = a + size;
  r->access = access;
  r->mr = mr;
  r->refs = 1;
  Registration* raw = r.get();
  std::lock_guard<std::mutex> lock(mu_);
  regs_.emplace(a, std::move(r));
  return raw;
}

void VerbsDevice::release(Registration* r) {
  if (r == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (--r->refs > 0) return;
  for (auto it = regs_.lower_bound(r->begin); it != regs_.end() && it->first == r->begin; ++it) {
    if (it->second.get() == r) {
      if (int err = ibv_->dereg_mr(r->mr); err != 0) {
        GW_LOG_WARN("verbs: ibv_dereg_mr failed: {}", strerror(err));
      }
      regs_.erase(it);
      return;
    }
  }
}

size_t VerbsDevice::cached_registrations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return regs_.size();
}

}  // namespace gw::verbs
