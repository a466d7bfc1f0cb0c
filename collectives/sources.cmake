# The sources of gw_coll, relative to collectives/: read by collectives/CMakeLists.txt and by the
# standalone build that compiles the library itself (perf/gpu/CMakeLists.txt).
set(GW_COLL_SOURCES
    algorithms.cc
    async_queue.cc
    coll_config.cc
    communicator.cc
    connection_pool.cc
    cost_model.cc
    executor.cc
    group.cc
    p2p.cc
    reduce.cc
    schedule.cc
    stall.cc
    types.cc)
