#include "verbs/verbs_config.h"

#include <sys/socket.h>

namespace gw::verbs {
namespace verbs_config {

using config::Type;

constinit const config::Row kVerbsEmulate{
    "GW_VERBS_EMULATE", Type::Bool, "0", "",
    "1 = use gradwire's software verbs emulator instead of libibverbs (tests, hosts without RDMA)"};
constinit const config::Row kVerbsEmuAddr{
    "GW_VERBS_EMU_ADDR", Type::String, "127.0.0.1", "",
    "IPv4 address the verbs emulator's NIC listens on (its RoCE v2 GID)"};
constinit const config::Row kVerbsEmuDmabuf{
    "GW_VERBS_EMU_DMABUF", Type::Bool, "1", "",
    "whether the verbs emulator's device supports ibv_reg_dmabuf_mr"};
constinit const config::Row kVerbsEmuLink{
    "GW_VERBS_EMU_LINK", Type::String, "roce", "",
    "link layer of the emulated port: roce (Ethernet, GIDs carry GW_VERBS_EMU_ADDR) or ib "
    "(InfiniBand, LID-routed; one subnet on one host)"};
constinit const config::Row kIbHca{
    "GW_IB_HCA", Type::String, "", "NCCL_IB_HCA",
    "RDMA devices/ports to use: mlx5_0:1,mlx5_1 (prefixes), ^ to exclude, = for exact names"};
constinit const config::Row kIbGidIndex{
    "GW_IB_GID_INDEX", Type::Int, "-1", "NCCL_IB_GID_INDEX",
    "GID index for RoCE (-1 = automatic: a RoCE v2 GID of GW_IB_ADDR_FAMILY)"};
constinit const config::Row kIbAddrFamily{
    "GW_IB_ADDR_FAMILY", Type::String, "AF_INET", "NCCL_IB_ADDR_FAMILY",
    "address family of the automatic RoCE GID: AF_INET or AF_INET6"};
constinit const config::Row kIbQpsPerConn{
    "GW_IB_QPS_PER_CONN", Type::Int, "1", "NCCL_IB_QPS_PER_CONNECTION",
    "RC queue pairs per verbs connection; every message is striped across them (1-16)"};
constinit const config::Row kIbTimeout{
    "GW_IB_TIMEOUT", Type::Int, "20", "NCCL_IB_TIMEOUT",
    "RC ACK timeout exponent: 4.096 us x 2^value per try (1-31)"};
constinit const config::Row kIbRetryCnt{
    "GW_IB_RETRY_CNT", Type::Int, "7", "NCCL_IB_RETRY_CNT",
    "RC transport retries before a work request fails with IBV_WC_RETRY_EXC_ERR (0-7)"};
constinit const config::Row kIbRnrRetry{"GW_IB_RNR_RETRY", Type::Int, "7", "",
                                        "RC receiver-not-ready retries (0-7; 7 = retry forever)"};
constinit const config::Row kIbTc{"GW_IB_TC", Type::Int, "0", "NCCL_IB_TC",
                                  "traffic class of RoCE/GRH packets (0-255)"};
constinit const config::Row kIbSl{"GW_IB_SL", Type::Int, "0", "NCCL_IB_SL",
                                  "InfiniBand service level (0-15)"};
constinit const config::Row kIbMtu{
    "GW_IB_MTU", Type::Int, "0", "",
    "path MTU in bytes (256-4096; 0 = the smaller of both ports' active MTUs)"};
constinit const config::Row kIbUseInline{
    "GW_IB_USE_INLINE", Type::Bool, "1", "",
    "send the receiver's clear-to-send records inline (no lkey, no DMA read)"};
constinit const config::Row kIbGpuDirect{
    "GW_IB_GPUDIRECT", Type::String, "auto", "",
    "GPUDirect RDMA registration of CUDA memory: auto (dma-buf, else nvidia-peermem, else none: "
    "NCCL stages through host memory), dmabuf, peermem or off"};
constinit const config::Row kIbGdrFlush{
    "GW_IB_GDR_FLUSH", Type::Bool, "1", "",
    "after a receive into GPU memory, iflush reads a byte of it back through a loopback QP so the "
    "GPU sees every write the NIC made before (NCCL's GDR flush); 0 skips it"};
constinit const config::Row kIbSysfsRoot{
    "GW_IB_SYSFS_ROOT", Type::String, "/sys", "",
    "root of the sysfs tree read for GID types and by gradwire-perf doctor (tests)"};

const config::RowSet& rows() {
  static const config::RowSet set(
      "verbs",
      {&kVerbsEmulate, &kVerbsEmuAddr, &kVerbsEmuDmabuf, &kVerbsEmuLink, &kIbHca, &kIbGidIndex,
       &kIbAddrFamily, &kIbQpsPerConn, &kIbTimeout, &kIbRetryCnt, &kIbRnrRetry, &kIbTc, &kIbSl,
       &kIbMtu, &kIbUseInline, &kIbGpuDirect, &kIbGdrFlush, &kIbSysfsRoot});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace verbs_config

namespace {

Result<int> ranged(const config::Snapshot& snapshot, const config::Row& row, int64_t lo,
                   int64_t hi) {
  int64_t v = snapshot.get_int(row);
  if (v < lo || v > hi) return invalid_arg("{}={} is out of range ({}-{})", row.name, v, lo, hi);
  return static_cast<int>(v);
}

}  // namespace

Result<VerbsConfig> load_verbs_config(const config::Snapshot& snapshot) {
  using namespace verbs_config;
  GW_RETURN_IF_ERROR(snapshot.validate());
  VerbsConfig c;
  c.emulate = snapshot.get_bool(kVerbsEmulate);
  c.hca = snapshot.get_string(kIbHca);
  GW_ASSIGN_OR_RETURN(c.gid_index, ranged(snapshot, kIbGidIndex, -1, 255));
  std::string family = snapshot.get_string(kIbAddrFamily);
  if (family == "AF_INET") {
    c.addr_family = AF_INET;
  } else if (family == "AF_INET6") {
    c.addr_family = AF_INET6;
  } else {
    return invalid_arg("GW_IB_ADDR_FAMILY='{}': expected AF_INET or AF_INET6", family);
  }
  GW_ASSIGN_OR_RETURN(c.qps_per_conn, ranged(snapshot, kIbQpsPerConn, 1, 16));
  GW_ASSIGN_OR_RETURN(c.timeout, ranged(snapshot, kIbTimeout, 1, 31));
  GW_ASSIGN_OR_RETURN(c.retry_cnt, ranged(snapshot, kIbRetryCnt, 0, 7));
  GW_ASSIGN_OR_RETURN(c.rnr_retry, ranged(snapshot, kIbRnrRetry, 0, 7));
  GW_ASSIGN_OR_RETURN(c.traffic_class, ranged(snapshot, kIbTc, 0, 255));
  GW_ASSIGN_OR_RETURN(c.service_level, ranged(snapshot, kIbSl, 0, 15));
  GW_ASSIGN_OR_RETURN(c.mtu_bytes, ranged(snapshot, kIbMtu, 0, 4096));
  if (c.mtu_bytes != 0 && (c.mtu_bytes < 256 || (c.mtu_bytes & (c.mtu_bytes - 1)) != 0)) {
    return invalid_arg("GW_IB_MTU={}: expected 0 or one of 256, 512, 1024, 2048, 4096",
                       c.mtu_bytes);
  }
  c.use_inline = snapshot.get_bool(kIbUseInline);
  const std::string gdr = snapshot.get_string(kIbGpuDirect);
  if (gdr == "auto") {
    c.gpudirect = VerbsConfig::GpuDirect::kAuto;
  } else if (gdr == "dmabuf") {
    c.gpudirect = VerbsConfig::GpuDirect::kDmabuf;
  } else if (gdr == "peermem") {
    c.gpudirect = VerbsConfig::GpuDirect::kPeermem;
  } else if (gdr == "off") {
    c.gpudirect = VerbsConfig::GpuDirect::kOff;
  } else {
    return invalid_arg("GW_IB_GPUDIRECT='{}': expected auto, dmabuf, peermem or off", gdr);
  }
  c.gdr_flush = snapshot.get_bool(kIbGdrFlush);
  c.sysfs_root = snapshot.get_string(kIbSysfsRoot);
  return c;
}

}  // namespace gw::verbs
