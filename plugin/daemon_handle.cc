#include "plugin/daemon_handle.h"

#include <cstring>

namespace gw::plugin {

namespace {
constexpr size_t kAddrAt = 36;

void put16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}
void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
}  // namespace

uint64_t host_hash(const std::string& host_identity) {
  uint64_t x = 0xcbf29ce484222325ull;
  for (unsigned char c : host_identity) x = (x ^ c) * 0x100000001b3ull;
  return x;
}

Status encode_daemon_handle(const DaemonHandle& h, uint8_t* out) {
  if (h.daemon.size() > kDaemonAddressMax) {
    return invalid_arg("daemon address '{}' is longer than the handle's {} bytes", h.daemon,
                       kDaemonAddressMax);
  }
  std::memset(out, 0, kDaemonHandleBytes);
  put32(out, DaemonHandle::kMagic);
  put16(out + 4, DaemonHandle::kVersion);
  put16(out + 6, static_cast<uint16_t>(h.daemon.size()));
  put64(out + 8, h.host);
  std::memcpy(out + 16, h.nonce.data(), h.nonce.size());
  put32(out + 32, h.pid);
  if (!h.daemon.empty()) std::memcpy(out + kAddrAt, h.daemon.data(), h.daemon.size());
  return ok_status();
}

Result<DaemonHandle> decode_daemon_handle(const uint8_t* p, size_t n) {
  if (p == nullptr || n < kDaemonHandleBytes) {
    return invalid_arg("daemon-mode handle: {} bytes, expected {}", p == nullptr ? 0 : n,
                       kDaemonHandleBytes);
  }
  if (get32(p) != DaemonHandle::kMagic) {
    return invalid_arg(
        "the handle is not a daemon-mode handle (magic {:#010x}): the listening rank runs the "
        "plugin in direct mode; set GW_DAEMON the same way on every rank",
        get32(p));
  }
  if (get16(p + 4) != DaemonHandle::kVersion) {
    return invalid_arg("daemon-mode handle of version {}; this plugin speaks version {}",
                       get16(p + 4), DaemonHandle::kVersion);
  }
  const size_t len = get16(p + 6);
  if (len > kDaemonAddressMax) {
    return invalid_arg("daemon-mode handle: address of {} bytes exceeds its {} bytes", len,
                       kDaemonAddressMax);
  }
  for (size_t i = kAddrAt + len; i < kDaemonHandleBytes; ++i) {
    if (p[i] != 0) return invalid_arg("daemon-mode handle: non-zero byte {} past its fields", i);
  }
  DaemonHandle h;
  h.host = get64(p + 8);
  std::memcpy(h.nonce.data(), p + 16, h.nonce.size());
  h.pid = get32(p + 32);
  h.daemon.assign(reinterpret_cast<const char*>(p + kAddrAt), len);
  return h;
}

}  // namespace gw::plugin
