// The parameter server's wire format (docs/wire-kv.md): every message is one 80-byte header
// (little-endian, fixed offsets) followed by header.payload bytes. Decoders check every field
// against the limits below before anything is allocated or applied; a frame that fails a check
// ends the connection with an Error frame saying why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/compress/codec.h"
#include "core/status.h"

namespace gw::kv {

// The frame magic carries the kv wire version: "GWK" + the version's digit. Version 2 added the
// Hello's chunk_bytes (a partition streamed in chunks); a version-1 peer's frames are refused with
// a message naming both versions (decode_header).
inline constexpr uint32_t kWireVersion = 2;
inline constexpr uint32_t kMagic = 0x324b5747;    // "GWK2"
inline constexpr uint32_t kMagicV1 = 0x314b5747;  // "GWK1": gradwire before streamed partitions
inline constexpr size_t kHeaderBytes = 80;
// The largest payload of one frame: one partition (GW_KV_PARTITION_BYTES is capped to this).
inline constexpr uint64_t kMaxPartitionBytes = 256ull << 20;
inline constexpr uint64_t kMaxPayload = kMaxPartitionBytes;
inline constexpr uint32_t kMaxPartitions = 1u << 24;  // per key (units: chunks when streamed)
inline constexpr uint32_t kMaxWorkers = 1u << 16;
inline constexpr size_t kMaxErrorBytes = 4096;
inline constexpr size_t kMaxTokenBytes = 1024;
// The store's codec spec in the Hello (its canonical form, coll::format_codec_spec).
inline constexpr size_t kMaxCodecSpecBytes = 128;
// A Push/PushPull's flags: 0 = the raw value, else the coll::CodecKind of its encoding (fp16 1,
// bf16 2, topk 3, randomk 4, sign 5, qsgd 6; powersgd 7 is not a byte codec and is refused).
inline constexpr uint16_t kMaxCodecFlag = 6;

enum class Type : uint8_t {
  kHello = 1,     // worker -> server: store id (aux), the store's config and the job token
  kInit = 2,      // value of one partition
  kPush = 3,      // one partition's contribution to clock `clock`
  kPull = 4,      // ask for one partition (answered when the mode allows)
  kPushPull = 5,  // push, then pull, in one frame
  kClock = 6,     // the worker's clock is now `clock` (it finished every clock below)
  kBye = 7,       // the worker destroyed its store (no more frames)
  kReply = 8,     // server -> worker: answers req_id; pull: the value; aux/aux2/aux3: stats
  kError = 9,     // server -> worker: answers req_id (0: the connection) with a message
};
const char* type_name(Type t);

struct Header {
  Type type = Type::kHello;
  uint8_t dtype = 0;       // gw_dtype_t of the value (Init, Push, Pull, PushPull, Reply)
  uint16_t flags = 0;      // Push/PushPull: the codec of the payload (0: raw); else 0
  uint32_t worker = 0;     // the sender's worker rank (worker -> server)
  uint32_t partition = 0;  // partition index of key
  uint64_t key = 0;
  uint64_t clock = 0;    // the worker's clock (Push, Pull, PushPull, Clock); Reply: applied clock
  uint64_t req_id = 0;   // worker's request id, echoed in the Reply / Error
  uint64_t count = 0;    // elements of this partition (Init, Push, Pull, PushPull, Reply)
  uint64_t total = 0;    // elements of the whole key (Init, Push, Pull, PushPull)
  uint64_t aux = 0;      // Hello: store id; encoded Push/PushPull: codec step; Reply: slowest clock
  uint64_t aux2 = 0;     // Reply: pushes dropped (sync)
  uint32_t aux3 = 0;     // Reply: workers lost
  uint32_t payload = 0;  // bytes following the header
};

// The store's settings, sent in every Hello; the first worker's Hello sets them on a server, and a
// worker whose settings differ is refused.
struct StoreConfig {
  uint32_t workers = 0;  // N
  uint32_t mode = 0;     // gw_kv_mode_t
  int32_t staleness = 0;
  int32_t sync_k = 0;
  uint32_t update = 0;  // gw_kv_update_t
  double lr = 0;
  double momentum = 0;
  uint64_t partition_bytes = 0;
  // A partition travels and is aggregated in chunks of at most this many bytes, each its own unit
  // on the partition's server (frames' `partition` field: the unit's index, see
  // docs/wire-kv.md §1); 0 or >= partition_bytes: the partition is one unit.
  uint64_t chunk_bytes = 0;
  std::string codec;  // "" (raw pushes) or the canonical codec spec of the pushes
  bool operator==(const StoreConfig&) const = default;
};
// StoreConfig's fixed fields (u32 at offset 20: the codec spec's length; u64 at 48: chunk_bytes),
// then the codec spec, then the token (the rest of the payload).
inline constexpr size_t kHelloFixedBytes = 56;

void encode_header(const Header& h, uint8_t out[kHeaderBytes]);
// Checks magic, type, flags, dtype and the payload bound; the per-type rules are in check_frame.
Status decode_header(const uint8_t in[kHeaderBytes], Header* h);
// The per-type rules a server applies to a worker's frame (sizes agree with dtype and count,
// partition and worker in range, reply-only types refused): kInvalidArg saying which. codec: the
// store's (null: none); an encoded Push/PushPull must name it in flags, be f32 and carry exactly
// codec->encoded_size(count) bytes.
Status check_request(const Header& h, uint32_t workers, const coll::Codec* codec = nullptr);
// A reply's rules as a worker checks them.
Status check_reply(const Header& h);

std::vector<uint8_t> encode_hello(const StoreConfig& c, const std::string& token);
Status decode_hello(const uint8_t* p, size_t n, StoreConfig* c, std::string* token);
// A config a server accepts: mode/update enumerators, the ranges of each field, a codec spec that
// parses, is canonical and names a byte codec (not powersgd).
Status check_config(const StoreConfig& c);
// The mode as docs/parameter-server.md writes it: "bsp", "ssp:2", "asp", "sync:3".
std::string mode_text(const StoreConfig& c);
// The update: "sum", "sgd:0.1,momentum=0.9".
std::string update_text(const StoreConfig& c);
// A codec spec a store accepts (check_config's codec rule): parsed, a byte codec, not none or
// powersgd (kInvalidArg saying why).
Result<coll::CodecSpec> check_codec_spec(std::string_view text);

}  // namespace gw::kv
