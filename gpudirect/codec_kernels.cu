// CUDA kernels of the cast and sign codecs, on device memory. Compiled with nvcc --fatbin
// (sm_80, sm_90 SASS + compute_90 PTX), embedded in the library and loaded with
// cuModuleLoadData by gpu_codecs.cc; the entry points are extern "C" so their names are plain.
//
// Results are those of collectives/compress/codec_kernels.cc, bit for bit: the conversions are
// the integer ones of cast16_math.h, and every f32 addition or subtraction whose result is NaN is
// given the NaN x86 gives (the first NaN operand, quieted; the default NaN 0xFFC00000 for
// inf - inf), since the GPU would produce its canonical NaN instead and the NaN's sign and payload
// reach the wire (f16 payload bits, sign bits). The one difference: sign's scale (mean |v| per
// chunk) is a block tree reduction here and an 8-lane sum on the CPU, so the scales agree within
// float rounding (see gpu_codecs.h for the bound).
//
// Memory access: 16-byte loads and stores per thread (float4; uint2 for four halves), coalesced
// across the warp, grid-stride loops over a grid sized from the SM count. A scalar path covers
// tails and buffers that are not 16-byte aligned.
#include <cstdint>

#include "gpudirect/cast16_math.h"

namespace {

using namespace gw::cuda::cast16;

constexpr int kThreads = 256;

__device__ __forceinline__ float quiet(float a) { return float_of(bits_of(a) | 0x400000u); }

// a + b and a - b with x86's NaN results.
__device__ __forceinline__ float fix_nan(float r, float a, float b) {
  if (r == r) return r;
  if (a != a) return quiet(a);
  if (b != b) return quiet(b);
  return float_of(0xFFC00000u);
}
__device__ __forceinline__ float xadd(float a, float b) { return fix_nan(__fadd_rn(a, b), a, b); }
__device__ __forceinline__ float xsub(float a, float b) { return fix_nan(__fsub_rn(a, b), a, b); }

template <bool kBf16>
__device__ __forceinline__ uint16_t narrow(float v) {
  return kBf16 ? to_bf16(v) : to_half(v);
}
template <bool kBf16>
__device__ __forceinline__ float widen(uint16_t h) {
  return kBf16 ? from_bf16(h) : from_half(h);
}

// One element of the cast encode: v = in + residual; out = narrow(v); residual = v - widen(out).
template <bool kBf16, bool kEf>
__device__ __forceinline__ uint16_t encode1(float x, float* r) {
  const float v = kEf ? xadd(x, *r) : x;
  const uint16_t h = narrow<kBf16>(v);
  if (kEf) *r = xsub(v, widen<kBf16>(h));
  return h;
}

template <bool kBf16, bool kEf>
__device__ __forceinline__ void cast_encode(const float* __restrict__ in, float* __restrict__ res,
                                            uint16_t* __restrict__ out, size_t n, int vec) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t nv = n / 4;
    const float4* in4 = reinterpret_cast<const float4*>(in);
    float4* r4 = reinterpret_cast<float4*>(res);
    uint2* o4 = reinterpret_cast<uint2*>(out);
    for (size_t i = tid; i < nv; i += stride) {
      const float4 x = in4[i];
      float4 r = kEf ? r4[i] : make_float4(0, 0, 0, 0);
      const uint32_t h0 = encode1<kBf16, kEf>(x.x, &r.x);
      const uint32_t h1 = encode1<kBf16, kEf>(x.y, &r.y);
      const uint32_t h2 = encode1<kBf16, kEf>(x.z, &r.z);
      const uint32_t h3 = encode1<kBf16, kEf>(x.w, &r.w);
      o4[i] = make_uint2(h0 | (h1 << 16), h2 | (h3 << 16));
      if (kEf) r4[i] = r;
    }
    done = nv * 4;
  }
  for (size_t i = done + tid; i < n; i += stride) {
    float r = kEf ? res[i] : 0.0f;
    out[i] = encode1<kBf16, kEf>(in[i], &r);
    if (kEf) res[i] = r;
  }
}

