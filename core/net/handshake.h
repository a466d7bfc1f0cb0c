// What the tcp and shm handshakes (and the store's hello) share: the challenge-response that
// proves knowledge of the job token without sending it, the handle header check, the accept
// side's verdict on a hello, the expected-rank check, the peer's name, and the error messages.
// Each backend keeps its own wire structs (docs/wire-tcp.md, docs/wire-shm.md,
// docs/wire-store.md); these helpers fill and check their common fields.
//
// The proof: each side sends a fresh random challenge; each answers with
// HMAC-SHA256(key = job token, message = transcript) where the transcript names the protocol,
// the role of the prover (connector or listener), the listener's handle nonce, the connection id
// and socket index, both ranks, and both challenges (prove() documents the exact bytes). The
// role keeps a listener's proof from being reflected as a connector's; the fresh challenges keep
// a captured exchange from being replayed. The token itself never crosses the wire.
//
// Everything here is thread-safe (no state) and never blocks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/net/transport.h"
#include "core/status.h"

namespace gw::net::handshake {

// Longest job token a transport accepts (checked at transport creation).
inline constexpr size_t kMaxToken = 256;
// The listener's one-byte answers (tcp: the whole answer; shm: the answer field of its reply).
inline constexpr uint8_t kAccept = 'A';
inline constexpr uint8_t kRefuse = 'R';
// tcp: the first byte of the listener's challenge (the hello passed the listener's checks).
inline constexpr uint8_t kChallenge = 'C';

// Handshakes a tcp, shm or verbs listener (and the dpdk engine, through
// EngineConfig::max_pending_handshakes) holds before they are authenticated: GW_LISTEN_MAX_PENDING
// (at least 1); beyond it the silent ones, then the oldest, are dropped (a listener's only past
// their grace period, core/net/pending_accept.h).
size_t max_pending();
// Connections a listener accepts per accept() call, so the handshakes it holds progress between
// bursts of a flood.
inline constexpr int kAcceptBurst = 16;

// A listener's warnings about handshakes it drops under a flood: the first, then at most one a
// second that counts the ones in between. Thread-compatible (one per listener).
class DropLog {
 public:
  // Whether to log this drop now; *skipped gets the drops left unlogged since the last line.
  bool should_log(int64_t now_ns, uint64_t* skipped) {
    if (logged_ && now_ns - last_ns_ < 1000000000) {
      ++skipped_;
      return false;
    }
    *skipped = skipped_;
    skipped_ = 0;
    last_ns_ = now_ns;
    logged_ = true;
    return true;
  }

 private:
  bool logged_ = false;
  int64_t last_ns_ = 0;
  uint64_t skipped_ = 0;
};

inline constexpr size_t kNonceSize = 32;
inline constexpr size_t kMacSize = 32;
using Nonce = std::array<uint8_t, kNonceSize>;
using Mac = std::array<uint8_t, kMacSize>;

enum class Role : uint8_t { kConnector = 1, kListener = 2 };

// Everything a proof covers. Fields a protocol does not have stay 0 / -1.
struct Transcript {
  std::string_view protocol;    // "tcp", "shm", "store"
  uint64_t handle_nonce = 0;    // the listener's nonce from its handle
  uint64_t conn_id = 0;         // tcp: the connector's connection id
  uint32_t index = 0;           // tcp: socket index within the connection
  int32_t connector_rank = -1;  // as the connector states it in its hello
  int32_t listener_rank = -1;   // as the connector read it from the handle
  Nonce connector_challenge{};  // fresh from the connector
  Nonce listener_challenge{};   // fresh from the listener
};

// Options every handshaking backend requires: a job token that fits kMaxToken and a positive
// connect timeout. kInvalidArg naming `backend` otherwise.
Status check_options(std::string_view backend, const TransportOptions& options);

// Writes a 4-byte magic ("GWH2") into a wire field.
void put_magic(char (&field)[4], std::string_view magic);
bool magic_is(const char (&field)[4], std::string_view magic);

// A fresh challenge from the system's cryptographic generator (OpenSSL RAND_bytes);
// kSystem when it cannot produce one (never a predictable fallback).
Status fresh_nonce(Nonce* out);

// HMAC-SHA256 over `message` keyed with `key` (any length, empty included).
Mac hmac_sha256(std::string_view key, const uint8_t* message, size_t size);

// The proof `role` gives for `t`: HMAC-SHA256(token, "gradwire-auth-v2" NUL protocol NUL
// u8 role, u64 handle_nonce, u64 conn_id, u32 index, i32 connector_rank, i32 listener_rank,
// connector_challenge[32], listener_challenge[32]) (integers little-endian).
Mac prove(std::string_view token, Role role, const Transcript& t);

// Whether `mac` is the proof `role` gives for `t` under `token`; constant time in `mac`.
bool verify(std::string_view token, Role role, const Transcript& t, const uint8_t* mac);

// Compares two job tokens (or MACs) in time that depends only on their lengths, so a refused
// peer learns nothing about a prefix.
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
  int32_t rank;           // the connector's rank
  int32_t listener_rank;  // the listener's rank as the connector read it from the handle
};

// What the listener expects of every hello.
struct HelloExpect {
  std::string_view backend;  // "tcp", "shm": names the protocol in the verdict
  std::string_view magic;
  uint64_t nonce;
  int32_t rank;           // this listener's rank (-1: unknown, not checked)
  int32_t expected_peer;  // the rank allowed to connect (-1: any; Listener::expect_peer)
};

// Why the listener refuses this hello before any proof ("" when the fields are fine): a foreign
// magic, a nonce of another listener (a stale handle), a hello meant for another rank, or a
// connector other than the expected peer. Checked in that order. The token is checked later,
// by verify() on the connector's proof.
std::string refusal(const HelloView& hello, const HelloExpect& expect);

// "rank 3 via tcp 10.0.0.2:4000": how a peer is named in every message of a connection.
std::string peer_label(int rank, std::string_view backend, std::string_view where);

// The connector's errors (kPeer), named after the peer.
Status refused_error(std::string_view peer);             // the listener answered kRefuse
Status closed_by_listener_error(std::string_view peer);  // EOF before any answer
Status listener_unproven_error(std::string_view peer);   // the listener's proof was wrong
// kTimeout after `timeout_ms` without a connection; `last_problem` says why ("" = no answer).
Status connect_timeout_error(std::string_view peer, int64_t timeout_ms,
                             std::string_view last_problem);

// A handle exists only once its listener listens (every backend's listen() makes the socket
// listen before it writes the handle), so a connect refused at a handle's address means that
// listener is gone: its process exited or closed it. It is retried for kListenerGoneMs only (the
// refusals of a listen queue overflowing, where a kernel answers so, pass within it), then
// listener_gone_error (kPeer) instead of waiting out timeout_ms.
inline constexpr int64_t kListenerGoneMs = 1000;
Status listener_gone_error(std::string_view peer, int64_t refused_ms);

}  // namespace gw::net::handshake
