// The plugin harness's per-version adapters (plugin_harness.h NetApi): one interface over the
// plugin's v8 to v12 tables, so the conformance cases run against every version NCCL may load.
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

#include "tests/plugin/plugin_harness.h"

namespace gw::plugin_test {

// ---- per-version adapters ------------------------------------------------------------------

namespace {

template <typename Props>
void common_props(const Props& s, ncclNetProperties_v11_t* p) {
  p->name = s.name;
  p->pciPath = s.pciPath;
  p->guid = s.guid;
  p->ptrSupport = s.ptrSupport;
  p->regIsGlobal = s.regIsGlobal;
  p->speed = s.speed;
  p->port = s.port;
  p->latency = s.latency;
  p->maxComms = s.maxComms;
  p->maxRecvs = s.maxRecvs;
  p->netDeviceType = s.netDeviceType;
  p->netDeviceVersion = s.netDeviceVersion;
}

// Shared by every version: the entries whose signature never changed.
template <typename Table>
class ApiBase : public NetApi {
 public:
  explicit ApiBase(Table* t) : t_(t) {}
  const char* name() const override { return t_->name; }
  ncclResult_t devices(int* n) override { return t_->devices(n); }
  ncclResult_t accept(void* lc, void** rc) override {
    ncclNetDeviceHandle_v11_t* dev = nullptr;
    return t_->accept(lc, rc, &dev);
  }
  ncclResult_t reg_mr(void* c, void* d, size_t s, int type, void** mh) override {
    return t_->regMr(c, d, s, type, mh);
  }
  ncclResult_t dereg_mr(void* c, void* mh) override { return t_->deregMr(c, mh); }
  ncclResult_t test(void* r, int* done, int* size) override { return t_->test(r, done, size); }
  ncclResult_t iflush(void* rc, void* data, int size, void* mh, void** req) override {
    return t_->iflush(rc, 1, &data, &size, &mh, req);
  }
  ncclResult_t close_send(void* c) override { return t_->closeSend(c); }
  ncclResult_t close_recv(void* c) override { return t_->closeRecv(c); }
  ncclResult_t close_listen(void* c) override { return t_->closeListen(c); }

 protected:
  Table* t_;
};

// v9 and v10 (one struct): v8's fields, forceFlush, the virtual NIC and the message limits.
template <typename Table>
ncclResult_t v10_props(Table* t, int dev, ncclNetProperties_v11_t* p) {
  ncclNetProperties_v10_t s{};
  ncclResult_t r = t->getProperties(dev, &s);
  common_props(s, p);
  p->forceFlush = s.forceFlush;
  p->vProps = s.vProps;
  p->maxP2pBytes = s.maxP2pBytes;
  p->maxCollBytes = s.maxCollBytes;
  return r;
}

// What getProperties of each context-per-communicator version fills, in v11's struct. v12's
// carries 8 virtual-device slots (v11's first 4 are kept), railId and planeId.
ncclResult_t context_props(ncclNet_v11_t* t, int dev, ncclNetProperties_v11_t* p) {
  return t->getProperties(dev, p);
}
ncclResult_t context_props(ncclNet_v12_t* t, int dev, ncclNetProperties_v11_t* p) {
  ncclNetProperties_v12_t s{};
  ncclResult_t r = t->getProperties(dev, &s);
  common_props(s, p);
  p->forceFlush = s.forceFlush;
  p->vProps.ndevs = s.vProps.ndevs;
  for (int i = 0; i < s.vProps.ndevs && i < NCCL_NET_MAX_DEVS_PER_NIC; ++i) {
    p->vProps.devs[i] = s.vProps.devs[i];
  }
  p->maxP2pBytes = s.maxP2pBytes;
  p->maxCollBytes = s.maxCollBytes;
  p->maxMultiRequestSize = s.maxMultiRequestSize;
  return r;
}

// v11 and v12 (NCCL 2.30): the same calls, with a context per communicator; only the properties
// struct differs.
template <typename Table>
class ContextApi : public ApiBase<Table> {
 public:
  ContextApi(Table* t, const char* version) : ApiBase<Table>(t), version_(version) {}
  const char* version() const override { return version_; }
  ncclResult_t init(void** ctx) override {
    ncclNetCommConfig_v11_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
    return t_->init(ctx, 0x1234, &cfg, record_log, nullptr);
  }
  ncclResult_t finalize(void* ctx) override { return t_->finalize(ctx); }
  ncclResult_t properties(int dev, ncclNetProperties_v11_t* p) override {
    return context_props(t_, dev, p);
  }
  ncclResult_t listen(void* ctx, int dev, void* h, void** lc) override {
    return t_->listen(ctx, dev, h, lc);
  }
  ncclResult_t connect(void* ctx, int dev, void* h, void** sc) override {
    ncclNetDeviceHandle_v11_t* dev_comm = nullptr;
    return t_->connect(ctx, dev, h, sc, &dev_comm);
  }
  ncclResult_t isend(void* sc, void* d, size_t s, int tag, void* mh, void** r) override {
    return t_->isend(sc, d, s, tag, mh, nullptr, r);
  }
  ncclResult_t reg_mr_dmabuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                             void** mh) override {
    return t_->regMrDmaBuf(comm, data, size, type, offset, fd, mh);
  }
  ncclResult_t irecv(void* rc, void* d, size_t s, int tag, void* mh, void** r) override {
    void* phandle = nullptr;
    return t_->irecv(rc, 1, &d, &s, &tag, &mh, &phandle, r);
  }

