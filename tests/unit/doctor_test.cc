// gradwire-perf doctor against fixture sysfs trees laid out as the kernel documents them
// (Documentation/ABI/stable/sysfs-class-infiniband, sysfs-class-net, sysfs-kernel-mm-hugepages).
#include "perf/doctor.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace gw::perf {
namespace {

namespace fs = std::filesystem;

class Fixture {
 public:
  Fixture() {
    char tmpl[] = "/tmp/gw-doctor-XXXXXX";
    root_ = mkdtemp(tmpl);
  }
  ~Fixture() {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  const std::string& root() const { return root_; }
  void write(const std::string& rel, const std::string& content) {
    fs::path p = fs::path(root_) / rel;
    fs::create_directories(p.parent_path());
    std::ofstream(p) << content << "\n";
  }
  void mkdir(const std::string& rel) { fs::create_directories(fs::path(root_) / rel); }
  // An RDMA port: state, link layer, rate; RoCE ports get GIDs, IB ports a LID.
  void port(const std::string& dev, int port, const std::string& state, const std::string& layer) {
    const std::string p = "sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) + "/";
    write(p + "state", state);
    write(p + "phys_state", state == "4: ACTIVE" ? "5: LinkUp" : "3: Disabled");
    write(p + "link_layer", layer);
    write(p + "rate", "100 Gb/sec (4X EDR)");
  }

 private:
  std::string root_;
};

DoctorInputs inputs(const Fixture& fx, uint64_t memlock = UINT64_MAX) {
  DoctorInputs in;
  in.root = fx.root() + "/sys";
  in.memlock_bytes = memlock;
  in.kernel_release = "6.1.0-18-amd64";
  in.have_dmabuf_symbol = true;
  return in;
}

// The finding of `area` whose text contains `needle`, or null.
const Finding* find(const std::vector<Finding>& f, const std::string& area,
                    const std::string& needle) {
  for (const auto& x : f) {
    if (x.area == area && x.what.find(needle) != std::string::npos) return &x;
  }
  return nullptr;
}

TEST(Doctor, NoRdmaDeviceIsSaidWithWhatToDo) {
  Fixture fx;
  auto f = run_doctor(inputs(fx));
  const Finding* n = find(f, "rdma", "no RDMA device");
  ASSERT_NE(n, nullptr) << format_findings(f);
  EXPECT_EQ(n->severity, Severity::kInfo);
  EXPECT_NE(n->fix.find("rdma_rxe"), std::string::npos);
  ASSERT_NE(find(f, "hugepages", "no hugepages"), nullptr);
  EXPECT_NE(find(f, "memlock", "unlimited"), nullptr);
}

TEST(Doctor, RocePortWithSmallMtuAndNoV2GidAreFlagged) {
  Fixture fx;
  // mlx5_0: RoCE, a RoCE v2 GID on eth0 whose MTU is 1500 (active MTU 1024).
  fx.port("mlx5_0", 1, "4: ACTIVE", "Ethernet");
  const std::string p = "sys/class/infiniband/mlx5_0/ports/1/";
  fx.write(p + "gids/0", "fe80:0000:0000:0000:0000:0000:0000:0001");
  fx.write(p + "gid_attrs/types/0", "IB/RoCE v1");
  fx.write(p + "gid_attrs/ndevs/0", "eth0");
  fx.write(p + "gids/1", "0000:0000:0000:0000:0000:ffff:0a00:0001");
  fx.write(p + "gid_attrs/types/1", "RoCE v2");
  fx.write(p + "gid_attrs/ndevs/1", "eth0");
  fx.write(p + "gids/2", "0000:0000:0000:0000:0000:0000:0000:0000");
  fx.write(p + "gid_attrs/types/2", "RoCE v2");
  fx.write("sys/class/infiniband/mlx5_0/device/numa_node", "0");
  fx.write("sys/class/net/eth0/mtu", "1500");
  fx.write("sys/class/net/eth0/speed", "100000");
  // mlx5_1: RoCE, only a v1 GID with an address.
  fx.port("mlx5_1", 1, "4: ACTIVE", "Ethernet");
  fx.write("sys/class/infiniband/mlx5_1/ports/1/gids/0", "fe80:0000:0000:0000:0000:0000:0000:0002");
  fx.write("sys/class/infiniband/mlx5_1/ports/1/gid_attrs/types/0", "IB/RoCE v1");
  auto f = run_doctor(inputs(fx));
  const Finding* v2 = find(f, "roce", "mlx5_0 port 1: RoCE v2 GID index 1 on eth0");
  ASSERT_NE(v2, nullptr) << format_findings(f);
  const Finding* mtu = find(f, "roce", "active MTU of 1024");
  ASSERT_NE(mtu, nullptr) << format_findings(f);
  EXPECT_EQ(mtu->severity, Severity::kWarn);
  EXPECT_NE(mtu->fix.find("MTU 9000"), std::string::npos);
  EXPECT_NE(mtu->what.find("100000 Mb/s"), std::string::npos);
  const Finding* nov2 = find(f, "roce", "mlx5_1 port 1: no RoCE v2 GID");
  ASSERT_NE(nov2, nullptr) << format_findings(f);
  EXPECT_EQ(nov2->severity, Severity::kError);
  // A 9000-byte netdev gives the 4096 MTU, without a warning.
  fx.write("sys/class/net/eth0/mtu", "9000");
  f = run_doctor(inputs(fx));
  const Finding* good = find(f, "roce", "active MTU 4096");
  ASSERT_NE(good, nullptr) << format_findings(f);
  EXPECT_EQ(good->severity, Severity::kOk);
}

TEST(Doctor, InfinibandPortDownOrWithoutLid) {
  Fixture fx;
  fx.port("mlx5_2", 1, "1: DOWN", "InfiniBand");
  fx.port("mlx5_3", 1, "4: ACTIVE", "InfiniBand");
  fx.write("sys/class/infiniband/mlx5_3/ports/1/lid", "0x0");
  fx.write("sys/class/infiniband/mlx5_3/ports/1/sm_lid", "0x0");
  fx.port("mlx5_4", 1, "4: ACTIVE", "InfiniBand");
  fx.write("sys/class/infiniband/mlx5_4/ports/1/lid", "0x11");
  fx.write("sys/class/infiniband/mlx5_4/ports/1/sm_lid", "0x1");
  auto f = run_doctor(inputs(fx));
  const Finding* down = find(f, "rdma", "mlx5_2 port 1: state 1: DOWN");
  ASSERT_NE(down, nullptr) << format_findings(f);
  EXPECT_EQ(down->severity, Severity::kWarn);
  EXPECT_NE(down->fix.find("subnet manager"), std::string::npos);
  const Finding* nolid = find(f, "ib", "mlx5_3 port 1: no LID");
  ASSERT_NE(nolid, nullptr) << format_findings(f);
  EXPECT_EQ(nolid->severity, Severity::kError);
  EXPECT_NE(nolid->fix.find("opensm"), std::string::npos);
  ASSERT_NE(find(f, "ib", "mlx5_4 port 1: lid 0x11, sm_lid 0x1"), nullptr) << format_findings(f);
}

TEST(Doctor, MemlockHugepagesGpuDirectAndNuma) {
  Fixture fx;
  fx.port("mlx5_0", 1, "4: ACTIVE", "InfiniBand");
  fx.write("sys/class/infiniband/mlx5_0/ports/1/lid", "0x5");
  fx.write("sys/class/infiniband/mlx5_0/device/numa_node", "0");
  fx.write("sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "512");
  fx.write("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "256");
  fx.write("sys/bus/pci/drivers/nvidia/0000:41:00.0/numa_node", "1");
  fx.mkdir("sys/bus/pci/drivers/nvidia/module");
  auto in = inputs(fx, 64 << 10);
  in.kernel_release = "5.10.0-28-amd64";  // before dma-buf
  auto f = run_doctor(in);
  const Finding* lock = find(f, "memlock", "64 KiB");
  ASSERT_NE(lock, nullptr) << format_findings(f);
  EXPECT_EQ(lock->severity, Severity::kWarn);
  EXPECT_NE(lock->fix.find("unlimited"), std::string::npos);
  ASSERT_NE(find(f, "hugepages", "1024 MiB of hugepages reserved, 512 MiB free"), nullptr)
      << format_findings(f);
  const Finding* gd = find(f, "gpudirect", "no GPUDirect RDMA path");
  ASSERT_NE(gd, nullptr) << format_findings(f);
  EXPECT_NE(gd->what.find("< 5.12"), std::string::npos);
  EXPECT_NE(gd->fix.find("nvidia-peermem"), std::string::npos);
  const Finding* numa = find(f, "numa", "GPU 0000:41:00.0 is on NUMA node 1, NIC mlx5_0 on node 0");
  ASSERT_NE(numa, nullptr) << format_findings(f);
  EXPECT_EQ(numa->severity, Severity::kWarn);
  // nvidia_peermem loaded: GPUDirect is fine.
  fx.mkdir("sys/module/nvidia_peermem");
  f = run_doctor(in);
  const Finding* ok = find(f, "gpudirect", "nvidia_peermem is loaded");
  ASSERT_NE(ok, nullptr) << format_findings(f);
  EXPECT_EQ(ok->severity, Severity::kOk);
}

TEST(Doctor, AfXdpPortOnAMultiQueueInterfaceIsFlagged) {
  Fixture fx;
  for (int q = 0; q < 4; ++q) {
    fx.mkdir("sys/class/net/eth1/queues/rx-" + std::to_string(q));
    fx.mkdir("sys/class/net/eth1/queues/tx-" + std::to_string(q));
  }
  fx.mkdir("sys/class/net/d0/queues/rx-0");
  fx.mkdir("sys/class/net/d0/queues/tx-0");
  auto in = inputs(fx);
  // No AF_XDP port named: nothing said about it.
  in.dpdk_eal_args = "-l 0 --no-huge --vdev net_af_packet0,iface=eth1";
  EXPECT_EQ(find(run_doctor(in), "af_xdp", ""), nullptr);
  // Four receive queues and a vdev that names none: the port takes them all.
  in.dpdk_eal_args = "-l 0 --no-huge -m 512 --vdev net_af_xdp0,iface=eth1";
  auto f = run_doctor(in);
  const Finding* all = find(f, "af_xdp", "net_af_xdp0 on eth1: the port takes every one of its 4");
  ASSERT_NE(all, nullptr) << format_findings(f);
  EXPECT_EQ(all->severity, Severity::kOk);
  // A vdev that names a queue holds that one only (both spellings of --vdev).
  in.dpdk_eal_args = "-l 0 --no-huge -m 512 --vdev net_af_xdp0,iface=eth1,start_queue=2";
  f = run_doctor(in);
  const Finding* w = find(f, "af_xdp", "net_af_xdp0 receives on queue 2 of eth1, which has 4");
  ASSERT_NE(w, nullptr) << format_findings(f);
  EXPECT_EQ(w->severity, Severity::kWarn);
  EXPECT_NE(w->fix.find("ethtool -L eth1 combined 1"), std::string::npos) << w->fix;
  EXPECT_NE(w->fix.find("dst-port 47000 action 2"), std::string::npos) << w->fix;
  // More queues than a port takes.
  for (int q = 4; q < 20; ++q) fx.mkdir("sys/class/net/eth1/queues/rx-" + std::to_string(q));
  in.dpdk_eal_args = "--vdev=net_af_xdp0,iface=eth1";
  f = run_doctor(in);
  const Finding* many = find(f, "af_xdp", "takes 16 of its 20 receive queues");
  ASSERT_NE(many, nullptr) << format_findings(f);
  EXPECT_EQ(many->severity, Severity::kWarn);
  EXPECT_NE(many->fix.find("ethtool -L eth1 combined 16"), std::string::npos) << many->fix;
  // One queue: fine. An interface this host lacks: an error.
  in.dpdk_eal_args = "--vdev=net_af_xdp0,iface=d0 --vdev net_af_xdp1,iface=nosuch0";
  f = run_doctor(in);
  const Finding* ok = find(f, "af_xdp", "net_af_xdp0 on d0: one receive queue");
  ASSERT_NE(ok, nullptr) << format_findings(f);
  EXPECT_EQ(ok->severity, Severity::kOk);
  const Finding* bad = find(f, "af_xdp", "'nosuch0'");
  ASSERT_NE(bad, nullptr) << format_findings(f);
  EXPECT_EQ(bad->severity, Severity::kError);
  // A vdev without iface=, a trailing --vdev: an error and nothing, never a crash.
  in.dpdk_eal_args = "--vdev net_af_xdp0 --vdev";
  f = run_doctor(in);
  ASSERT_NE(find(f, "af_xdp", "names interface ''"), nullptr) << format_findings(f);
}

TEST(Doctor, JsonCarriesEveryFindingAndTheCounts) {
  Fixture fx;
  fx.port("mlx5_3", 1, "4: ACTIVE", "InfiniBand");
  fx.write("sys/class/infiniband/mlx5_3/ports/1/lid", "0");
  auto f = run_doctor(inputs(fx, 1 << 20));
  auto doc = nlohmann::json::parse(findings_json(f));
  ASSERT_EQ(doc["findings"].size(), f.size());
  EXPECT_EQ(doc["errors"], 1);
  EXPECT_GE(doc["warnings"].get<int>(), 1);  // memlock 1 MiB
  EXPECT_EQ(doc["findings"][0]["area"], f[0].area);
  // Unreadable or garbage files are findings, never a crash.
  fx.write("sys/class/infiniband/mlx5_3/ports/1/lid", "not-a-number");
  fx.write("sys/kernel/mm/hugepages/hugepages-garbage/nr_hugepages", "x");
  EXPECT_FALSE(run_doctor(inputs(fx)).empty());
}

}  // namespace
}  // namespace gw::perf
