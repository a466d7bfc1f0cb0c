#include "kv/wire.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "collectives/compress/codec.h"
#include "collectives/types.h"

namespace gw::kv {

namespace {

template <typename T>
void put(uint8_t* p, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::memcpy(p, &v, sizeof(T));  // the supported hosts are little-endian (DESIGN.md)
}
template <typename T>
T get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

bool carries_value(Type t) { return t == Type::kInit || t == Type::kPush || t == Type::kPushPull; }

}  // namespace

const char* type_name(Type t) {
  switch (t) {
    case Type::kHello:
      return "hello";
    case Type::kInit:
      return "init";
    case Type::kPush:
      return "push";
    case Type::kPull:
      return "pull";
    case Type::kPushPull:
      return "pushpull";
    case Type::kClock:
      return "clock";
    case Type::kBye:
      return "bye";
    case Type::kReply:
      return "reply";
    case Type::kError:
      return "error";
  }
  return "?";
}

void encode_header(const Header& h, uint8_t out[kHeaderBytes]) {
  put<uint32_t>(out + 0, kMagic);
  out[4] = static_cast<uint8_t>(h.type);
  out[5] = h.dtype;
  put<uint16_t>(out + 6, h.flags);
  put<uint32_t>(out + 8, h.worker);
  put<uint32_t>(out + 12, h.partition);
  put<uint64_t>(out + 16, h.key);
  put<uint64_t>(out + 24, h.clock);
  put<uint64_t>(out + 32, h.req_id);
  put<uint64_t>(out + 40, h.count);
  put<uint64_t>(out + 48, h.total);
  put<uint64_t>(out + 56, h.aux);
  put<uint64_t>(out + 64, h.aux2);
  put<uint32_t>(out + 72, h.aux3);
  put<uint32_t>(out + 76, h.payload);
}

Status decode_header(const uint8_t in[kHeaderBytes], Header* h) {
  const uint32_t magic = get<uint32_t>(in);
  if (magic == kMagicV1) {
    return invalid_arg(
        "kv frame: the peer speaks kv wire version 1 (a gradwire from before streamed partitions), "
        "this one version {}: run the same gradwire on every worker and server",
        kWireVersion);
  }
  if (magic != kMagic) return invalid_arg("kv frame: bad magic {:#010x} (not a kv peer?)", magic);
  const uint8_t type = in[4];
  if (type < static_cast<uint8_t>(Type::kHello) || type > static_cast<uint8_t>(Type::kError)) {
    return invalid_arg("kv frame: unknown type {}", type);
  }
  h->type = static_cast<Type>(type);
  h->dtype = in[5];
  h->flags = get<uint16_t>(in + 6);
  if (h->flags > kMaxCodecFlag) {
    return invalid_arg("kv frame: flags {:#x} name no codec (0..{})", h->flags, kMaxCodecFlag);
  }
  if (!coll::valid_dtype(h->dtype)) return invalid_arg("kv frame: unknown dtype {}", h->dtype);
  h->worker = get<uint32_t>(in + 8);
  h->partition = get<uint32_t>(in + 12);
  h->key = get<uint64_t>(in + 16);
  h->clock = get<uint64_t>(in + 24);
  h->req_id = get<uint64_t>(in + 32);
  h->count = get<uint64_t>(in + 40);
  h->total = get<uint64_t>(in + 48);
  h->aux = get<uint64_t>(in + 56);
  h->aux2 = get<uint64_t>(in + 64);
  h->aux3 = get<uint32_t>(in + 72);
  h->payload = get<uint32_t>(in + 76);
  if (h->payload > kMaxPayload) {
    return invalid_arg("kv frame: payload {} bytes exceeds the limit {}", h->payload, kMaxPayload);
  }
  if (h->partition >= kMaxPartitions) {
    return invalid_arg("kv frame: partition {} out of range", h->partition);
  }
  return ok_status();
}

Status check_request(const Header& h, uint32_t workers, const coll::Codec* codec) {
  if (h.worker >= workers) {
    return invalid_arg("kv {}: worker {} out of range (the store has {} workers)",
                       type_name(h.type), h.worker, workers);
  }
  const bool pushes = h.type == Type::kPush || h.type == Type::kPushPull;
  if (h.flags != 0 && !pushes) {
    return invalid_arg("kv {}: flags {:#x} on a frame that carries no encoding", type_name(h.type),
                       h.flags);
  }
  if (pushes && codec != nullptr && h.flags == 0) {
    return invalid_arg("kv {}: a raw push to a store whose pushes are encoded ({})",
                       type_name(h.type), coll::format_codec_spec(codec->spec()));
  }
  if (h.flags != 0) {
    if (codec == nullptr) {
      return invalid_arg("kv {}: an encoded push (codec {}) to a store without a codec",
                         type_name(h.type), h.flags);
    }
    if (h.flags != static_cast<uint16_t>(codec->spec().kind)) {
      return invalid_arg("kv {}: codec {} is not the store's ({} = {})", type_name(h.type), h.flags,
                         coll::format_codec_spec(codec->spec()),
                         static_cast<int>(codec->spec().kind));
    }
    const auto dt = static_cast<coll::DataType>(h.dtype);
    if (dt != coll::DataType::kF32 && dt != coll::DataType::kF64 && dt != coll::DataType::kF16 &&
        dt != coll::DataType::kBF16) {
      return invalid_arg(
          "kv {}: an encoded push of dtype {} (only float32, float64, float16 and bfloat16 are "
          "encoded)",
          type_name(h.type), h.dtype);
    }
    // The server decodes it into f32, then into the dtype: both within kMaxPayload.
    if (h.count == 0 || h.count > kMaxPayload / std::max(sizeof(float), coll::dtype_size(dt))) {
      return invalid_arg("kv {}: partition count {} out of range", type_name(h.type), h.count);
    }
    if (h.total < h.count) {
      return invalid_arg("kv {}: key count {} < partition count {}", type_name(h.type), h.total,
                         h.count);
    }
    const uint64_t want = codec->encoded_size(h.count);
    if (h.payload != want) {
      return invalid_arg("kv {}: payload {} bytes, the {} encoding of {} elements is {}",
                         type_name(h.type), h.payload, coll::codec_name(codec->spec().kind),
                         h.count, want);
    }
    return ok_status();
  }
  const size_t elem = coll::dtype_size(static_cast<coll::DataType>(h.dtype));
  switch (h.type) {
    case Type::kInit:
    case Type::kPush:
    case Type::kPull:
    case Type::kPushPull: {
      if (h.count == 0 || h.count > kMaxPayload / elem) {
        return invalid_arg("kv {}: partition count {} out of range", type_name(h.type), h.count);
      }
      if (h.total < h.count) {
        return invalid_arg("kv {}: key count {} < partition count {}", type_name(h.type), h.total,
                           h.count);
      }
      const uint64_t want = carries_value(h.type) ? h.count * elem : 0;
      if (h.payload != want) {
        return invalid_arg("kv {}: payload {} bytes, expected {} ({} x {} bytes)",
                           type_name(h.type), h.payload, want, h.count, elem);
      }
      return ok_status();
    }
    case Type::kClock:
    case Type::kBye:
      if (h.payload != 0) return invalid_arg("kv {}: unexpected payload", type_name(h.type));
      return ok_status();
    case Type::kHello:
      if (h.payload < kHelloFixedBytes ||
          h.payload > kHelloFixedBytes + kMaxCodecSpecBytes + kMaxTokenBytes) {
        return invalid_arg("kv hello: payload {} bytes out of range", h.payload);
      }
      return ok_status();
    case Type::kReply:
    case Type::kError:
      return invalid_arg("kv: a worker sent a {} frame", type_name(h.type));
  }
  return invalid_arg("kv: unknown frame");
}

Status check_reply(const Header& h) {
  if (h.type == Type::kError) {
    if (h.payload > kMaxErrorBytes) return invalid_arg("kv error: message too long");
    return ok_status();
  }
  if (h.type != Type::kReply) {
    return invalid_arg("kv: a server sent a {} frame", type_name(h.type));
  }
  const size_t elem = coll::dtype_size(static_cast<coll::DataType>(h.dtype));
  if (h.payload != 0 && h.payload != h.count * elem) {
    return invalid_arg("kv reply: payload {} bytes for {} elements of {} bytes", h.payload, h.count,
                       elem);
  }
  return ok_status();
}

std::vector<uint8_t> encode_hello(const StoreConfig& c, const std::string& token) {
  std::vector<uint8_t> out(kHelloFixedBytes + c.codec.size() + token.size());
  uint8_t* p = out.data();
  put<uint32_t>(p + 0, c.workers);
  put<uint32_t>(p + 4, c.mode);
  put<int32_t>(p + 8, c.staleness);
  put<int32_t>(p + 12, c.sync_k);
  put<uint32_t>(p + 16, c.update);
  put<uint32_t>(p + 20, static_cast<uint32_t>(c.codec.size()));
  put<double>(p + 24, c.lr);
  put<double>(p + 32, c.momentum);
  put<uint64_t>(p + 40, c.partition_bytes);
  put<uint64_t>(p + 48, c.chunk_bytes);
  if (!c.codec.empty()) std::memcpy(p + kHelloFixedBytes, c.codec.data(), c.codec.size());
  // The token's length is the rest of the payload.
  if (!token.empty()) {
    std::memcpy(p + kHelloFixedBytes + c.codec.size(), token.data(), token.size());
  }
  return out;
}

Status decode_hello(const uint8_t* p, size_t n, StoreConfig* c, std::string* token) {
  if (n < kHelloFixedBytes || n > kHelloFixedBytes + kMaxCodecSpecBytes + kMaxTokenBytes) {
    return invalid_arg("kv hello: {} bytes out of range", n);
  }
  c->workers = get<uint32_t>(p + 0);
  c->mode = get<uint32_t>(p + 4);
  c->staleness = get<int32_t>(p + 8);
  c->sync_k = get<int32_t>(p + 12);
  c->update = get<uint32_t>(p + 16);
  const uint32_t codec_len = get<uint32_t>(p + 20);
  if (codec_len > kMaxCodecSpecBytes || codec_len > n - kHelloFixedBytes) {
    return invalid_arg("kv hello: codec spec of {} bytes out of range (at most {})", codec_len,
                       kMaxCodecSpecBytes);
  }
  c->lr = get<double>(p + 24);
  c->momentum = get<double>(p + 32);
  c->partition_bytes = get<uint64_t>(p + 40);
  c->chunk_bytes = get<uint64_t>(p + 48);
  c->codec.assign(reinterpret_cast<const char*>(p + kHelloFixedBytes), codec_len);
  const size_t at = kHelloFixedBytes + codec_len;
  if (n - at > kMaxTokenBytes) return invalid_arg("kv hello: token of {} bytes", n - at);
  token->assign(reinterpret_cast<const char*>(p + at), n - at);
  return check_config(*c);
}

Status check_config(const StoreConfig& c) {
  if (c.workers == 0 || c.workers > kMaxWorkers) {
    return invalid_arg("workers {} out of range [1, {}]", c.workers, kMaxWorkers);
  }
  if (c.mode > 3) return invalid_arg("mode {} is not a gw_kv_mode_t", c.mode);
  if (c.update > 1) return invalid_arg("update {} is not a gw_kv_update_t", c.update);
  if (c.mode == 1 && c.staleness < 0) return invalid_arg("ssp staleness {} < 0", c.staleness);
  if (c.mode == 3 && (c.sync_k < 1 || static_cast<uint32_t>(c.sync_k) > c.workers)) {
    return invalid_arg("sync_k {} out of range [1, {}] (the workers)", c.sync_k, c.workers);
  }
  if (c.update == 1) {
    if (!(std::isfinite(c.lr) && c.lr > 0)) return invalid_arg("sgd lr {} must be > 0", c.lr);
    if (!(std::isfinite(c.momentum) && c.momentum >= 0 && c.momentum < 1)) {
      return invalid_arg("sgd momentum {} must be in [0, 1)", c.momentum);
    }
  }
  if (c.partition_bytes < 64 || c.partition_bytes > kMaxPartitionBytes) {
    return invalid_arg("partition_bytes {} out of range [64, {}]", c.partition_bytes,
                       kMaxPartitionBytes);
  }
  if (c.chunk_bytes != 0 && (c.chunk_bytes < 64 || c.chunk_bytes > kMaxPartitionBytes)) {
    return invalid_arg("chunk_bytes {} out of range (0, or [64, {}])", c.chunk_bytes,
                       kMaxPartitionBytes);
  }
  if (!c.codec.empty()) {
    GW_ASSIGN_OR_RETURN(coll::CodecSpec spec, check_codec_spec(c.codec));
    if (coll::format_codec_spec(spec) != c.codec) {
      return invalid_arg("codec \"{}\" is not in its canonical form \"{}\"", c.codec,
                         coll::format_codec_spec(spec));
    }
  }
  return ok_status();
}

Result<coll::CodecSpec> check_codec_spec(std::string_view text) {
  if (text.size() > kMaxCodecSpecBytes) {
    return invalid_arg("codec spec of {} bytes (at most {})", text.size(), kMaxCodecSpecBytes);
  }
  GW_ASSIGN_OR_RETURN(coll::CodecSpec spec, coll::parse_codec_spec(text));
  if (spec.kind == coll::CodecKind::kNone) {
    return invalid_arg("codec \"{}\": none encodes nothing (pass no codec)", text);
  }
  if (spec.kind == coll::CodecKind::kPowerSgd) {
    return invalid_arg(
        "codec \"{}\": powersgd is a low-rank protocol between ranks, not a byte codec a push "
        "can carry; use gw_allreduce_compressed for it, or fp16, bf16, topk, randomk, sign or "
        "qsgd for kv pushes",
        text);
  }
  GW_ASSIGN_OR_RETURN(auto codec, coll::Codec::create(spec));
  (void)codec;
  return spec;
}

std::string mode_text(const StoreConfig& c) {
  switch (c.mode) {
    case 0:
      return "bsp";
    case 1:
      return fmt::format("ssp:{}", c.staleness);
    case 2:
      return "asp";
    case 3:
      return fmt::format("sync:{}", c.sync_k);
    default:
      return fmt::format("mode {}", c.mode);
  }
}

std::string update_text(const StoreConfig& c) {
  if (c.update == 0) return "sum";
  if (c.momentum == 0) return fmt::format("sgd:{}", c.lr);
  return fmt::format("sgd:{},momentum={}", c.lr, c.momentum);
}

}  // namespace gw::kv
