// Helper process for the plugin tests: scenarios that need a process of their own.
//   nccl_plugin_peer exchange ROLE   one side of the two-process transfer (handles on stdin/stdout)
//   nccl_plugin_peer init CODE TEXT  the first init must return CODE and WARN a line with TEXT
//   nccl_plugin_peer info TEXT       the first init must succeed and its INFO line contain TEXT
//   nccl_plugin_peer channels VALUE  the first init must succeed and leave NCCL_MIN_NCHANNELS at
//                                    VALUE ("-": unset)
//   nccl_plugin_peer pin EXPECT      after init/finalize/dlclose the library is (1) or is not (0)
//                                    still mapped
//   nccl_plugin_peer gdr FAKE_CUDA   with the stand-in CUDA driver at FAKE_CUDA loaded first (its
//                                    "device memory" is a memfd mapping, marked, whose dma-buf is
//                                    that memfd): the plugin reports NCCL_PTR_CUDA|NCCL_PTR_DMABUF,
//                                    regMr(NCCL_PTR_CUDA) and regMrDmaBuf register, and bytes move
//                                    between such buffers (the emulated NIC reaches them only
//                                    through the dma-buf). Daemon mode of two hosts: the sending
//                                    end is a second instance on host a (its daemon's NIC moves
//                                    the bytes to this host's). Where the daemon says device
//                                    buffers do not go through it, the plugin must report HOST
//                                    only: then "gdr skipped: <the plugin's reason>", exit 77
//   nccl_plugin_peer tuner WANT      with the net inited for comm 5, the exported tuner asks for
//                                    WANT channels (0: none) for a large allreduce of comm 5 on 2
//                                    nodes, and for none on one node, for other comms, for small
//                                    or point-to-point operations
//   nccl_plugin_peer timeline ON     one connection pair (v11, comm 0x1234), the kTimelineSizes
//                                    transfers (plugin_harness.h), each buffer registered and
//                                    deregistered, then close and finalize: the trace GW_TIMELINE
//                                    asks for is checked by the caller; the first init's INFO
//                                    lines name a timeline file (ON 1) or none (ON 0)
//   daemon mode's scenarios, and the two-process bench with its ceilings:
//                                    tests/plugin/daemon_scenarios.h
// Exit status 0 means the scenario held; the reason for anything else goes to stderr.
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "plugin/nccl_tuner_abi.h"
#include "tests/plugin/daemon_scenarios.h"
#include "tests/plugin/plugin_harness.h"
#include "tests/support/fake_cuda.h"

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

