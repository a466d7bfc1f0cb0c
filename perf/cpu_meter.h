// What a timed section cost in CPU time: the whole machine's busy time (every CPU's user, nice,
// system, irq, softirq and steal time from /proc/stat, so the kernel's TCP work over veth and
// other ranks' processes count too) and this process's own user and system time (getrusage).
// The machine figure is the cost of the section only on an otherwise idle machine; its
// resolution is a clock tick (sysconf(_SC_CLK_TCK), 10 ms on Debian), so time sections of a
// second or more.
#pragma once

#include <string>

namespace gw::perf {

struct CpuSample {
  double machine_busy_s = -1;  // -1: /proc/stat could not be read
  double self_user_s = 0;
  double self_sys_s = 0;
};

// Now.
CpuSample cpu_sample();

// The nominal clock of the first CPU in GHz ("cpu MHz" of /proc/cpuinfo), 0 when unknown: CPU
// seconds times this estimates cycles where no cycle counter is readable (a VM without a PMU).
double cpu_nominal_ghz();

// From a /proc/stat text: the first "cpu " line's busy ticks (user nice system irq softirq steal;
// guest time is inside user already), -1 when there is none. Public for the tests.
double proc_stat_busy_ticks(const std::string& text);

// What the section [a, b) that moved `gb` gigabytes (the buffer's bytes times the timed
// iterations) cost per GB: machine -1 when /proc/stat could not be read.
struct CpuPerGb {
  double machine = -1;
  double rank_user = 0;
  double rank_sys = 0;
};
CpuPerGb cpu_per_gb(double gb, const CpuSample& a, const CpuSample& b);

// The "# cpu:" line gradwire-perf --cpu prints after a row (cpu_per_gb's figures); empty when
// nothing moved.
std::string cpu_line(size_t bytes, double gb, const CpuSample& a, const CpuSample& b);

}  // namespace gw::perf
