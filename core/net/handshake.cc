#include "core/net/handshake.h"

#include <cstring>

#include "core/net/socket_util.h"

namespace gw::net::handshake {

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

void put_token(std::string_view token, uint32_t* len, TokenField& field) {
  const size_t n = std::min(token.size(), kMaxToken);
  *len = static_cast<uint32_t>(n);
  std::memcpy(field, token.data(), n);
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
    return fmt::format("not a gradwire {} handshake", expect.backend);
  }
  if (hello.nonce != expect.nonce) return "handshake for another listener (nonce mismatch)";
  if (hello.token_len > kMaxToken ||
      !tokens_equal(std::string_view(hello.token, hello.token_len), expect.token)) {
    return "job token mismatch";
  }
  return std::string();
}

std::string peer_label(int rank, std::string_view backend, std::string_view where) {
  return fmt::format("{} via {} {}", rank_name(rank), backend, where);
}

Status refused_error(std::string_view peer) {
  return peer_error("handshake with {}: refused (job token mismatch or stale handle)", peer);
}

Status closed_by_listener_error(std::string_view peer) {
  return peer_error("handshake with {}: connection closed by the listener", peer);
}

Status connect_timeout_error(std::string_view peer, int64_t timeout_ms,
                             std::string_view last_problem) {
  return timeout_error("connect to {}: no connection within {} ms ({})", peer, timeout_ms,
                       last_problem.empty() ? "no answer" : last_problem);
}

}  // namespace gw::net::handshake
