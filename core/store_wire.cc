#include "core/store_wire.h"

#include <charconv>
#include <cstring>

namespace gw::store_wire {

namespace {

void put_u8(Bytes& b, uint8_t v) { b.push_back(v); }
void put_u16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v));
  b.push_back(static_cast<uint8_t>(v >> 8));
}
void put_u32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_u64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void put_bytes(Bytes& b, const void* p, size_t n) {
  const auto* c = static_cast<const uint8_t*>(p);
  b.insert(b.end(), c, c + n);
}

// Reads fields from a body, refusing to step past its end.
class Reader {
 public:
  Reader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool u8(uint8_t* v) {
    if (n_ - off_ < 1) return false;
    *v = p_[off_++];
    return true;
  }
  bool u16(uint16_t* v) {
    if (n_ - off_ < 2) return false;
    *v = static_cast<uint16_t>(p_[off_] | (p_[off_ + 1] << 8));
    off_ += 2;
    return true;
  }
  bool u32(uint32_t* v) {
    if (n_ - off_ < 4) return false;
    uint32_t r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<uint32_t>(p_[off_ + i]) << (8 * i);
    *v = r;
    off_ += 4;
    return true;
  }
  bool u64(uint64_t* v) {
    if (n_ - off_ < 8) return false;
    uint64_t r = 0;
    for (int i = 0; i < 8; ++i) r |= static_cast<uint64_t>(p_[off_ + i]) << (8 * i);
    *v = r;
    off_ += 8;
    return true;
  }
  // Only after the caller checked `len` against its limit.
  bool str(size_t len, std::string* s) {
    if (n_ - off_ < len) return false;
    s->assign(reinterpret_cast<const char*>(p_ + off_), len);
    off_ += len;
    return true;
  }
  bool bytes(size_t len, Bytes* b) {
    if (n_ - off_ < len) return false;
    b->assign(p_ + off_, p_ + off_ + len);
    off_ += len;
    return true;
  }
  bool raw(uint8_t* out, size_t len) {
    if (n_ - off_ < len) return false;
    std::memcpy(out, p_ + off_, len);
    off_ += len;
    return true;
  }
  size_t remaining() const { return n_ - off_; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
};

Bytes frame(Bytes body) {
  Bytes out;
  out.reserve(body.size() + kHeaderSize);
  put_u32(out, static_cast<uint32_t>(body.size()));
  put_bytes(out, body.data(), body.size());
  return out;
}

Status truncated(std::string_view what) {
  return peer_error("store protocol: truncated {} message", what);
}

}  // namespace

net::handshake::Transcript transcript(const net::handshake::Nonce& client_challenge,
                                      const net::handshake::Nonce& server_challenge) {
  net::handshake::Transcript t;
  t.protocol = "store";
  t.connector_challenge = client_challenge;
  t.listener_challenge = server_challenge;
  return t;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::kHello:
      return "hello";
    case Op::kSet:
      return "set";
    case Op::kGet:
      return "get";
    case Op::kAdd:
      return "add";
    case Op::kErase:
      return "erase";
    case Op::kAuth:
      return "auth";
  }
  return "?";
}

Status check_key(std::string_view key) {
  if (key.empty()) return invalid_arg("store key is empty");
  if (key.size() > kMaxKey) {
    return invalid_arg("store key of {} bytes exceeds the limit of {} bytes", key.size(), kMaxKey);
  }
  return ok_status();
}

Status check_value_size(size_t size) {
  if (size > kMaxValue) {
    return invalid_arg("store value of {} bytes exceeds the limit of {} bytes", size, kMaxValue);
  }
  return ok_status();
}

Result<Bytes> encode_request(const Request& r) {
  Bytes b;
  put_u8(b, static_cast<uint8_t>(r.op));
  switch (r.op) {
    case Op::kHello:
      put_u32(b, kMagic);
      put_u16(b, r.version);
      put_bytes(b, r.challenge.data(), r.challenge.size());
      break;
    case Op::kAuth:
      put_bytes(b, r.proof.data(), r.proof.size());
      break;
    case Op::kSet:
    case Op::kGet:
    case Op::kAdd:
    case Op::kErase:
      GW_RETURN_IF_ERROR(check_key(r.key));
      put_u16(b, static_cast<uint16_t>(r.key.size()));
      put_bytes(b, r.key.data(), r.key.size());
      if (r.op == Op::kSet) {
        GW_RETURN_IF_ERROR(check_value_size(r.value.size()));
        put_u32(b, static_cast<uint32_t>(r.value.size()));
        put_bytes(b, r.value.data(), r.value.size());
      } else if (r.op == Op::kGet) {
        put_u32(b, r.wait_ms);
      } else if (r.op == Op::kAdd) {
        put_u64(b, static_cast<uint64_t>(r.delta));
      }
      break;
    default:
      return invalid_arg("unknown store op {}", static_cast<int>(r.op));
  }
  return frame(std::move(b));
}

