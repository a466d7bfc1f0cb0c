# The sources of the daemon's libraries and programs, relative to daemon/: read by
# daemon/CMakeLists.txt and by the standalone build of the GPU checks (perf/gpu/CMakeLists.txt),
# which compiles them itself on a GPU host without Debian's -dev packages.
# gw_daemon_proto: the client protocol (hello/welcome, arena rings, their decoders; ring.h is
# header-only), the daemon's config rows and its transport offer.
set(GW_DAEMON_PROTO_SOURCES protocol.cc daemon_config.cc arena_allocator.cc transport_offer.cc)
# gw_daemon_client: the trainer's side of that protocol (daemon/client.h).
set(GW_DAEMON_CLIENT_SOURCES client.cc)
# gw_daemon_control: the control protocol (daemon/control.h).
set(GW_DAEMON_CONTROL_SOURCES control.cc control_call.cc control_trace.cc)
# gw_daemon: the daemon's engine (daemon/server.h).
set(GW_DAEMON_ENGINE_SOURCES
    server.cc            # Server: create, the serve loop, stats
    admission.cc         # the trainers' socket: credentials, hello, admit, departures
    control_server.cc    # the gradwirectl socket
    counters.cc          # ServerStats' counters and phase histograms
    job.cc               # a job: its daemons' communicator, the rings, its thread
    job_collectives.cc   # each collective's local and inter-host work
    job_p2p.cc           # sends and receives among a job's trainers of this host
    job_p2p_remote.cc    # ... and with the trainers of the job's other hosts
    job_device.cc        # trainers' device buffers: imports, host-path staging
    job_dmabuf.cc        # trainers' device buffers as dma-bufs on the NIC (version 8)
    job_trace.cc         # gradwirectl trace: a job's collectives as a Chrome trace
    job_stall.cc         # the stall inspector: trainers a collective waits for
    device_import.cc     # one imported device allocation (CUDA IPC)
    reduce_pool.cc)
# gw_daemon_http: the poll loop behind --metrics and its request decoder (daemon/metrics_server.h).
set(GW_DAEMON_HTTP_SOURCES http_request.cc metrics_server.cc)
# The executables.
set(GW_GRADWIRED_SOURCES main.cc metrics.cc notifier.cc)
set(GW_GRADWIRECTL_SOURCES gradwirectl.cc)
