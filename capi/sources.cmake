# The sources of libgradwire.so, relative to capi/: read by capi/CMakeLists.txt and by the
# standalone build that compiles the library itself (perf/gpu/CMakeLists.txt).
set(GW_CAPI_SRC
    gradwire.cc         # the C ABI over a Session (session.h): handles, config, errors
    collectives.cc      # the collectives and their i-forms
    requests.cc         # gw_wait/gw_test and point-to-point
    direct_session.cc   # direct mode: a Communicator in this process
    daemon_session.cc   # daemon mode: a client of gradwired (daemon/client.h): the data path
    daemon_session_setup.cc  # daemon mode: rendezvous, connection, agreed chunk, split
    daemon_session_trace.cc  # daemon mode: the trainer's side of GW_TIMELINE
    daemon_device.cc    # daemon mode: device buffers imported into gradwired, or staged
    daemon_calls.cc     # daemon mode: reduce/gather/scatter/alltoallv composed; the i-forms
    daemon_session_p2p.cc  # daemon mode: gw_send/gw_recv through gradwired
    setup_checks.cc     # both modes: checks before the rendezvous, failures said in the store
    compressed.cc       # gw_allreduce_compressed and its stats
    kv.cc               # the parameter server's gw_kv_* (kv/)
    host_memory.cc      # which buffers are device memory; gw_mem_register
    device_memory.cc    # direct mode: allocation cache, staging pool, registrations
    device_staging.cc   # direct mode: device buffers copied through host memory
    fusion_queue.cc     # tensor fusion of small gw_iallreduce calls: the queue, the agreement
    fusion_session.cc)  # a Session that fuses them and drains before other collectives
