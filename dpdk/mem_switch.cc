#include <cstring>

#include "dpdk/frame_port.h"

namespace gw::dpdk {

namespace {
uint64_t mac_key(const MacAddr& m) {
  uint64_t k = 0;
  for (uint8_t b : m) k = (k << 8) | b;
  return k;
}
}  // namespace

class MemPort : public FramePort {
 public:
  MemPort(std::shared_ptr<MemSwitch> sw, MacAddr mac, size_t mtu)
      : sw_(std::move(sw)), mac_(mac), mtu_(mtu) {}
  ~MemPort() override { sw_->detach(mac_); }
  MacAddr mac() const override { return mac_; }
  size_t mtu() const override { return mtu_; }
  std::string name() const override { return "mem:" + format_mac(mac_); }
  bool alloc(FrameBuf* buf) override {
    auto* v = new std::vector<uint8_t>(mtu_ + kEthLen);
    buf->data = v->data();
    buf->cap = v->size();
    buf->len = 0;
    buf->opaque = v;
    buf->l4_checksum_ok = false;
    return true;
  }
  void free(FrameBuf& buf) override {
    delete static_cast<std::vector<uint8_t>*>(buf.opaque);
    buf = FrameBuf{};
  }
  size_t tx_burst(FrameBuf* bufs, size_t n) override {
    for (size_t i = 0; i < n; ++i) {
      sw_->deliver(bufs[i].data, bufs[i].len);  // a full queue drops, like a NIC
      free(bufs[i]);
    }
    return n;
  }
  size_t rx_burst(FrameBuf* bufs, size_t n) override {
    size_t got = 0;
    while (got < n) {
      auto* v = new std::vector<uint8_t>();
      if (!sw_->pop(mac_, v)) {
        delete v;
        break;
      }
      bufs[got].data = v->data();
      bufs[got].len = v->size();
      bufs[got].cap = v->size();
      bufs[got].opaque = v;
      bufs[got].l4_checksum_ok = false;
      ++got;
    }
    return got;
  }

 private:
  std::shared_ptr<MemSwitch> sw_;
  MacAddr mac_;
  size_t mtu_;
};

std::unique_ptr<FramePort> MemSwitch::attach(const MacAddr& mac, size_t mtu, size_t queue_limit) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queues_[mac_key(mac)].limit = queue_limit;
  }
  return std::make_unique<MemPort>(shared_from_this(), mac, mtu);
}

void MemSwitch::detach(const MacAddr& mac) {
  std::lock_guard<std::mutex> lock(mu_);
  queues_.erase(mac_key(mac));
}

bool MemSwitch::deliver(const uint8_t* data, size_t len) {
  if (len < 6) return false;
  MacAddr dst;
  std::memcpy(dst.data(), data, 6);
  std::lock_guard<std::mutex> lock(mu_);
  if (tap_) tap_(data, len);
  if (filter_ && !filter_(data, len)) return true;  // lost on the way, as far as the sender knows
  auto it = queues_.find(mac_key(dst));
  if (it == queues_.end() || it->second.frames.size() >= it->second.limit) return false;
  it->second.frames.emplace_back(data, data + len);
  ++delivered_;
  return true;
}

bool MemSwitch::pop(const MacAddr& mac, std::vector<uint8_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = queues_.find(mac_key(mac));
  if (it == queues_.end() || it->second.frames.empty()) return false;
  *out = std::move(it->second.frames.front());
  it->second.frames.pop_front();
  return true;
}

void MemSwitch::set_tap(std::function<void(const uint8_t*, size_t)> tap) {
  std::lock_guard<std::mutex> lock(mu_);
  tap_ = std::move(tap);
}

void MemSwitch::set_filter(std::function<bool(const uint8_t*, size_t)> filter) {
  std::lock_guard<std::mutex> lock(mu_);
  filter_ = std::move(filter);
}

uint64_t MemSwitch::delivered() const {
  std::lock_guard<std::mutex> lock(mu_);
  return delivered_;
}

}  // namespace gw::dpdk
