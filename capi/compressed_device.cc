// gw_allreduce_compressed on GPU memory (a cudaMalloc'd tensor).
//
// fp16 / bf16 on a float32 buffer run their casts and error feedback on the GPU with the kernels of
// gpudirect/, slice by slice (the slices the host path uses for the spec, so the same exchanges):
// a stream of this module's encodes slice s+1 (with the residual, kept on the device per tensor
// key) into a device buffer of halves and copies it into page-locked host memory while the
// Compressor's ring sums slice s on the communicator's progress thread, and copies slice s-1's
// sum back and widens it into the tensor meanwhile (Compressor::allreduce_cast_encoded_sliced).
// Only half the tensor's bytes cross PCIe each way, mostly hidden behind the exchange, and the
// results are those of the host path bit for bit (the kernels match the CPU ones; checked by
// gw-gpu-allreduce-check on an H100).
//
// sign on a float32 buffer runs the worker side on the GPU: its encode (with the worker residual
// on the device) and the final decode use gpudirect's sign kernels, only the 1-bit encodings
// cross PCIe, and the host runs the all-to-all, the server step (server residual in host memory)
// and the allgather (Compressor::allreduce_two_phase_encoded). The GPU sums a chunk's scale in
// another order than the CPU, so results may differ from the host path's within the kernels'
// scale tolerance (gpu_codecs.h); every rank gets the same bits.
//
// Every other codec and dtype is staged: the tensor is copied to host memory, compressed there by
// the Compressor like a host buffer (its residuals in host memory), and copied back.
//
// Host memory is one page-locked buffer per communicator, grown to the largest call (calls are
// serialised by the C ABI); where pinning fails it is pageable (one debug line says why), which
// is slower, never an error.
//
// Both paths are synchronous: the call returns when the tensor holds the result and no copy or
// kernel of the call is still queued, on success or failure (every wait has a deadline). The
// stream is a blocking one, so its work runs after work queued on the legacy default stream and
// on other blocking streams (PyTorch's default stream is the legacy one); work on a non-blocking
// stream must be finished by the caller.
#include "capi/compressed_device.h"

#include <cstring>
#include <map>
#include <string>

#include "collectives/compress/codec.h"
#include "core/log.h"
#include "gpudirect/cuda_driver.h"
#include "gpudirect/device_buffer.h"
#include "gpudirect/gpu_codecs.h"
#include "gpudirect/stream.h"

namespace gw::capi {

namespace {

// A device wait must end: the encode or decode of even a 1 GiB tensor takes a few ms.
constexpr int64_t kKernelWaitMs = 60000;
// The Compressor starts at most two slices that are not yet ready (compress.h): one event each.
constexpr size_t kSliceEvents = 2;

}  // namespace

struct DeviceCompression {
  struct Tensor {
    int device = -1;
    bool bf16 = false;
    cuda::DeviceBuffer residual;  // count floats; empty without error feedback
    cuda::DeviceBuffer wire;      // fp16/bf16: count halves; sign: the p slots of its encodings
  };
  std::map<std::string, Tensor, std::less<>> tensors;
  cuda::PinnedBuffer host;              // the halves, or the staged path's copy
  std::map<int, cuda::Stream> streams;  // per device

  // `bytes` of host memory for copies with `device` (page-locked: portable to every device).
  Result<void*> host_memory(int device, size_t bytes) {
    if (host.get() != nullptr && host.size() >= bytes) return host.get();
    host.reset();  // before the new one: never two of the largest size
    GW_ASSIGN_OR_RETURN(host, cuda::PinnedBuffer::allocate(device, bytes));
    if (!host.pinned()) {
      GW_LOG_DEBUG(
          "compressed allreduce on GPU {}: host staging of {} bytes is pageable, not pinned ({}); "
          "copies will be slower and not overlap the exchange",
          device, bytes, host.why_pageable());
    }
    return host.get();
  }

  // The key's device state, made on its first use (*fresh): with error feedback a zeroed residual
  // of count floats, and wire_bytes of device wire (none when 0). kInvalidArg for a key used on
  // another GPU before.
  Result<Tensor*> tensor(std::string_view key, int device, size_t count, bool error_feedback,
                         bool bf16, size_t wire_bytes, bool* fresh) {
    auto it = tensors.find(key);
    *fresh = it == tensors.end();
    if (*fresh) {
      Tensor t;
      t.device = device;
      t.bf16 = bf16;
      if (error_feedback) {
        GW_ASSIGN_OR_RETURN(t.residual, cuda::DeviceBuffer::allocate(device, count * 4));
        GW_RETURN_IF_ERROR(t.residual.fill(0));
      }
      if (wire_bytes > 0) {
        GW_ASSIGN_OR_RETURN(t.wire, cuda::DeviceBuffer::allocate(device, wire_bytes));
      }
      it = tensors.emplace(std::string(key), std::move(t)).first;
    }
    if (it->second.device != device) {
      return invalid_arg(
          "compressed allreduce: tensor key \"{}\" was used on GPU {} and now on GPU {}; use one "
          "key per tensor",
          key, it->second.device, device);
    }
    return &it->second;
  }

