// fp16 / bf16 on a float32 buffer run their casts and error feedback on the GPU with the kernels of
// gpu_codecs.h, slice by slice (the slices the host path uses for the spec, so the same
// exchanges): this class's stream encodes slice s+1 (with the residual, kept on the device per
// tensor key) into a device buffer of halves and copies it into page-locked host memory while the
// Compressor's ring sums slice s on the communicator's progress thread, and copies slice s-1's
// sum back and widens it into the tensor meanwhile (Compressor::allreduce_cast_encoded_sliced).
// Only half the tensor's bytes cross PCIe each way, mostly hidden behind the exchange, and the
// results are those of the host path bit for bit (the kernels match the CPU ones; checked by
// gw-gpu-allreduce-check, perf/gpu/).
//
// sign on a float32 buffer runs the worker side on the GPU: its encode (with the worker residual
// on the device) and the final decode use the sign kernels, only the 1-bit encodings cross PCIe,
// and the host runs the all-to-all, the server step (server residual in host memory) and the
// allgather (Compressor::allreduce_two_phase_encoded). The GPU sums a chunk's scale in another
// order than the CPU, so results may differ from the host path's within the kernels' scale
// tolerance (gpu_codecs.h); every rank gets the same bits.
//
// Every other codec and dtype is staged: the tensor is copied to host memory, compressed there by
// the Compressor like a host buffer (its residuals in host memory), and copied back.
#include "gpudirect/device_compression.h"

#include <cstring>
#include <vector>

#include "collectives/compress/codec.h"
#include "collectives/compress/compress.h"
#include "core/log.h"
#include "gpudirect/cuda_driver.h"
#include "gpudirect/gpu_codecs.h"

