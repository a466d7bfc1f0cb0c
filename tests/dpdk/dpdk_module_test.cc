// The DPDK port module (dpdk/port_module.h): libgradwire.so and the NCCL plugin need no DPDK
// library; the dpdk backend loads libgradwire_dpdk.so of the same build and opens its port through
// it; a missing module is one INFO line and leaves every other backend working; a module of
// another build, or a library that is no module, is refused with the reason.
//
// Each case that loads (or fails to load) the module runs in a helper process of its own
// (tests/support/exec_child.h): the loader keeps its verdict for the life of the process.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/net/backend_registry.h"
#include "dpdk/port_module.h"
#include "tests/support/exec_child.h"
#include "tests/support/shell_run.h"

namespace gw::dpdk {
namespace {

using ::gw::testing::env_or_empty;
using ::gw::testing::ExecChild;
using ::gw::testing::register_child_case;
using ::gw::testing::run_shell;
using ::gw::testing::ShellRun;

std::string needed_libraries(const std::string& file) {
  ShellRun r = run_shell("readelf -d '" + file + "' | grep NEEDED");
  EXPECT_EQ(r.rc, 0) << r.out;
  return r.out;
}

TEST(DpdkModule, TheLibraryAndThePluginNeedNoDpdkButTheModuleDoes) {
  for (const char* file : {GW_LIBGRADWIRE_FILE, GW_PLUGIN_FILE}) {
    std::string needed = needed_libraries(file);
    EXPECT_NE(needed.find("libc.so"), std::string::npos) << file << ": " << needed;
    EXPECT_EQ(needed.find("librte_"), std::string::npos) << file << " links DPDK: " << needed;
  }
  EXPECT_NE(needed_libraries(GW_MODULE_FILE).find("librte_eal"), std::string::npos);
  // Built beside libgradwire.so, where the loader looks first.
  std::string lib = GW_LIBGRADWIRE_FILE, mod = GW_MODULE_FILE;
  EXPECT_EQ(lib.substr(0, lib.rfind('/')), mod.substr(0, mod.rfind('/')));
}

TEST(DpdkModule, ProbeFindsThisBuildsModuleWithoutLoadingIt) {
  if (!env_or_empty("GW_DPDK_MODULE").empty()) GTEST_SKIP() << "GW_DPDK_MODULE is set";
  auto found = find_port_module();
  ASSERT_TRUE(found.ok()) << found.status().to_string();
  EXPECT_EQ(*found, GW_MODULE_FILE);
  EXPECT_TRUE(net::backend_status("dpdk").ok());
  EXPECT_EQ(loaded_port_module(), "");  // a probe does not dlopen
}

TEST(DpdkModule, LooksBesideItsOwnBinaryFirstThenInTheBuildTreeThenTheInstallLibdir) {
  if (!env_or_empty("GW_DPDK_MODULE").empty()) GTEST_SKIP() << "GW_DPDK_MODULE is set";
  char exe[4096] = {0};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof(exe) - 1), 0);
  std::string dir = exe;
  dir = dir.substr(0, dir.rfind('/'));
  std::string mod = GW_MODULE_FILE;
  std::vector<std::string> c = port_module_candidates();
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0], dir + "/libgradwire_dpdk.so");
  EXPECT_EQ(c[1], mod);
  EXPECT_EQ(c[2].substr(0, dir.rfind('/') + 1), dir.substr(0, dir.rfind('/') + 1));
  EXPECT_NE(c[3].find("/libgradwire_dpdk.so"), std::string::npos);
  setenv("GW_DPDK_MODULE", "/some/where/m.so", 1);
  std::vector<std::string> only = port_module_candidates();
  unsetenv("GW_DPDK_MODULE");
  EXPECT_EQ(only, std::vector<std::string>{"/some/where/m.so"});
}

