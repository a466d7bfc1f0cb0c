#include "plugin/daemon_transport.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <type_traits>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/net/socket_util.h"
#include "core/store.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "daemon/client.h"
#include "daemon/control.h"
#include "daemon/daemon_config.h"
#include "gpudirect/cuda_driver.h"
#include "plugin/daemon_comm.h"
#include "plugin/daemon_handle.h"
#include "plugin/daemon_meeting.h"

namespace gw::plugin {

namespace {

using daemon::Client;
using daemon::Opcode;
using daemon::SqEntry;
using daemon_mode::announce_key;
using daemon_mode::conn_name;
using daemon_mode::connection_token;
using daemon_mode::DaemonComm;
using daemon_mode::join_and_post;
using daemon_mode::joined;
using daemon_mode::Joining;
using daemon_mode::listen_store;
using daemon_mode::Shared;
using daemon_mode::StorePlace;

// How often a listener's accept() looks in its store for a connector of another host.
constexpr int64_t kStoreLookEveryNs = 2'000'000;

// A region of a daemon-mode comm: host memory (copied through the arena), or a dma-buf the daemon
// registered with its NIC (dmabuf_id != 0, its id in the daemon).
struct DaemonRegion : net::MemRegion {
  uint32_t dmabuf_id = 0;
};

// regMr(NCCL_PTR_CUDA): device memory with no dma-buf handed in. As the direct verbs path does
// with GPUDirect, the plugin exports one itself through the CUDA driver
// (cuMemGetHandleForAddressRange over the allocation's pages) and hands it to `reg` (the daemon's
// register_dmabuf) for the pages of [data, + size); the descriptor is closed after (the daemon's
// registration holds the buffer). A driver that is missing or cannot export is an error naming
// it: device memory never falls back to a host path here (the CPU cannot copy it).
struct Exported {
  uintptr_t begin = 0;  // the registered pages: [begin, begin + bytes)
  size_t bytes = 0;
  uint64_t offset = 0;  // begin's offset in the dma-buf
};
Result<Exported> export_dmabuf(void* data, size_t size,
                               const std::function<Status(int fd, const Exported&)>& reg) {
  const char* what = "regMr(NCCL_PTR_CUDA) in daemon mode";
  const cuda::Driver* d = cuda::resident_driver();
  if (d == nullptr) {
    return Status(
        Code::kUnsupported,
        fmt::format("{}: no CUDA driver in this process to export the buffer's dma-buf", what));
  }
  if (d->cuMemGetHandleForAddressRange == nullptr || d->cuMemGetAddressRange == nullptr) {
    return Status(Code::kUnsupported,
                  fmt::format("{}: the CUDA driver ({}) cannot export dma-bufs "
                              "(cuMemGetHandleForAddressRange needs CUDA 11.7 or later)",
                              what, d->version));
  }
  const auto ptr = reinterpret_cast<cuda::CUdeviceptr>(data);
  cuda::CUdeviceptr base = 0;
  size_t alloc = 0;
  if (cuda::CUresult r = d->cuMemGetAddressRange(&base, &alloc, ptr); r != cuda::kCudaSuccess) {
    return cuda::cuda_error(*d, r, fmt::format("{}: cuMemGetAddressRange({:#x})", what, ptr));
  }
  if (ptr < base || size > alloc || ptr - base > alloc - size) {
    return invalid_arg("{}: [{:#x}, +{}) is not inside one CUDA allocation ({:#x}, +{})", what, ptr,
                       size, base, alloc);
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t export_size = (alloc + page - 1) & ~(page - 1);
  int fd = -1;
  if (cuda::CUresult r = d->cuMemGetHandleForAddressRange(&fd, base, export_size,
                                                          cuda::kMemRangeHandleDmaBufFd, 0);
      r != cuda::kCudaSuccess) {
    return cuda::cuda_error(*d, r,
                            fmt::format("{}: cuMemGetHandleForAddressRange(DMA_BUF_FD)", what));
  }
  Exported e;
  e.begin = std::max<uintptr_t>(ptr & ~(page - 1), base);
  const uintptr_t end =
      std::min<uintptr_t>((ptr + size + page - 1) & ~(page - 1), base + export_size);
  e.bytes = end - e.begin;
  e.offset = e.begin - base;
  Status s = reg(fd, e);
  ::close(fd);
  if (!s.ok()) return s;
  return e;
}

// A buffer in a device region (docs/nccl-plugin.md "Daemon mode"): the daemon's registration id
// and the buffer's offset in it (0 for a host buffer, copied through the arena).
struct DeviceAt {
  uint32_t id = 0;
  uint64_t off = 0;
};
Result<DeviceAt> device_at(net::MemRegion* mr, const void* data, size_t size, const char* what);

Result<DeviceAt> device_at(net::MemRegion* mr, const void* data, size_t size, const char* what) {
  if (mr == nullptr || mr->type == net::MemType::kHost) return DeviceAt{};
  const auto* r = static_cast<const DaemonRegion*>(mr);
  const auto* base = static_cast<const uint8_t*>(r->base);
  const auto* p = static_cast<const uint8_t*>(data);
  if (r->dmabuf_id == 0 || p < base || static_cast<size_t>(p - base) > r->size ||
      size > r->size - static_cast<size_t>(p - base)) {
    return invalid_arg("{}: {} bytes at {} outside the device region [{}, +{})", what, size, data,
                       r->base, r->size);
  }
  return DeviceAt{r->dmabuf_id, static_cast<uint64_t>(p - base)};
}

// What a send comm and a receive comm over the daemon share: regions, test and the peer's name
// from the connection.
// The end owns its regions: one whose deregistration the daemon refused stays registered (and
// its handle valid) until a later deregMr succeeds or the comm closes.
template <class Base>
class DaemonEnd : public Base {
 public:
  explicit DaemonEnd(std::unique_ptr<DaemonComm> c) : c_(std::move(c)) {}
  Result<net::MemRegion*> reg_mr(void* data, size_t size, net::MemType type) override {
    if (type == net::MemType::kHost) return keep(data, size, net::MemType::kHost, 0);
    if (data == nullptr || size == 0) return invalid_arg("regMr: {} bytes at {}", size, data);
    uint32_t id = 0;
    GW_ASSIGN_OR_RETURN(Exported e, export_dmabuf(data, size, [&](int fd, const Exported& x) {
                          auto got = c_->register_dmabuf(fd, x.offset, x.bytes, kSend);
                          if (got.ok()) id = *got;
                          return got.status();
                        }));
    return keep(reinterpret_cast<void*>(e.begin), e.bytes, net::MemType::kCuda, id);
  }
  // The dma-buf goes to the daemon, which registers it on the NIC of the job's link to the peer's
  // host (for this end's direction); the daemon never maps it.
  Result<net::MemRegion*> reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd) override {
    if (data == nullptr || size == 0) {
      return invalid_arg("regMrDmaBuf: {} bytes at {}", size, data);
    }
    GW_ASSIGN_OR_RETURN(uint32_t id, c_->register_dmabuf(fd, offset, size, kSend));
    return keep(data, size, net::MemType::kCuda, id);
  }
  // A refusal (an op still names the dma-buf) keeps the region, and the error says why.
  Status dereg_mr(net::MemRegion* mr) override {
    std::lock_guard<std::mutex> lock(regions_mu_);
    auto it = std::find_if(regions_.begin(), regions_.end(),
                           [mr](const std::unique_ptr<DaemonRegion>& r) { return r.get() == mr; });
    if (mr == nullptr || it == regions_.end()) {
      return invalid_arg("deregMr: {} is not a registration of this comm", static_cast<void*>(mr));
    }
    Status s;
    if ((*it)->dmabuf_id != 0) {
      bool refused = false;
      s = c_->deregister_dmabuf((*it)->dmabuf_id, &refused);
      if (refused) return s;
    }
    regions_.erase(it);
    return s;
  }
  Status test(net::Request* r, bool* done, size_t* size) override {
    return c_->test(r, done, size);
  }
  std::string peer_name() const override { return c_->name(); }

 protected:
  static constexpr bool kSend = std::is_same_v<Base, net::SendComm>;
  std::unique_ptr<DaemonComm> c_;

 private:
  net::MemRegion* keep(void* base, size_t size, net::MemType type, uint32_t id) {
    auto r = std::make_unique<DaemonRegion>();
    r->base = base;
    r->size = size;
    r->type = type;
    r->dmabuf_id = id;
    std::lock_guard<std::mutex> lock(regions_mu_);
    regions_.push_back(std::move(r));
    return regions_.back().get();
  }
  std::mutex regions_mu_;
  std::vector<std::unique_ptr<DaemonRegion>> regions_;
};

class DaemonSend final : public DaemonEnd<net::SendComm> {
 public:
  using DaemonEnd::DaemonEnd;
  Result<net::Request*> isend(const void* data, size_t size, int tag, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(DeviceAt d, device_at(mr, data, size, "isend"));
    return c_->post(true, const_cast<void*>(data), size, tag, d.id, d.off);
  }
};

class DaemonRecv final : public DaemonEnd<net::RecvComm> {
 public:
  using DaemonEnd::DaemonEnd;
  Result<net::Request*> irecv(void* data, size_t size, int tag, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(DeviceAt d, device_at(mr, data, size, "irecv"));
    return c_->post(false, data, size, tag, d.id, d.off);
  }
  // A device receive's flush runs in the receiving daemon (its NIC wrote the bytes): a request
  // that completes when the daemon answered, as direct mode's GDR flush is one. Host buffers, and
  // an empty receive, need none (no request).
  Result<net::Request*> iflush(void* data, size_t size, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(DeviceAt d, device_at(mr, data, size, "iflush"));
    if (d.id == 0 || size == 0) return static_cast<net::Request*>(nullptr);
    return c_->post_flush(d.id, d.off, size);
  }
};

// Joining side of a connection: its client and the 0-byte message that proves the job complete.
// The listener joins its host's daemon as for a connector of this host on its first accept, and
// meanwhile looks (every kStoreLookEveryNs) in the store it hosts for a connector of another
// host's announcement: then it leaves that job and joins the two-host one instead.
class DaemonListener final : public net::Listener {
 public:
  DaemonListener(std::shared_ptr<const Shared> s, DaemonHandle h, std::shared_ptr<TcpStore> store,
                 StorePlace place)
      : s_(std::move(s)),
        h_(std::move(h)),
        token_(connection_token(s_->options.job_token, h_.nonce)),
        store_(std::move(store)),
        place_(std::move(place)) {}
  Result<std::unique_ptr<net::RecvComm>> accept() override {
    if (!j_.client) {
      GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, false));
    }
    if (!xhost_ && store_) {
      const int64_t now = sys::now_ns();
      if (now - last_look_ns_ >= kStoreLookEveryNs) {
        last_look_ns_ = now;
        // A counter: add(0) reads it without waiting for the key (get would wait).
        auto v =
            store_->add(announce_key(token_), 0, sys::deadline_after_ms(s_->options.timeout_ms));
        if (!v.ok()) return v.status().with_context("accept: the listener's store");
        if (*v > 0) {
          xhost_ = true;
          (void)store_->erase(announce_key(token_), sys::deadline_after_ms(s_->options.timeout_ms));
          j_ = Joining{};  // leaves the one-host job (never complete)
          GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, false, &place_));
        }
      }
    }
    GW_ASSIGN_OR_RETURN(bool ready, joined(j_, "accept"));
    if (!ready) return std::unique_ptr<net::RecvComm>();
    auto c = std::make_unique<DaemonComm>(std::move(j_.client), conn_name(token_, h_, false), 0,
                                          s_->options.timeout_ms);
    j_ = Joining{};
    return std::unique_ptr<net::RecvComm>(std::make_unique<DaemonRecv>(std::move(c)));
  }

 private:
  std::shared_ptr<const Shared> s_;
  DaemonHandle h_;
  std::string token_;
  std::shared_ptr<TcpStore> store_;
  StorePlace place_;
  bool xhost_ = false;
  int64_t last_look_ns_ = 0;
  Joining j_;
};

