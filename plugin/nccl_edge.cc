#include "plugin/nccl_edge.h"

#include <cstring>

#include "plugin/net_plugin.h"

namespace gw::plugin {

ncclResult_t to_nccl(const Status& s, const char* op) {
  if (s.ok()) return ncclSuccess;
  ncclResult_t r = ncclSystemError;
  const char* hint = "";
  switch (s.code()) {
    case Code::kSystem:
    case Code::kPeer:
    case Code::kTimeout:
    case Code::kNoMemory:
    case Code::kAborted:
      r = ncclSystemError;
      hint =
          "check that the peer process is alive and reachable over the interface chosen by "
          "NCCL_SOCKET_IFNAME / GW_SOCKET_IFNAME, that GW_JOB_TOKEN is the same on every rank, "
          "and that GW_TIMEOUT_MS is long enough";
      break;
    case Code::kInvalidArg:
    case Code::kUnsupported:
      r = ncclInvalidUsage;
      hint =
          "fix the configuration named above (GW_* and NCCL_SOCKET_IFNAME, see "
          "docs/nccl-plugin.md), or set NCCL_NET=Socket to use NCCL's own transport";
      break;
    case Code::kInternal:
    case Code::kOk:
      r = ncclInternalError;
      hint = "NCCL and the plugin disagree about the API; report it with NCCL_DEBUG=INFO output";
      break;
  }
  GWP_WARN("NET/gradwire: {} failed: {}; {}", op, s.to_string(), hint);
  return r;
}

// Runs `body` (returning Status) and converts everything, exceptions included, at the C edge.

ncclResult_t count_devices(int* ndev) {
  return guarded("devices", [&]() -> Status {
    if (ndev == nullptr) return internal_error("NULL ndev");
    GW_ASSIGN_OR_RETURN(*ndev, NetPlugin::instance().device_count());
    return ok_status();
  });
}

ncclResult_t get_properties_v12(int dev, ncclNetProperties_v12_t* props) {
  return guarded("getProperties", [&]() -> Status {
    if (props == nullptr) return internal_error("NULL properties");
    GW_ASSIGN_OR_RETURN(const DeviceInfo* d, NetPlugin::instance().device(dev));
    std::memset(props, 0, sizeof(*props));
    props->name = const_cast<char*>(d->name.c_str());
    props->pciPath = d->pci_path.empty() ? nullptr : const_cast<char*>(d->pci_path.c_str());
    props->guid = d->guid;
    props->ptrSupport = d->ptr_support;
    props->regIsGlobal = 0;  // registrations belong to one comm
    props->forceFlush = 0;
    props->speed = d->speed_mbps;
    props->port = 0;
    props->latency = d->latency_us;
    props->maxComms = d->max_comms;
    props->maxRecvs = 1;  // no grouped receives
    props->netDeviceType = NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = 0;
    // Every device is physical (no makeVDevice): a virtual NIC of itself alone. The striping over
    // the backend's interfaces and sockets happens below NCCL and is not shown as devices.
    props->vProps.ndevs = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes = kMaxMessageBytes;  // test_request() reports int sizes
    props->maxCollBytes = kMaxMessageBytes;
    props->maxMultiRequestSize = 1;
    // The plugin knows of no rail or plane: its backends do not say which switch rail or network
    // plane an interface is cabled to, so it reports NCCL's "undefined" rather than a guess.
    props->railId = NCCL_NET_ID_UNDEF;
    props->planeId = NCCL_NET_ID_UNDEF;
    return ok_status();
  });
}

namespace {

// The fields v8 and every later struct share, same name and meaning.
template <typename From, typename To>
void copy_v8_fields(const From& f, To* t) {
  t->name = f.name;
  t->pciPath = f.pciPath;
  t->guid = f.guid;
  t->ptrSupport = f.ptrSupport;
  t->regIsGlobal = f.regIsGlobal;
  t->speed = f.speed;
  t->port = f.port;
  t->latency = f.latency;
  t->maxComms = f.maxComms;
  t->maxRecvs = f.maxRecvs;
  t->netDeviceType = f.netDeviceType;
  t->netDeviceVersion = f.netDeviceVersion;
}

// v9/v10 add forceFlush, the virtual NIC and the message limits. The virtual NIC is copied entry by
// entry: v12's holds more devices than the older ones (the caller checked that the count fits).
template <typename From, typename To>
void copy_v10_fields(const From& f, To* t) {
  copy_v8_fields(f, t);
  t->forceFlush = f.forceFlush;
  t->vProps.ndevs = f.vProps.ndevs;
  for (int i = 0; i < f.vProps.ndevs; ++i) t->vProps.devs[i] = f.vProps.devs[i];
  t->maxP2pBytes = f.maxP2pBytes;
  t->maxCollBytes = f.maxCollBytes;
}

// The structs older than v11 are filled from v11's (which checked the virtual NIC's size).
template <typename To, typename Copy>
ncclResult_t from_v11(int dev, To* props, Copy copy) {
  if (props == nullptr) return to_nccl(internal_error("NULL properties"), "getProperties");
  ncclNetProperties_v11_t p{};
  ncclResult_t r = get_properties_v11(dev, &p);
  if (r != ncclSuccess) return r;
  std::memset(props, 0, sizeof(*props));
  copy(p, props);
  return ncclSuccess;
}

}  // namespace

ncclResult_t get_properties_v11(int dev, ncclNetProperties_v11_t* props) {
  if (props == nullptr) return to_nccl(internal_error("NULL properties"), "getProperties");
  ncclNetProperties_v12_t p{};
  ncclResult_t r = get_properties_v12(dev, &p);
  if (r != ncclSuccess) return r;
  if (p.vProps.ndevs < 0 || p.vProps.ndevs > NCCL_NET_MAX_DEVS_PER_NIC) {
    return to_nccl(internal_error("device {} fuses {} devices; v11 holds at most {}", dev,
                                  p.vProps.ndevs, NCCL_NET_MAX_DEVS_PER_NIC),
                   "getProperties");
  }
  std::memset(props, 0, sizeof(*props));
  copy_v10_fields(p, props);
  props->maxMultiRequestSize = p.maxMultiRequestSize;
  return ncclSuccess;
}

ncclResult_t get_properties_v10(int dev, ncclNetProperties_v10_t* props) {
  return from_v11(dev, props, [](const auto& p, auto* t) { copy_v10_fields(p, t); });
}

ncclResult_t get_properties_v8(int dev, ncclNetProperties_v8_t* props) {
  return from_v11(dev, props, [](const auto& p, auto* t) { copy_v8_fields(p, t); });
}

}  // namespace gw::plugin
