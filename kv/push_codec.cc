#include "kv/push_codec.h"

#include <cstring>

#include "collectives/types.h"

namespace gw::kv {

static_assert(static_cast<int>(coll::CodecKind::kQsgd) == kMaxCodecFlag,
              "kv frames name a codec by its coll::CodecKind");

coll::CodecContext push_context(uint64_t key, uint32_t partition, uint64_t step, uint32_t worker) {
  coll::CodecContext ctx;
  // One hash per (key, partition): every worker's randomk picks the same indices for it.
  ctx.key_hash = key * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(partition) << 1 | 1);
  ctx.step = step;
  ctx.rank = static_cast<int>(worker);
  return ctx;
}

Result<std::unique_ptr<PushEncoder>> PushEncoder::create(const std::string& spec, uint32_t worker) {
  GW_ASSIGN_OR_RETURN(coll::CodecSpec s, check_codec_spec(spec));
  GW_ASSIGN_OR_RETURN(std::unique_ptr<coll::Codec> codec, coll::Codec::create(s));
  return std::unique_ptr<PushEncoder>(new PushEncoder(std::move(codec), worker));
}

Result<std::shared_ptr<std::vector<uint8_t>>> PushEncoder::encode(uint64_t key, uint32_t partition,
                                                                  const float* v, size_t n,
                                                                  uint64_t* step) {
  auto out = std::make_shared<std::vector<uint8_t>>(codec_->encoded_size(n));
  std::lock_guard<std::mutex> lock(mu_);
  State& st = states_[{key, partition}];
  float* residual = nullptr;
  if (codec_->spec().error_feedback) {
    if (st.residual.size() != n) st.residual.assign(n, 0.0f);
    residual = st.residual.data();
  }
  *step = st.step;
  GW_RETURN_IF_ERROR(codec_->encode(v, residual, n, out->data(), out->size(),
                                    push_context(key, partition, st.step, worker_)));
  ++st.step;
  return out;
}

std::vector<float> PushEncoder::residual(uint64_t key, uint32_t partition) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = states_.find({key, partition});
  return it == states_.end() ? std::vector<float>{} : it->second.residual;
}

Status decode_push(const coll::Codec& codec, Header* h, const uint8_t* payload,
                   std::vector<uint8_t>* scratch) {
  scratch->resize(h->count * sizeof(float));
  Status s = codec.decode(payload, h->payload, h->count, reinterpret_cast<float*>(scratch->data()),
                          push_context(h->key, h->partition, h->aux, h->worker));
  if (!s.ok()) {
    return s.with_context(fmt::format("kv {} of key {} partition {} by worker {}",
                                      type_name(h->type), h->key, h->partition, h->worker));
  }
  h->flags = 0;
  h->aux = 0;
  h->payload = static_cast<uint32_t>(scratch->size());
  return ok_status();
}

}  // namespace gw::kv
