// A PluginComm's life and its memory registrations (regMr, regMrDmaBuf, deregMr). NCCL's service
// thread registers while the progress thread runs the data path (comm_data.cc), so the
// registrations have a lock of their own.
#include <algorithm>

#include "core/timeline.h"
#include "plugin/net_plugin.h"
#include "plugin/plugin_timeline.h"

namespace gw::plugin {

PluginComm::PluginComm(std::shared_ptr<net::Transport> transport,
                       std::unique_ptr<net::SendComm> send)
    : magic_(kSendMagic), transport_(std::move(transport)), send_(std::move(send)) {
  for (int i = kSlots - 1; i >= 0; --i) free_.push_back(i);
}

PluginComm::PluginComm(std::shared_ptr<net::Transport> transport,
                       std::unique_ptr<net::RecvComm> recv)
    : magic_(kRecvMagic), transport_(std::move(transport)), recv_(std::move(recv)) {
  for (int i = kSlots - 1; i >= 0; --i) free_.push_back(i);
}

PluginComm::~PluginComm() {
  magic_ = 0;
  std::lock_guard<std::mutex> mr_lock(mr_mu_);
  // NCCL deregisters before closing; after an abort it may not, so release what is left
  // while the core comm still exists.
  for (MemHandle* mh : mrs_) {
    if (mh->mr != nullptr) (void)comm()->dereg_mr(mh->mr);
    mh->magic = 0;
    delete mh;
  }
  mrs_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  for (Request& r : requests_) r.magic = 0;  // requests in flight are abandoned
  send_.reset();
  recv_.reset();
}

net::Comm* PluginComm::comm() const {
  return send_ ? static_cast<net::Comm*>(send_.get()) : static_cast<net::Comm*>(recv_.get());
}

std::string PluginComm::peer_name() const { return comm()->peer_name(); }

Result<MemHandle*> PluginComm::reg_mr(void* data, size_t size, bool cuda) {
  const int64_t t0 = timeline::on() ? timeline::now_us() : -1;
  auto reg = [&]() -> Result<MemHandle*> {
    if (data == nullptr && size > 0) return internal_error("NULL buffer of {} bytes", size);
    GW_ASSIGN_OR_RETURN(
        net::MemRegion * mr,
        comm()->reg_mr(data, size, cuda ? net::MemType::kCuda : net::MemType::kHost));
    return track(mr, data, size);
  };
  Result<MemHandle*> mh = reg();
  if (t0 >= 0) trace::registration(*this, "regMr", t0, size, cuda ? "cuda" : "host", !mh.ok());
  return mh;
}

Result<MemHandle*> PluginComm::reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd) {
  const int64_t t0 = timeline::on() ? timeline::now_us() : -1;
  auto reg = [&]() -> Result<MemHandle*> {
    if (data == nullptr || size == 0) {
      return internal_error("dma-buf of {} bytes at {}", size, data);
    }
    GW_ASSIGN_OR_RETURN(net::MemRegion * mr, comm()->reg_mr_dmabuf(data, size, offset, fd));
    return track(mr, data, size);
  };
  Result<MemHandle*> mh = reg();
  if (t0 >= 0) trace::registration(*this, "regMrDmaBuf", t0, size, "dmabuf", !mh.ok());
  return mh;
}

MemHandle* PluginComm::track(net::MemRegion* mr, void* data, size_t size) {
  auto* mh = new MemHandle;
  mh->comm = this;
  mh->mr = mr;
  mh->base = static_cast<const char*>(data);
  mh->size = size;
  std::lock_guard<std::mutex> lock(mr_mu_);
  mrs_.push_back(mh);
  return mh;
}

Status PluginComm::dereg_mr(MemHandle* mh) {
  if (mh == nullptr) return internal_error("NULL memory handle");
  if (mh->comm != this)
    return internal_error("memory handle {} belongs to another comm", (void*)mh);
  const int64_t t0 = timeline::on() ? timeline::now_us() : -1;
  const size_t bytes = mh->size;
  const bool cuda = mh->mr != nullptr && mh->mr->type == net::MemType::kCuda;
  Status st;
  {
    std::lock_guard<std::mutex> lock(mr_mu_);
    auto it = std::find(mrs_.begin(), mrs_.end(), mh);
    if (it == mrs_.end()) return internal_error("memory handle {} is not registered", (void*)mh);
    st = mh->mr != nullptr ? comm()->dereg_mr(mh->mr) : ok_status();
    // A backend that fails leaves the region registered (daemon mode: the daemon refused, an op
    // still names it): the handle stays valid, NCCL may deregister it again.
    if (st.ok()) {
      mrs_.erase(it);
      mh->magic = 0;
      delete mh;
    }
  }
  if (t0 >= 0) trace::registration(*this, "deregMr", t0, bytes, cuda ? "cuda" : "host", !st.ok());
  return st;
}
}  // namespace gw::plugin