  Result<cuda::Stream*> stream(int device) {
    auto it = streams.find(device);
    if (it == streams.end()) {
      GW_ASSIGN_OR_RETURN(cuda::Stream s, cuda::Stream::create(device));
      it = streams.emplace(device, std::move(s)).first;
    }
    return &it->second;
  }

  // After a stream that did not drain: its queued copies and kernels may still use the host
  // buffer, the stream and the tensor's device memory, so none of them may be freed or reused.
  // They are leaked on purpose (a GPU that does not finish in kKernelWaitMs is wedged anyway);
  // the next call starts with new ones, and the key with a zero residual.
  void abandon(int device, std::string_view key) {
    (void)new cuda::PinnedBuffer(std::move(host));
    if (auto s = streams.find(device); s != streams.end()) {
      (void)new cuda::Stream(std::move(s->second));
      streams.erase(s);
    }
    if (auto t = tensors.find(key); t != tensors.end()) {
      (void)new Tensor(std::move(t->second));
      tensors.erase(t);
    }
  }
};

bool is_device_buffer(const void* p) { return cuda::is_device_pointer(p); }

namespace {

// Waits for the stream after a call, on success and failure alike (nothing of the call may still
// run when it returns: the host buffer and the stream are shared by the next call, the tensor is
// the caller's). A stream that does not drain abandons the buffers. A first use that failed keeps
// no device memory behind; a later failure keeps the residual, as the host path does.
Status finish_call(DeviceCompression& state, cuda::Stream& stream, int device, std::string_view key,
                   bool fresh, Status st) {
  Status drained = stream.wait(kKernelWaitMs);
  if (!drained.ok()) {
    GW_LOG_ERROR(
        "compressed allreduce \"{}\" on GPU {}: the stream did not drain ({}); its buffers are "
        "abandoned",
        key, device, drained.to_string());
    state.abandon(device, key);
    return st.ok() ? drained : st;
  }
  if (!st.ok() && fresh) {
    if (auto it = state.tensors.find(key); it != state.tensors.end()) state.tensors.erase(it);
  }
  return st;
}

// sign on a float32 GPU tensor: the worker encode (with the worker residual, on the device) and
// the final decode run on the GPU with gpudirect's kernels; only the 1-bit encodings cross PCIe
// (p slots of ~count / 32 floats' size each way), and the host runs the exchange and the server
// step (Compressor::allreduce_two_phase_encoded). The GPU's per-chunk scale is summed in another
// order than the CPU's (gpu_codecs.h), so the result may differ from the host path's within
// sign_scale_tolerance; every rank still gets the same bits.
Status allreduce_sign_device(DeviceCompression& state, coll::Compressor& compressor, int device,
                             float* buf, size_t count, const coll::CodecSpec& spec,
                             std::string_view spec_text, std::string_view key) {
  GW_ASSIGN_OR_RETURN(cuda::Stream * stream, state.stream(device));
  bool fresh = false;
  GW_ASSIGN_OR_RETURN(DeviceCompression::Tensor * tp,
                      state.tensor(key, device, count, spec.error_feedback, false, 0, &fresh));
  DeviceCompression::Tensor& t = *tp;
  const size_t chunk = spec.chunk;
  float* res = t.residual.size() > 0 ? t.residual.as<float>() : nullptr;
  // The device copy of the p slots (grown to the blob size on first use; the key's spec and
  // count are fixed once the Compressor accepted them, so is the size).
  auto device_blob = [&](size_t bytes) -> Result<uint8_t*> {
    if (t.wire.size() < bytes) {
      t.wire.reset();
      GW_ASSIGN_OR_RETURN(t.wire, cuda::DeviceBuffer::allocate(device, bytes));
    }
    return t.wire.as<uint8_t>();
  };
  coll::Compressor::TwoPhaseHooks hooks;
  hooks.encode = [&](uint8_t* blob, size_t slot,
                     const std::vector<coll::Compressor::Partition>& parts) -> Status {
    const size_t bytes = slot * parts.size();
    GW_ASSIGN_OR_RETURN(uint8_t * dblob, device_blob(bytes));
    GW_ASSIGN_OR_RETURN(void* host, state.host_memory(device, bytes));
    GW_RETURN_IF_ERROR(t.wire.fill(0));  // the slots' unused tail bytes, as the host path's
    for (size_t j = 0; j < parts.size(); ++j) {
      if (parts[j].len == 0) continue;
      GW_RETURN_IF_ERROR(cuda::sign_encode(buf + parts[j].offset,
                                           res ? res + parts[j].offset : nullptr, parts[j].len,
                                           chunk, dblob + slot * j, stream->get()));
    }
    GW_RETURN_IF_ERROR(stream->copy_to_host(host, dblob, bytes));
    GW_RETURN_IF_ERROR(stream->wait(kKernelWaitMs));
    std::memcpy(blob, host, bytes);
    return ok_status();
  };
  hooks.decode = [&](const uint8_t* blob, size_t slot,
                     const std::vector<coll::Compressor::Partition>& parts) -> Status {
    const size_t bytes = slot * parts.size();
    GW_ASSIGN_OR_RETURN(uint8_t * dblob, device_blob(bytes));
    GW_ASSIGN_OR_RETURN(void* host, state.host_memory(device, bytes));
    std::memcpy(host, blob, bytes);
    GW_RETURN_IF_ERROR(stream->copy_to_device(dblob, host, bytes));
    for (size_t j = 0; j < parts.size(); ++j) {
      if (parts[j].len == 0) continue;
      GW_RETURN_IF_ERROR(cuda::sign_decode(dblob + slot * j, parts[j].len, chunk,
                                           buf + parts[j].offset, /*add=*/false, stream->get()));
    }
    return ok_status();
  };
  Status st =
      compressor.allreduce_two_phase_encoded(count, coll::DataType::kF32, spec_text, key, hooks);
  return finish_call(state, *stream, device, key, fresh, std::move(st));
}

}  // namespace

Status allreduce_compressed_device(std::shared_ptr<DeviceCompression>& state,
                                   coll::Compressor& compressor, void* buf, size_t count,
                                   coll::DataType dtype, std::string_view spec_text,
                                   std::string_view key) {
  if (!state) state = std::make_shared<DeviceCompression>();
  GW_ASSIGN_OR_RETURN(coll::CodecSpec spec, coll::parse_codec_spec(spec_text));
  GW_ASSIGN_OR_RETURN(int device, cuda::device_of(buf));
  const bool cast = spec.kind == coll::CodecKind::kFp16 || spec.kind == coll::CodecKind::kBf16;
  if (cast && dtype == coll::DataType::kF32 && cuda::codecs_available().ok()) {
    GW_ASSIGN_OR_RETURN(void* host_bytes, state->host_memory(device, count * 2));
    GW_ASSIGN_OR_RETURN(cuda::Stream * stream, state->stream(device));
    auto* host = static_cast<uint16_t*>(host_bytes);
    bool fresh = false;
    GW_ASSIGN_OR_RETURN(DeviceCompression::Tensor * tp,
                        state->tensor(key, device, count, spec.error_feedback,
                                      spec.kind == coll::CodecKind::kBf16, count * 2, &fresh));
    DeviceCompression::Tensor& t = *tp;
    // The Compressor checks spec, count and (on first use) the ranks' agreement before it calls
    // a hook, so a refused call leaves the residual as it was. Each hook only queues work on the
    // stream, except ready, which waits for one slice's copy to the host.
    const auto* in = static_cast<const float*>(buf);
    auto* out = static_cast<float*>(buf);
    float* res = t.residual.size() > 0 ? t.residual.as<float>() : nullptr;
    uint16_t* dwire = t.wire.as<uint16_t>();
    const bool bf16 = t.bf16;
    coll::Compressor::CastSliceHooks hooks;
    hooks.start = [&](size_t s, size_t off, size_t len) -> Status {
      GW_RETURN_IF_ERROR(cuda::encode_cast16(in + off, res ? res + off : nullptr, len, dwire + off,
                                             bf16, stream->get()));
      GW_RETURN_IF_ERROR(stream->copy_to_host(host + off, dwire + off, len * 2));
      return stream->record(s % kSliceEvents);
    };
    hooks.ready = [&](size_t s, size_t, size_t) {
      return stream->wait_event(s % kSliceEvents, kKernelWaitMs);
    };
    hooks.done = [&](size_t, size_t off, size_t len) -> Status {
      GW_RETURN_IF_ERROR(stream->copy_to_device(dwire + off, host + off, len * 2));
      return cuda::decode_cast16(dwire + off, len, out + off, bf16, /*add=*/false, stream->get());
    };
    Status st = compressor.allreduce_cast_encoded_sliced(host, count, dtype, spec_text, key, hooks);
    return finish_call(*state, *stream, device, key, fresh, std::move(st));
  }
  if (spec.kind == coll::CodecKind::kSign && dtype == coll::DataType::kF32 &&
      cuda::codecs_available().ok()) {
    return allreduce_sign_device(*state, compressor, device, static_cast<float*>(buf), count, spec,
                                 spec_text, key);
  }
  // Staged: the host path on a host copy.
  const size_t bytes = count * coll::dtype_size(dtype);
  GW_ASSIGN_OR_RETURN(void* host, state->host_memory(device, bytes));
  GW_RETURN_IF_ERROR(cuda::copy_to_host(host, buf, bytes));
  GW_RETURN_IF_ERROR(compressor.allreduce(host, count, dtype, spec_text, key));
  return cuda::copy_to_device(buf, host, bytes);
}

}  // namespace gw::capi
