#include "perf/gpu/gpu_check.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "collectives/compress/codec_kernels.h"
#include "collectives/reduce.h"
#include "gpudirect/cast16_math.h"
#include "gpudirect/device_buffer.h"
#include "gpudirect/gpu_codecs.h"

namespace gw::cuda::check {

namespace ck = gw::coll::codec_kernels;

namespace {

constexpr int kDevice = 0;
constexpr int64_t kWaitMs = 60000;

// Equal bits, or both NaN (an f32 result whose NaN payload is unspecified: see gpu_codecs.h).
bool same_f32(float a, float b) {
  return cast16::bits_of(a) == cast16::bits_of(b) || (std::isnan(a) && std::isnan(b));
}

// Gradient-like values with the special ones mixed in. `specials` false: finite normal values
// only (for residuals, which are finite in practice).
std::vector<float> random_floats(size_t n, std::mt19937_64& rng, bool specials) {
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-30, 16);
  std::uniform_int_distribution<int> pick(0, 99);
  std::uniform_int_distribution<uint32_t> any;
  static const float kEdges[] = {0.0f,
                                 -0.0f,
                                 65504.0f,
                                 65519.0f,
                                 65520.0f,
                                 -65520.0f,
                                 6.1035156e-05f,
                                 5.9604645e-08f,
                                 2.9802322e-08f,
                                 1.0009765625f,
                                 1.00048828125f,
                                 -3.0517578e-05f,
                                 1e-40f,
                                 -1e-45f,
                                 3.3895314e+38f,
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity()};
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const int p = specials ? pick(rng) : 99;
    if (p < 3) {  // NaN, quiet or signalling, either sign, random payload
      v[i] = cast16::float_of((any(rng) & 0x807FFFFFu) | 0x7F800000u |
                              (any(rng) & 1 ? 0x400000u : 1u));
    } else if (p < 10) {
      v[i] = kEdges[any(rng) % std::size(kEdges)];
    } else if (p < 15) {  // denormal f32
      v[i] = cast16::float_of((any(rng) & 0x807FFFFFu));
    } else if (p < 25) {  // any finite bit pattern
      uint32_t u;
      do u = any(rng);
      while ((u & 0x7F800000u) == 0x7F800000u);
      v[i] = cast16::float_of(u);
    } else {
      v[i] = std::ldexp(gauss(rng), expo(rng));
    }
  }
  return v;
}

template <typename T>
Result<DeviceBuffer> to_device(const std::vector<T>& host, size_t misalign_bytes,
                               size_t extra = 0) {
  GW_ASSIGN_OR_RETURN(auto b, DeviceBuffer::allocate(
                                  kDevice, misalign_bytes + host.size() * sizeof(T) + extra + 16));
  GW_RETURN_IF_ERROR(b.fill(0xA5));  // poison: every element must be written
  if (!host.empty())
    GW_RETURN_IF_ERROR(b.upload(host.data(), host.size() * sizeof(T), misalign_bytes));
  return b;
}

template <typename T>
Result<std::vector<T>> from_device(const DeviceBuffer& b, size_t n, size_t misalign_bytes) {
  std::vector<T> h(n);
  if (n) GW_RETURN_IF_ERROR(b.download(h.data(), n * sizeof(T), misalign_bytes));
  return h;
}

Status wait() {
  GW_ASSIGN_OR_RETURN(const Driver* d, driver());
  // The legacy default stream is the current context's: without one, cuStreamQuery fails with
  // CUDA_ERROR_INVALID_CONTEXT (seen on the H100).
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(kDevice));
  return stream_wait(*d, nullptr, kWaitMs);
}

Status mismatch(const Case& c, std::string_view what, size_t i, std::string_view detail) {
  return internal_error("{}: {} differs at element {}: {}", c.name(), what, i, detail);
}

