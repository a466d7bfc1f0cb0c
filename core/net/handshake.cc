#include "core/net/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/config.h"
#include "core/net/net_config.h"
#include "core/net/socket_util.h"

namespace gw::net::handshake {

size_t max_pending() {
  return static_cast<size_t>(std::max<int64_t>(1, config::get_int(net_config::kListenMaxPending)));
}

namespace {

void put_le(std::vector<uint8_t>& b, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> transcript_bytes(Role role, const Transcript& t) {
  static constexpr std::string_view kLabel = "gradwire-auth-v2";
  std::vector<uint8_t> b;
  b.reserve(kLabel.size() + t.protocol.size() + 2 + 1 + 28 + 2 * kNonceSize);
  b.insert(b.end(), kLabel.begin(), kLabel.end());
  b.push_back(0);
  b.insert(b.end(), t.protocol.begin(), t.protocol.end());
  b.push_back(0);
  b.push_back(static_cast<uint8_t>(role));
  put_le(b, t.handle_nonce, 8);
  put_le(b, t.conn_id, 8);
  put_le(b, t.index, 4);
  put_le(b, static_cast<uint32_t>(t.connector_rank), 4);
  put_le(b, static_cast<uint32_t>(t.listener_rank), 4);
  b.insert(b.end(), t.connector_challenge.begin(), t.connector_challenge.end());
  b.insert(b.end(), t.listener_challenge.begin(), t.listener_challenge.end());
  return b;
}

}  // namespace

Status check_options(std::string_view backend, const TransportOptions& options) {
  if (options.job_token.size() > kMaxToken) {
    return invalid_arg("{}: job token of {} bytes is longer than {}", backend,
                       options.job_token.size(), kMaxToken);
  }
  if (options.timeout_ms <= 0) {
    return invalid_arg("{}: timeout_ms must be positive (got {})", backend, options.timeout_ms);
  }
  return ok_status();
}

void put_magic(char (&field)[4], std::string_view magic) {
  std::memcpy(field, magic.data(), std::min(magic.size(), sizeof(field)));
}

bool magic_is(const char (&field)[4], std::string_view magic) {
  return magic.size() == sizeof(field) && std::memcmp(field, magic.data(), sizeof(field)) == 0;
}

Status fresh_nonce(Nonce* out) {
  if (RAND_bytes(out->data(), static_cast<int>(out->size())) != 1) {
    return Status(Code::kSystem, "handshake: the system's random generator failed (RAND_bytes)");
  }
  return ok_status();
}

Mac hmac_sha256(std::string_view key, const uint8_t* message, size_t size) {
  Mac mac{};
  unsigned int len = 0;
  static const uint8_t kEmpty = 0;
  const void* k = key.empty() ? static_cast<const void*>(&kEmpty) : key.data();
  const uint8_t* m = size == 0 ? &kEmpty : message;
  // HMAC() fails only when the digest is unavailable, which a working libcrypto never is; the
  // all-zero result then matches no honest proof.
  if (HMAC(EVP_sha256(), k, static_cast<int>(key.size()), m, size, mac.data(), &len) == nullptr ||
      len != mac.size()) {
    mac.fill(0);
  }
  return mac;
}

Mac prove(std::string_view token, Role role, const Transcript& t) {
  std::vector<uint8_t> msg = transcript_bytes(role, t);
  return hmac_sha256(token, msg.data(), msg.size());
}

bool verify(std::string_view token, Role role, const Transcript& t, const uint8_t* mac) {
  const Mac want = prove(token, role, t);
  return CRYPTO_memcmp(want.data(), mac, want.size()) == 0;
}

bool tokens_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

Status check_handle(std::string_view backend, const char (&magic)[4], std::string_view want_magic,
                    uint16_t version, uint16_t want_version) {
  if (!magic_is(magic, want_magic)) {
    return invalid_arg("{} connect: the handle is not a {} handle", backend, backend);
  }
  if (version != want_version) {
    return invalid_arg("{} connect: handle version {} (this build speaks {})", backend, version,
                       want_version);
  }
  return ok_status();
}

std::string refusal(const HelloView& hello, const HelloExpect& expect) {
  if (!magic_is(hello.magic, expect.magic)) {
    return fmt::format("not a gradwire {} handshake of this version", expect.backend);
  }
  if (hello.nonce != expect.nonce) return "handshake for another listener (nonce mismatch)";
  if (expect.rank >= 0 && hello.listener_rank != expect.rank) {
    return fmt::format("handshake meant for {} (this listener is rank {})",
                       rank_name(hello.listener_rank), expect.rank);
  }
  if (expect.expected_peer >= 0 && hello.rank != expect.expected_peer) {
    return fmt::format("{} connected where rank {} was expected", rank_name(hello.rank),
                       expect.expected_peer);
  }
  return std::string();
}

std::string peer_label(int rank, std::string_view backend, std::string_view where) {
  return fmt::format("{} via {} {}", rank_name(rank), backend, where);
}

Status refused_error(std::string_view peer) {
  return peer_error(
      "handshake with {}: refused (job token mismatch, unexpected rank or stale handle)", peer);
}

Status closed_by_listener_error(std::string_view peer) {
  return peer_error("handshake with {}: connection closed by the listener", peer);
}

Status listener_unproven_error(std::string_view peer) {
  return peer_error(
      "handshake with {}: the listener did not prove the job token (another job, or not the "
      "listener the handle names)",
      peer);
}

Status listener_gone_error(std::string_view peer, int64_t refused_ms) {
  return peer_error(
      "connect to {}: connection refused for {} ms where it listened: that rank is gone (its "
      "process exited or closed the communicator)",
      peer, refused_ms);
}

Status connect_timeout_error(std::string_view peer, int64_t timeout_ms,
                             std::string_view last_problem) {
  return timeout_error("connect to {}: no connection within {} ms ({})", peer, timeout_ms,
                       last_problem.empty() ? "no answer" : last_problem);
}

}  // namespace gw::net::handshake
