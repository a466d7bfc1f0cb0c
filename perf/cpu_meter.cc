#include "perf/cpu_meter.h"

#include <fmt/format.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

namespace gw::perf {
namespace {

double seconds(const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; }

std::string read_file(const char* path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace

double proc_stat_busy_ticks(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu ", 0) != 0) continue;
    std::istringstream fields(line.substr(4));
    // user nice system idle iowait irq softirq steal: idle (3) and iowait (4) are not busy.
    double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int n = 0;
    while (n < 8 && fields >> v[n]) ++n;
    if (n < 4) return -1;
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  }
  return -1;
}

CpuSample cpu_sample() {
  CpuSample s;
  const double ticks = proc_stat_busy_ticks(read_file("/proc/stat"));
  const long hz = sysconf(_SC_CLK_TCK);
  if (ticks >= 0 && hz > 0) s.machine_busy_s = ticks / static_cast<double>(hz);
  rusage ru{};
  if (getrusage(RUSAGE_SELF, &ru) == 0) {
    s.self_user_s = seconds(ru.ru_utime);
    s.self_sys_s = seconds(ru.ru_stime);
  }
  return s;
}

double cpu_nominal_ghz() {
  std::istringstream in(read_file("/proc/cpuinfo"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("cpu MHz", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return 0;
    try {
      return std::stod(line.substr(colon + 1)) / 1000.0;
    } catch (...) {
      return 0;
    }
  }
  return 0;
}

CpuPerGb cpu_per_gb(double gb, const CpuSample& a, const CpuSample& b) {
  CpuPerGb c;
  c.rank_user = (b.self_user_s - a.self_user_s) / gb;
  c.rank_sys = (b.self_sys_s - a.self_sys_s) / gb;
  if (a.machine_busy_s >= 0 && b.machine_busy_s >= 0) {
    c.machine = (b.machine_busy_s - a.machine_busy_s) / gb;
  }
  return c;
}

std::string cpu_line(size_t bytes, double gb, const CpuSample& a, const CpuSample& b) {
  if (gb <= 0) return "";
  const CpuPerGb c = cpu_per_gb(gb, a, b);
  const unsigned cpus = std::thread::hardware_concurrency();
  if (c.machine < 0) {
    return fmt::format(
        "# cpu: bytes={} machine_cpu_s_per_gb=? rank_user_s_per_gb={:.4f} "
        "rank_sys_s_per_gb={:.4f} (/proc/stat unreadable)",
        bytes, c.rank_user, c.rank_sys);
  }
  const double ghz = cpu_nominal_ghz();
  const std::string cycles =
      ghz > 0 ? fmt::format("{:.2f}", c.machine * ghz) : std::string("?");  // s/GB x GHz = cyc/B
  return fmt::format(
      "# cpu: bytes={} machine_cpu_s_per_gb={:.4f} cycles_per_byte={} ghz={:.2f} cpus={} "
      "rank_user_s_per_gb={:.4f} rank_sys_s_per_gb={:.4f}",
      bytes, c.machine, cycles, ghz, cpus, c.rank_user, c.rank_sys);
}

}  // namespace gw::perf