namespace gw::cuda {

namespace {

// A device wait must end: the encode or decode of even a 1 GiB tensor takes a few ms.
constexpr int64_t kKernelWaitMs = 60000;
// The Compressor starts at most two slices that are not yet ready (compress.h): one event each.
constexpr size_t kSliceEvents = 2;

}  // namespace

// `bytes` of host memory for copies with `device` (page-locked: portable to every device).
Result<void*> DeviceCompression::host_memory(int device, size_t bytes) {
  if (host_.get() != nullptr && host_.size() >= bytes) return host_.get();
  host_.reset();  // before the new one: never two of the largest size
  GW_ASSIGN_OR_RETURN(host_, PinnedBuffer::allocate(device, bytes));
  if (!host_.pinned()) {
    GW_LOG_DEBUG(
        "compressed allreduce on GPU {}: host staging of {} bytes is pageable, not pinned ({}); "
        "copies will be slower and not overlap the exchange",
        device, bytes, host_.why_pageable());
  }
  return host_.get();
}

// The key's device state, made on its first use (*fresh): with error feedback a zeroed residual
// of count floats, and wire_bytes of device wire (none when 0). kInvalidArg for a key used on
// another GPU before.
Result<DeviceCompression::Tensor*> DeviceCompression::tensor(std::string_view key, int device,
                                                             size_t count, bool error_feedback,
                                                             bool bf16, size_t wire_bytes,
                                                             bool* fresh) {
  auto it = tensors_.find(key);
  *fresh = it == tensors_.end();
  if (*fresh) {
    Tensor t;
    t.device = device;
    t.bf16 = bf16;
    if (error_feedback) {
      GW_ASSIGN_OR_RETURN(t.residual, DeviceBuffer::allocate(device, count * 4));
      GW_RETURN_IF_ERROR(t.residual.fill(0));
    }
    if (wire_bytes > 0) {
      GW_ASSIGN_OR_RETURN(t.wire, DeviceBuffer::allocate(device, wire_bytes));
    }
    it = tensors_.emplace(std::string(key), std::move(t)).first;
  }
  if (it->second.device != device) {
    return invalid_arg(
        "compressed allreduce: tensor key \"{}\" was used on GPU {} and now on GPU {}; use one "
        "key per tensor",
        key, it->second.device, device);
  }
  return &it->second;
}

Result<Stream*> DeviceCompression::stream(int device) {
  auto it = streams_.find(device);
  if (it == streams_.end()) {
    GW_ASSIGN_OR_RETURN(Stream s, Stream::create(device));
    it = streams_.emplace(device, std::move(s)).first;
  }
  return &it->second;
}

// After a stream that did not drain: its queued copies and kernels may still use the host
// buffer, the stream and the tensor's device memory, so none of them may be freed or reused.
// They are leaked on purpose (a GPU that does not finish in kKernelWaitMs is wedged anyway);
// the next call starts with new ones, and the key with a zero residual.
void DeviceCompression::abandon(int device, std::string_view key) {
  (void)new PinnedBuffer(std::move(host_));
  if (auto s = streams_.find(device); s != streams_.end()) {
    (void)new Stream(std::move(s->second));
    streams_.erase(s);
  }
  if (auto t = tensors_.find(key); t != tensors_.end()) {
    (void)new Tensor(std::move(t->second));
    tensors_.erase(t);
  }
}

// Waits for the stream after a call, on success and failure alike (nothing of the call may still
// run when it returns: the host buffer and the stream are shared by the next call, the tensor is
// the caller's). A stream that does not drain abandons the buffers. A first use that failed keeps
// no device memory behind; a later failure keeps the residual, as the host path does.
Status DeviceCompression::finish_call(Stream& stream, int device, std::string_view key, bool fresh,
                                      Status st) {
  Status drained = stream.wait(kKernelWaitMs);
  if (!drained.ok()) {
    GW_LOG_ERROR(
        "compressed allreduce \"{}\" on GPU {}: the stream did not drain ({}); its buffers are "
        "abandoned",
        key, device, drained.to_string());
    abandon(device, key);
    return st.ok() ? drained : st;
  }
  if (!st.ok() && fresh) {
    if (auto it = tensors_.find(key); it != tensors_.end()) tensors_.erase(it);
  }
  return st;
}

// fp16 / bf16 on a float32 GPU tensor, in slices overlapped with the exchange.
Status DeviceCompression::allreduce_cast(coll::Compressor& compressor, int device, float* buf,
                                         size_t count, bool error_feedback, bool bf16,
                                         std::string_view spec_text, std::string_view key) {
  GW_ASSIGN_OR_RETURN(void* host_bytes, host_memory(device, count * 2));
  GW_ASSIGN_OR_RETURN(Stream * s, stream(device));
  auto* host = static_cast<uint16_t*>(host_bytes);
  bool fresh = false;
  GW_ASSIGN_OR_RETURN(Tensor * tp,
                      tensor(key, device, count, error_feedback, bf16, count * 2, &fresh));
  Tensor& t = *tp;
  // The Compressor checks spec, count and (on first use) the ranks' agreement before it calls
  // a hook, so a refused call leaves the residual as it was. Each hook only queues work on the
  // stream, except ready, which waits for one slice's copy to the host.
  const float* in = buf;
  float* out = buf;
  float* res = t.residual.size() > 0 ? t.residual.as<float>() : nullptr;
  uint16_t* dwire = t.wire.as<uint16_t>();
  const bool wire_bf16 = t.bf16;
  coll::Compressor::CastSliceHooks hooks;
  hooks.start = [&](size_t slice, size_t off, size_t len) -> Status {
    GW_RETURN_IF_ERROR(
        encode_cast16(in + off, res ? res + off : nullptr, len, dwire + off, wire_bf16, s->get()));
    GW_RETURN_IF_ERROR(s->copy_to_host(host + off, dwire + off, len * 2));
    return s->record(slice % kSliceEvents);
  };
  hooks.ready = [&](size_t slice, size_t, size_t) {
    return s->wait_event(slice % kSliceEvents, kKernelWaitMs);
  };
  hooks.done = [&](size_t, size_t off, size_t len) -> Status {
    GW_RETURN_IF_ERROR(s->copy_to_device(dwire + off, host + off, len * 2));
    return decode_cast16(dwire + off, len, out + off, wire_bf16, /*add=*/false, s->get());
  };
  Status st = compressor.allreduce_cast_encoded_sliced(host, count, coll::DataType::kF32, spec_text,
                                                       key, hooks);
  return finish_call(*s, device, key, fresh, std::move(st));
}

// sign on a float32 GPU tensor: the worker encode (with the worker residual, on the device) and
// the final decode run on the GPU; only the 1-bit encodings cross PCIe (p slots of ~count / 32
// floats' size each way), and the host runs the exchange and the server step
// (Compressor::allreduce_two_phase_encoded). The GPU's per-chunk scale is summed in another
// order than the CPU's (gpu_codecs.h), so the result may differ from the host path's within
// sign_scale_tolerance; every rank still gets the same bits.
Status DeviceCompression::allreduce_sign(coll::Compressor& compressor, int device, float* buf,
                                         size_t count, bool error_feedback, size_t chunk,
                                         std::string_view spec_text, std::string_view key) {
  GW_ASSIGN_OR_RETURN(Stream * s, stream(device));
  bool fresh = false;
  GW_ASSIGN_OR_RETURN(Tensor * tp, tensor(key, device, count, error_feedback, false, 0, &fresh));
  Tensor& t = *tp;
  float* res = t.residual.size() > 0 ? t.residual.as<float>() : nullptr;
  // The device copy of the p slots (grown to the blob size on first use; the key's spec and
  // count are fixed once the Compressor accepted them, so is the size).
  auto device_blob = [&](size_t bytes) -> Result<uint8_t*> {
    if (t.wire.size() < bytes) {
      t.wire.reset();
      GW_ASSIGN_OR_RETURN(t.wire, DeviceBuffer::allocate(device, bytes));
    }
    return t.wire.as<uint8_t>();
  };
  coll::Compressor::TwoPhaseHooks hooks;
  hooks.encode = [&](uint8_t* blob, size_t slot,
                     const std::vector<coll::Compressor::Partition>& parts) -> Status {
    const size_t bytes = slot * parts.size();
    GW_ASSIGN_OR_RETURN(uint8_t * dblob, device_blob(bytes));
    GW_ASSIGN_OR_RETURN(void* host, host_memory(device, bytes));
    GW_RETURN_IF_ERROR(t.wire.fill(0));  // the slots' unused tail bytes, as the host path's
    for (size_t j = 0; j < parts.size(); ++j) {
      if (parts[j].len == 0) continue;
      GW_RETURN_IF_ERROR(sign_encode(buf + parts[j].offset, res ? res + parts[j].offset : nullptr,
                                     parts[j].len, chunk, dblob + slot * j, s->get()));
    }
    GW_RETURN_IF_ERROR(s->copy_to_host(host, dblob, bytes));
    GW_RETURN_IF_ERROR(s->wait(kKernelWaitMs));
    std::memcpy(blob, host, bytes);
    return ok_status();
  };
  hooks.decode = [&](const uint8_t* blob, size_t slot,
                     const std::vector<coll::Compressor::Partition>& parts) -> Status {
    const size_t bytes = slot * parts.size();
    GW_ASSIGN_OR_RETURN(uint8_t * dblob, device_blob(bytes));
    GW_ASSIGN_OR_RETURN(void* host, host_memory(device, bytes));
    std::memcpy(host, blob, bytes);
    GW_RETURN_IF_ERROR(s->copy_to_device(dblob, host, bytes));
    for (size_t j = 0; j < parts.size(); ++j) {
      if (parts[j].len == 0) continue;
      GW_RETURN_IF_ERROR(sign_decode(dblob + slot * j, parts[j].len, chunk, buf + parts[j].offset,
                                     /*add=*/false, s->get()));
    }
    return ok_status();
  };
  Status st =
      compressor.allreduce_two_phase_encoded(count, coll::DataType::kF32, spec_text, key, hooks);
  return finish_call(*s, device, key, fresh, std::move(st));
}

Status DeviceCompression::allreduce(coll::Compressor& compressor, void* buf, size_t count,
                                    coll::DataType dtype, std::string_view spec_text,
                                    std::string_view key) {
  GW_ASSIGN_OR_RETURN(coll::CodecSpec spec, coll::parse_codec_spec(spec_text));
  GW_ASSIGN_OR_RETURN(int device, device_of(buf));
  const bool f32_kernels = dtype == coll::DataType::kF32 && codecs_available().ok();
  const bool cast = spec.kind == coll::CodecKind::kFp16 || spec.kind == coll::CodecKind::kBf16;
  if (cast && f32_kernels) {
    return allreduce_cast(compressor, device, static_cast<float*>(buf), count, spec.error_feedback,
                          spec.kind == coll::CodecKind::kBf16, spec_text, key);
  }
  if (spec.kind == coll::CodecKind::kSign && f32_kernels) {
    return allreduce_sign(compressor, device, static_cast<float*>(buf), count, spec.error_feedback,
                          spec.chunk, spec_text, key);
  }
  // Staged: the host path on a host copy.
  const size_t bytes = count * coll::dtype_size(dtype);
  GW_ASSIGN_OR_RETURN(void* host, host_memory(device, bytes));
  GW_RETURN_IF_ERROR(copy_to_host(host, buf, bytes));
  GW_RETURN_IF_ERROR(compressor.allreduce(host, count, dtype, spec_text, key));
  return copy_to_device(buf, host, bytes);
}

}  // namespace gw::cuda
