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
  check(h->daemon.size() <= plugin::kDaemonAddressMax, "daemon handle: address fits its room");
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
  h.daemon = "unix:/run/gradwire/gradwired.sock";
  (void)plugin::encode_daemon_handle(h, b.data());
  out.push_back(b);
  out.push_back(std::vector<uint8_t>(plugin::kDaemonHandleBytes, 0));  // a direct-mode-like one
  b[4] = 9;                                                            // another version
  out.push_back(b);
  return out;
}

}  // namespace gw::fuzz