 private:
  using ApiBase<Table>::t_;
  const char* version_;
};

// v8 to v10: one process-wide context, nothing to finalize, listen without a context.
template <typename Table>
class SharedContextApi : public ApiBase<Table> {
 public:
  using ApiBase<Table>::ApiBase;
  ncclResult_t finalize(void*) override { return ncclSuccess; }
  ncclResult_t listen(void*, int dev, void* h, void** lc) override {
    return this->t_->listen(dev, h, lc);
  }
};

class V10 : public SharedContextApi<ncclNet_v10_t> {
 public:
  using SharedContextApi::SharedContextApi;
  const char* version() const override { return "v10"; }
  ncclResult_t init(void** ctx) override {
    *ctx = nullptr;
    return t_->init(record_log, nullptr);
  }
  ncclResult_t properties(int dev, ncclNetProperties_v11_t* p) override {
    return v10_props(t_, dev, p);
  }
  ncclResult_t connect(void*, int dev, void* h, void** sc) override {
    ncclNetCommConfig_v10_t cfg{NCCL_NET_TRAFFIC_CLASS_UNDEF};
    ncclNetDeviceHandle_v10_t* dev_comm = nullptr;
    return t_->connect(dev, &cfg, h, sc, &dev_comm);
  }
  ncclResult_t isend(void* sc, void* d, size_t s, int tag, void* mh, void** r) override {
    return t_->isend(sc, d, s, tag, mh, nullptr, r);
  }
  ncclResult_t irecv(void* rc, void* d, size_t s, int tag, void* mh, void** r) override {
    void* phandle = nullptr;
    return t_->irecv(rc, 1, &d, &s, &tag, &mh, &phandle, r);
  }
};

class V9 : public SharedContextApi<ncclNet_v9_t> {
 public:
  using SharedContextApi::SharedContextApi;
  const char* version() const override { return "v9"; }
  ncclResult_t init(void** ctx) override {
    *ctx = nullptr;
    return t_->init(record_log);
  }
  ncclResult_t properties(int dev, ncclNetProperties_v11_t* p) override {
    return v10_props(t_, dev, p);
  }
  ncclResult_t connect(void*, int dev, void* h, void** sc) override {
    ncclNetDeviceHandle_v9_t* dev_comm = nullptr;
    return t_->connect(dev, h, sc, &dev_comm);
  }
  ncclResult_t isend(void* sc, void* d, size_t s, int tag, void* mh, void** r) override {
    return t_->isend(sc, d, s, tag, mh, r);
  }
  ncclResult_t irecv(void* rc, void* d, size_t s, int tag, void* mh, void** r) override {
    return t_->irecv(rc, 1, &d, &s, &tag, &mh, r);
  }
};

class V8 : public SharedContextApi<ncclNet_v8_t> {
 public:
  using SharedContextApi::SharedContextApi;
  const char* version() const override { return "v8"; }
  ncclResult_t init(void** ctx) override {
    *ctx = nullptr;
    return t_->init(record_log);
  }
  ncclResult_t properties(int dev, ncclNetProperties_v11_t* p) override {
    ncclNetProperties_v8_t s{};
    ncclResult_t r = t_->getProperties(dev, &s);
    common_props(s, p);
    return r;
  }
  ncclResult_t connect(void*, int dev, void* h, void** sc) override {
    ncclNetDeviceHandle_v8_t* dev_comm = nullptr;
    return t_->connect(dev, h, sc, &dev_comm);
  }
  ncclResult_t isend(void* sc, void* d, size_t s, int tag, void* mh, void** r) override {
    return t_->isend(sc, d, static_cast<int>(s), tag, mh, r);
  }
  ncclResult_t irecv(void* rc, void* d, size_t s, int tag, void* mh, void** r) override {
    int size = static_cast<int>(s);
    return t_->irecv(rc, 1, &d, &size, &tag, &mh, r);
  }
};

}  // namespace

std::unique_ptr<NetApi> make_api(const std::string& version) {
  const Loaded& l = plugin();
  if (version == "v12") return std::make_unique<ContextApi<ncclNet_v12_t>>(l.v12, "v12");
  if (version == "v11") return std::make_unique<ContextApi<ncclNet_v11_t>>(l.v11, "v11");
  if (version == "v10") return std::make_unique<V10>(l.v10);
  if (version == "v9") return std::make_unique<V9>(l.v9);
  if (version == "v8") return std::make_unique<V8>(l.v8);
  throw std::invalid_argument("unknown plugin API version " + version);
}

std::unique_ptr<NetApi> make_api_of_copy() {
  // A copy under another path: dlopen loads it again, with statics (configuration, host identity,
  // daemon) of its own.
  char path[] = "/tmp/gw-plugin-copy-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) throw std::runtime_error("mkstemp failed");
  FILE* in = std::fopen(GW_PLUGIN_PATH, "rb");
  bool ok = in != nullptr;
  char buf[1 << 16];
  for (size_t n; ok && (n = std::fread(buf, 1, sizeof(buf), in)) > 0;) {
    ok = write(fd, buf, n) == static_cast<ssize_t>(n);
  }
  if (in != nullptr) std::fclose(in);
  close(fd);
  void* lib = ok ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  unlink(path);
  if (lib == nullptr) throw std::runtime_error("loading a copy of " GW_PLUGIN_PATH " failed");
  auto* v11 = static_cast<ncclNet_v11_t*>(dlsym(lib, "ncclNetPlugin_v11"));
  if (v11 == nullptr) throw std::runtime_error("the plugin's copy has no ncclNetPlugin_v11");
  return std::make_unique<ContextApi<ncclNet_v11_t>>(v11, "v11");
}

}  // namespace gw::plugin_test