class DaemonConnector final : public net::Connector {
 public:
  DaemonConnector(std::shared_ptr<const Shared> s, DaemonHandle h)
      : s_(std::move(s)),
        h_(std::move(h)),
        token_(connection_token(s_->options.job_token, h_.nonce)),
        deadline_(sys::deadline_after_ms(s_->options.timeout_ms)) {}
  Result<std::unique_ptr<net::SendComm>> poll() override {
    if (!j_.client) {
      if (h_.host == s_->host) {
        GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, true));
      } else {
        GW_RETURN_IF_ERROR(announce());
        GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, true, &place_));
      }
    }
    GW_ASSIGN_OR_RETURN(bool ready, joined(j_, "connect"));
    if (!ready) {
      if (sys::expired(deadline_)) {
        return timeout_error(
            "connect: no process of this job accepted on the handle (listener pid {}) within {} "
            "ms through gradwired ({}): the listener closed, or it runs with another "
            "GW_JOB_TOKEN",
            h_.pid, s_->options.timeout_ms, s_->options.address);
      }
      return std::unique_ptr<net::SendComm>();
    }
    auto c = std::make_unique<DaemonComm>(std::move(j_.client), conn_name(token_, h_, true), 1,
                                          s_->options.timeout_ms);
    j_ = Joining{};
    store_.reset();
    return std::unique_ptr<net::SendComm>(std::make_unique<DaemonSend>(std::move(c)));
  }

 private:
  // A connector of another host: tells the listener through its store (which requires the job
  // token: another job's process is refused there) to join the two-host job.
  Status announce() {
    if (h_.store.empty()) {
      return Status(Code::kUnsupported,
                    fmt::format("connect: the listener (pid {}) is on another host and its "
                                "handle names no store (an older plugin)",
                                h_.pid));
    }
    GW_RETURN_IF_ERROR(split_store_address(h_.store, &place_.host, &place_.port));
    TcpStoreOptions o;
    o.host = place_.host;
    o.port = place_.port;
    o.host_server = false;
    o.token = s_->options.job_token;
    o.connect_timeout_ms = std::max(1, sys::ms_until(deadline_));
    auto made = TcpStore::create(o);
    if (!made.ok()) {
      return made.status().with_context(fmt::format(
          "connect: the listener's store at {} (listener pid {} on another host; the same "
          "GW_JOB_TOKEN on every rank?)",
          h_.store, h_.pid));
    }
    store_ = *made;
    return store_->add(announce_key(token_), 1, deadline_)
        .status()
        .with_context("connect: announcing this connector in the listener's store");
  }

  std::shared_ptr<const Shared> s_;
  DaemonHandle h_;
  std::string token_;
  sys::Deadline deadline_;
  StorePlace place_;
  std::shared_ptr<TcpStore> store_;
  Joining j_;
};