// The CPU sign encoding of a whole vector (the layout of collectives/compress/codecs/sign.cc).
std::vector<unsigned char> cpu_sign_encode(const float* in, float* residual, size_t n,
                                           size_t chunk) {
  const size_t nchunks = (n + chunk - 1) / chunk;
  std::vector<unsigned char> out(sign_encoded_size(n, chunk), 0);
  for (size_t c = 0; c < nchunks; ++c) {
    const size_t off = c * chunk, cn = std::min(chunk, n - off);
    auto* w = reinterpret_cast<uint64_t*>(out.data() + nchunks * 4 + c * (chunk / 8));
    const float s = ck::sign_encode_chunk(in + off, residual ? residual + off : nullptr, cn, w);
    std::memcpy(out.data() + c * 4, &s, 4);
  }
  return out;
}

}  // namespace

std::string Case::name() const {
  return fmt::format("n={} misalign={} bf16={} ef={} add={} chunk={} seed={}", n, misalign, bf16,
                     ef, add, chunk, seed);
}

Status cast_encode(const Case& c) {
  std::mt19937_64 rng(c.seed);
  const std::vector<float> in = random_floats(c.n, rng, true);
  std::vector<float> res = random_floats(c.n, rng, false);
  for (float& r : res) r = std::ldexp(r, -12);  // a residual is small next to the gradient
  const size_t off4 = 4 * c.misalign, off2 = 2 * c.misalign;
  GW_ASSIGN_OR_RETURN(auto d_in, to_device(in, off4));
  GW_ASSIGN_OR_RETURN(auto d_res, to_device(res, off4));
  GW_ASSIGN_OR_RETURN(auto d_out, to_device(std::vector<uint16_t>(c.n), off2));
  GW_RETURN_IF_ERROR(d_out.fill(0xA5));
  GW_RETURN_IF_ERROR(encode_cast16(d_in.as<float>(off4), c.ef ? d_res.as<float>(off4) : nullptr,
                                   c.n, d_out.as<uint16_t>(off2), c.bf16, nullptr));
  GW_RETURN_IF_ERROR(wait());
  GW_ASSIGN_OR_RETURN(auto g_out, from_device<uint16_t>(d_out, c.n, off2));
  GW_ASSIGN_OR_RETURN(auto g_res, from_device<float>(d_res, c.n, off4));
  std::vector<float> c_res = res;
  std::vector<uint16_t> c_out(c.n);
  ck::encode_cast16(in.data(), c.ef ? c_res.data() : nullptr, c.n, c_out.data(), c.bf16);
  for (size_t i = 0; i < c.n; ++i) {
    if (g_out[i] != c_out[i]) {
      return mismatch(
          c, "payload", i,
          fmt::format("in {:#010x} res {:#010x}: gpu {:#06x} cpu {:#06x}", cast16::bits_of(in[i]),
                      cast16::bits_of(res[i]), g_out[i], c_out[i]));
    }
    if (!same_f32(g_res[i], c_res[i])) {
      return mismatch(c, "residual", i,
                      fmt::format("gpu {:#010x} cpu {:#010x}", cast16::bits_of(g_res[i]),
                                  cast16::bits_of(c_res[i])));
    }
    if (c.ef) {  // error feedback: what was sent plus the new residual is v, exactly
      const float v = in[i] + res[i];
      const float sent =
          c.bf16 ? gw::coll::bf16_to_float(g_out[i]) : gw::coll::half_to_float(g_out[i]);
      if (std::isfinite(v) && std::isfinite(sent) && sent + g_res[i] != v) {
        return mismatch(c, "EF invariant", i, fmt::format("{} + {} != {}", sent, g_res[i], v));
      }
    }
  }
  return ok_status();
}

Status cast_decode(const Case& c) {
  std::mt19937_64 rng(c.seed);
  std::vector<uint16_t> in(c.n);
  std::uniform_int_distribution<uint32_t> any;
  for (auto& h : in) h = static_cast<uint16_t>(any(rng));  // every pattern: NaNs, subnormals
  const std::vector<float> acc = random_floats(c.n, rng, false);
  const size_t off4 = 4 * c.misalign, off2 = 2 * c.misalign;
  GW_ASSIGN_OR_RETURN(auto d_in, to_device(in, off2));
  GW_ASSIGN_OR_RETURN(auto d_acc, to_device(acc, off4));
  GW_RETURN_IF_ERROR(
      decode_cast16(d_in.as<uint16_t>(off2), c.n, d_acc.as<float>(off4), c.bf16, c.add, nullptr));
  GW_RETURN_IF_ERROR(wait());
  GW_ASSIGN_OR_RETURN(auto g, from_device<float>(d_acc, c.n, off4));
  std::vector<float> cpu = acc;
  ck::decode_cast16(in.data(), c.n, cpu.data(), c.bf16, c.add);
  for (size_t i = 0; i < c.n; ++i) {
    // set: a pure bit conversion, identical NaN payloads included.
    const bool ok =
        c.add ? same_f32(g[i], cpu[i]) : cast16::bits_of(g[i]) == cast16::bits_of(cpu[i]);
    if (!ok) {
      return mismatch(c, "decoded value", i,
                      fmt::format("in {:#06x}: gpu {:#010x} cpu {:#010x}", in[i],
                                  cast16::bits_of(g[i]), cast16::bits_of(cpu[i])));
    }
  }
  return ok_status();
}

