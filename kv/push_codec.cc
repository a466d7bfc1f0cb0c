#include "kv/push_codec.h"

#include <cstring>

#include "collectives/reduce.h"
#include "collectives/types.h"

namespace gw::kv {

namespace {

using coll::DataType;

void to_f32(const void* v, DataType dtype, size_t n, float* out) {
  switch (dtype) {
    case DataType::kF64:
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(static_cast<const double*>(v)[i]);
      break;
    case DataType::kF16:
      for (size_t i = 0; i < n; ++i)
        out[i] = coll::half_to_float(static_cast<const uint16_t*>(v)[i]);
      break;
    case DataType::kBF16:
      for (size_t i = 0; i < n; ++i)
        out[i] = coll::bf16_to_float(static_cast<const uint16_t*>(v)[i]);
      break;
    default:
      std::memcpy(out, v, n * sizeof(float));
  }
}

void from_f32(const float* f, DataType dtype, size_t n, void* out) {
  switch (dtype) {
    case DataType::kF64:
      for (size_t i = 0; i < n; ++i) static_cast<double*>(out)[i] = f[i];
      break;
    case DataType::kF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(out)[i] = coll::float_to_half(f[i]);
      break;
    case DataType::kBF16:
      for (size_t i = 0; i < n; ++i) static_cast<uint16_t*>(out)[i] = coll::float_to_bf16(f[i]);
      break;
    default:
      std::memcpy(out, f, n * sizeof(float));
  }
}

// What the server's rounding into dtype leaves of x (x itself for f32 and f64).
float as_applied(float x, DataType dtype) {
  if (dtype == DataType::kF16) return coll::half_to_float(coll::float_to_half(x));
  if (dtype == DataType::kBF16) return coll::bf16_to_float(coll::float_to_bf16(x));
  return x;
}

}  // namespace

bool encodable_dtype(coll::DataType dtype) {
  return dtype == DataType::kF32 || dtype == DataType::kF64 || dtype == DataType::kF16 ||
         dtype == DataType::kBF16;
}

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

float* PushEncoder::residual_of(State& st, size_t n) const {
  if (!codec_->spec().error_feedback) return nullptr;
  if (st.residual.size() != n) st.residual.assign(n, 0.0f);
  return st.residual.data();
}

Result<std::shared_ptr<std::vector<uint8_t>>> PushEncoder::encode(uint64_t key, uint32_t partition,
                                                                  const float* v, size_t n,
                                                                  uint64_t* step) {
  auto out = std::make_shared<std::vector<uint8_t>>(codec_->encoded_size(n));
  std::lock_guard<std::mutex> lock(mu_);
  State& st = states_[{key, partition}];
  float* residual = residual_of(st, n);
  *step = st.step;
  GW_RETURN_IF_ERROR(codec_->encode(v, residual, n, out->data(), out->size(),
                                    push_context(key, partition, st.step, worker_)));
  ++st.step;
  return out;
}

Result<std::shared_ptr<std::vector<uint8_t>>> PushEncoder::encode(uint64_t key, uint32_t partition,
                                                                  const void* v,
                                                                  coll::DataType dtype, size_t n,
                                                                  uint64_t* step) {
  if (dtype == DataType::kF32) return encode(key, partition, static_cast<const float*>(v), n, step);
  if (!encodable_dtype(dtype)) {
    return invalid_arg("kv: a push of {} cannot be encoded (floating dtypes only)",
                       coll::dtype_name(dtype));
  }
  std::vector<float> x(n);
  to_f32(v, dtype, n, x.data());
  auto out = std::make_shared<std::vector<uint8_t>>(codec_->encoded_size(n));
  std::lock_guard<std::mutex> lock(mu_);
  State& st = states_[{key, partition}];
  float* residual = residual_of(st, n);
  const coll::CodecContext ctx = push_context(key, partition, st.step, worker_);
  if (residual != nullptr && dtype == DataType::kF64) {
    // The low bits the conversion dropped join the residual before the codec adds it.
    const auto* d = static_cast<const double*>(v);
    for (size_t i = 0; i < n; ++i) residual[i] += static_cast<float>(d[i] - double(x[i]));
  }
  *step = st.step;
  GW_RETURN_IF_ERROR(codec_->encode(x.data(), residual, n, out->data(), out->size(), ctx));
  if (residual != nullptr && dtype != DataType::kF64) {
    // residual = sent - decoded; the server applies decoded rounded into the key's dtype, so what
    // that rounding drops is the worker's to carry too.
    std::vector<float> decoded(n);
    GW_RETURN_IF_ERROR(codec_->decode(out->data(), out->size(), n, decoded.data(), ctx));
    for (size_t i = 0; i < n; ++i) residual[i] += decoded[i] - as_applied(decoded[i], dtype);
  }
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
  const auto dtype = static_cast<DataType>(h->dtype);
  std::vector<float> wide;  // keys other than f32: decoded here, then converted into *scratch
  float* f = nullptr;
  if (dtype == DataType::kF32) {
    scratch->resize(h->count * sizeof(float));
    f = reinterpret_cast<float*>(scratch->data());
  } else {
    wide.resize(h->count);
    f = wide.data();
  }
  Status s = codec.decode(payload, h->payload, h->count, f,
                          push_context(h->key, h->partition, h->aux, h->worker));
  if (!s.ok()) {
    return s.with_context(fmt::format("kv {} of key {} partition {} by worker {}",
                                      type_name(h->type), h->key, h->partition, h->worker));
  }
  if (dtype != DataType::kF32) {
    scratch->resize(h->count * coll::dtype_size(dtype));
    from_f32(f, dtype, h->count, scratch->data());
  }
  h->flags = 0;
  h->aux = 0;
  h->payload = static_cast<uint32_t>(scratch->size());
  return ok_status();
}

}  // namespace gw::kv
