#include "tests/fuzz/fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <map>

namespace gw::fuzz {

std::vector<std::vector<uint8_t>> store_server_seeds();
std::vector<std::vector<uint8_t>> store_client_seeds();
std::vector<std::vector<uint8_t>> tcp_seeds();
std::vector<std::vector<uint8_t>> shm_seeds();
std::vector<std::vector<uint8_t>> shm_connector_seeds();
std::vector<std::vector<uint8_t>> shm_ring_seeds();
std::vector<std::vector<uint8_t>> plugin_handle_seeds();
std::vector<std::vector<uint8_t>> plugin_daemon_handle_seeds();
std::vector<std::vector<uint8_t>> codec_spec_seeds();
std::vector<std::vector<uint8_t>> codec_payload_seeds();
std::vector<std::vector<uint8_t>> config_seeds();
std::vector<std::vector<uint8_t>> daemon_hello_seeds();
std::vector<std::vector<uint8_t>> daemon_control_seeds();
std::vector<std::vector<uint8_t>> daemon_import_seeds();
std::vector<std::vector<uint8_t>> daemon_p2p_seeds();
std::vector<std::vector<uint8_t>> daemon_p2p_xhost_seeds();
std::vector<std::vector<uint8_t>> daemon_control_trace_seeds();
std::vector<std::vector<uint8_t>> metrics_http_seeds();
std::vector<std::vector<uint8_t>> kv_seeds();
std::vector<std::vector<uint8_t>> pool_announcement_seeds();
std::vector<std::vector<uint8_t>> shm_direct_calls_seeds();
std::vector<std::vector<uint8_t>> af_xdp_eal_args_seeds();
#ifdef GW_FUZZ_VERBS
std::vector<std::vector<uint8_t>> verbs_seeds();
#endif

uint64_t& counter(const std::string& name) {
  static auto* all = new std::map<std::string, uint64_t>();
  return (*all)[name];
}

void check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property failed: %s\n", what);
  std::abort();
}

const std::vector<Target>& targets() {
  static const std::vector<Target> all = {
      {"store_server_frames", &store_server_frames, &store_server_seeds},
      {"store_client_frames", &store_client_frames, &store_client_seeds},
      {"tcp_wire", &tcp_wire, &tcp_seeds},
      {"shm_handshake", &shm_handshake, &shm_seeds},
      {"shm_connector", &shm_connector, &shm_connector_seeds},
      {"shm_ring", &shm_ring, &shm_ring_seeds},
      {"plugin_handle", &plugin_handle, &plugin_handle_seeds},
      {"plugin_daemon_handle", &plugin_daemon_handle, &plugin_daemon_handle_seeds},
      {"codec_spec", &codec_spec, &codec_spec_seeds},
      {"codec_payload", &codec_payload, &codec_payload_seeds},
      {"config_toml", &config_toml, &config_seeds},
      {"daemon_hello", &daemon_hello, &daemon_hello_seeds},
      {"daemon_control_request", &daemon_control_request, &daemon_control_seeds},
      {"daemon_import", &daemon_import, &daemon_import_seeds},
      {"daemon_p2p", &daemon_p2p, &daemon_p2p_seeds},
      {"daemon_p2p_xhost", &daemon_p2p_xhost, &daemon_p2p_xhost_seeds},
      {"daemon_control_trace", &daemon_control_trace, &daemon_control_trace_seeds},
      {"metrics_http_request", &metrics_http_request, &metrics_http_seeds},
      {"kv_frames", &kv_frames, &kv_seeds},
      {"pool_announcement", &pool_announcement, &pool_announcement_seeds},
      {"shm_direct_calls", &shm_direct_calls, &shm_direct_calls_seeds},
      {"af_xdp_eal_args", &af_xdp_eal_args, &af_xdp_eal_args_seeds},
#ifdef GW_FUZZ_VERBS
      {"verbs_wire", &verbs_wire, &verbs_seeds},
#endif
  };
  return all;
}

}  // namespace gw::fuzz