// The child's stderr goes to GW_TEST_STDERR so the parent can read what it logged.
void redirect_stderr() {
  std::string path = env_or_empty("GW_TEST_STDERR");
  if (!path.empty()) (void)std::freopen(path.c_str(), "w", stderr);
  log::reload_level();
}

net::TransportOptions options() {
  net::TransportOptions o;
  o.job_token = "module-test";
  o.timeout_ms = 10000;
  return o;
}

const bool kLoads = register_child_case("DpdkModuleChild", "Loads", [] {
  redirect_stderr();
  auto t = net::make_transport("dpdk", options());
  if (!t.ok()) {
    std::fprintf(stderr, "make_transport: %s\n", t.status().to_string().c_str());
    return 1;
  }
  if (loaded_port_module() != GW_MODULE_FILE) {
    std::fprintf(stderr, "loaded %s\n", loaded_port_module().c_str());
    return 2;
  }
  return 0;
});

const bool kRefused = register_child_case("DpdkModuleChild", "Refused", [] {
  redirect_stderr();
  Status probe1 = net::backend_status("dpdk");
  Status probe2 = net::backend_status("dpdk");
  auto t = net::make_transport("dpdk", options());
  auto tcp = net::make_transport("tcp", options());
  std::fprintf(stderr, "probe: %s\n", probe1.to_string().c_str());
  std::fprintf(stderr, "make_transport: %s\n", t.ok() ? "ok" : t.status().to_string().c_str());
  std::fprintf(stderr, "tcp: %s\n", tcp.ok() ? "ok" : tcp.status().to_string().c_str());
  std::fflush(stderr);
  if (t.ok() || t.status().code() != Code::kUnsupported) return 1;
  if (!tcp.ok()) return 2;
  return 0;
});

std::string run_child(const std::string& name, const std::string& module, int* rc) {
  char path[] = "/tmp/gw_dpdk_module_test.XXXXXX";
  int fd = mkstemp(path);
  EXPECT_GE(fd, 0);
  close(fd);
  std::vector<std::string> env = {"GW_TEST_STDERR=" + std::string(path), "GW_LOG_LEVEL=info",
                                  "GW_DPDK_PORT=ring"};
  if (!module.empty()) env.push_back("GW_DPDK_MODULE=" + module);
  ExecChild child("DpdkModuleChild." + name, env);
  *rc = child.wait(60000);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  unlink(path);
  return ss.str();
}

int count(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(DpdkModule, TheBackendOpensARingPortThroughThisBuildsModule) {
  int rc = 0;
  std::string err = run_child("Loads", "", &rc);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_EQ(count(err, "dpdk: port module " GW_MODULE_FILE), 1) << err;
}

TEST(DpdkModule, AMissingModuleIsOneInfoLineAndTcpStillWorks) {
  int rc = 0;
  std::string err = run_child("Refused", "/nonexistent/libgradwire_dpdk.so", &rc);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_EQ(count(err, "] info "), 1) << err;  // said once, though probed twice and then asked for
  EXPECT_EQ(count(err, "GW_DPDK_MODULE=/nonexistent/libgradwire_dpdk.so: no such file"), 3) << err;
  EXPECT_NE(err.find("transport 'dpdk' is unavailable"), std::string::npos) << err;
}

TEST(DpdkModule, AModuleOfAnotherBuildIsRefusedNamingBoth) {
  int rc = 0;
  std::string err = run_child("Refused", GW_OTHER_MODULE_FILE, &rc);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("comes from another build of gradwire (another build) than this one (" +
                     std::string(build_id()) + ")"),
            std::string::npos)
      << err;
}

TEST(DpdkModule, ALibraryThatIsNoModuleIsRefused) {
  int rc = 0;
  std::string err = run_child("Refused", GW_LIBGRADWIRE_FILE, &rc);
  EXPECT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("is not a gradwire DPDK module (no gw_dpdk_port_module_v1)"),
            std::string::npos)
      << err;
}

}  // namespace
}  // namespace gw::dpdk