Status sign_encode(const Case& c) {
  std::mt19937_64 rng(c.seed);
  const std::vector<float> in = random_floats(c.n, rng, c.seed % 2 == 0);  // some runs all finite
  std::vector<float> res = random_floats(c.n, rng, false);
  for (float& r : res) r = std::ldexp(r, -8);
  const size_t off4 = 4 * c.misalign;
  const size_t bytes = sign_encoded_size(c.n, c.chunk);
  GW_ASSIGN_OR_RETURN(auto d_in, to_device(in, off4));
  GW_ASSIGN_OR_RETURN(auto d_res, to_device(res, off4));
  GW_ASSIGN_OR_RETURN(auto d_out, to_device(std::vector<unsigned char>(bytes), off4));
  GW_RETURN_IF_ERROR(d_out.fill(0xA5));
  GW_RETURN_IF_ERROR(gw::cuda::sign_encode(d_in.as<float>(off4),
                                           c.ef ? d_res.as<float>(off4) : nullptr, c.n, c.chunk,
                                           d_out.as<void>(off4), nullptr));
  GW_RETURN_IF_ERROR(wait());
  GW_ASSIGN_OR_RETURN(auto g_enc, from_device<unsigned char>(d_out, bytes, off4));
  GW_ASSIGN_OR_RETURN(auto g_res, from_device<float>(d_res, c.n, off4));
  std::vector<float> c_res = res;
  const auto c_enc = cpu_sign_encode(in.data(), c.ef ? c_res.data() : nullptr, c.n, c.chunk);
  const size_t nchunks = (c.n + c.chunk - 1) / c.chunk;
  for (size_t ch = 0; ch < nchunks; ++ch) {
    float gs, cs;
    std::memcpy(&gs, g_enc.data() + 4 * ch, 4);
    std::memcpy(&cs, c_enc.data() + 4 * ch, 4);
    const size_t cn = std::min(c.chunk, c.n - ch * c.chunk);
    const bool ok = std::isfinite(cs)
                        ? std::fabs(static_cast<double>(gs) - cs) <=
                              sign_scale_tolerance(cn) * std::fabs(static_cast<double>(cs))
                        : same_f32(gs, cs);
    if (!ok) {
      return mismatch(c, "scale of chunk", ch, fmt::format("gpu {} cpu {}", gs, cs));
    }
    for (size_t i = ch * c.chunk; i < ch * c.chunk + cn; ++i) {
      const float v = in[i] + (c.ef ? res[i] : 0.0f);
      const float want = v - std::copysign(gs, v);  // the residual with the GPU's scale
      if (c.ef && !same_f32(g_res[i], want)) {
        return mismatch(c, "residual", i, fmt::format("gpu {} want {}", g_res[i], want));
      }
      if (!c.ef && cast16::bits_of(g_res[i]) != cast16::bits_of(res[i])) {
        return mismatch(c, "residual (must be untouched without ef)", i, "");
      }
    }
  }
  for (size_t b = 4 * nchunks; b < bytes; ++b) {
    if (g_enc[b] != c_enc[b]) {
      return mismatch(c, "bit-word byte", b - 4 * nchunks,
                      fmt::format("gpu {:#04x} cpu {:#04x}", g_enc[b], c_enc[b]));
    }
  }
  return ok_status();
}

