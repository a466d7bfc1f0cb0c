// detect_launch() for every launcher and every malformed value, host identity, host exchange and
// the job token, through setenv/unsetenv (each test starts from a clean launcher environment).
#include "core/bootstrap.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <optional>
#include <thread>

#include "core/bootstrap_env.h"

namespace gw {
namespace {

const char* const kVars[] = {
    "GW_RANK",
    "GW_WORLD_SIZE",
    "GW_STORE",
    "GW_JOB_TOKEN",
    "GW_HOSTID",
    "NCCL_HOSTID",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
};

class BootstrapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      if (const char* old = std::getenv(v)) saved_[v] = old;
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (const char* v : kVars) unsetenv(v);
    for (const auto& [k, v] : saved_) setenv(k.c_str(), v.c_str(), 1);
  }
  static void set(const char* k, const char* v) { setenv(k, v, 1); }

  // Expects kInvalidArg whose message names `var`.
  static void expect_error_naming(const std::string& var) {
    auto r = detect_launch();
    ASSERT_FALSE(r.ok()) << "expected an error naming " << var;
    EXPECT_EQ(r.status().code(), Code::kInvalidArg);
    EXPECT_NE(r.status().message().find(var), std::string::npos) << r.status().message();
  }

  std::map<std::string, std::string> saved_;
};

TEST_F(BootstrapTest, NothingSetIsAnErrorThatSaysWhatToSet) {
  auto r = detect_launch();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kInvalidArg);
  EXPECT_NE(r.status().message().find("GW_RANK"), std::string::npos);
  EXPECT_NE(r.status().message().find("torchrun"), std::string::npos);
}

TEST_F(BootstrapTest, GwVariables) {
  set("GW_RANK", "2");
  set("GW_WORLD_SIZE", "4");
  set("GW_STORE", "10.1.2.3:29500");
  auto r = detect_launch();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, "GW_*");
  EXPECT_EQ(r->rank, 2);
  EXPECT_EQ(r->world_size, 4);
  EXPECT_EQ(r->local_rank, -1);
  EXPECT_EQ(r->store_host, "10.1.2.3");
  EXPECT_EQ(r->store_port, 29500);
}

TEST_F(BootstrapTest, GwVariablesWinOverLaunchers) {
  set("GW_RANK", "1");
  set("GW_WORLD_SIZE", "2");
  set("RANK", "5");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  set("OMPI_COMM_WORLD_RANK", "6");
  set("SLURM_PROCID", "7");
  set("GW_STORE", "[::1]:1234");
  set("MASTER_ADDR", "other");
  set("MASTER_PORT", "99");
  auto r = detect_launch();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, "GW_*");
  EXPECT_EQ(r->rank, 1);
  EXPECT_EQ(r->world_size, 2);
  EXPECT_EQ(r->local_rank, 1);  // the launcher underneath still tells the local position
  EXPECT_EQ(r->store_host, "::1");
  EXPECT_EQ(r->store_port, 1234);
}

TEST_F(BootstrapTest, Torchrun) {
  set("RANK", "3");
  set("WORLD_SIZE", "8");
  set("LOCAL_RANK", "1");
  set("LOCAL_WORLD_SIZE", "2");
  set("MASTER_ADDR", "node0");
  set("MASTER_PORT", "29500");
  auto r = detect_launch();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, "torchrun");
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->local_world_size, 2);
  EXPECT_EQ(r->store_host, "node0");
  EXPECT_EQ(r->store_port, 29500);
}

TEST_F(BootstrapTest, TorchrunWinsOverOpenMpiAndSlurm) {
  set("RANK", "0");
  set("WORLD_SIZE", "1");
  set("OMPI_COMM_WORLD_RANK", "3");
  set("OMPI_COMM_WORLD_SIZE", "4");
  set("SLURM_PROCID", "2");
  set("SLURM_NTASKS", "4");
  auto r = detect_launch();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, "torchrun");
  EXPECT_EQ(r->world_size, 1);
  EXPECT_TRUE(r->store_host.empty());  // a world of one needs no store
}

