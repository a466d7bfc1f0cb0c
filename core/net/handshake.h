// What the tcp and shm handshakes share: the job-token field and its comparison, the handle
// header check, the accept side's verdict on a hello, the peer's name, and the error messages.
// Each backend keeps its own wire structs (docs/wire-tcp.md, docs/wire-shm.md); these helpers
// read and write their common fields in place, so the bytes on the wire are the backend's.
//
// Everything here is thread-safe (no state) and never blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/net/transport.h"
#include "core/status.h"

namespace gw::net::handshake {

// Size of the token field in every hello; longer job tokens are refused at transport creation.
inline constexpr size_t kMaxToken = 256;
// The listener's one-byte answers (tcp: the whole answer; shm: the answer field of its reply).
inline constexpr uint8_t kAccept = 'A';
inline constexpr uint8_t kRefuse = 'R';

using TokenField = char[kMaxToken];

// Options every handshaking backend requires: a job token that fits the field and a positive
// connect timeout. kInvalidArg naming `backend` otherwise.
Status check_options(std::string_view backend, const TransportOptions& options);

// Writes a 4-byte magic ("GWH1") into a wire field.
void put_magic(char (&field)[4], std::string_view magic);
bool magic_is(const char (&field)[4], std::string_view magic);

// Writes `token` (at most kMaxToken bytes: check_options) and its length into a hello; the rest
// of the field stays as the caller zeroed it.
void put_token(std::string_view token, uint32_t* len, TokenField& field);

// Compares two job tokens in time that depends only on their lengths, so a refused peer learns
// nothing about a prefix.
bool tokens_equal(std::string_view a, std::string_view b);

// Checks the magic and version at the front of a handle passed to connect():
// "<backend> connect: the handle is not a <backend> handle" /
// "<backend> connect: handle version V (this build speaks W)" (kInvalidArg).
Status check_handle(std::string_view backend, const char (&magic)[4], std::string_view want_magic,
                    uint16_t version, uint16_t want_version);

// The common fields of a hello as the accept side received them.
struct HelloView {
  const char (&magic)[4];
  uint64_t nonce;
  uint32_t token_len;
  const TokenField& token;
};

// What the listener expects of every hello.
struct HelloExpect {
  std::string_view backend;  // "tcp", "shm": names the protocol in the verdict
  std::string_view magic;
  uint64_t nonce;
  std::string_view token;
};

// Why the listener refuses this hello ("" when the common fields are fine): a foreign magic, a
// nonce of another listener (a stale handle), or a different job token. Checked in that order.
std::string refusal(const HelloView& hello, const HelloExpect& expect);

// "rank 3 via tcp 10.0.0.2:4000": how a peer is named in every message of a connection.
std::string peer_label(int rank, std::string_view backend, std::string_view where);

// The connector's errors (kPeer), named after the peer.
Status refused_error(std::string_view peer);             // the listener answered kRefuse
Status closed_by_listener_error(std::string_view peer);  // EOF before any answer
// kTimeout after `timeout_ms` without a connection; `last_problem` says why ("" = no answer).
Status connect_timeout_error(std::string_view peer, int64_t timeout_ms,
                             std::string_view last_problem);

}  // namespace gw::net::handshake
