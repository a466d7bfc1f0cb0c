// DeviceCompression: the CUDA side of the compressed allreduce, for gradients in GPU memory.
//
// It runs a Compressor's allreduce (collectives/compress/compress.h) on a buffer in GPU memory:
// fp16 / bf16 on float32 encode and widen on the GPU, slice by slice, overlapped with the
// exchange; sign on float32 runs the worker encode and the final decode on the GPU; every other
// codec and dtype is staged through host memory. The C ABI (capi/compressed.cc) keeps one per
// communicator beside its Compressor; a daemon or a language binding can do the same.
//
// Needs no CUDA headers and no libcuda at link time: the driver is dlopen'd (cuda_driver.h).
#pragma once

#include <cstddef>
#include <map>
#include <string>
#include <string_view>

#include "collectives/types.h"
#include "core/status.h"
#include "gpudirect/device_buffer.h"
#include "gpudirect/stream.h"

namespace gw::coll {
class Compressor;
}

namespace gw::cuda {

// Per-communicator device state: residuals per tensor key (on the tensor's GPU), one page-locked
// staging buffer grown to the largest call, a stream per device. Everything is freed with the
// object, except after a stream that did not drain (see allreduce). Not thread-safe: the owner
// serialises calls, as it serialises calls of the Compressor.
class DeviceCompression {
 public:
  DeviceCompression() = default;
  DeviceCompression(const DeviceCompression&) = delete;
  DeviceCompression& operator=(const DeviceCompression&) = delete;

  // compressor.allreduce(buf, count, dtype, spec, key) for `buf` in GPU memory (is_device_pointer
  // in cuda_driver.h says whether it is). Requires count > 0, a valid dtype, count * element size
  // without overflow, and the same `compressor` on every call with this object (the staged path
  // keeps its residuals there, the GPU paths here). Collective like Compressor::allreduce.
  //
  // Guarantees: fp16 / bf16 give the host path's result bit for bit; sign gives the same bits on
  // every rank, within the sign kernels' scale tolerance of the host path (gpu_codecs.h). A key
  // used on another GPU than before is kInvalidArg. Synchronous: on return, success or not, no
  // copy or kernel of the call is still queued (every wait has a deadline). The stream is a
  // blocking one, so its work runs after work queued on the legacy default stream and on other
  // blocking streams (PyTorch's default stream is the legacy one); work on a non-blocking stream
  // must be finished by the caller. Host staging that cannot be pinned is pageable: slower, never
  // an error.
  Status allreduce(coll::Compressor& compressor, void* buf, size_t count, coll::DataType dtype,
                   std::string_view spec, std::string_view key);

 private:
  struct Tensor {
    int device = -1;
    bool bf16 = false;
    DeviceBuffer residual;  // count floats; empty without error feedback
    DeviceBuffer wire;      // fp16/bf16: count halves; sign: the p slots of its encodings
  };

  Result<void*> host_memory(int device, size_t bytes);
  Result<Tensor*> tensor(std::string_view key, int device, size_t count, bool error_feedback,
                         bool bf16, size_t wire_bytes, bool* fresh);
  Result<Stream*> stream(int device);
  void abandon(int device, std::string_view key);
  Status finish_call(Stream& stream, int device, std::string_view key, bool fresh, Status st);
  Status allreduce_cast(coll::Compressor& compressor, int device, float* buf, size_t count,
                        bool error_feedback, bool bf16, std::string_view spec_text,
                        std::string_view key);
  Status allreduce_sign(coll::Compressor& compressor, int device, float* buf, size_t count,
                        bool error_feedback, size_t chunk, std::string_view spec_text,
                        std::string_view key);

  std::map<std::string, Tensor, std::less<>> tensors_;
  PinnedBuffer host_;              // the halves, or the staged path's copy
  std::map<int, Stream> streams_;  // per device
};

}  // namespace gw::cuda