Status sign_decode(const Case& c) {
  std::mt19937_64 rng(c.seed);
  const std::vector<float> in = random_floats(c.n, rng, false);
  // A CPU encoding (interchangeable with the GPU's), with a negative, a zero and a NaN scale.
  std::vector<unsigned char> enc = cpu_sign_encode(in.data(), nullptr, c.n, c.chunk);
  const size_t nchunks = (c.n + c.chunk - 1) / c.chunk;
  const float odd[] = {-0.5f, 0.0f, cast16::float_of(0xFFC12345u)};
  for (size_t k = 0; k < std::size(odd) && k < nchunks; ++k) {
    std::memcpy(enc.data() + 4 * (k * 7 % nchunks), &odd[k], 4);
  }
  const std::vector<float> acc = random_floats(c.n, rng, false);
  const size_t off4 = 4 * c.misalign;
  GW_ASSIGN_OR_RETURN(auto d_enc, to_device(enc, off4));
  GW_ASSIGN_OR_RETURN(auto d_acc, to_device(acc, off4));
  GW_RETURN_IF_ERROR(gw::cuda::sign_decode(d_enc.as<void>(off4), c.n, c.chunk,
                                           d_acc.as<float>(off4), c.add, nullptr));
  GW_RETURN_IF_ERROR(wait());
  GW_ASSIGN_OR_RETURN(auto g, from_device<float>(d_acc, c.n, off4));
  std::vector<float> cpu = acc;
  for (size_t ch = 0; ch < nchunks; ++ch) {
    float s;
    std::memcpy(&s, enc.data() + 4 * ch, 4);
    const size_t off = ch * c.chunk, cn = std::min(c.chunk, c.n - off);
    const auto* w =
        reinterpret_cast<const uint64_t*>(enc.data() + nchunks * 4 + ch * (c.chunk / 8));
    if (c.add) {
      ck::sign_decode_add(w, s, cn, cpu.data() + off);
    } else {
      ck::sign_decode_set(w, s, cn, cpu.data() + off);
    }
  }
  for (size_t i = 0; i < c.n; ++i) {
    if (!same_f32(g[i], cpu[i])) {
      return mismatch(
          c, "decoded value", i,
          fmt::format("gpu {:#010x} cpu {:#010x}", cast16::bits_of(g[i]), cast16::bits_of(cpu[i])));
    }
  }
  return ok_status();
}

std::vector<Case> cast_cases() {
  std::vector<Case> out;
  uint64_t seed = 1;
  for (size_t n : {size_t{1}, size_t{3}, size_t{4}, size_t{5}, size_t{63}, size_t{1000},
                   size_t{4097}, size_t{65543}, size_t{1} << 20}) {
    for (size_t mis : {size_t{0}, size_t{1}, size_t{2}}) {
      for (int v = 0; v < 4; ++v) {
        Case c;
        c.n = n;
        c.misalign = mis;
        c.bf16 = v & 1;
        c.ef = c.add = (v & 2) != 0;
        c.seed = seed++;
        out.push_back(c);
      }
    }
  }
  return out;
}

std::vector<Case> sign_cases() {
  std::vector<Case> out;
  uint64_t seed = 1000;
  for (size_t chunk : {size_t{64}, size_t{1024}, size_t{2048}, size_t{3072}, size_t{4096},
                       size_t{8192}, size_t{16384}}) {
    for (size_t n : {size_t{1}, size_t{5}, size_t{64}, chunk - 1, chunk, chunk + 3, 3 * chunk + 17,
                     size_t{200003}}) {
      for (size_t mis : {size_t{0}, size_t{1}}) {
        for (int ef = 0; ef < 2; ++ef) {
          Case c;
          c.n = n;
          c.chunk = chunk;
          c.misalign = mis;
          c.ef = c.add = ef != 0;
          c.seed = seed++;
          out.push_back(c);
        }
      }
    }
  }
  return out;
}