class DaemonTransport final : public net::Transport {
 public:
  DaemonTransport(std::shared_ptr<const Shared> s, net::Properties p)
      : s_(std::move(s)), props_(std::move(p)) {}
  const net::Properties& properties() const override { return props_; }
  Result<std::unique_ptr<net::Listener>> listen(net::Handle* handle) override {
    DaemonHandle h;
    h.host = s_->host;
    h.pid = static_cast<uint32_t>(::getpid());
    std::random_device rd;
    for (size_t i = 0; i < h.nonce.size(); i += 4) {
      const uint32_t v = rd();
      std::memcpy(h.nonce.data() + i, &v, 4);
    }
    GW_ASSIGN_OR_RETURN(std::shared_ptr<TcpStore> store, listen_store(*s_, &h.store));
    StorePlace place;
    GW_RETURN_IF_ERROR(split_store_address(h.store, &place.host, &place.port));
    GW_RETURN_IF_ERROR(encode_daemon_handle(h, handle->bytes.data()));
    return std::unique_ptr<net::Listener>(
        std::make_unique<DaemonListener>(s_, std::move(h), std::move(store), std::move(place)));
  }
  Result<std::unique_ptr<net::Connector>> connect(const net::Handle& handle) override {
    GW_ASSIGN_OR_RETURN(DaemonHandle h,
                        decode_daemon_handle(handle.bytes.data(), handle.bytes.size()));
    return std::unique_ptr<net::Connector>(std::make_unique<DaemonConnector>(s_, std::move(h)));
  }
  // What gradwired said at start-up (daemon_device_buffers): device buffers go through it as
  // dma-bufs (regMrDmaBuf, or regMr(NCCL_PTR_CUDA) exporting one), or host buffers only.
  DeviceMemory device_memory() const override { return device_; }
  void set_device_memory(DeviceMemory d) { device_ = std::move(d); }