TEST_F(BootstrapTest, OpenMpi) {
  set("OMPI_COMM_WORLD_RANK", "5");
  set("OMPI_COMM_WORLD_SIZE", "6");
  set("OMPI_COMM_WORLD_LOCAL_RANK", "2");
  set("OMPI_COMM_WORLD_LOCAL_SIZE", "3");
  set("SLURM_PROCID", "0");
  set("SLURM_NTASKS", "6");
  set("GW_STORE", "head:7000");
  auto r = detect_launch();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, "Open MPI");
  EXPECT_EQ(r->rank, 5);
  EXPECT_EQ(r->world_size, 6);
  EXPECT_EQ(r->local_rank, 2);
  EXPECT_EQ(r->local_world_size, 3);
  EXPECT_EQ(r->store_host, "head");
  EXPECT_EQ(r->store_port, 7000);
}

TEST_F(BootstrapTest, Slurm) {
  set("SLURM_PROCID", "7");
  set("SLURM_NTASKS", "16");
  set("SLURM_LOCALID", "3");
  set("MASTER_ADDR", "10.0.0.1");
  set("MASTER_PORT", "12345");
  auto r = detect_launch();
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->source, "Slurm");
  EXPECT_EQ(r->rank, 7);
  EXPECT_EQ(r->world_size, 16);
  EXPECT_EQ(r->local_rank, 3);
  EXPECT_EQ(r->local_world_size, -1);
  EXPECT_EQ(r->store_host, "10.0.0.1");
  EXPECT_EQ(r->store_port, 12345);
}

TEST_F(BootstrapTest, MalformedRankAndSize) {
  set("GW_WORLD_SIZE", "4");
  expect_error_naming("GW_RANK");  // half of the GW_* pair
  set("GW_RANK", "abc");
  expect_error_naming("GW_RANK");
  set("GW_RANK", "1x");
  expect_error_naming("GW_RANK");
  set("GW_RANK", " 1");
  expect_error_naming("GW_RANK");
  set("GW_RANK", "");
  expect_error_naming("GW_RANK");
  set("GW_RANK", "99999999999999999999");
  expect_error_naming("GW_RANK");
  set("GW_RANK", "4");
  expect_error_naming("GW_RANK");  // out of range
  set("GW_RANK", "-1");
  expect_error_naming("GW_RANK");
  set("GW_RANK", "0");
  set("GW_WORLD_SIZE", "0");
  expect_error_naming("GW_WORLD_SIZE");
  set("GW_WORLD_SIZE", "four");
  expect_error_naming("GW_WORLD_SIZE");
  unsetenv("GW_WORLD_SIZE");
  expect_error_naming("GW_WORLD_SIZE");
}

TEST_F(BootstrapTest, MalformedTorchrunValues) {
  set("MASTER_ADDR", "h");
  set("MASTER_PORT", "1");
  set("RANK", "1");
  expect_error_naming("WORLD_SIZE");
  set("WORLD_SIZE", "2.0");
  expect_error_naming("WORLD_SIZE");
  set("WORLD_SIZE", "2");
  set("RANK", "2");
  expect_error_naming("RANK");
  set("RANK", "1");
  set("LOCAL_RANK", "x");
  expect_error_naming("LOCAL_RANK");
  set("LOCAL_RANK", "2");
  set("LOCAL_WORLD_SIZE", "2");
  expect_error_naming("local rank");
  set("LOCAL_RANK", "0");
  set("LOCAL_WORLD_SIZE", "3");  // more local ranks than ranks
  expect_error_naming("local world size");
  set("LOCAL_WORLD_SIZE", "0");
  expect_error_naming("local world size");
  set("LOCAL_WORLD_SIZE", "2");
  EXPECT_TRUE(detect_launch().ok());
}

TEST_F(BootstrapTest, MalformedOpenMpiAndSlurmValues) {
  set("GW_STORE", "h:1");
  set("OMPI_COMM_WORLD_RANK", "0");
  expect_error_naming("OMPI_COMM_WORLD_SIZE");
  set("OMPI_COMM_WORLD_SIZE", "-3");
  expect_error_naming("OMPI_COMM_WORLD_SIZE");
  unsetenv("OMPI_COMM_WORLD_RANK");
  unsetenv("OMPI_COMM_WORLD_SIZE");
  set("SLURM_PROCID", "3");
  set("SLURM_NTASKS", "3");
  expect_error_naming("SLURM_PROCID");
  set("SLURM_PROCID", "2");
  set("SLURM_LOCALID", "?");
  expect_error_naming("SLURM_LOCALID");
}

