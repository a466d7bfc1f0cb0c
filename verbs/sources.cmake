# The sources of gw_verbs, relative to verbs/: read by verbs/CMakeLists.txt and by the standalone
# build of the GPU checks (perf/gpu/CMakeLists.txt's gw-gpu-dmabuf-check).
set(GW_VERBS_SOURCES
    device_select.cc
    ibv_table.cc
    verbs_comm.cc
    verbs_config.cc
    verbs_device.cc
    verbs_transport.cc
    # the emulator (emu/nic.h says which file does what)
    emu/faults.cc
    emu/nic.cc
    emu/nic_requester.cc
    emu/nic_responder.cc
    emu/verbs_entries.cc)
