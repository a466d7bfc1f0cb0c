# Debian packages of the install rules, one per install component: `cpack -G DEB` in a build tree
# (after building it; docs/daemon.md "Debian packages"). They install under /usr:
#   libgradwire0      lib     libgradwire.so.0, the NCCL net plugin (and libnccl-net.so)
#   gradwire-dpdk     dpdk    the DPDK backend's module (where it was built), apart so that the
#                             library needs no DPDK libraries
#   libgradwire-dev   dev     gradwire.h, libgradwire.so, gradwire.pc, the CMake package
#   gradwired         daemon  gradwired, gradwirectl, the systemd unit, /etc/gradwire/gradwired.toml
#                             (a conffile: an upgrade keeps an edited one) and its .example
#   gradwire-tools    tools   gradwire-perf
#   python3-gradwire  python  the Python package in /usr/lib/python3/dist-packages (with its own
#                             copy of libgradwire.so, as the wheel has), gradwire-run
# Run-time dependencies on Debian's libraries come from dpkg-shlibdeps; between the packages, from
# the component dependencies below (same version). tests/install/deb_test.sh builds and checks them.
set(CPACK_PACKAGE_NAME gradwire)
set(CPACK_PACKAGE_VENDOR gradwire)
set(CPACK_PACKAGE_CONTACT "gradwire maintainers <gradwire@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
# The install code sees CMAKE_INSTALL_PREFIX=/usr (the unit's ExecStart, /etc); files go to DESTDIR.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
# gradwire-perf needs libgradwire.so.0 of libgradwire0 (a dependency below), not a Debian library.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${CMAKE_BINARY_DIR}/capi)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
# A component's description: its synopsis, then a paragraph (dpkg's continuation lines).
function(gw_deb_description comp synopsis)
  string(JOIN " " text ${ARGN})
  set(CPACK_DEBIAN_${comp}_DESCRIPTION "${synopsis}\n${text}" PARENT_SCOPE)
endfunction()

set(CPACK_DEBIAN_LIB_PACKAGE_NAME libgradwire${PROJECT_VERSION_MAJOR})
gw_deb_description(LIB "gradwire library and NCCL net plugin"
                   "libgradwire (the C ABI of gradwire.h: allreduce and the other collectives"
                   "over TCP, shared memory, RDMA verbs, DPDK) and libnccl-net-gradwire.so for"
                   "NCCL_NET_PLUGIN.")
set(CPACK_DEBIAN_DPDK_PACKAGE_NAME gradwire-dpdk)
gw_deb_description(DPDK "gradwire DPDK backend"
                   "libgradwire_dpdk.so, loaded by libgradwire when GW_TRANSPORT names dpdk.")
set(CPACK_COMPONENT_DPDK_DEPENDS lib)
set(CPACK_DEBIAN_DEV_PACKAGE_NAME libgradwire-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
gw_deb_description(DEV "gradwire development files"
                   "gradwire.h, libgradwire.so, gradwire.pc (pkg-config) and the CMake package"
                   "(find_package(gradwire), gradwire::gradwire).")
set(CPACK_COMPONENT_DEV_DEPENDS lib)
set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME gradwired)
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION net)
gw_deb_description(DAEMON "gradwire per-host daemon"
                   "gradwired (systemd unit gradwired.service, /etc/gradwire/gradwired.toml)"
                   "and gradwirectl: one daemon per host shares the NIC among the trainers of"
                   "the host.")
set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME gradwire-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION net)
gw_deb_description(TOOLS "gradwire perf tool"
                   "gradwire-perf: nccl-tests and perftest style numbers per transport and"
                   "collective, and the doctor.")
set(CPACK_COMPONENT_TOOLS_DEPENDS lib)
set(CPACK_DEBIAN_PYTHON_PACKAGE_NAME python3-gradwire)
set(CPACK_DEBIAN_PYTHON_PACKAGE_SECTION python)
set(CPACK_DEBIAN_PYTHON_PACKAGE_DEPENDS "python3 (>= 3.9)")
set(CPACK_DEBIAN_PYTHON_PACKAGE_SUGGESTS python3-torch)
gw_deb_description(PYTHON "gradwire for Python"
                   "import gradwire: the collectives on NumPy arrays and torch tensors, a DDP"
                   "comm hook, and gradwire-run, the launcher.")

# The daemon's config is the admin's: dpkg keeps an edited one on upgrade.
file(WRITE ${CMAKE_BINARY_DIR}/packaging/daemon/conffiles "/etc/gradwire/gradwired.toml\n")
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA ${CMAKE_BINARY_DIR}/packaging/daemon/conffiles)

include(CPack)