int run_tuner(int want) {
  const Loaded& l = plugin();
  if (l.first_init != ncclSuccess) return fail("init failed");
  auto* t = static_cast<ncclTuner_v5_t*>(dlsym(l.lib, "ncclTunerPlugin_v5"));
  if (t == nullptr) return fail("no ncclTunerPlugin_v5");
  if (t->name == nullptr || std::strcmp(t->name, "gradwire") != 0) return fail("tuner name");
  // NCCL inits the net for a communicator before its tuner: comm 5 is on the gradwire net.
  void* net_ctx = nullptr;
  ncclNetCommConfig_v11_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
  if (l.v11->init(&net_ctx, 5, &cfg, record_log, nullptr) != ncclSuccess) return fail("net init");
  ncclNvlDomainInfo_v5_t nvl{};
  ncclTunerConstants_v5_t constants{};
  constants.baseLatencies[1][2] = 8.4;
  const ncclTunerConstants_v5_t before = constants;
  // channels the tuner asks for: comm `id` on `nodes` nodes, collective `coll` of `bytes`.
  auto ask = [&](uint64_t id, size_t nodes, ncclFunc_t coll, size_t bytes, int* got) -> bool {
    void* ctx = nullptr;
    if (t->init(&ctx, id, 4, nodes, record_log, &nvl, &constants) != ncclSuccess) return false;
    std::array<std::array<float, NCCL_NUM_PROTOCOLS_V5>, NCCL_NUM_ALGORITHMS_V5> table{};
    std::array<float*, NCCL_NUM_ALGORITHMS_V5> rows{};
    for (size_t a = 0; a < rows.size(); ++a) rows[a] = table[a].data();
    table[1][2] = 5.0f;
    *got = 0;
    const ncclResult_t r = t->getCollInfo(ctx, coll, bytes, 1, rows.data(), NCCL_NUM_ALGORITHMS_V5,
                                          NCCL_NUM_PROTOCOLS_V5, 0, got);
    const bool table_kept = table[1][2] == 5.0f && table[0][0] == 0.0f;
    return r == ncclSuccess && table_kept && t->finalize(ctx) == ncclSuccess;
  };
  int got = -1;
  if (!ask(5, 2, ncclFuncAllReduce, 256 << 20, &got) || got != want) {
    return fail("large allreduce: asked for " + std::to_string(got) + " channels, expected " +
                std::to_string(want));
  }
  if (!ask(5, 2, ncclFuncAllGather, 64 << 20, &got) || got != want) return fail("allgather");
  const struct {
    uint64_t id;
    size_t nodes;
    ncclFunc_t coll;
    size_t bytes;
    const char* what;
  } untouched[] = {
      {5, 2, ncclFuncAllReduce, 4096, "a 4 KiB allreduce"},
      {5, 2, ncclFuncSendRecv, 256 << 20, "send/recv"},
      {5, 1, ncclFuncAllReduce, 256 << 20, "one node"},
      {1, 2, ncclFuncAllReduce, 256 << 20, "a finalized comm"},
      {77, 2, ncclFuncAllReduce, 256 << 20, "a comm on another net"},
  };
  for (const auto& u : untouched) {
    if (!ask(u.id, u.nodes, u.coll, u.bytes, &got) || got != 0) {
      return fail(std::string("asked for channels for ") + u.what);
    }
  }
  if (std::memcmp(&before, &constants, sizeof(constants)) != 0) return fail("constants changed");
  std::array<uint64_t, 8> junk{};
  int n = 0;
  if (t->getCollInfo(junk.data(), ncclFuncAllReduce, 1 << 20, 1, nullptr, 0, 0, 0, &n) !=
      ncclInternalError) {
    return fail("getCollInfo accepted a foreign context");
  }
  if (t->finalize(nullptr) != ncclSuccess) return fail("finalize(NULL)");
  if (l.v11->finalize(net_ctx) != ncclSuccess) return fail("net finalize");
  for (const std::string& line : log_lines()) std::fprintf(stderr, "  %s\n", line.c_str());
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

// Sends `n` bytes from `src` to `dst` over the pair through the given handles; checks content.
// `sapi` is the send comm's instance (the receive comm's, `api`, unless two hosts are in play).
Error move(NetApi& api, void* sc, void* rc, uint8_t* src, uint8_t* dst, size_t n, void* ms,
           void* md, uint32_t seed, NetApi* sapi = nullptr) {
  fill_pattern(src, n, seed);
  std::memset(dst, 0, n);
  void *rr = nullptr, *sr = nullptr;
  if (Error e = post_recv(api, rc, dst, n, 1, md, &rr); !e.empty()) return e;
  if (Error e = post_send(sapi != nullptr ? *sapi : api, sc, src, n, 1, ms, &sr); !e.empty()) {
    return e;
  }
  if (sapi == nullptr) {
    if (Error e = wait_all(api, {sr, rr}); !e.empty()) return e;
  } else {
    // Each request through its own instance, polled in turn as two proxy threads would.
    for (const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);;) {
      int sd = 0, rd = 0, got = 0;
      if (sr != nullptr && sapi->test(sr, &sd, &got) != ncclSuccess) return "isend failed";
      if (sd) sr = nullptr;
      if (rr != nullptr && api.test(rr, &rd, &got) != ncclSuccess) return "irecv failed";
      if (rd) rr = nullptr;
      if (sr == nullptr && rr == nullptr) break;
      if (std::chrono::steady_clock::now() > until) return "transfer not done after 20 s";
    }
  }
  if (int64_t bad = check_pattern(dst, n, seed); bad >= 0) {
    return "byte " + std::to_string(bad) + " differs";
  }
  return "";
}

