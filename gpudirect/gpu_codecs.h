// The cast (fp16 / bf16) and sign codecs on device memory: the kernels of codec_kernels.cu,
// launched through the dlopen'd driver (cuda_driver.h).
//
// Every pointer is device memory (cuMemAlloc, cudaMalloc, or managed), all on one device; the
// work is queued on `stream` (a CUstream of that device's primary context, or null for its
// legacy default stream) and the call returns without waiting: use stream_wait() before reading
// the results on the host. Buffers must not overlap, except where a call says otherwise.
//
// Results are those of gw::coll::codec_kernels, bit for bit (f16/bf16 payloads, sign bits,
// decoded values, residuals), with two exceptions: (1) where an f32 addition has two NaN
// operands the NaN payload is unspecified (it is on the CPU too: the compiler may swap the
// operands), and (2) sign's per-chunk scale is summed in another order, so it may differ from the
// CPU's by at most sign_scale_tolerance(n) relative to it; the bits are the same, and the
// residual is v - copysign(scale, v) with the scale this call wrote.
//
// Errors: kInvalidArg for a null pointer with n > 0, a misaligned pointer (f32: 4 bytes, f16: 2,
// the sign encoding: 4), a bad chunk, overlapping buffers, host memory or buffers on two devices;
// kUnsupported when gradwire was built without nvcc or there is no CUDA driver or device (the
// message says which); a driver error otherwise. n == 0 is a no-op. Thread-safe: the module is
// loaded once per device on first use.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.h"
#include "gpudirect/cuda_driver.h"

namespace gw::cuda {

// OK when the kernels can run here: built with nvcc, a driver, a device. Loads nothing per
// device; the first codec call on a device loads the module there.
Status codecs_available();

// v = in + residual (residual may be null); out = f16/bf16(v), round to nearest even;
// residual = v - widen(out).
Status encode_cast16(const float* in, float* residual, size_t n, uint16_t* out, bool bf16,
                     CUstream stream);
// acc = widen(in) (add false) or acc += widen(in).
Status decode_cast16(const uint16_t* in, size_t n, float* acc, bool bf16, bool add,
                     CUstream stream);

// The sign codec's encoding of `count` elements in chunks of `chunk` (a multiple of 64, at most
// 1048576): ceil(count / chunk) f32 scales, then chunk / 64 u64 bit words per chunk (the layout of
// collectives/compress/codecs/sign.cc, so host and device encodings are interchangeable).
size_t sign_encoded_size(size_t count, size_t chunk);
// Encodes into `out` (sign_encoded_size bytes, 4-byte aligned); residual as for the cast.
Status sign_encode(const float* in, float* residual, size_t count, size_t chunk, void* out,
                   CUstream stream);
// Decodes an encoding (sign_encoded_size bytes) into acc (set or add).
Status sign_decode(const void* in, size_t count, size_t chunk, float* acc, bool add,
                   CUstream stream);

// The largest relative difference allowed between the GPU's and the CPU's scale of a chunk of n
// elements: each is a sum of n non-negative floats (relative error at most (n - 1) * 2^-24 in
// any order) divided by n (half an ulp), so the two differ by at most 2 * n * 2^-24 relative.
inline double sign_scale_tolerance(size_t n) {
  return 2.0 * static_cast<double>(n) / 16777216.0 + 1.2e-7;
}

}  // namespace gw::cuda
