// Encoder and bounds-checked decoder of the TCP store protocol (docs/wire-store.md).
//
// Pure functions over byte buffers, no sockets: the server, the client and the fuzz target share
// them. A decoder never trusts a length field: every field is checked against the bytes that are
// actually there and against the protocol limits before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/net/handshake.h"
#include "core/status.h"

// The bottom of the store's layers: store.cc (the in-process store) and store_tcp.cc (server and
// client) call it; it includes neither store.h nor calls them.
namespace gw::store_wire {

using Bytes = std::vector<uint8_t>;  // the same type as gw::Bytes (core/store.h)

inline constexpr uint32_t kMagic = 0x54535747;  // "GWST" on the wire (little-endian)
inline constexpr uint16_t kVersion = 2;
inline constexpr size_t kMaxKey = 4096;         // bytes of a key (at least 1)
inline constexpr size_t kMaxValue = 64u << 20;  // bytes of a value
inline constexpr size_t kMaxToken = 1024;       // bytes of a job token (it never crosses the wire)
inline constexpr size_t kMaxMessage = 1024;     // bytes of an error message
inline constexpr size_t kMaxBody = kMaxValue + kMaxKey + 64;  // largest frame body accepted
// Largest frame body accepted before the hello exchange completed: a hello (op, magic, version,
// challenge: 39 bytes) or an auth (op, proof: 33 bytes), with room for an older client's hello
// to be read and answered "version not supported".
inline constexpr size_t kMaxHelloBody = 64;
inline constexpr size_t kHeaderSize = 4;  // u32 body length

enum class Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kErase = 5, kAuth = 6 };
enum class ReplyCode : uint8_t { kOk = 0, kNotFound = 1, kError = 2 };

const char* op_name(Op op);

struct Request {
  Op op = Op::kHello;
  uint16_t version = kVersion;        // hello
  net::handshake::Nonce challenge{};  // hello: the client's challenge
  net::handshake::Mac proof{};        // auth: the client's proof
  std::string key;                    // set/get/add/erase
  Bytes value;                        // set
  int64_t delta = 0;                  // add
  uint32_t wait_ms = 0;               // get: how long the server may hold the request for the key
};

struct Response {
  ReplyCode code = ReplyCode::kOk;
  Bytes value;                        // get
  int64_t number = 0;                 // add
  std::string message;                // error
  net::handshake::Nonce challenge{};  // hello: the server's challenge
  net::handshake::Mac proof{};        // hello: the server's proof
};

// What the store's proofs cover (core/net/handshake.h): protocol "store", the server as
// listener and the client as connector, and both challenges.
net::handshake::Transcript transcript(const net::handshake::Nonce& client_challenge,
                                      const net::handshake::Nonce& server_challenge);

// Key and value limits shared by every Store implementation.
Status check_key(std::string_view key);
Status check_value_size(size_t size);

// Whole frames (length prefix included). The request must satisfy the limits (callers check
// first; violating them is kInvalidArg).
Result<Bytes> encode_request(const Request& request);
Bytes encode_response(Op op, const Response& response);

// Reads the u32 body length at `header` and checks it against kMaxBody (and > 0).
Result<uint32_t> decode_length(const uint8_t* header);

// Decode one frame body (without the length prefix). Trailing bytes are an error.
Result<Request> decode_request(const uint8_t* body, size_t size);
Result<Response> decode_response(Op op, const uint8_t* body, size_t size);

// Integers stored by add() are decimal text; strict parse ("-12" yes, " 12", "1x", "" no).
bool parse_counter(const Bytes& value, int64_t* out);
Bytes format_counter(int64_t value);

}  // namespace gw::store_wire