int run_gdr(const char* fake_cuda) {
  const gw::testing::FakeCuda& cuda = gw::testing::fake_cuda(fake_cuda);
  if (cuda.mark_dmabuf == nullptr || cuda.exports == nullptr) {
    const char* why = dlerror();
    return fail(std::string("cannot use the stand-in driver ") + fake_cuda + ": " +
                (why != nullptr ? why : "it lacks its hooks"));
  }
  auto mark = cuda.mark_dmabuf;
  auto exports = cuda.exports;
  const Loaded& l = plugin();
  if (l.first_init != ncclSuccess) return fail("init failed");
  bool said = false;
  std::string no_gdr;  // daemon mode: the start-up line's reason for host buffers only
  for (const std::string& line : l.first_init_log) {
    std::fprintf(stderr, "  %s\n", line.c_str());
    if (line.find("pointer support HOST|CUDA|DMABUF") != std::string::npos &&
        line.find("GPUDirect RDMA dma-buf") != std::string::npos) {
      said = true;
    }
    const size_t at = line.find("GPUDirect RDMA none through gradwired (");
    if (line.find("pointer support HOST,") != std::string::npos && at != std::string::npos) {
      no_gdr = line.substr(at + 15);
    }
  }
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init failed");
  ncclNetProperties_v11_t props{};
  if (api->properties(0, &props) != ncclSuccess) return fail("getProperties failed");
  if (!said && !no_gdr.empty() && props.ptrSupport == NCCL_PTR_HOST) {
    // Daemon mode where the daemon takes no device buffers: NCCL stages them (nothing to run).
    std::printf("gdr skipped: %s\n", no_gdr.c_str());
    std::fflush(stdout);
    api->finalize(ctx);
    return 77;
  }
  if (!said) return fail("the INFO line does not report HOST|CUDA|DMABUF via dma-buf");
  if (props.ptrSupport != (NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF)) {
    return fail("ptrSupport is " + std::to_string(props.ptrSupport));
  }
  // Two hosts (daemon mode, GW_PLUGIN_TEST_XHOST=1): the sending end on host a, in a second
  // instance through daemon a; this process (the receiving end) is on host b.
  std::unique_ptr<NetApi> capi;
  void* cctx = ctx;
  if (const char* a = std::getenv("GW_PLUGIN_TEST_HOST_A_DAEMON"); a != nullptr) {
    if (Error e = second_instance_on_host_a(*api, ctx, a, &capi, &cctx); !e.empty()) {
      return fail("gdr: " + e);
    }
  }
  NetApi& sapi = capi ? *capi : *api;
  NetApi* two = capi ? capi.get() : nullptr;
  void *sc = nullptr, *rc = nullptr;
  if (Error e = connect_pair(*api, ctx, sapi, cctx, &sc, &rc); !e.empty()) return fail(e);
  constexpr size_t kBytes = 1 << 20;
  MemfdBuffer src(kBytes, "gw-nccl-device-src"), dst(kBytes, "gw-nccl-device-dst");
  if (src.data == nullptr || dst.data == nullptr) return fail("memfd");
  mark(src.data, kBytes, src.fd);
  mark(dst.data, kBytes, dst.fd);
  // regMr of device memory: the plugin exports a dma-buf itself.
  void *ms = nullptr, *md = nullptr;
  const long before = exports();
  if (sapi.reg_mr(sc, src.data, kBytes, NCCL_PTR_CUDA, &ms) != ncclSuccess ||
      api->reg_mr(rc, dst.data, kBytes, NCCL_PTR_CUDA, &md) != ncclSuccess) {
    return fail("regMr(NCCL_PTR_CUDA) failed");
  }
  if (exports() - before != 2) return fail("regMr did not export dma-bufs");
  if (Error e = move(*api, sc, rc, src.data, dst.data, kBytes, ms, md, 11, two); !e.empty()) {
    return fail("CUDA-registered transfer: " + e);
  }
  // The GDR flush of the received device buffer: a request that completes.
  void* data[1] = {dst.data};
  int sizes[1] = {static_cast<int>(kBytes)};
  void* mhs[1] = {md};
  void* flush = nullptr;
  if (l.v11->iflush(rc, 1, data, sizes, mhs, &flush) != ncclSuccess || flush == nullptr) {
    return fail("iflush of device memory gave no request");
  }
  if (Error e = wait_all(*api, {flush}, nullptr); !e.empty()) return fail("iflush: " + e);
  sizes[0] = 0;  // nothing received: nothing to flush
  if (l.v11->iflush(rc, 1, data, sizes, mhs, &flush) != ncclSuccess || flush != nullptr) {
    return fail("iflush of an empty receive gave a request");
  }
  sapi.dereg_mr(sc, ms);
  api->dereg_mr(rc, md);
  // regMrDmaBuf: NCCL exported the buffer and hands over fd and offset. Both buffers lie in one
  // dma-buf (the send buffer at 4096, the receive buffer at kBytes + 8192), the buffers ARE its
  // pages: the bytes arrive only if the NIC reached them through the fd at those offsets.
  ms = md = nullptr;
  {
    MemfdBuffer whole(2 * kBytes + 8192, "gw-nccl-dmabuf");
    if (whole.data == nullptr) return fail("memfd");
    uint8_t* s = whole.data + 4096;
    uint8_t* d = whole.data + kBytes + 8192;
    if (sapi.reg_mr_dmabuf(sc, s, kBytes, NCCL_PTR_CUDA, 4096, whole.fd, &ms) != ncclSuccess ||
        l.v11->regMrDmaBuf(rc, d, kBytes, NCCL_PTR_CUDA, kBytes + 8192, whole.fd, &md) !=
            ncclSuccess) {
      return fail("regMrDmaBuf failed");
    }
    if (Error e = move(*api, sc, rc, s, d, kBytes, ms, md, 12, two); !e.empty()) {
      return fail("dma-buf-registered transfer: " + e);
    }
    sapi.dereg_mr(sc, ms);
    api->dereg_mr(rc, md);
  }
  sapi.close_send(sc);
  api->close_recv(rc);
  if (capi) capi->finalize(cctx);
  api->finalize(ctx);
  return 0;
}