template <bool kAdd>
__device__ __forceinline__ float put(float acc, float f) {
  return kAdd ? xadd(acc, f) : f;
}

template <bool kBf16, bool kAdd>
__device__ __forceinline__ void cast_decode(const uint16_t* __restrict__ in,
                                            float* __restrict__ acc, size_t n, int vec) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t done = 0;
  if (vec) {
    const size_t nv = n / 4;
    const uint2* in4 = reinterpret_cast<const uint2*>(in);
    float4* a4 = reinterpret_cast<float4*>(acc);
    for (size_t i = tid; i < nv; i += stride) {
      const uint2 h = in4[i];
      float4 a = kAdd ? a4[i] : make_float4(0, 0, 0, 0);
      a.x = put<kAdd>(a.x, widen<kBf16>(static_cast<uint16_t>(h.x)));
      a.y = put<kAdd>(a.y, widen<kBf16>(static_cast<uint16_t>(h.x >> 16)));
      a.z = put<kAdd>(a.z, widen<kBf16>(static_cast<uint16_t>(h.y)));
      a.w = put<kAdd>(a.w, widen<kBf16>(static_cast<uint16_t>(h.y >> 16)));
      a4[i] = a;
    }
    done = nv * 4;
  }
  for (size_t i = done + tid; i < n; i += stride) {
    acc[i] = put<kAdd>(kAdd ? acc[i] : 0.0f, widen<kBf16>(in[i]));
  }
}

// Sum of `s` over the block; every thread gets the result. `scratch` holds one float per warp.
__device__ __forceinline__ float block_sum(float s, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xFFFFFFFFu, s, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nwarps = blockDim.x / 32;
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  float t = lane < nwarps ? scratch[lane] : 0.0f;
  for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(0xFFFFFFFFu, t, o);
  __syncthreads();  // scratch is reused by the next chunk
  return t;
}

// Sign encode, chunk = 1024 * K elements per block of 256 threads, one chunk per block at a time:
// thread t holds elements k * 1024 + 4t .. +3 (k < K) in registers, so the chunk is read once.
// `words` is the encoding's bit words as 32-bit halves (they are only 4-byte aligned there).
template <int K, bool kEf>
__device__ __forceinline__ void sign_encode_regs(const float* __restrict__ in,
                                                 float* __restrict__ res, size_t n, size_t chunk,
                                                 float* __restrict__ scales,
                                                 uint32_t* __restrict__ words) {
  __shared__ float scratch[32];
  const size_t nchunks = (n + chunk - 1) / chunk;
  const int t = threadIdx.x;
  for (size_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const size_t off = c * chunk;
    const size_t cn = min(chunk, n - off);
    float4 v[K];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const size_t e = static_cast<size_t>(k) * 1024 + 4 * t;
      if (e + 4 <= cn) {
        const float4 x = *reinterpret_cast<const float4*>(in + off + e);
        if (kEf) {
          const float4 r = *reinterpret_cast<const float4*>(res + off + e);
          v[k] = make_float4(xadd(x.x, r.x), xadd(x.y, r.y), xadd(x.z, r.z), xadd(x.w, r.w));
        } else {
          v[k] = x;
        }
      } else {
        // The chunk's tail: missing elements are +0, which adds nothing and encodes bit 0.
        float tmp[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          if (e + j < cn) tmp[j] = kEf ? xadd(in[off + e + j], res[off + e + j]) : in[off + e + j];
        }
        v[k] = make_float4(tmp[0], tmp[1], tmp[2], tmp[3]);
      }
      s += fabsf(v[k].x) + fabsf(v[k].y) + fabsf(v[k].z) + fabsf(v[k].w);
    }
    const float scale = block_sum(s, scratch) / static_cast<float>(cn);
    if (t == 0) scales[c] = scale;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const size_t e = static_cast<size_t>(k) * 1024 + 4 * t;
      uint32_t nib = (bits_of(v[k].x) >> 31) | (bits_of(v[k].y) >> 31) << 1 |
                     (bits_of(v[k].z) >> 31) << 2 | (bits_of(v[k].w) >> 31) << 3;
      nib <<= 4 * (t % 8);
      nib |= __shfl_xor_sync(0xFFFFFFFFu, nib, 1);
      nib |= __shfl_xor_sync(0xFFFFFFFFu, nib, 2);
      nib |= __shfl_xor_sync(0xFFFFFFFFu, nib, 4);
      if (t % 8 == 0) words[c * (chunk / 32) + e / 32] = nib;
      if (kEf) {
        const float4 r = make_float4(
            xsub(v[k].x, copysignf(scale, v[k].x)), xsub(v[k].y, copysignf(scale, v[k].y)),
            xsub(v[k].z, copysignf(scale, v[k].z)), xsub(v[k].w, copysignf(scale, v[k].w)));
        if (e + 4 <= cn) {
          *reinterpret_cast<float4*>(res + off + e) = r;
        } else {
          const float tmp[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            if (e + j < cn) res[off + e + j] = tmp[j];
          }
        }
      }
    }
  }
}

