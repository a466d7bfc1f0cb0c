// perf/cpu_meter: the busy ticks of /proc/stat's first line, and the line gradwire-perf --cpu
// prints from two samples.
#include "perf/cpu_meter.h"

#include <gtest/gtest.h>
#include <time.h>

#include <chrono>

namespace gw::perf {
namespace {

TEST(CpuMeter, BusyTicksAreUserNiceSystemIrqSoftirqStealNotIdleOrIowait) {
  // user nice system idle iowait irq softirq steal guest guest_nice
  EXPECT_EQ(proc_stat_busy_ticks("cpu  100 2 30 5000 7 1 4 3 50 0\ncpu0 1 1 1 1 1 1 1 1 0 0\n"),
            100 + 2 + 30 + 1 + 4 + 3);
  // Older kernels print fewer fields; the missing ones count as zero.
  EXPECT_EQ(proc_stat_busy_ticks("cpu 10 0 5 99\n"), 15);
  EXPECT_EQ(proc_stat_busy_ticks("cpu0 1 2 3 4\nintr 5\n"), -1) << "no total line";
  EXPECT_EQ(proc_stat_busy_ticks("cpu  x y\n"), -1) << "not numbers";
  EXPECT_EQ(proc_stat_busy_ticks(""), -1);
}

TEST(CpuMeter, ASpinningSectionShowsUpInTheMachineAndTheProcess) {
  const CpuSample a = cpu_sample();
  ASSERT_GE(a.machine_busy_s, 0) << "/proc/stat unreadable";
  // Spin until this process has had 0.3 s of CPU (on a loaded machine that takes longer than
  // 0.3 s of wall-clock time: a deadline of 0.3 s gave the test 0.13 s of CPU beside a build),
  // within 20 s.
  auto cpu_now = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double cpu0 = cpu_now();
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  volatile unsigned long spin = 0;
  while (cpu_now() - cpu0 < 0.3 && std::chrono::steady_clock::now() < give_up) spin = spin + 1;
  const CpuSample b = cpu_sample();
  // This process spun for 0.3 s of CPU: its own user time and the machine's busy time both grew
  // by most of it (ticks are 10 ms; a loaded machine only adds to the machine's figure).
  EXPECT_GT(b.self_user_s + b.self_sys_s - a.self_user_s - a.self_sys_s, 0.15);
  EXPECT_GT(b.machine_busy_s - a.machine_busy_s, 0.15);
  const std::string line = cpu_line(1 << 20, 0.5, a, b);
  EXPECT_EQ(line.rfind("# cpu: bytes=1048576 machine_cpu_s_per_gb=", 0), 0u) << line;
  EXPECT_NE(line.find(" rank_user_s_per_gb="), std::string::npos) << line;
  EXPECT_EQ(cpu_line(1, 0, a, b), "") << "nothing moved, nothing to say";
  CpuSample unreadable = a;
  unreadable.machine_busy_s = -1;
  EXPECT_NE(cpu_line(1, 1, unreadable, b).find("machine_cpu_s_per_gb=? "), std::string::npos);
}

}  // namespace
}  // namespace gw::perf
