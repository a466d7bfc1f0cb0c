#include "dpdk/dpdk_config.h"

namespace gw::dpdk::dpdk_config {

using config::Type;

constinit const config::Row kDpdkEalArgs{
    "GW_DPDK_EAL_ARGS", Type::String, "", "",
    "EAL arguments, whitespace-separated (empty: -l 0 --no-huge -m 512 --no-pci --no-shconf "
    "--no-telemetry; the port is then a loopback net_ring)"};
constinit const config::Row kDpdkPort{
    "GW_DPDK_PORT", Type::String, "", "",
    "ethdev to use: empty = the first one the EAL args created, ring = loopback net_ring, or "
    "a port id"};
constinit const config::Row kDpdkIp{
    "GW_DPDK_IP", Type::String, "", "",
    "IPv4 address of this host's DPDK endpoint (empty: 10.x.y.z from the port's MAC)"};
constinit const config::Row kDpdkUdpPort{"GW_DPDK_UDP_PORT", Type::Int, "47000", "",
                                         "UDP port of the DPDK transport"};
constinit const config::Row kDpdkMtu{
    "GW_DPDK_MTU", Type::Size, "9000", "",
    "L3 MTU wanted (jumbo where the port allows; clamped to the port's maximum)"};
constinit const config::Row kDpdkNbMbufs{"GW_DPDK_NB_MBUFS", Type::Int, "8192", "",
                                         "mbufs in the DPDK packet pool"};
constinit const config::Row kDpdkWindow{
    "GW_DPDK_WINDOW", Type::Int, "0", "",
    "packets in flight per connection (0 = twice the bandwidth-delay product)"};
constinit const config::Row kDpdkMaxWindow{"GW_DPDK_MAX_WINDOW", Type::Int, "512", "",
                                           "upper bound of the automatic window (packets)"};
constinit const config::Row kDpdkLinkGbps{
    "GW_DPDK_LINK_GBPS", Type::Double, "10", "",
    "link rate in Gbit/s used for the bandwidth-delay-product window"};
constinit const config::Row kDpdkRtoUs{"GW_DPDK_RTO_US", Type::Int, "1000", "",
                                       "retransmission timeout floor (us)"};
constinit const config::Row kDpdkHeartbeatMs{
    "GW_DPDK_HEARTBEAT_MS", Type::Int, "100", "",
    "an idle connection sends an acknowledgement this often (ms)"};
constinit const config::Row kDpdkPeerTimeoutMs{
    "GW_DPDK_PEER_TIMEOUT_MS", Type::Int, "10000", "",
    "silence after which a peer is declared dead (ms; also capped by GW_TIMEOUT_MS)"};
constinit const config::Row kDpdkBurst{"GW_DPDK_BURST", Type::Int, "32", "", "RX/TX burst size"};
constinit const config::Row kDpdkProgressUs{
    "GW_DPDK_PROGRESS_US", Type::Int, "500", "",
    "period of the background progress thread (us; acks and heartbeats while idle)"};
constinit const config::Row kDpdkZeroCopy{
    "GW_DPDK_ZERO_COPY", Type::String, "auto", "",
    "transmit registered memory without copying it (chained external mbufs): auto (ports "
    "known to take them), on (fail if the port cannot), off"};
constinit const config::Row kDpdkEager{
    "GW_DPDK_EAGER", Type::Bool, "1", "",
    "send one-frame messages before the receive's CTS (0: every message waits for its CTS)"};
constinit const config::Row kDpdkInjectLoss{
    "GW_DPDK_INJECT_LOSS", Type::Double, "0", "",
    "fault injection: probability that a transmitted frame is dropped"};
constinit const config::Row kDpdkInjectReorder{
    "GW_DPDK_INJECT_REORDER", Type::Double, "0", "",
    "fault injection: probability that a transmitted frame is held behind later ones"};
constinit const config::Row kDpdkInjectDup{
    "GW_DPDK_INJECT_DUP", Type::Double, "0", "",
    "fault injection: probability that a transmitted frame is sent twice"};
constinit const config::Row kDpdkModule{
    "GW_DPDK_MODULE", Type::String, "", "",
    "the DPDK port module (libgradwire_dpdk.so) to load; empty: look beside the library, in the "
    "build tree and in the install libdir"};
constinit const config::Row kDpdkInjectSeed{"GW_DPDK_INJECT_SEED", Type::Int, "1", "",
                                            "fault injection: RNG seed"};

const config::RowSet& rows() {
  static const config::RowSet set(
      "dpdk", {&kDpdkEalArgs,    &kDpdkPort,          &kDpdkIp,          &kDpdkUdpPort,
               &kDpdkMtu,        &kDpdkNbMbufs,       &kDpdkWindow,      &kDpdkMaxWindow,
               &kDpdkLinkGbps,   &kDpdkRtoUs,         &kDpdkHeartbeatMs, &kDpdkPeerTimeoutMs,
               &kDpdkBurst,      &kDpdkProgressUs,    &kDpdkZeroCopy,    &kDpdkEager,
               &kDpdkInjectLoss, &kDpdkInjectReorder, &kDpdkInjectDup,   &kDpdkInjectSeed,
               &kDpdkModule});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::dpdk::dpdk_config
