// The one reader of net_af_xdp vdevs in EAL arguments, shared by the engine's port and
// `gradwire-perf doctor` (dpdk/af_xdp_args.h).
#include "dpdk/af_xdp_args.h"

#include <gtest/gtest.h>

namespace gw::dpdk {
namespace {

TEST(AfXdpArgs, SplitsOnAnyWhitespaceWithoutQuoting) {
  EXPECT_EQ(split_eal_args("  -l 0 \t--no-pci\n--vdev=a,b  "),
            (std::vector<std::string>{"-l", "0", "--no-pci", "--vdev=a,b"}));
  EXPECT_TRUE(split_eal_args("").empty());
  EXPECT_TRUE(split_eal_args(" \t\n").empty());
  EXPECT_EQ(split_eal_args("\"a b\""), (std::vector<std::string>{"\"a", "b\""}));
}

TEST(AfXdpArgs, DevargTakesTheFirstExactKey) {
  const std::string args = "iface=d0,start_queue=3,iface=d1,queue=9";
  EXPECT_EQ(devarg(args, "iface"), "d0");
  EXPECT_EQ(devarg(args, "start_queue"), "3");
  EXPECT_EQ(devarg(args, "queue"), "9");  // not start_queue's value: keys match whole
  EXPECT_EQ(devarg(args, "queue_count"), "");
  EXPECT_EQ(devarg("", "iface"), "");
  EXPECT_EQ(devarg("iface=", "iface"), "");
  EXPECT_EQ(devarg("ifacex=d0", "iface"), "");
}

TEST(AfXdpArgs, FindsEveryAfXdpVdevInBothSpellings) {
  const auto words = split_eal_args(
      "-l 0 --vdev net_af_xdp0,iface=d0 --vdev=net_memif0,role=client "
      "--vdev=net_af_xdp1,iface=d1,start_queue=2 --vdev net_af_xdp2,queue_count=1,iface=d2 "
      "--vdev net_af_xdp3");
  const auto v = af_xdp_vdevs(words);
  ASSERT_EQ(v.size(), 4u);
  EXPECT_EQ(v[0].name, "net_af_xdp0");
  EXPECT_EQ(v[0].args, "iface=d0");
  EXPECT_EQ(v[0].iface, "d0");
  EXPECT_FALSE(v[0].names_queue);
  EXPECT_EQ(v[0].first_queue(), "0");
  EXPECT_EQ(v[1].name, "net_af_xdp1");
  EXPECT_EQ(v[1].iface, "d1");
  EXPECT_TRUE(v[1].names_queue);
  EXPECT_EQ(v[1].first_queue(), "2");
  EXPECT_EQ(v[2].iface, "d2");
  EXPECT_TRUE(v[2].names_queue);  // queue_count alone names a queue range from 0
  EXPECT_EQ(v[2].first_queue(), "0");
  EXPECT_EQ(v[3].name, "net_af_xdp3");  // no arguments at all: no interface
  EXPECT_EQ(v[3].args, "");
  EXPECT_EQ(v[3].iface, "");
}

TEST(AfXdpArgs, ADanglingVdevFlagOrAnotherDriverIsNoPort) {
  EXPECT_TRUE(af_xdp_vdevs(split_eal_args("-l 0 --vdev")).empty());
  EXPECT_TRUE(af_xdp_vdevs(split_eal_args("--vdev=")).empty());
  EXPECT_TRUE(af_xdp_vdevs(split_eal_args("--vdev net_ring0 net_af_xdp0,iface=d0")).empty());
  // "--vdev" consumes the next word even when it looks like a flag.
  EXPECT_TRUE(af_xdp_vdevs(split_eal_args("--vdev --vdev net_af_xdp0")).empty());
}

TEST(AfXdpArgs, QueueEthdevNamesRoundTripAndNothingElseMatches) {
  for (size_t q = 1; q < kAfXdpMaxQueues; ++q) {
    const std::string name = af_xdp_queue_vdev("net_af_xdp0", q);
    ASSERT_EQ(af_xdp_queue_of(name, "net_af_xdp0"), q) << name;
  }
  EXPECT_EQ(af_xdp_queue_vdev("net_af_xdp0", 3), "net_af_xdp0q3");
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0q", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0q0", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0q03", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0q16", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0q99999999999999999999", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0q1x", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp0x1", "net_af_xdp0"));
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp1q1", "net_af_xdp0"));
  // The queues of net_af_xdp1 are not those of net_af_xdp1's prefix net_af_xdp.
  EXPECT_FALSE(af_xdp_queue_of("net_af_xdp1q1", "net_af_xdp"));
  EXPECT_FALSE(af_xdp_queue_of("", "net_af_xdp0"));
}

}  // namespace
}  // namespace gw::dpdk