 private:
  std::shared_ptr<const Shared> s_;
  net::Properties props_;
  DeviceMemory device_;
};

// Asks the daemon (its control socket's status: docs/wire-daemon.md "Control socket") whether
// device buffers can go through it: `device_buffers` and its one-line `device_buffers_why`. A
// daemon that does not answer in time, or an older one that does not say, means host buffers only.
net::Transport::DeviceMemory daemon_device_buffers(const std::string& address, int64_t timeout_ms) {
  net::Transport::DeviceMemory d;
  const std::string ctl = daemon::control_socket_path(address.substr(5));
  auto st = daemon::control_call(ctl, daemon::ControlCommand::kStatus,
                                 std::clamp<int64_t>(timeout_ms, 1, 5000));
  if (!st.ok()) {
    d.why = fmt::format("gradwired's status did not answer ({}): host buffers only",
                        st.status().message());
    return d;
  }
  const auto& r = *st;
  if (!r.contains("device_buffers") || !r["device_buffers"].is_boolean() ||
      !r.contains("device_buffers_why") || !r["device_buffers_why"].is_string()) {
    d.why =
        "gradwired does not say whether device buffers go through it (an older daemon): "
        "host buffers only";
    return d;
  }
  d.reg = d.dmabuf = r["device_buffers"].get<bool>();
  d.why = "gradwired says " + r["device_buffers_why"].get<std::string>();
  return d;
}

}  // namespace

Result<std::unique_ptr<net::Transport>> make_daemon_transport(const DaemonNetOptions& options,
                                                              const net::Properties& nic) {
  auto s = std::make_shared<Shared>();
  s->options = options;
  s->host_id = host_identity();
  s->host = host_hash(s->host_id);
  s->spin_ns = 0;  // test() never waits: NCCL's proxy thread polls
  auto t = std::make_unique<DaemonTransport>(s, nic);
  t->set_device_memory(daemon_device_buffers(options.address, options.timeout_ms));
  return std::unique_ptr<net::Transport>(std::move(t));
}

}  // namespace gw::plugin
