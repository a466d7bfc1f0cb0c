// The GPU side of gw_allreduce_compressed (compressed_device.cc): tensors in GPU memory.
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "collectives/compress.h"
#include "collectives/types.h"
#include "core/status.h"

namespace gw::capi {

// Per-communicator device state: residuals and staging buffers per tensor key. Opaque here so
// that the rest of the C ABI needs no CUDA headers; freed with the communicator.
struct DeviceCompression;

// True when p is GPU memory known to the CUDA driver (false without a driver: never loads more).
bool is_device_buffer(const void* p);

// gw_allreduce_compressed for a buffer in GPU memory (arguments already checked by the caller,
// count > 0);
// creates *state on first use. fp16/bf16 on float32 run on the GPU, the rest is staged through
// host memory (see the .cc).
Status allreduce_compressed_device(std::shared_ptr<DeviceCompression>& state,
                                   coll::Compressor& compressor, void* buf, size_t count,
                                   coll::DataType dtype, std::string_view spec,
                                   std::string_view key);

}  // namespace gw::capi
