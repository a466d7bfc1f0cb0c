# The sources of gw_kv (the parameter server), relative to kv/: read by kv/CMakeLists.txt and by
# the standalone build that compiles the library itself (perf/gpu/CMakeLists.txt).
set(GW_KV_SOURCES
    client.cc     # the worker's side: partitions, per-server links, requests
    io.cc         # plain TCP sockets with deadlines
    push_codec.cc # compressed pushes: the worker's encoder and residuals, the server's decode
    kv_config.cc  # GW_KV_* and GW_ROLE
    rules.cc      # one store's state and the consistency rules (no I/O)
    server.cc     # the server: connections, stores, serve()
    update.cc     # sum and sgd over a partition's bytes
    wire.cc)      # frames: encode, decode, checks