// Sign encode for any chunk (a multiple of 64) and any 4-byte alignment: two passes over each
// chunk per block, one element per thread per step; the residual, when there is one, holds v
// between the passes (as on the CPU). Warp w of a step covers 32 consecutive elements starting
// at a multiple of 32, so one ballot is one 32-bit half of a bit word.
template <bool kEf>
__device__ __forceinline__ void sign_encode_any(const float* __restrict__ in,
                                                float* __restrict__ res, size_t n, size_t chunk,
                                                float* __restrict__ scales,
                                                uint32_t* __restrict__ words) {
  __shared__ float scratch[32];
  const size_t nchunks = (n + chunk - 1) / chunk;
  for (size_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const size_t off = c * chunk;
    const size_t cn = min(chunk, n - off);
    float s = 0.0f;
    for (size_t e = threadIdx.x; e < cn; e += blockDim.x) {
      const float v = kEf ? xadd(in[off + e], res[off + e]) : in[off + e];
      if (kEf) res[off + e] = v;
      s += fabsf(v);
    }
    const float scale = block_sum(s, scratch) / static_cast<float>(cn);
    if (threadIdx.x == 0) scales[c] = scale;
    for (size_t e = threadIdx.x; e < chunk; e += blockDim.x) {  // warp-uniform trip count
      const bool valid = e < cn;
      const float v = valid ? (kEf ? res[off + e] : in[off + e]) : 0.0f;
      const uint32_t bits = __ballot_sync(0xFFFFFFFFu, (bits_of(v) >> 31) != 0);
      if (threadIdx.x % 32 == 0) words[c * (chunk / 32) + e / 32] = bits;
      if (kEf && valid) res[off + e] = xsub(v, copysignf(scale, v));
    }
  }
}

// Sign decode: out = +-scale (set: 0 + decode, as on the CPU) or acc += +-scale. One chunk per
// block at a time, four elements per thread per step.
template <bool kAdd>
__device__ __forceinline__ void sign_decode(const float* __restrict__ scales,
                                            const uint32_t* __restrict__ words, size_t n,
                                            size_t chunk, float* __restrict__ acc, int vec) {
  const size_t nchunks = (n + chunk - 1) / chunk;
  for (size_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const size_t off = c * chunk;
    const size_t cn = min(chunk, n - off);
    const float scale = scales[c];
    // -scale by flipping the sign bit: neg.f32 may not keep a NaN's payload, x86 does.
    const float nscale = float_of(bits_of(scale) ^ 0x80000000u);
    const uint32_t* w = words + c * (chunk / 32);
    for (size_t e = 4 * threadIdx.x; e < cn; e += 4 * blockDim.x) {
      const uint32_t b = w[e / 32] >> (e % 32);  // e % 32 <= 28: the four bits are in this half
      if (vec && e + 4 <= cn) {
        float4* p = reinterpret_cast<float4*>(acc + off + e);
        float4 a = kAdd ? *p : make_float4(0, 0, 0, 0);
        a.x = xadd(a.x, (b & 1u) ? nscale : scale);
        a.y = xadd(a.y, (b & 2u) ? nscale : scale);
        a.z = xadd(a.z, (b & 4u) ? nscale : scale);
        a.w = xadd(a.w, (b & 8u) ? nscale : scale);
        *p = a;
      } else {
        for (int j = 0; j < 4 && e + j < cn; ++j) {
          float* p = acc + off + e + j;
          *p = xadd(kAdd ? *p : 0.0f, ((b >> j) & 1u) ? nscale : scale);
        }
      }
    }
  }
}

}  // namespace

