// Helper process for the plugin tests: scenarios that need a process of their own.
//   nccl_plugin_peer exchange ROLE   one side of the two-process transfer (handles on stdin/stdout)
//   nccl_plugin_peer init CODE TEXT  the first init must return CODE and WARN a line with TEXT
//   nccl_plugin_peer info TEXT       the first init must succeed and its INFO line contain TEXT
//   nccl_plugin_peer channels VALUE  the first init must succeed and leave NCCL_MIN_NCHANNELS at
//                                    VALUE ("-": unset)
//   nccl_plugin_peer pin EXPECT      after init/finalize/dlclose the library is (1) or is not (0)
//                                    still mapped
// Exit status 0 means the scenario held; the reason for anything else goes to stderr.
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/plugin/plugin_harness.h"

using namespace gw::plugin_test;

namespace {

int fail(const std::string& why) {
  std::fprintf(stderr, "nccl_plugin_peer: %s\n", why.c_str());
  return 1;
}

int run_init(int expected, const std::string& needle) {
  const Loaded& l = plugin();
  if (l.v11 == nullptr) return fail("no ncclNetPlugin_v11");
  for (const std::string& line : l.first_init_log) std::fprintf(stderr, "  %s\n", line.c_str());
  if (l.first_init != expected) {
    return fail("init returned " + std::to_string(l.first_init) + ", expected " +
                std::to_string(expected));
  }
  bool warned = false;
  for (const std::string& line : l.first_init_log) {
    if (line.rfind("WARN", 0) == 0 && line.find(needle) != std::string::npos) warned = true;
  }
  if (expected != ncclSuccess && !warned) return fail("no WARN line mentioning " + needle);
  // NCCL calls finalize on the context of a failed init.
  if (l.v11->finalize(nullptr) != ncclSuccess) return fail("finalize(NULL) failed");
  return 0;
}

int run_info(const std::string& needle) {
  const Loaded& l = plugin();
  if (l.v11 == nullptr) return fail("no ncclNetPlugin_v11");
  for (const std::string& line : l.first_init_log) std::fprintf(stderr, "  %s\n", line.c_str());
  if (l.first_init != ncclSuccess) return fail("init failed");
  for (const std::string& line : l.first_init_log) {
    if (line.rfind("INFO NET/gradwire: backend ", 0) == 0 &&
        line.find(needle) != std::string::npos) {
      return 0;
    }
  }
  return fail("no INFO line mentioning " + needle);
}

int run_channels(const std::string& want) {
  const Loaded& l = plugin();
  if (l.v11 == nullptr) return fail("no ncclNetPlugin_v11");
  for (const std::string& line : l.first_init_log) std::fprintf(stderr, "  %s\n", line.c_str());
  if (l.first_init != ncclSuccess) return fail("init failed");
  const char* v = std::getenv("NCCL_MIN_NCHANNELS");
  const std::string got = v == nullptr ? "-" : v;
  if (got != want) return fail("NCCL_MIN_NCHANNELS is " + got + ", expected " + want);
  return 0;
}

int run_pin(bool expect_loaded) {
  set_test_environment();
  void* lib = dlopen(GW_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return fail(std::string("dlopen: ") + dlerror());
  auto* v11 = static_cast<ncclNet_v11_t*>(dlsym(lib, "ncclNetPlugin_v11"));
  if (v11 == nullptr) return fail("no ncclNetPlugin_v11");
  void* ctx = nullptr;
  ncclNetCommConfig_v11_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
  if (v11->init(&ctx, 1, &cfg, record_log, nullptr) != ncclSuccess) return fail("init failed");
  // A connection, so the backend has done real work (and any threads it uses are running).
  auto api = make_api("v11");
  void *sc = nullptr, *rc = nullptr;
  if (Error e = connect_pair(*api, ctx, &sc, &rc); !e.empty()) return fail(e);
  v11->closeSend(sc);
  v11->closeRecv(rc);
  if (v11->finalize(ctx) != ncclSuccess) return fail("finalize failed");
  // make_api's own dlopen handle (plugin()) holds a reference too: drop both, as NCCL's
  // dlclose after the last communicator would.
  dlclose(plugin().lib);
  dlclose(lib);
  void* again = dlopen(GW_PLUGIN_PATH, RTLD_NOW | RTLD_NOLOAD);
  bool loaded = again != nullptr;
  if (loaded != expect_loaded) {
    return fail(std::string("library ") + (loaded ? "still" : "no longer") + " loaded");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2)
    return fail(
        "usage: nccl_plugin_peer exchange ROLE | init CODE TEXT | info TEXT | channels VALUE | "
        "pin 0|1");
  std::string mode = argv[1];
  try {
    if (mode == "exchange" && argc == 3) {
      auto api = make_api("v11");
      Error e = exchange_with_peer(*api, STDIN_FILENO, STDOUT_FILENO, std::atoi(argv[2]));
      return e.empty() ? 0 : fail(e);
    }
    if (mode == "init" && argc == 4) return run_init(std::atoi(argv[2]), argv[3]);
    if (mode == "info" && argc == 3) return run_info(argv[2]);
    if (mode == "channels" && argc == 3) return run_channels(argv[2]);
    if (mode == "pin" && argc == 3) return run_pin(std::atoi(argv[2]) != 0);
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return fail("bad arguments");
}
