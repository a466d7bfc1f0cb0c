#include "plugin/daemon_handle.h"

#include <cctype>
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

Status split_store_address(const std::string& a, std::string* host, int* port) {
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 >= a.size() || a.size() - colon > 6) {
    return invalid_arg("store address '{}' is not host:port", a);
  }
  for (size_t i = 0; i < colon; ++i) {
    const unsigned char c = static_cast<unsigned char>(a[i]);
    if (!std::isalnum(c) && c != '.' && c != ':' && c != '%' && c != '-' && c != '_') {
      return invalid_arg("store address '{}': byte {} is not an address character", a, i);
    }
  }
  int p = 0;
  for (size_t i = colon + 1; i < a.size(); ++i) {
    if (a[i] < '0' || a[i] > '9')
      return invalid_arg("store address '{}': the port is no number", a);
    p = p * 10 + (a[i] - '0');
  }
  if (p <= 0 || p > 65535) return invalid_arg("store address '{}': port out of 1..65535", a);
  *host = a.substr(0, colon);
  *port = p;
  return ok_status();
}

uint64_t host_hash(const std::string& host_identity) {
  uint64_t x = 0xcbf29ce484222325ull;
  for (unsigned char c : host_identity) x = (x ^ c) * 0x100000001b3ull;
  return x;
}

Status encode_daemon_handle(const DaemonHandle& h, uint8_t* out) {
  if (h.store.size() > kStoreAddressMax) {
    return invalid_arg("store address '{}' is longer than the handle's {} bytes", h.store,
                       kStoreAddressMax);
  }
  if (!h.store.empty()) {
    std::string host;
    int port = 0;
    GW_RETURN_IF_ERROR(split_store_address(h.store, &host, &port));
  }
  std::memset(out, 0, kDaemonHandleBytes);
  put32(out, DaemonHandle::kMagic);
  put16(out + 4, DaemonHandle::kVersion);
  put16(out + 6, static_cast<uint16_t>(h.store.size()));
  put64(out + 8, h.host);
  std::memcpy(out + 16, h.nonce.data(), h.nonce.size());
  put32(out + 32, h.pid);
  if (!h.store.empty()) std::memcpy(out + kAddrAt, h.store.data(), h.store.size());
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
  if (len > kStoreAddressMax) {
    return invalid_arg("daemon-mode handle: address of {} bytes exceeds its {} bytes", len,
                       kStoreAddressMax);
  }
  for (size_t i = kAddrAt + len; i < kDaemonHandleBytes; ++i) {
    if (p[i] != 0) return invalid_arg("daemon-mode handle: non-zero byte {} past its fields", i);
  }
  DaemonHandle h;
  h.host = get64(p + 8);
  std::memcpy(h.nonce.data(), p + 16, h.nonce.size());
  h.pid = get32(p + 32);
  h.store.assign(reinterpret_cast<const char*>(p + kAddrAt), len);
  if (len > 0) {
    std::string host;
    int port = 0;
    Status st = split_store_address(h.store, &host, &port);
    if (!st.ok()) return st.with_context("daemon-mode handle");
  }
  return h;
}

}  // namespace gw::plugin