#define GW_CAST_ENCODE(name, bf16, ef)                                      \
  extern "C" __global__ void __launch_bounds__(kThreads)                    \
      name(const float* in, float* res, uint16_t* out, size_t n, int vec) { \
    cast_encode<bf16, ef>(in, res, out, n, vec);                            \
  }
GW_CAST_ENCODE(gw_cast_encode_f16, false, false)
GW_CAST_ENCODE(gw_cast_encode_f16_ef, false, true)
GW_CAST_ENCODE(gw_cast_encode_bf16, true, false)
GW_CAST_ENCODE(gw_cast_encode_bf16_ef, true, true)

#define GW_CAST_DECODE(name, bf16, add)                         \
  extern "C" __global__ void __launch_bounds__(kThreads)        \
      name(const uint16_t* in, float* acc, size_t n, int vec) { \
    cast_decode<bf16, add>(in, acc, n, vec);                    \
  }
GW_CAST_DECODE(gw_cast_decode_f16_set, false, false)
GW_CAST_DECODE(gw_cast_decode_f16_add, false, true)
GW_CAST_DECODE(gw_cast_decode_bf16_set, true, false)
GW_CAST_DECODE(gw_cast_decode_bf16_add, true, true)

#define GW_SIGN_ENCODE_REGS(name, k, ef)                                                          \
  extern "C" __global__ void __launch_bounds__(kThreads)                                          \
      name(const float* in, float* res, size_t n, size_t chunk, float* scales, uint32_t* words) { \
    sign_encode_regs<k, ef>(in, res, n, chunk, scales, words);                                    \
  }
GW_SIGN_ENCODE_REGS(gw_sign_encode_r1, 1, false)
GW_SIGN_ENCODE_REGS(gw_sign_encode_r1_ef, 1, true)
GW_SIGN_ENCODE_REGS(gw_sign_encode_r2, 2, false)
GW_SIGN_ENCODE_REGS(gw_sign_encode_r2_ef, 2, true)
GW_SIGN_ENCODE_REGS(gw_sign_encode_r4, 4, false)
GW_SIGN_ENCODE_REGS(gw_sign_encode_r4_ef, 4, true)
GW_SIGN_ENCODE_REGS(gw_sign_encode_r8, 8, false)
GW_SIGN_ENCODE_REGS(gw_sign_encode_r8_ef, 8, true)

extern "C" __global__ void __launch_bounds__(kThreads)
    gw_sign_encode_any(const float* in, float* res, size_t n, size_t chunk, float* scales,
                       uint32_t* words) {
  sign_encode_any<false>(in, res, n, chunk, scales, words);
}
extern "C" __global__ void __launch_bounds__(kThreads)
    gw_sign_encode_any_ef(const float* in, float* res, size_t n, size_t chunk, float* scales,
                          uint32_t* words) {
  sign_encode_any<true>(in, res, n, chunk, scales, words);
}

extern "C" __global__ void __launch_bounds__(kThreads, 4)
    gw_sign_decode_set(const float* scales, const uint32_t* words, size_t n, size_t chunk,
                       float* out, int vec) {
  sign_decode<false>(scales, words, n, chunk, out, vec);
}
extern "C" __global__ void __launch_bounds__(kThreads, 4)
    gw_sign_decode_add(const float* scales, const uint32_t* words, size_t n, size_t chunk,
                       float* acc, int vec) {
  sign_decode<true>(scales, words, n, chunk, acc, vec);
}