Result<std::vector<BenchRow>> bench(const std::vector<size_t>& sizes, int reps) {
  GW_ASSIGN_OR_RETURN(const Driver* d, driver());
  GW_RETURN_IF_ERROR(codecs_available());
  const size_t max_bytes = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  GW_ASSIGN_OR_RETURN(auto in, DeviceBuffer::allocate(kDevice, max_bytes));
  GW_ASSIGN_OR_RETURN(auto res, DeviceBuffer::allocate(kDevice, max_bytes));
  GW_ASSIGN_OR_RETURN(auto out, DeviceBuffer::allocate(kDevice, max_bytes));
  {  // real data, not zeros: gaussians, uploaded in 64 MiB pieces
    std::mt19937_64 rng(7);
    std::vector<float> host(std::min<size_t>(max_bytes / 4, size_t{16} << 20));
    std::normal_distribution<float> g;
    for (float& f : host) f = g(rng);
    for (size_t off = 0; off < max_bytes; off += host.size() * 4) {
      const size_t b = std::min(host.size() * 4, max_bytes - off);
      GW_RETURN_IF_ERROR(in.upload(host.data(), b, off));
      for (float& f : host) f *= 1e-3f;
      GW_RETURN_IF_ERROR(res.upload(host.data(), b, off));
      for (float& f : host) f *= 1e3f;
    }
  }
  GW_ASSIGN_OR_RETURN(auto scope, ScopedContext::enter(kDevice));
  CUevent start, stop;
  if (CUresult r = d->cuEventCreate(&start, kEventDefault); r)
    return cuda_error(*d, r, "cuEventCreate");
  if (CUresult r = d->cuEventCreate(&stop, kEventDefault); r) {
    d->cuEventDestroy(start);
    return cuda_error(*d, r, "cuEventCreate");
  }
  struct Kernel {
    const char* name;
    double traffic_per_elem;  // bytes read + written per element
    std::function<Status(size_t)> run;
  };
  float* fin = in.as<float>();
  float* fres = res.as<float>();
  const std::vector<Kernel> kernels = {
      {"fp16 encode", 6,
       [&](size_t n) {
         return encode_cast16(fin, nullptr, n, out.as<uint16_t>(), false, nullptr);
       }},
      {"fp16 encode+ef", 14,
       [&](size_t n) { return encode_cast16(fin, fres, n, out.as<uint16_t>(), false, nullptr); }},
      {"bf16 encode+ef", 14,
       [&](size_t n) { return encode_cast16(fin, fres, n, out.as<uint16_t>(), true, nullptr); }},
      {"fp16 decode add", 10,
       [&](size_t n) { return decode_cast16(out.as<uint16_t>(), n, fres, false, true, nullptr); }},
      {"sign encode", 4.1328125,
       [&](size_t n) { return gw::cuda::sign_encode(fin, nullptr, n, 2048, out.get(), nullptr); }},
      {"sign encode+ef", 12.1328125,
       [&](size_t n) { return gw::cuda::sign_encode(fin, fres, n, 2048, out.get(), nullptr); }},
      {"sign decode add", 8.1328125,
       [&](size_t n) { return gw::cuda::sign_decode(out.get(), n, 2048, fres, true, nullptr); }},
  };
  std::vector<BenchRow> rows;
  Status st;
  for (const Kernel& k : kernels) {
    for (size_t bytes : sizes) {
      const size_t n = bytes / 4;
      std::vector<float> ms;
      for (int it = 0; it < reps + 3 && st.ok(); ++it) {
        d->cuEventRecord(start, nullptr);
        st = k.run(n);
        d->cuEventRecord(stop, nullptr);
        if (st.ok()) st = stream_wait(*d, nullptr, kWaitMs);
        float t = 0;
        if (st.ok()) {
          if (CUresult r = d->cuEventElapsedTime(&t, start, stop); r)
            st = cuda_error(*d, r, "cuEventElapsedTime");
        }
        if (it >= 3) ms.push_back(t);
      }
      if (!st.ok()) break;
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      BenchRow row;
      row.kernel = k.name;
      row.bytes = bytes;
      row.median_us = ms[ms.size() / 2] * 1e3;
      row.gbps_input = static_cast<double>(bytes) / (row.median_us * 1e3);
      row.gbps_traffic = k.traffic_per_elem * static_cast<double>(n) / (row.median_us * 1e3);
      rows.push_back(row);
    }
    if (!st.ok()) break;
  }
  d->cuEventDestroy(start);
  d->cuEventDestroy(stop);
  if (!st.ok()) return st;
  return rows;
}

}  // namespace gw::cuda::check
