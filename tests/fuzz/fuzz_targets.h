// The fuzz targets for every decoder of bytes that come from outside the process (besides the
// DPDK frames: dpdk_decoder_fuzz.h). Each is a function with libFuzzer's signature; fuzz_main.cc
// turns one into a libFuzzer binary (the `fuzz` preset), and fuzz_targets_test.cc runs all of
// them in the normal suite over the checked-in seeds (corpus/<name>/), their mutations and
// random bytes. A target aborts (so the fuzzer reports it) when a property fails: a guard byte
// changed, a refused peer was accepted, a round trip disagreed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace gw::fuzz {

// Store frames as the server reads them: the decoder alone, then the live server over a socket,
// before and after a proper hello exchange.
int store_server_frames(const uint8_t* data, size_t size);
// Store replies as the client decodes them, for every operation.
int store_client_frames(const uint8_t* data, size_t size);
// tcp: the listener fed a raw handshake, the connector fed a fake listener's answer, and a
// RecvComm fed a message stream (headers and payloads) after a proper handshake.
int tcp_wire(const uint8_t* data, size_t size);
// shm: the listener fed two handshake packets of any size.
int shm_handshake(const uint8_t* data, size_t size);
// shm: the connector fed a fake listener's challenge and answer (and the descriptor it passes).
int shm_connector(const uint8_t* data, size_t size);
// shm: a receiver fed the ring's slot headers and control block as its peer writes them.
int shm_ring(const uint8_t* data, size_t size);
// NCCL plugin: the 128-byte handle NCCL hands to connect(), decoded by tcp and shm.
int plugin_handle(const uint8_t* data, size_t size);
int plugin_daemon_handle(const uint8_t* data, size_t size);  // plugin/daemon_handle.h
// The codec spec parser (GW_COMPRESS, gw_config_t.compress); parse/format round trip.
int codec_spec(const uint8_t* data, size_t size);
// The codecs' decoders fed a peer's encoded payload (decode_add, decode, decode_sum,
// merge_encode), and PowerSGD's factor helpers fed arbitrary floats.
int codec_payload(const uint8_t* data, size_t size);
// The TOML configuration file loader (GW_CONFIG_FILE).
int config_toml(const uint8_t* data, size_t size);
// gradwired's hello as its admission decodes it (daemon/protocol.h); round trip.
int daemon_hello(const uint8_t* data, size_t size);
// gradwired's control request (daemon/control.h); round trip.
int daemon_control_request(const uint8_t* data, size_t size);
// gradwired's device-buffer messages (version 5: import, release, collectives naming imported
// allocations) as a job decodes them, one trainer's imports held from one to the next.
int daemon_import(const uint8_t* data, size_t size);
// gradwired's point-to-point messages (version 7: send, recv) and out-of-order completions.
int daemon_p2p(const uint8_t* data, size_t size);
// The header one gradwired sends another for a point-to-point message across hosts
// (daemon/p2p_xhost_wire.h); round trip.
int daemon_p2p_xhost(const uint8_t* data, size_t size);
// gradwirectl trace (daemon/control_trace.h): the request's arguments as gradwired reads them
// (round trip), and the answer, a Chrome trace, as gradwirectl checks it; one selector byte.
int daemon_control_trace(const uint8_t* data, size_t size);
// The /metrics listener's HTTP request (daemon/http_request.h).
int metrics_http_request(const uint8_t* data, size_t size);
// The parameter server's frames (kv/wire.h): decoded, checked, applied to one store's rules, and
// its answers checked as a worker checks replies.
int kv_frames(const uint8_t* data, size_t size);
// A peer's announcement in the store (collectives/connection_pool.h, parse_announcement): what
// parses has a pid and a pid namespace, and formats back to itself.
int pool_announcement(const uint8_t* data, size_t size);
// The direct allreduce's per-call descriptors (collectives/shm_direct.h, decode_calls and
// check_ref): what decodes names the call's size, and an accepted shared reference stays inside
// its region.
int shm_direct_calls(const uint8_t* data, size_t size);
// The net_af_xdp vdevs of DPDK EAL arguments (GW_DPDK_EAL_ARGS, dpdk/af_xdp_args.h) as the port
// and `gradwire-perf doctor` read them: names, interfaces, queues and the ethdevs added per queue.
int af_xdp_eal_args(const uint8_t* data, size_t size);
// verbs (over the emulator): the handle connect() decodes, the listener fed a raw or patched
// hello and ready record, the connector fed a fake listener's reply. Built where gw_verbs is
// (GW_FUZZ_VERBS).
int verbs_wire(const uint8_t* data, size_t size);

struct Target {
  const char* name;
  int (*run)(const uint8_t* data, size_t size);
  // Inputs that reach deep into the target (valid frames, handshakes, encodings).
  std::vector<std::vector<uint8_t>> (*seeds)();
};
const std::vector<Target>& targets();

// How often each target reached its deep paths ("tcp.message", ...): the gtest driver checks
// that the seeds and mutations get past the first checks.
uint64_t& counter(const std::string& name);

// Aborts with a message (the fuzzer's crash) when `ok` is false.
void check(bool ok, const char* what);

// Seeds that are text: each string's bytes, in order.
inline std::vector<std::vector<uint8_t>> text_seeds(std::initializer_list<std::string_view> texts) {
  std::vector<std::vector<uint8_t>> out;
  for (std::string_view s : texts) out.emplace_back(s.begin(), s.end());
  return out;
}

}  // namespace gw::fuzz