TEST_F(BootstrapTest, StoreAddressIsRequiredAndValidated) {
  set("GW_RANK", "0");
  set("GW_WORLD_SIZE", "2");
  expect_error_naming("GW_STORE");
  set("MASTER_ADDR", "h");
  expect_error_naming("MASTER_PORT");
  unsetenv("MASTER_ADDR");
  set("MASTER_PORT", "100");
  expect_error_naming("MASTER_ADDR");
  set("MASTER_ADDR", "h");
  set("MASTER_PORT", "http");
  expect_error_naming("MASTER_PORT");
  set("MASTER_PORT", "70000");
  expect_error_naming("MASTER_PORT");
  set("MASTER_PORT", "0");
  expect_error_naming("MASTER_PORT");
  set("MASTER_PORT", "100");
  EXPECT_TRUE(detect_launch().ok());
  set("MASTER_ADDR", "[fe80::1]");
  auto r = detect_launch();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->store_host, "fe80::1");
  for (const char* bad : {"host", "host:", ":29500", "host:0", "host:65536", "host:12ab", "::1:80",
                          "[::1]", "[::1]80"}) {
    set("GW_STORE", bad);
    expect_error_naming("GW_STORE");
  }
}

TEST_F(BootstrapTest, HostIdentity) {
  std::string natural = host_identity();
  EXPECT_FALSE(natural.empty());
  EXPECT_NE(natural.find("netns:"), std::string::npos);
  EXPECT_EQ(natural, host_identity());  // stable
  set("NCCL_HOSTID", "nccl-box");
  EXPECT_EQ(host_identity(), "nccl-box");
  set("GW_HOSTID", "gw-box");
  EXPECT_EQ(host_identity(), "gw-box");  // GW_ wins over the NCCL alias
}

TEST_F(BootstrapTest, ExchangeHostsGroupsRanks) {
  auto store = make_memory_store();
  constexpr int kWorld = 5;
  // Host identity comes from the environment, which is process-wide: publish the other ranks'
  // identities directly and run rank 2 through exchange_hosts.
  // An identity may hold a '\n' ("a\nx"): the mode (none here) follows the last.
  const char* ids[kWorld] = {"a\nx", "b", "a\nx", "c", "b"};
  for (int r = 0; r < kWorld; ++r) {
    if (r == 2) continue;
    std::string id = std::string(ids[r]) + "\n";
    ASSERT_TRUE(store
                    ->set("gw/host/" + std::to_string(r), Bytes(id.begin(), id.end()),
                          deadline_after_ms(1000))
                    .ok());
  }
  set("GW_HOSTID", "a\nx");
  auto m = exchange_hosts(*store, 2, kWorld, deadline_after_ms(2000));
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  EXPECT_EQ(m->host_of_rank, (std::vector<int>{0, 1, 0, 2, 1}));
  ASSERT_EQ(m->ranks_of_host.size(), 3u);
  EXPECT_EQ(m->ranks_of_host[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(m->ranks_of_host[1], (std::vector<int>{1, 4}));
  EXPECT_EQ(m->ranks_of_host[2], (std::vector<int>{3}));
  EXPECT_EQ(m->my_host, 0);
  EXPECT_EQ(m->local_rank, 1);
  EXPECT_EQ(m->host_ids, (std::vector<std::string>{"a\nx", "b", "c"}));
}

// The C ABI's ranks give their mode with their host: the same everywhere passes (and the host
// map ignores it), a job whose ranks differ fails at once on every rank (one without a mode too),
// naming who runs how.
TEST_F(BootstrapTest, ExchangeHostsComparesModes) {
  constexpr int kWorld = 4;
  auto publish = [](Store& store, int r, const std::string& v) {
    return store.set("gw/host/" + std::to_string(r), Bytes(v.begin(), v.end()),
                     deadline_after_ms(1000));
  };
  set("GW_HOSTID", "a");
  {
    auto store = make_memory_store();
    for (int r = 1; r < kWorld; ++r) ASSERT_TRUE(publish(*store, r, "a\ndaemon").ok());
    auto m = exchange_hosts(*store, 0, kWorld, deadline_after_ms(2000), "daemon");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->host_ids, (std::vector<std::string>{"a"}));
    EXPECT_EQ(m->ranks_of_host[0].size(), 4u);
  }
  {
    auto store = make_memory_store();
    ASSERT_TRUE(publish(*store, 1, "a\ndirect").ok());
    ASSERT_TRUE(publish(*store, 2, "b\ndaemon").ok());
    ASSERT_TRUE(publish(*store, 3, "b\ndirect").ok());
    // The others have read the modes too: rank 0, which hosts the store, need not wait for them.
    for (int r = 1; r < kWorld; ++r) {
      ASSERT_TRUE(
          store->set("gw/mode_seen/" + std::to_string(r), Bytes{1}, deadline_after_ms(100)).ok());
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto m = exchange_hosts(*store, 0, kWorld, deadline_after_ms(5000), "daemon");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));  // at once
    ASSERT_EQ(m.status().code(), Code::kInvalidArg) << m.status().to_string();
    EXPECT_NE(m.status().message().find("ranks 0, 2 in daemon mode"), std::string::npos)
        << m.status().message();
    EXPECT_NE(m.status().message().find("ranks 1, 3 in direct mode"), std::string::npos)
        << m.status().message();
    EXPECT_NE(m.status().message().find("GW_DAEMON"), std::string::npos);
  }
  {
    auto store = make_memory_store();  // a rank that gave no mode
    for (int r = 1; r < 3; ++r) ASSERT_TRUE(publish(*store, r, "a\ndirect").ok());
    ASSERT_TRUE(publish(*store, 3, "a").ok());
    // Nobody says it has read the modes: rank 0 waits 2 s for them at most, then fails.
    const auto t0 = std::chrono::steady_clock::now();
    auto m = exchange_hosts(*store, 0, kWorld, deadline_after_ms(10000), "direct");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(4));
    EXPECT_NE(m.status().message().find("rank 3 in an unknown mode"), std::string::npos)
        << m.status().to_string();
  }
  {
    auto store = make_memory_store();  // the rank without a mode sees the others' too
    for (int r = 1; r < kWorld; ++r) {
      ASSERT_TRUE(publish(*store, r, "a\ndaemon").ok());
      ASSERT_TRUE(
          store->set("gw/mode_seen/" + std::to_string(r), Bytes{1}, deadline_after_ms(100)).ok());
    }
    auto m = exchange_hosts(*store, 0, kWorld, deadline_after_ms(5000));
    ASSERT_EQ(m.status().code(), Code::kInvalidArg) << m.status().to_string();
    EXPECT_NE(m.status().message().find("rank 0 in an unnamed mode"), std::string::npos)
        << m.status().message();
    EXPECT_NE(m.status().message().find("ranks 1, 2, 3 in daemon mode"), std::string::npos)
        << m.status().message();
  }
}

