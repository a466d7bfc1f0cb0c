// The compression part of the C ABI: gw_allreduce_compressed, gw_comm_stats,
// gw_comm_reset_stats, gw_comm_release_compression.
//
// The per-communicator Compressor (residuals per tensor key, byte counters) lives in the comm's
// CommState, created on first use and freed with the communicator; it runs on the communicator
// itself, so argument checks, abort handling and deadlines are those of the collectives.
#include <cstdint>
#include <cstring>

#include "capi/capi_internal.h"
#include "collectives/compress/compress.h"
#include "collectives/types.h"
#include "gpudirect/cuda_driver.h"
#include "gpudirect/device_compression.h"

namespace {

using gw::Status;
using gw::capi::CommState;
using gw::capi::guarded;
using gw::capi::usable;

// The comm's compressor, created on first use. Callers hold st.compress_mu.
gw::coll::Compressor& compressor_of(CommState& st) {
  if (!st.compressor) st.compressor = std::make_unique<gw::coll::Compressor>(st.comm.get());
  return *st.compressor;
}

}  // namespace

GW_EXPORT gw_status_t gw_allreduce_compressed(gw_comm_t comm, void* buf, size_t count,
                                              gw_dtype_t dtype, const char* codec_spec,
                                              const char* tensor_key) {
  return guarded("gw_allreduce_compressed", [&]() -> Status {
    int d;
    static_assert(sizeof(d) == sizeof(dtype));
    std::memcpy(&d, &dtype, sizeof(d));  // any int a C caller passes, without UB
    GW_ASSIGN_OR_RETURN(auto st, usable(comm));
    if (codec_spec == nullptr) return gw::invalid_arg("argument codec_spec is NULL");
    if (tensor_key == nullptr) return gw::invalid_arg("argument tensor_key is NULL");
    if (!gw::coll::valid_dtype(d)) {
      return gw::invalid_arg("argument dtype: unknown gw_dtype_t value {}", d);
    }
    const size_t elem = gw::coll::dtype_size(static_cast<gw::coll::DataType>(d));
    if (count > SIZE_MAX / elem) {
      return gw::invalid_arg("argument count {} overflows the buffer size", count);
    }
    if (buf == nullptr && count > 0) {
      return gw::invalid_arg("argument buf is NULL with {} elements", count);
    }
    std::lock_guard<std::mutex> lock(st->compress_mu);
    if (count > 0 && gw::cuda::is_device_pointer(buf)) {
      if (!st->device_compression) {
        st->device_compression = std::make_shared<gw::cuda::DeviceCompression>();
      }
      return st->device_compression->allreduce(compressor_of(*st), buf, count,
                                               static_cast<gw::coll::DataType>(d), codec_spec,
                                               tensor_key);
    }
    return compressor_of(*st).allreduce(buf, count, static_cast<gw::coll::DataType>(d), codec_spec,
                                        tensor_key);
  });
}

GW_EXPORT gw_status_t gw_comm_stats(gw_comm_t comm, gw_comm_stats_t* out) {
  return guarded("gw_comm_stats", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, gw::capi::lookup(comm));
    if (out == nullptr) return gw::invalid_arg("argument out (the output pointer) is NULL");
    std::lock_guard<std::mutex> lock(st->compress_mu);
    const gw::coll::CompressStats s = compressor_of(*st).stats();
    out->bytes_sent = s.bytes_sent;
    out->bytes_uncompressed = s.bytes_uncompressed;
    out->calls = s.calls;
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_reset_stats(gw_comm_t comm) {
  return guarded("gw_comm_reset_stats", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, gw::capi::lookup(comm));
    std::lock_guard<std::mutex> lock(st->compress_mu);
    compressor_of(*st).reset_stats();
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_release_compression(gw_comm_t comm) {
  return guarded("gw_comm_release_compression", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto st, gw::capi::lookup(comm));
    std::lock_guard<std::mutex> lock(st->compress_mu);
    st->compressor.reset();
    st->device_compression.reset();
    return gw::ok_status();
  });
}
