# The sources of gw_coll, relative to collectives/: read by collectives/CMakeLists.txt and by the
# standalone build that compiles the library itself (perf/gpu/CMakeLists.txt).
set(GW_COLL_SOURCES
    algorithms.cc
    async_queue.cc
    call.cc
    coll_config.cc
    comm_collectives.cc
    comm_rooted.cc
    communicator.cc
    connection_pool.cc
    cost_model.cc
    executor.cc
    group.cc
    p2p.cc
    p2p_calls.cc
    p2p_progress.cc
    reduce.cc
    rooted_schedule.cc
    schedule.cc
    shared_host_memory.cc
    shm_direct.cc
    stall.cc
    types.cc)
