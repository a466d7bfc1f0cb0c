# gpudirect's sources and its embedded fatbin, for gpudirect/CMakeLists.txt (the library) and for
# perf/gpu/'s standalone build of the GPU check programs (which compiles them in).
#
# In: GW_NVCC, the nvcc to compile codec_kernels.cu with, or empty (no kernels: no_fatbin.cc).
# Out: GW_GPUDIRECT_KERNELS_SRC, what needs only core/status.cc beside it (driver table, buffers,
# streams, codec launches, the fatbin); GW_GPUDIRECT_SRC, that and device_compression.cc (which
# needs gw_compress). The fatbin commands are added to the including directory, so its targets
# are the ones that may use these lists.
set(GW_GPUDIRECT_DIR ${CMAKE_CURRENT_LIST_DIR})
get_filename_component(GW_GPUDIRECT_ROOT ${GW_GPUDIRECT_DIR}/.. ABSOLUTE)

# The fatbin, embedded as a generated .cc (embed_fatbin.cmake: no xxd needed).
if(GW_NVCC)
  set(GW_FATBIN ${CMAKE_CURRENT_BINARY_DIR}/codec_kernels.fatbin)
  set(GW_FATBIN_CC ${CMAKE_CURRENT_BINARY_DIR}/codec_kernels_fatbin.cc)
  add_custom_command(
    OUTPUT ${GW_FATBIN}
    COMMAND ${GW_NVCC} --fatbin -std=c++17 -O3 -ccbin ${CMAKE_CXX_COMPILER} -I${GW_GPUDIRECT_ROOT}
            -gencode=arch=compute_80,code=sm_80 -gencode=arch=compute_90,code=sm_90
            -gencode=arch=compute_90,code=compute_90
            -o ${GW_FATBIN} ${GW_GPUDIRECT_DIR}/codec_kernels.cu
    DEPENDS ${GW_GPUDIRECT_DIR}/codec_kernels.cu ${GW_GPUDIRECT_DIR}/cast16_math.h
    COMMENT "nvcc --fatbin codec_kernels.cu (sm_80, sm_90, compute_90)"
    VERBATIM)
  add_custom_command(
    OUTPUT ${GW_FATBIN_CC}
    COMMAND ${CMAKE_COMMAND} -DIN=${GW_FATBIN} -DOUT=${GW_FATBIN_CC}
            -P ${GW_GPUDIRECT_DIR}/embed_fatbin.cmake
    DEPENDS ${GW_FATBIN} ${GW_GPUDIRECT_DIR}/embed_fatbin.cmake
    COMMENT "embedding the codec fatbin"
    VERBATIM)
  set(GW_FATBIN_SRC ${GW_FATBIN_CC})
else()
  set(GW_FATBIN_SRC ${GW_GPUDIRECT_DIR}/no_fatbin.cc)
endif()

set(GW_GPUDIRECT_KERNELS_SRC
    ${GW_GPUDIRECT_DIR}/cuda_driver.cc
    ${GW_GPUDIRECT_DIR}/allocation_cache.cc
    ${GW_GPUDIRECT_DIR}/device_buffer.cc
    ${GW_GPUDIRECT_DIR}/fatbin.cc
    ${GW_GPUDIRECT_DIR}/gpu_codecs.cc
    ${GW_GPUDIRECT_DIR}/stream.cc
    ${GW_FATBIN_SRC})
set(GW_GPUDIRECT_SRC ${GW_GPUDIRECT_KERNELS_SRC} ${GW_GPUDIRECT_DIR}/device_compression.cc)
