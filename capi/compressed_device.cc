// gw_allreduce_compressed on GPU memory (a cudaMalloc'd tensor).
//
// fp16 / bf16 on a float32 buffer run their casts and error feedback on the GPU with the kernels of
// gpudirect/: encode (with the residual, kept on the device per tensor key) into a device buffer
// of halves, copy the halves to the host, sum them over the ranks with the Compressor's ring
// (exactly the exchange of the host path), copy the sum back and widen it into the tensor. Only
// half the tensor's bytes cross PCIe each way, and the results are those of the host path bit for
// bit (the kernels match the CPU ones; checked by gw-gpu-allreduce-check on an H100).
//
// Every other codec and dtype is staged: the tensor is copied to host memory, compressed there by
// the Compressor like a host buffer (its residuals in host memory), and copied back.
//
// Both paths are synchronous: the call returns when the tensor holds the result. They use the
// legacy default stream, so they run after work queued on blocking streams (PyTorch's default
// stream is one); work on a non-blocking stream must be finished by the caller.
#include "capi/compressed_device.h"

#include <map>
#include <string>
#include <vector>

#include "collectives/codec.h"
#include "gpudirect/cuda_driver.h"
#include "gpudirect/device_buffer.h"
#include "gpudirect/gpu_codecs.h"

namespace gw::capi {

namespace {

// A device wait must end: the encode or decode of even a 1 GiB tensor takes a few ms.
constexpr int64_t kKernelWaitMs = 60000;

// Waits for the kernels queued on `device`'s legacy default stream (it needs the context).
Status wait_default_stream(int device) {
  GW_ASSIGN_OR_RETURN(auto scope, cuda::ScopedContext::enter(device));
  return cuda::stream_wait(**cuda::driver(), nullptr, kKernelWaitMs);
}

}  // namespace

struct DeviceCompression {
  struct Tensor {
    int device = -1;
    bool bf16 = false;
    cuda::DeviceBuffer residual;  // count floats; empty without error feedback
    cuda::DeviceBuffer wire;      // count halves
    std::vector<uint16_t> host;   // count halves
  };
  std::map<std::string, Tensor, std::less<>> tensors;
  std::vector<unsigned char> staging;  // the staged path's host copy
};

bool is_device_buffer(const void* p) { return cuda::is_device_pointer(p); }

Status allreduce_compressed_device(std::shared_ptr<DeviceCompression>& state,
                                   coll::Compressor& compressor, void* buf, size_t count,
                                   coll::DataType dtype, std::string_view spec_text,
                                   std::string_view key) {
  if (!state) state = std::make_shared<DeviceCompression>();
  GW_ASSIGN_OR_RETURN(coll::CodecSpec spec, coll::parse_codec_spec(spec_text));
  GW_ASSIGN_OR_RETURN(int device, cuda::device_of(buf));
  const bool cast = spec.kind == coll::CodecKind::kFp16 || spec.kind == coll::CodecKind::kBf16;
  if (cast && dtype == coll::DataType::kF32 && cuda::codecs_available().ok()) {
    const std::string name(key);
    auto it = state->tensors.find(name);
    const bool fresh = it == state->tensors.end();
    if (fresh) {
      DeviceCompression::Tensor t;
      t.device = device;
      t.bf16 = spec.kind == coll::CodecKind::kBf16;
      if (spec.error_feedback) {
        GW_ASSIGN_OR_RETURN(t.residual, cuda::DeviceBuffer::allocate(device, count * 4));
        GW_RETURN_IF_ERROR(t.residual.fill(0));
      }
      GW_ASSIGN_OR_RETURN(t.wire, cuda::DeviceBuffer::allocate(device, count * 2));
      t.host.resize(count);
      it = state->tensors.emplace(name, std::move(t)).first;
    }
    DeviceCompression::Tensor& t = it->second;
    if (t.device != device) {
      return invalid_arg(
          "compressed allreduce: tensor key \"{}\" was used on GPU {} and now on GPU {}; use one "
          "key per tensor",
          key, t.device, device);
    }
    // The Compressor checks spec, count and (on first use) the ranks' agreement before it runs
    // the encode, so a refused call leaves the residual as it was.
    auto encode = [&]() -> Status {
      float* res = t.residual.size() > 0 ? t.residual.as<float>() : nullptr;
      GW_RETURN_IF_ERROR(cuda::encode_cast16(static_cast<const float*>(buf), res, count,
                                             t.wire.as<uint16_t>(), t.bf16, nullptr));
      GW_RETURN_IF_ERROR(wait_default_stream(device));
      return t.wire.download(t.host.data(), count * 2);
    };
    Status st =
        compressor.allreduce_cast_encoded(t.host.data(), count, dtype, spec_text, key, encode);
    if (!st.ok()) {
      // A first use the Compressor refused (another spec or host state under the key, ranks
      // disagreeing) keeps no device memory behind. A later failure keeps the residual, as the
      // host path does.
      if (fresh) state->tensors.erase(it);
      return st;
    }
    GW_RETURN_IF_ERROR(t.wire.upload(t.host.data(), count * 2));
    GW_RETURN_IF_ERROR(cuda::decode_cast16(t.wire.as<uint16_t>(), count, static_cast<float*>(buf),
                                           t.bf16, /*add=*/false, nullptr));
    return wait_default_stream(device);
  }
  // Staged: the host path on a host copy.
  const size_t bytes = count * coll::dtype_size(dtype);
  state->staging.resize(bytes);
  GW_RETURN_IF_ERROR(cuda::copy_to_host(state->staging.data(), buf, bytes));
  GW_RETURN_IF_ERROR(compressor.allreduce(state->staging.data(), count, dtype, spec_text, key));
  return cuda::copy_to_device(buf, state->staging.data(), bytes);
}

}  // namespace gw::capi
