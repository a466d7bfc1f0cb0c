// The exported ABI as NCCL sees it: dlopen the built library (RTLD_NOW | RTLD_LOCAL, as NCCL does),
// look up every ncclNetPlugin_vN NCCL 2.20 to 2.30 probes, and check each table's name and
// entries, and that v12's getProperties fills its new fields (8 virtual-device slots, railId,
// planeId) at the offsets NCCL 2.30 reads.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {
namespace {

// The library opened again as NCCL opens it (the harness's handle is the same mapping).
class Opened {
 public:
  Opened() {
    plugin();  // the test environment (loopback) and the first init
    lib_ = dlopen(GW_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
  }
  ~Opened() {
    if (lib_ != nullptr) dlclose(lib_);
  }
  void* lib() const { return lib_; }
  template <typename T>
  T* table(const char* name) const {
    return static_cast<T*>(dlsym(lib_, name));
  }

 private:
  void* lib_ = nullptr;
};

// The entries every version has, non-NULL, and the ones the plugin leaves NULL (no device
// offload), for a table of any version.
template <typename T>
void check_common(const T* t, const char* symbol) {
  ASSERT_NE(t, nullptr) << symbol << " is not exported";
  EXPECT_STREQ(t->name, "gradwire") << symbol;
  EXPECT_NE(t->init, nullptr) << symbol;
  EXPECT_NE(t->devices, nullptr) << symbol;
  EXPECT_NE(t->getProperties, nullptr) << symbol;
  EXPECT_NE(t->listen, nullptr) << symbol;
  EXPECT_NE(t->connect, nullptr) << symbol;
  EXPECT_NE(t->accept, nullptr) << symbol;
  EXPECT_NE(t->regMr, nullptr) << symbol;
  EXPECT_NE(t->regMrDmaBuf, nullptr) << symbol;
  EXPECT_NE(t->deregMr, nullptr) << symbol;
  EXPECT_NE(t->isend, nullptr) << symbol;
  EXPECT_NE(t->irecv, nullptr) << symbol;
  EXPECT_NE(t->iflush, nullptr) << symbol;
  EXPECT_NE(t->test, nullptr) << symbol;
  EXPECT_NE(t->closeSend, nullptr) << symbol;
  EXPECT_NE(t->closeRecv, nullptr) << symbol;
  EXPECT_NE(t->closeListen, nullptr) << symbol;
  EXPECT_EQ(t->getDeviceMr, nullptr) << symbol;
  EXPECT_EQ(t->irecvConsumed, nullptr) << symbol;
}

TEST(PluginAbi, EveryVersionFromV8ToV12IsExportedAndNamed) {
  Opened o;
  ASSERT_NE(o.lib(), nullptr) << dlerror();
  check_common(o.table<ncclNet_v12_t>("ncclNetPlugin_v12"), "ncclNetPlugin_v12");
  check_common(o.table<ncclNet_v11_t>("ncclNetPlugin_v11"), "ncclNetPlugin_v11");
  check_common(o.table<ncclNet_v10_t>("ncclNetPlugin_v10"), "ncclNetPlugin_v10");
  check_common(o.table<ncclNet_v9_t>("ncclNetPlugin_v9"), "ncclNetPlugin_v9");
  check_common(o.table<ncclNet_v8_t>("ncclNetPlugin_v8"), "ncclNetPlugin_v8");
  // Versions the plugin does not implement are not there for NCCL to find.
  for (const char* absent : {"ncclNetPlugin_v13", "ncclNetPlugin_v7", "ncclNetPlugin_v6"}) {
    EXPECT_EQ(dlsym(o.lib(), absent), nullptr) << absent;
  }
  // v12 and v11 are one implementation: the same functions, apart from getProperties' struct.
  const auto* v12 = o.table<ncclNet_v12_t>("ncclNetPlugin_v12");
  const auto* v11 = o.table<ncclNet_v11_t>("ncclNetPlugin_v11");
  ASSERT_NE(v12, nullptr);
  ASSERT_NE(v11, nullptr);
  EXPECT_EQ(reinterpret_cast<void*>(v12->init), reinterpret_cast<void*>(v11->init));
  EXPECT_EQ(reinterpret_cast<void*>(v12->isend), reinterpret_cast<void*>(v11->isend));
  EXPECT_EQ(reinterpret_cast<void*>(v12->test), reinterpret_cast<void*>(v11->test));
  EXPECT_EQ(reinterpret_cast<void*>(v12->finalize), reinterpret_cast<void*>(v11->finalize));
  EXPECT_NE(reinterpret_cast<void*>(v12->getProperties),
            reinterpret_cast<void*>(v11->getProperties));
  EXPECT_NE(v12->finalize, nullptr);  // NCCL calls it without a NULL check
  EXPECT_EQ(v12->makeVDevice, nullptr);
  EXPECT_EQ(v12->setNetAttr, nullptr);
}

TEST(PluginAbi, V12PropertiesFillTheNewFields) {
  Opened o;
  const auto* v12 = o.table<ncclNet_v12_t>("ncclNetPlugin_v12");
  const auto* v11 = o.table<ncclNet_v11_t>("ncclNetPlugin_v11");
  ASSERT_NE(v12, nullptr);
  ASSERT_NE(v11, nullptr);
  void* ctx = nullptr;
  ncclNetCommConfig_v12_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
  ASSERT_EQ(v12->init(&ctx, 0x12, &cfg, record_log, nullptr), ncclSuccess);
  int n = 0;
  ASSERT_EQ(v12->devices(&n), ncclSuccess);
  ASSERT_GE(n, 1);
  for (int dev = 0; dev < n; ++dev) {
    // Garbage first: every byte NCCL 2.30 reads must be written.
    alignas(8) std::array<uint8_t, sizeof(ncclNetProperties_v12_t)> raw;
    raw.fill(0xab);
    auto* p = reinterpret_cast<ncclNetProperties_v12_t*>(raw.data());
    ASSERT_EQ(v12->getProperties(dev, p), ncclSuccess);
    EXPECT_EQ(p->vProps.ndevs, 1) << "a physical device is a virtual NIC of itself";
    EXPECT_EQ(p->vProps.devs[0], dev);
    for (int i = 1; i < NCCL_NET_MAX_DEVS_PER_NIC_V12; ++i) EXPECT_EQ(p->vProps.devs[i], 0) << i;
    EXPECT_EQ(p->railId, NCCL_NET_ID_UNDEF);
    EXPECT_EQ(p->planeId, NCCL_NET_ID_UNDEF);
    // The same bytes at the offsets of NCCL 2.30's layout (x86-64).
    int16_t rail = 0, plane = 0;
    size_t p2p = 0;
    int ndevs = 0;
    std::memcpy(&ndevs, raw.data() + 64, sizeof(ndevs));
    std::memcpy(&p2p, raw.data() + 104, sizeof(p2p));
    std::memcpy(&rail, raw.data() + 124, sizeof(rail));
    std::memcpy(&plane, raw.data() + 126, sizeof(plane));
    EXPECT_EQ(ndevs, 1);
    EXPECT_EQ(p2p, size_t{1} << 30);
    EXPECT_EQ(rail, -1);
    EXPECT_EQ(plane, -1);
    // Every field v11 has agrees with v11's answer.
    ncclNetProperties_v11_t q{};
    ASSERT_EQ(v11->getProperties(dev, &q), ncclSuccess);
    EXPECT_STREQ(p->name, q.name);
    EXPECT_EQ(p->name, q.name) << "one static string per device (NCCL keeps the pointer)";
    EXPECT_EQ(p->pciPath, q.pciPath);
    EXPECT_EQ(p->guid, q.guid);
    EXPECT_EQ(p->ptrSupport, q.ptrSupport);
    EXPECT_EQ(p->regIsGlobal, q.regIsGlobal);
    EXPECT_EQ(p->forceFlush, q.forceFlush);
    EXPECT_EQ(p->speed, q.speed);
    EXPECT_EQ(p->port, q.port);
    EXPECT_EQ(p->latency, q.latency);
    EXPECT_EQ(p->maxComms, q.maxComms);
    EXPECT_EQ(p->maxRecvs, q.maxRecvs);
    EXPECT_EQ(p->netDeviceType, q.netDeviceType);
    EXPECT_EQ(p->netDeviceVersion, q.netDeviceVersion);
    EXPECT_EQ(p->vProps.ndevs, q.vProps.ndevs);
    EXPECT_EQ(p->vProps.devs[0], q.vProps.devs[0]);
    EXPECT_EQ(p->maxP2pBytes, q.maxP2pBytes);
    EXPECT_EQ(p->maxCollBytes, q.maxCollBytes);
    EXPECT_EQ(p->maxMultiRequestSize, q.maxMultiRequestSize);
  }
  ncclNetProperties_v12_t bad{};
  EXPECT_EQ(v12->getProperties(n, &bad), ncclInternalError);
  EXPECT_EQ(v12->getProperties(0, nullptr), ncclInternalError);
  EXPECT_EQ(v12->finalize(ctx), ncclSuccess);
}

}  // namespace
}  // namespace gw::plugin_test
