# The sources of libnccl-net-gradwire.so, relative to plugin/: read by plugin/CMakeLists.txt and by
# the standalone build of the GPU checks (perf/gpu/CMakeLists.txt), whose plugin has daemon mode.
set(GW_PLUGIN_SOURCES exports.cc net_plugin.cc devices.cc connection.cc comm_memory.cc
    comm_data.cc nccl_edge.cc plugin_config.cc plugin_timeline.cc tuner.cc daemon_handle.cc)
# Daemon mode (GW_DAEMON; daemon_transport.h): needs the daemon's client (daemon/client.h), its
# control protocol and the CUDA driver table, so only builds that have them compile it (and define
# GW_PLUGIN_DAEMON=1).
set(GW_PLUGIN_DAEMON_SOURCES daemon_transport.cc daemon_meeting.cc)
