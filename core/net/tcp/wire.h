// The tcp backend's wire structs and the settings every part of it shares (docs/wire-tcp.md).
// Internal to core/net/tcp/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/net/handshake.h"
#include "core/net/tcp/zerocopy.h"
#include "core/net/transport.h"

namespace gw::net::tcp {

inline constexpr uint16_t kVersion = 2;
inline constexpr uint32_t kHeaderMagic = 0x47574d31;   // "GWM1"
inline constexpr uint32_t kNoticeMagic = 0x47574e31;   // "GWN1"
inline constexpr int64_t kRetryNs = 20 * 1000 * 1000;  // between connect() attempts on ECONNREFUSED

// All wire structs are little-endian, fixed size, no implicit padding (docs/wire-tcp.md).
struct HandleWire {
  char magic[4];  // "GWT1"
  uint16_t version;
  uint16_t nsocks;
  uint16_t family;   // AF_INET or AF_INET6
  uint16_t port_be;  // network byte order
  uint32_t scope_id;
  uint8_t addr[16];
  uint64_t nonce;
  int32_t rank;
  uint32_t reserved;
};
static_assert(sizeof(HandleWire) == 48 && sizeof(HandleWire) <= kHandleSize);

// Connector -> listener, first message of every socket.
struct Hello {
  char magic[4];  // "GWH2"
  uint16_t sock_index;
  uint16_t nsocks;
  uint64_t nonce;  // from the handle
  uint64_t conn_id;
  int32_t rank;           // the connector's
  int32_t listener_rank;  // the listener's, as the handle says
  handshake::Nonce challenge;
};
static_assert(sizeof(Hello) == 64);

// Listener -> connector after a hello it does not refuse outright (a refusal is kRefuse alone).
struct Challenge {
  uint8_t answer;  // kChallenge
  uint8_t reserved[7];
  handshake::Nonce challenge;
  handshake::Mac proof;  // the listener's
};
static_assert(sizeof(Challenge) == 72);

// Connector -> listener: the connector's proof. The listener answers kAccept or kRefuse.
struct Proof {
  handshake::Mac proof;
};
static_assert(sizeof(Proof) == 32);

struct MsgHeader {
  uint32_t magic;
  int32_t tag;
  uint64_t size;
};
static_assert(sizeof(MsgHeader) == 16);

struct Notice {
  uint32_t magic;
  uint32_t code;  // gw::Code of the receiver's failure
  uint64_t seq;   // message number (0-based, per connection)
};
static_assert(sizeof(Notice) == 16);

inline handshake::Transcript transcript(const Hello& h) {
  handshake::Transcript t;
  t.protocol = "tcp";
  t.handle_nonce = h.nonce;
  t.conn_id = h.conn_id;
  t.index = h.sock_index;
  t.connector_rank = h.rank;
  t.listener_rank = h.listener_rank;
  t.connector_challenge = h.challenge;
  return t;
}

// The settings make_tcp_transport resolved (core/net/tcp/transport.cc).
struct TcpConfig {
  int nsocks = 4;
  int64_t bufsize = 0;
  size_t chunk = 0;
  int threads = 0;                 // I/O worker threads per comm; 0 = the caller's thread
  ZcMode zerocopy = ZcMode::kOff;  // GW_SOCKET_ZEROCOPY (core/net/tcp/zerocopy.h)
  size_t zerocopy_min = 0;         // GW_SOCKET_ZEROCOPY_MIN
  int busy_poll_us = 0;            // GW_SOCKET_BUSY_POLL (0 = off, or the kernel refused it)
};

}  // namespace gw::net::tcp