// Namespace "hosts" of one machine share its kernel (and CPUs): host_identity() without the netns.
TEST_F(BootstrapTest, KernelOfAHostIdentity) {
  EXPECT_EQ(kernel_of_host_id("box/4f1c-boot/netns:4026531840"), "box/4f1c-boot");
  EXPECT_EQ(kernel_of_host_id("box/4f1c-boot/netns:1"), kernel_of_host_id("box/4f1c-boot/netns:2"));
  const std::string natural = host_identity();
  EXPECT_NE(kernel_of_host_id(natural), natural);
  // Anything else (GW_HOSTID, NCCL_HOSTID) is its own kernel.
  for (const std::string id : {"gw-box", "box/netns:1", "a/b/netns:", "a/b/netns:12x", "a/b/c"}) {
    EXPECT_EQ(kernel_of_host_id(id), id);
  }
}

TEST_F(BootstrapTest, ExchangeHostsAsThreads) {
  auto store = make_memory_store();
  constexpr int kWorld = 4;
  std::vector<std::thread> threads;
  std::vector<std::optional<HostMap>> maps(kWorld);
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      auto m = exchange_hosts(*store, r, kWorld, deadline_after_ms(5000));
      if (m.ok()) maps[r] = *m;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(maps[r].has_value());
    EXPECT_EQ(maps[r]->ranks_of_host.size(), 1u);  // threads share one host
    EXPECT_EQ(maps[r]->local_rank, r);
  }
}

TEST_F(BootstrapTest, ExchangeHostsFailsOnAMissingRankAndBadArgs) {
  auto store = make_memory_store();
  auto start = Clock::now();
  auto m = exchange_hosts(*store, 0, 2, deadline_after_ms(200));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kTimeout);
  EXPECT_NE(m.status().message().find("rank 1"), std::string::npos) << m.status().message();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  EXPECT_EQ(exchange_hosts(*store, 2, 2, deadline_after_ms(100)).status().code(),
            Code::kInvalidArg);
  EXPECT_EQ(exchange_hosts(*store, -1, 2, deadline_after_ms(100)).status().code(),
            Code::kInvalidArg);
  EXPECT_EQ(exchange_hosts(*store, 0, 0, deadline_after_ms(100)).status().code(),
            Code::kInvalidArg);
}

