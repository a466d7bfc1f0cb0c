// The compression part of the C ABI: gw_allreduce_compressed, gw_comm_stats,
// gw_comm_reset_stats, gw_comm_release_compression.
//
// The compression state (residuals per tensor key, byte counters) belongs to the comm's Session,
// created on first use and freed with it; it runs on the communicator itself, so abort handling
// and deadlines are those of the collectives.
#include <cstdint>

#include "capi/capi_internal.h"
#include "collectives/types.h"

namespace {

using gw::Status;
using gw::capi::guarded;

}  // namespace

GW_EXPORT gw_status_t gw_allreduce_compressed(gw_comm_t comm, void* buf, size_t count,
                                              gw_dtype_t dtype_arg, const char* codec_spec,
                                              const char* tensor_key) {
  return guarded("gw_allreduce_compressed", [&]() -> Status {
    const int dtype = gw::capi::raw_enum(dtype_arg);
    GW_ASSIGN_OR_RETURN(auto session, gw::capi::usable(comm));
    if (codec_spec == nullptr) return gw::invalid_arg("argument codec_spec is NULL");
    if (tensor_key == nullptr) return gw::invalid_arg("argument tensor_key is NULL");
    GW_RETURN_IF_ERROR(gw::capi::check_dtype(dtype));
    GW_ASSIGN_OR_RETURN(size_t bytes, gw::capi::buffer_bytes("count", count, dtype));
    GW_RETURN_IF_ERROR(gw::capi::check_buffer("buf", buf, bytes));
    // A codec may gather every rank's encoding, up to twice the input each (top-k's index and
    // value pairs): a count whose exchange no process could hold is the caller's error.
    GW_RETURN_IF_ERROR(
        gw::capi::buffer_bytes("count", count, dtype, 2 * static_cast<size_t>(session->size()))
            .status());
    return session->allreduce_compressed(buf, count, static_cast<gw::coll::DataType>(dtype),
                                         codec_spec, tensor_key);
  });
}

GW_EXPORT gw_status_t gw_comm_stats(gw_comm_t comm, gw_comm_stats_t* out) {
  return guarded("gw_comm_stats", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, gw::capi::lookup(comm));
    if (out == nullptr) return gw::invalid_arg("argument out (the output pointer) is NULL");
    GW_ASSIGN_OR_RETURN(*out, session->compression_stats());
    return gw::ok_status();
  });
}

GW_EXPORT gw_status_t gw_comm_reset_stats(gw_comm_t comm) {
  return guarded("gw_comm_reset_stats", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, gw::capi::lookup(comm));
    return session->reset_compression_stats();
  });
}

GW_EXPORT gw_status_t gw_comm_release_compression(gw_comm_t comm) {
  return guarded("gw_comm_release_compression", [&]() -> Status {
    GW_ASSIGN_OR_RETURN(auto session, gw::capi::lookup(comm));
    return session->release_compression();
  });
}
