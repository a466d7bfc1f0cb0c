// Fuzz target of the NCCL plugin's daemon-mode listen handle (plugin/daemon_handle.h): any 128
// bytes decode or are refused with kInvalidArg, and what decodes encodes back to the same bytes.
#include <cstring>

#include "plugin/daemon_handle.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

int plugin_daemon_handle(const uint8_t* data, size_t size) {
  auto h = plugin::decode_daemon_handle(data, size);
  if (!h.ok()) {
    check(h.status().code() == Code::kInvalidArg, "daemon handle: refusal is kInvalidArg");
    ++counter("plugin.daemon_handle_refused");
    return 0;
  }
  ++counter("plugin.daemon_handle_ok");
  check(h->store.size() <= plugin::kStoreAddressMax, "daemon handle: address fits its room");
  if (!h->store.empty()) {
    ++counter("plugin.daemon_handle_store");
    std::string host;
    int port = 0;
    check(plugin::split_store_address(h->store, &host, &port).ok() && !host.empty() && port > 0 &&
              port <= 65535,
          "daemon handle: a decoded store address is host:port");
  }
  uint8_t again[plugin::kDaemonHandleBytes];
  check(plugin::encode_daemon_handle(*h, again).ok(), "daemon handle: a decoded one encodes");
  check(std::memcmp(again, data, sizeof(again)) == 0, "daemon handle: encode(decode(b)) == b");
  return 0;
}

std::vector<std::vector<uint8_t>> plugin_daemon_handle_seeds() {
  std::vector<std::vector<uint8_t>> out;
  plugin::DaemonHandle h;
  h.host = plugin::host_hash("host-a/boot/netns:1");
  for (size_t i = 0; i < h.nonce.size(); ++i) h.nonce[i] = static_cast<uint8_t>(i * 7 + 1);
  h.pid = 4242;
  std::vector<uint8_t> b(plugin::kDaemonHandleBytes);
  (void)plugin::encode_daemon_handle(h, b.data());
  out.push_back(b);
  h.store = "10.0.0.2:41234";  // the listener's store (the cross-host leg)
  (void)plugin::encode_daemon_handle(h, b.data());
  out.push_back(b);
  h.store = "fd00::2:41234";
  (void)plugin::encode_daemon_handle(h, b.data());
  out.push_back(b);
  std::vector<uint8_t> bad = b;  // an address without a port: refused
  const char kNoPort[] = "10.0.0.2";
  bad[6] = sizeof(kNoPort) - 1;
  std::memset(bad.data() + 36, 0, 64);
  std::memcpy(bad.data() + 36, kNoPort, sizeof(kNoPort) - 1);
  out.push_back(bad);
  out.push_back(std::vector<uint8_t>(plugin::kDaemonHandleBytes, 0));  // a direct-mode-like one
  b[4] = 9;                                                            // another version
  out.push_back(b);
  return out;
}

}  // namespace gw::fuzz