TEST_F(BootstrapTest, JobTokenGeneratedByRankZero) {
  auto store = make_memory_store();
  std::string t0;
  std::string t1;
  std::thread other([&] {
    auto t = agree_job_token(*store, 1, deadline_after_ms(5000));
    if (t.ok()) t1 = *t;
  });
  auto t = agree_job_token(*store, 0, deadline_after_ms(5000));
  other.join();
  ASSERT_TRUE(t.ok()) << t.status().to_string();
  t0 = *t;
  EXPECT_EQ(t0.size(), 32u);
  EXPECT_EQ(t0.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(t0, t1);
  // Another job gets another token.
  auto store2 = make_memory_store();
  auto again = agree_job_token(*store2, 0, deadline_after_ms(1000));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, t0);
}

TEST_F(BootstrapTest, JobTokenFromEnvironmentAndFailures) {
  auto store = make_memory_store();
  set("GW_JOB_TOKEN", "from-env");
  EXPECT_EQ(*agree_job_token(*store, 3, deadline_after_ms(100)), "from-env");
  unsetenv("GW_JOB_TOKEN");
  auto start = Clock::now();
  auto t = agree_job_token(*store, 1, deadline_after_ms(200));  // rank 0 never publishes
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), Code::kTimeout);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
  ASSERT_TRUE(store->set("gw/job_token", Bytes{'x'}, deadline_after_ms(100)).ok());
  EXPECT_EQ(agree_job_token(*store, 1, deadline_after_ms(100)).status().code(), Code::kPeer);
  EXPECT_EQ(agree_job_token(*store, -1, deadline_after_ms(100)).status().code(), Code::kInvalidArg);
}

TEST(ParseEnvIntTest, Strict) {
  EXPECT_EQ(*parse_env_int("X", "42"), 42);
  EXPECT_EQ(*parse_env_int("X", "-7"), -7);
  for (const char* bad : {"", " 1", "1 ", "+1", "0x10", "1e3", "2147483648"}) {
    auto r = parse_env_int("X", bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("X="), std::string::npos);
  }
}

// Each rank's world size and launcher travel with its host: an entry that disagrees fails the
// reader at once, naming both values (ranks started for different sizes used to wait out their
// deadline). Rank 0 hosts the store: it returns once the others said they know (here at once).
TEST_F(BootstrapTest, ExchangeHostsComparesWorldSizeAndLauncher) {
  set("GW_HOSTID", "a");
  auto publish = [](Store& store, int r, const std::string& v) {
    return store.set("gw/host/" + std::to_string(r), Bytes(v.begin(), v.end()),
                     deadline_after_ms(1000));
  };
  {
    auto store = make_memory_store();
    ASSERT_TRUE(publish(*store, 1, "a\ndirect\nworld=2 launcher=GW_*").ok());
    auto m = exchange_hosts(*store, 0, 2, deadline_after_ms(2000), "direct", "GW_*");
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    EXPECT_EQ(m->host_ids, (std::vector<std::string>{"a"}));  // the line is not the identity
  }
  {
    auto store = make_memory_store();
    ASSERT_TRUE(publish(*store, 1, "a\ndirect\nworld=3 launcher=GW_*").ok());
    ASSERT_TRUE(store->add("gw/setup_failure_seen", 1, deadline_after_ms(100)).ok());
    const auto t0 = std::chrono::steady_clock::now();
    auto m = exchange_hosts(*store, 0, 2, deadline_after_ms(10000), "direct", "GW_*");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    ASSERT_EQ(m.status().code(), Code::kInvalidArg) << m.status().to_string();
    EXPECT_NE(m.status().message().find("rank 1 was started for a world of 3 ranks, this rank "
                                        "(rank 0) for 2"),
              std::string::npos)
        << m.status().message();
  }
  {
    // Rank 1 reads rank 0's entry first: a mismatch fails it without waiting for rank 2.
    auto store = make_memory_store();
    ASSERT_TRUE(publish(*store, 0, "a\ndirect\nworld=2 launcher=GW_*").ok());
    const auto t0 = std::chrono::steady_clock::now();
    auto m = exchange_hosts(*store, 1, 3, deadline_after_ms(10000), "direct", "GW_*");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    ASSERT_EQ(m.status().code(), Code::kInvalidArg) << m.status().to_string();
    EXPECT_NE(m.status().message().find("world of 2"), std::string::npos) << m.status().message();
  }
  {
    auto store = make_memory_store();
    ASSERT_TRUE(publish(*store, 1, "a\ndirect\nworld=2 launcher=torchrun").ok());
    ASSERT_TRUE(store->add("gw/setup_failure_seen", 1, deadline_after_ms(100)).ok());
    auto m = exchange_hosts(*store, 0, 2, deadline_after_ms(10000), "direct", "GW_*");
    ASSERT_EQ(m.status().code(), Code::kInvalidArg) << m.status().to_string();
    EXPECT_NE(m.status().message().find("rank 1 was started by torchrun"), std::string::npos)
        << m.status().message();
    EXPECT_NE(m.status().message().find("by GW_*"), std::string::npos) << m.status().message();
  }
}

