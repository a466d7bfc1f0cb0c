# The sources of gw_compress, relative to collectives/compress/: read by its CMakeLists.txt and by
# the standalone build that compiles the library itself (perf/gpu/CMakeLists.txt).
set(GW_COMPRESS_SOURCES
    codec.cc
    codec_kernels.cc
    codec_kernels_avx512.cc
    codec_spec.cc
    compress.cc
    compress_config.cc
    powersgd.cc
    qsgd_kernels.cc
    topk_select.cc
    codecs/cast.cc
    codecs/qsgd.cc
    codecs/randomk.cc
    codecs/sign.cc
    codecs/topk.cc)
