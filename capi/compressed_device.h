// The GPU side of gw_allreduce_compressed (compressed_device.cc): tensors in GPU memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "collectives/compress/compress.h"
#include "collectives/types.h"
#include "core/status.h"

namespace gw::capi {

// Per-communicator device state: residuals per tensor key, a page-locked staging buffer, a stream
// per device. Opaque here so that the rest of the C ABI needs no CUDA headers; freed with the
// communicator.
struct DeviceCompression;

// True when p is GPU memory known to the CUDA driver (false without a driver: never loads more).
bool is_device_buffer(const void* p);

// gw_allreduce_compressed for a buffer in GPU memory (arguments already checked by the caller,
// count > 0; calls serialised by the caller); creates *state on first use. fp16/bf16 on float32
// run on the GPU in slices overlapped with the exchange, the rest is staged through host memory
// (see the .cc). Synchronous: on return, success or not, no work of the call is left on the GPU.
Status allreduce_compressed_device(std::shared_ptr<DeviceCompression>& state,
                                   coll::Compressor& compressor, void* buf, size_t count,
                                   coll::DataType dtype, std::string_view spec,
                                   std::string_view key);

}  // namespace gw::capi