int run_timeline(bool on) {
  const Loaded& l = plugin();
  if (l.first_init != ncclSuccess) return fail("init failed");
  bool said = false;
  for (const std::string& line : l.first_init_log) {
    if (line.rfind("INFO NET/gradwire: timeline to ", 0) == 0) said = true;
  }
  if (said != on) return fail(on ? "no timeline INFO line" : "a timeline INFO line, unasked");
  auto api = make_api("v11");
  void* ctx = nullptr;
  if (api->init(&ctx) != ncclSuccess) return fail("init");
  void *sc = nullptr, *rc = nullptr;
  if (Error e = connect_pair(*api, ctx, &sc, &rc); !e.empty()) return fail(e);
  int i = 0;
  for (size_t size : kTimelineSizes) {
    const int tag = kTimelineTag0 + i;
    Buffer out(size), in(size + kTimelineRecvExtra);
    fill_pattern(out.data, size, 40 + i);
    void *smh = nullptr, *rmh = nullptr, *sreq = nullptr, *rreq = nullptr;
    if (api->reg_mr(sc, out.data, out.size, NCCL_PTR_HOST, &smh) != ncclSuccess ||
        api->reg_mr(rc, in.data, in.size, NCCL_PTR_HOST, &rmh) != ncclSuccess) {
      return fail("regMr");
    }
    if (Error e = post_recv(*api, rc, in.data, in.size, tag, rmh, &rreq); !e.empty())
      return fail(e);
    if (Error e = post_send(*api, sc, out.data, size, tag, smh, &sreq); !e.empty()) return fail(e);
    std::vector<int> sizes;
    if (Error e = wait_all(*api, {sreq, rreq}, &sizes); !e.empty()) return fail(e);
    if (sizes[1] != static_cast<int>(size) || check_pattern(in.data, size, 40 + i) != -1) {
      return fail("message " + std::to_string(i) + " arrived wrong");
    }
    if (api->dereg_mr(sc, smh) != ncclSuccess || api->dereg_mr(rc, rmh) != ncclSuccess) {
      return fail("deregMr");
    }
    ++i;
  }
  if (api->close_send(sc) != ncclSuccess || api->close_recv(rc) != ncclSuccess) {
    return fail("close");
  }
  if (api->finalize(ctx) != ncclSuccess) return fail("finalize");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gw::plugin_test::become_peer_host();
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
    if (mode == "tuner" && argc == 3) return run_tuner(std::atoi(argv[2]));
    if (mode == "pin" && argc == 3) return run_pin(std::atoi(argv[2]) != 0);
    if (mode == "gdr" && argc == 3) return run_gdr(argv[2]);
    if (mode == "timeline" && argc == 3) return run_timeline(std::atoi(argv[2]) != 0);
    if (int rc = run_daemon_scenario(argc, argv); rc >= 0) return rc;
    if (int rc = run_bench_scenario(argc, argv); rc >= 0) return rc;
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return fail("bad arguments");
}