Bytes encode_response(Op op, const Response& r) {
  Bytes b;
  put_u8(b, static_cast<uint8_t>(r.code));
  if (r.code == ReplyCode::kError) {
    size_t n = std::min(r.message.size(), kMaxMessage);
    put_u16(b, static_cast<uint16_t>(n));
    put_bytes(b, r.message.data(), n);
  } else if (r.code == ReplyCode::kOk) {
    if (op == Op::kGet) {
      put_u32(b, static_cast<uint32_t>(r.value.size()));
      put_bytes(b, r.value.data(), r.value.size());
    } else if (op == Op::kAdd) {
      put_u64(b, static_cast<uint64_t>(r.number));
    } else if (op == Op::kHello) {
      put_bytes(b, r.challenge.data(), r.challenge.size());
      put_bytes(b, r.proof.data(), r.proof.size());
    }
  }
  return frame(std::move(b));
}

Result<uint32_t> decode_length(const uint8_t* header) {
  uint32_t len = 0;
  Reader rd(header, kHeaderSize);
  rd.u32(&len);
  if (len == 0) return peer_error("store protocol: empty frame");
  if (len > kMaxBody) {
    return peer_error("store protocol: frame of {} bytes exceeds the limit of {} bytes", len,
                      kMaxBody);
  }
  return len;
}

Result<Request> decode_request(const uint8_t* body, size_t size) {
  Reader rd(body, size);
  uint8_t op = 0;
  if (!rd.u8(&op)) return truncated("request");
  Request r;
  r.op = static_cast<Op>(op);
  switch (r.op) {
    case Op::kHello: {
      uint32_t magic = 0;
      if (!rd.u32(&magic) || !rd.u16(&r.version)) return truncated("hello");
      if (magic != kMagic) return peer_error("store protocol: bad magic {:#x} in hello", magic);
      // Another version's hello is not parsed further: the server answers "not supported".
      if (r.version != kVersion) return r;
      if (!rd.raw(r.challenge.data(), r.challenge.size())) return truncated("hello");
      break;
    }
    case Op::kAuth:
      if (!rd.raw(r.proof.data(), r.proof.size())) return truncated("auth");
      break;
    case Op::kSet:
    case Op::kGet:
    case Op::kAdd:
    case Op::kErase: {
      uint16_t klen = 0;
      if (!rd.u16(&klen)) return truncated(op_name(r.op));
      if (klen == 0 || klen > kMaxKey) {
        return peer_error("store protocol: key length {} outside 1..{}", klen, kMaxKey);
      }
      if (!rd.str(klen, &r.key)) return truncated(op_name(r.op));
      if (r.op == Op::kSet) {
        uint32_t vlen = 0;
        if (!rd.u32(&vlen)) return truncated("set");
        if (vlen > kMaxValue) {
          return peer_error("store protocol: value of {} bytes exceeds the limit of {} bytes", vlen,
                            kMaxValue);
        }
        if (!rd.bytes(vlen, &r.value)) return truncated("set");
      } else if (r.op == Op::kGet) {
        if (!rd.u32(&r.wait_ms)) return truncated("get");
      } else if (r.op == Op::kAdd) {
        uint64_t d = 0;
        if (!rd.u64(&d)) return truncated("add");
        r.delta = static_cast<int64_t>(d);
      }
      break;
    }
    default:
      return peer_error("store protocol: unknown op {}", op);
  }
  if (rd.remaining() != 0) {
    return peer_error("store protocol: {} unexpected trailing bytes in {}", rd.remaining(),
                      op_name(r.op));
  }
  return r;
}

Result<Response> decode_response(Op op, const uint8_t* body, size_t size) {
  Reader rd(body, size);
  uint8_t code = 0;
  if (!rd.u8(&code)) return truncated("reply");
  Response r;
  if (code > static_cast<uint8_t>(ReplyCode::kError)) {
    return peer_error("store protocol: unknown reply code {}", code);
  }
  r.code = static_cast<ReplyCode>(code);
  if (r.code == ReplyCode::kError) {
    uint16_t mlen = 0;
    if (!rd.u16(&mlen)) return truncated("error reply");
    if (mlen > kMaxMessage) return peer_error("store protocol: error message too long");
    if (!rd.str(mlen, &r.message)) return truncated("error reply");
  } else if (r.code == ReplyCode::kOk) {
    if (op == Op::kGet) {
      uint32_t vlen = 0;
      if (!rd.u32(&vlen)) return truncated("get reply");
      if (vlen > kMaxValue) {
        return peer_error("store protocol: value of {} bytes exceeds the limit", vlen);
      }
      if (!rd.bytes(vlen, &r.value)) return truncated("get reply");
    } else if (op == Op::kAdd) {
      uint64_t n = 0;
      if (!rd.u64(&n)) return truncated("add reply");
      r.number = static_cast<int64_t>(n);
    } else if (op == Op::kHello) {
      if (!rd.raw(r.challenge.data(), r.challenge.size()) ||
          !rd.raw(r.proof.data(), r.proof.size())) {
        return truncated("hello reply");
      }
    }
  }
  if (rd.remaining() != 0) {
    return peer_error("store protocol: {} unexpected trailing bytes in {} reply", rd.remaining(),
                      op_name(op));
  }
  return r;
}

bool parse_counter(const Bytes& value, int64_t* out) {
  if (value.empty() || value.size() > 20) return false;
  const char* b = reinterpret_cast<const char*>(value.data());
  const char* e = b + value.size();
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || ptr != e) return false;
  *out = v;
  return true;
}

Bytes format_counter(int64_t value) {
  std::string s = std::to_string(value);
  return Bytes(s.begin(), s.end());
}

}  // namespace gw::store_wire