// A rank that refuses a setting before the rendezvous says why in the store: the others fail at
// once naming it (rank 0's failure reaches them through the job token's key, another rank's
// through its host entry), and rank 0 keeps the store until they have read it.
TEST_F(BootstrapTest, APublishedSetupFailureFailsTheOthersAtOnce) {
  set("GW_HOSTID", "a");
  {
    auto store = make_memory_store();
    std::thread bad([&] {
      (void)publish_setup_failure(*store, 2, 3, invalid_arg("GW_TRANSPORT 'tpc': no such"),
                                  deadline_after_ms(5000));
    });
    auto prefixed = make_prefix_store(store, "gw/comm1/");
    const auto t0 = std::chrono::steady_clock::now();
    std::thread one(
        [&] { (void)exchange_hosts(*prefixed, 1, 3, deadline_after_ms(10000), "direct", "GW_*"); });
    auto m = exchange_hosts(*prefixed, 0, 3, deadline_after_ms(10000), "direct", "GW_*");
    one.join();
    bad.join();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
    ASSERT_EQ(m.status().code(), Code::kPeer) << m.status().to_string();
    EXPECT_NE(m.status().message().find("rank 2 failed to set up: GW_TRANSPORT 'tpc'"),
              std::string::npos)
        << m.status().message();
  }
  {
    auto store = make_memory_store();
    const auto t0 = std::chrono::steady_clock::now();
    std::thread zero([&] {
      (void)publish_setup_failure(*store, 0, 2, invalid_arg("bad setting"),
                                  deadline_after_ms(5000));
    });
    auto prefixed = make_prefix_store(store, "gw/comm1/");
    auto t = agree_job_token(*prefixed, 1, deadline_after_ms(10000), 2);
    zero.join();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));  // rank 0 too
    ASSERT_EQ(t.status().code(), Code::kPeer) << t.status().to_string();
    EXPECT_NE(t.status().message().find("rank 0 failed to set up: bad setting"), std::string::npos)
        << t.status().message();
  }
}

// Issue 33 item 6: which store addresses count as this host only, and when a token-less job warns.
TEST(TokenlessJobWarningTest, OnlyATokenlessJobWithAStoreBeyondLoopbackIsWarned) {
  for (const char* h : {"127.0.0.1", "127.8.9.10", "::1", "localhost"}) {
    EXPECT_TRUE(is_loopback_host(h)) << h;
  }
  for (const char* h : {"", "0.0.0.0", "::", "10.1.2.3", "192.0.2.7", "no-such-host.invalid"}) {
    EXPECT_FALSE(is_loopback_host(h)) << h;
  }
  const std::string w = tokenless_job_warning("", 4, "10.1.2.3", 29500);
  EXPECT_NE(w.find("10.1.2.3:29500"), std::string::npos) << w;
  EXPECT_NE(w.find("GW_JOB_TOKEN"), std::string::npos) << w;
  EXPECT_EQ(tokenless_job_warning("GW_JOB_TOKEN", 4, "10.1.2.3", 29500), "");
  EXPECT_EQ(tokenless_job_warning("PMIx (made by rank 0)", 4, "10.1.2.3", 29500), "");
  EXPECT_EQ(tokenless_job_warning("", 1, "10.1.2.3", 29500), "");
  EXPECT_EQ(tokenless_job_warning("", 4, "127.0.0.1", 29500), "");
}

}  // namespace
}  // namespace gw
