// The parameter server's frames (kv/wire.h) as a server decodes them, then through one store's
// rules (kv/rules.h), and as a worker decodes replies (fuzz_targets.h).
#include <cstring>
#include <vector>

#include "collectives/compress/codec.h"
#include "kv/push_codec.h"
#include "kv/rules.h"
#include "kv/wire.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

std::vector<uint8_t> frame(kv::Header h, const std::vector<uint8_t>& payload) {
  h.payload = static_cast<uint32_t>(payload.size());
  std::vector<uint8_t> out(kv::kHeaderBytes);
  kv::encode_header(h, out.data());
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

}  // namespace

// The store's codec by bits 3-4 of the config byte: none, fp16, topk:0.5, sign (canonical forms).
const char* fuzz_codec(uint8_t cfg) {
  static const char* const kCodecs[] = {"", "fp16,ef=0", "topk:0.5,ef=1", "sign,ef=1,chunk=2048"};
  return kCodecs[(cfg >> 3) & 3];
}

// Input: a config byte (mode, update, codec), then frames (80-byte header + payload) back to
// back. Encoded pushes are decoded as a server does (kv/push_codec.h) before the rules see them.
int kv_frames(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  kv::StoreConfig c;
  c.workers = 3;
  c.mode = data[0] & 3;
  c.staleness = 1;
  c.sync_k = 2;
  c.update = (data[0] >> 2) & 1;
  c.lr = 0.5;
  c.momentum = 0.25;
  c.partition_bytes = 4096;
  c.chunk_bytes = (data[0] & 32) != 0 ? 1024 : 0;  // the rules see units alike either way
  c.codec = fuzz_codec(data[0]);
  check(kv::check_config(c).ok(), "kv: the fuzz config is valid");
  std::unique_ptr<coll::Codec> codec;
  if (!c.codec.empty()) {
    auto made = coll::Codec::create(*kv::check_codec_spec(c.codec));
    check(made.ok(), "kv: the fuzz codec is made");
    codec = std::move(*made);
  }
  kv::StoreRules rules(c, 0);
  std::vector<uint8_t> decoded;
  size_t at = 1;
  std::vector<kv::Answer> out;
  while (at + kv::kHeaderBytes <= size) {
    kv::Header h;
    const uint8_t* head = data + at;
    at += kv::kHeaderBytes;
    if (!kv::decode_header(head, &h).ok()) break;
    ++counter("kv.decoded");
    uint8_t again[kv::kHeaderBytes];
    kv::encode_header(h, again);
    check(std::memcmp(again, head, kv::kHeaderBytes) == 0, "kv: header round trip");
    (void)kv::check_reply(h);
    if (!kv::check_request(h, c.workers, codec.get()).ok()) break;
    if (h.payload > size - at) break;
    const uint8_t* payload = data + at;
    at += h.payload;
    if (h.type == kv::Type::kHello) {
      kv::StoreConfig hc;
      std::string token;
      (void)kv::decode_hello(payload, h.payload, &hc, &token);
      continue;
    }
    std::vector<uint8_t> copy(payload, payload + h.payload);  // the rules read exactly this
    if (h.flags != 0) {
      if (!kv::decode_push(*codec, &h, copy.data(), &decoded).ok()) break;
      ++counter("kv.decoded_push");
      if (h.dtype != static_cast<uint8_t>(coll::DataType::kF32))
        ++counter("kv.decoded_push_converted");
      check(h.flags == 0 &&
                h.payload == h.count * coll::dtype_size(static_cast<coll::DataType>(h.dtype)),
            "kv: a decoded push is raw, in its dtype");
      copy = decoded;
    }
    out.clear();
    if (h.type == kv::Type::kBye) {
      rules.on_bye(h.worker, &out);
    } else {
      rules.on_frame(h, copy.data(), &out);
    }
    ++counter("kv.applied");
    for (const kv::Answer& a : out) {
      check(a.reply.payload == a.payload.size(), "kv: an answer's payload size is its header's");
      check(kv::check_reply(a.reply).ok(), "kv: every answer passes the worker's checks");
      check(a.worker < c.workers, "kv: answers go to a worker of the store");
    }
  }
  return 0;
}

std::vector<std::vector<uint8_t>> kv_seeds() {
  std::vector<std::vector<uint8_t>> seeds;
  for (uint8_t cfg : {0, 1, 2, 3, 4, 7, 8, 16 | 2, 24 | 4}) {
    std::vector<uint8_t> s = {cfg};
    std::unique_ptr<coll::Codec> codec;
    if (*fuzz_codec(cfg) != '\0')
      codec = std::move(*coll::Codec::create(*kv::check_codec_spec(fuzz_codec(cfg))));
    std::vector<uint8_t> value(16);
    float f[4] = {1, 2, 3, 4};
    std::memcpy(value.data(), f, sizeof(f));
    for (uint32_t w = 0; w < 3; ++w) {
      kv::Header h;
      h.type = kv::Type::kInit;
      h.worker = w;
      h.key = 5;
      h.count = h.total = 4;
      h.req_id = 1;
      auto fr = frame(h, value);
      s.insert(s.end(), fr.begin(), fr.end());
      h.type = kv::Type::kPush;
      h.req_id = 2;
      if (codec) {  // the push as a worker encodes it
        std::vector<uint8_t> enc(codec->encoded_size(4));
        (void)codec->encode(f, nullptr, 4, enc.data(), enc.size(), kv::push_context(5, 0, 0, w));
        h.flags = static_cast<uint16_t>(codec->spec().kind);
        fr = frame(h, enc);
        h.flags = 0;
      } else {
        fr = frame(h, value);
      }
      s.insert(s.end(), fr.begin(), fr.end());
      if (codec) {  // a float16 key: encoded as f32, decoded back into float16 by the server
        kv::Header k16 = h;
        k16.type = kv::Type::kInit;
        k16.key = 6;
        k16.dtype = static_cast<uint8_t>(coll::DataType::kF16);
        k16.req_id = 4;
        fr = frame(k16, std::vector<uint8_t>(8, 0x3c));
        s.insert(s.end(), fr.begin(), fr.end());
        k16.type = kv::Type::kPush;
        k16.req_id = 5;
        std::vector<uint8_t> enc(codec->encoded_size(4));
        (void)codec->encode(f, nullptr, 4, enc.data(), enc.size(), kv::push_context(6, 0, 0, w));
        k16.flags = static_cast<uint16_t>(codec->spec().kind);
        fr = frame(k16, enc);
        s.insert(s.end(), fr.begin(), fr.end());
      }
      h.type = kv::Type::kPull;
      h.req_id = 3;
      fr = frame(h, {});
      s.insert(s.end(), fr.begin(), fr.end());
      kv::Header ck;
      ck.type = kv::Type::kClock;
      ck.worker = w;
      ck.clock = 1;
      fr = frame(ck, {});
      s.insert(s.end(), fr.begin(), fr.end());
    }
    kv::Header hello;
    hello.type = kv::Type::kHello;
    kv::StoreConfig c;
    c.workers = 3;
    c.partition_bytes = 4096;
    c.chunk_bytes = (cfg & 1) != 0 ? 1024 : 0;  // version 2's field: streamed partitions
    auto fr = frame(hello, kv::encode_hello(c, "token"));
    s.insert(s.end(), fr.begin(), fr.end());
    kv::Header bye;
    bye.type = kv::Type::kBye;
    fr = frame(bye, {});
    s.insert(s.end(), fr.begin(), fr.end());
    seeds.push_back(std::move(s));
  }
  return seeds;
}

}  // namespace gw::fuzz
