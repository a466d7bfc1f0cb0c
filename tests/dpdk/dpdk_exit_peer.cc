// One end of a net_memif pair that exits the ordinary way (return from main: atexit handlers,
// static destructors, stdio flush) at about the moment its peer leaves. dpdk_exit_test runs two
// of these many times and counts the processes that never finish exiting.
//
//   dpdk_exit_peer server|client SOCKET MAC DELAY_US
//
// Opens its end (its own EAL, as a gradwired or a plugin process does; "open" once a server
// listens), waits for the link and for one frame from the peer, prints "ready" and waits until
// stdin reaches EOF (the test closes every peer's stdin together). It then has EAL's interrupt
// thread log one ERR line DELAY_US later, leaves output in stdout's buffer for exit() to flush,
// and returns 0, stopping its port on the way. Exit codes: 0 done; 2 usage; 3 port; 4 link or
// peer frame not seen within 10 s; 5 the alarm could not be set.
#include <rte_alarm.h>
#include <rte_log.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "dpdk/dpdk_port.h"

namespace {

void log_from_interrupt_thread(void*) {
  RTE_LOG(ERR, EAL, "dpdk_exit_peer: the peer is leaving\n");
}

using Clock = std::chrono::steady_clock;

int run(const std::string& role, const std::string& socket, const std::string& mac,
        unsigned delay_us) {
  gw::dpdk::DpdkPortOptions o;
  // ERR from EAL and its drivers stays on (the default): the line the interrupt thread logs when
  // the peer leaves is what exit() used to deadlock against.
  o.eal_args =
      "-l 0 --no-huge -m 64 --no-pci --no-shconf --no-telemetry --log-level=*:error "
      "--vdev net_memif0,id=0,role=" +
      role + ",socket=" + socket + ",mac=" + mac;
  o.mtu = 1500;
  o.nb_mbufs = 1024;
  o.nb_desc = 256;
  auto port = gw::dpdk::open_dpdk_port(o);
  if (!port.ok()) {
    std::fprintf(stderr, "dpdk_exit_peer %s: %s\n", role.c_str(), port.status().message().c_str());
    return 3;
  }
  std::printf("open\n");  // a server listens from here on
  std::fflush(stdout);
  gw::dpdk::FramePort& p = **port;
  // Send a broadcast frame every 10 ms until one arrives from the peer, then 10 more (100 ms):
  // the peer may have lost every frame sent before its side was up, and a side that stopped at
  // its first frame left such a peer waiting (a failure seen under load).
  auto send_one = [&p] {
    gw::dpdk::FrameBuf b;
    if (!p.alloc(&b)) return;
    std::memset(b.data, 0xff, 6);
    const gw::dpdk::MacAddr m = p.mac();
    std::memcpy(b.data + 6, m.data(), 6);
    b.data[12] = 0x88;  // local experimental ethertype
    b.data[13] = 0xb5;
    std::memset(b.data + 14, 0, 46);
    b.len = 60;
    if (p.tx_burst(&b, 1) != 1) p.free(b);
  };
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  bool got = false;
  while (!got) {
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "dpdk_exit_peer %s: no frame from the peer within 10 s\n", role.c_str());
      return 4;
    }
    if (p.check_link()) {
      send_one();
      gw::dpdk::FrameBuf in[8];
      const size_t n = p.rx_burst(in, 8);
      for (size_t i = 0; i < n; ++i) {
        got = got || (in[i].len >= 14 && in[i].data[12] == 0x88 && in[i].data[13] == 0xb5);
        p.free(in[i]);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (int i = 0; i < 10; ++i) {
    send_one();
    gw::dpdk::FrameBuf in[8];
    const size_t n = p.rx_burst(in, 8);
    for (size_t j = 0; j < n; ++j) p.free(in[j]);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Streams with output pending: exit() holds glibc's stream-list lock while it flushes them, so
  // the peer's leaving (logged by this process's EAL interrupt thread) falls in that window
  // more often than in a process with few streams.
  for (int i = 0; i < 1000; ++i) {
    FILE* f = std::fopen("/dev/null", "w");
    if (f == nullptr) break;
    std::fputc('x', f);
  }
  std::printf("ready\n");
  std::fflush(stdout);
  char c;
  while (::read(0, &c, 1) > 0) {
  }
  // The memif PMD's own log at leaving ("EAL: Error: Invalid memory", from its interrupt thread
  // when both ends stop at once) is a race inside DPDK that a test cannot time. So EAL's
  // interrupt thread is also made to log here, DELAY_US after the order to leave, while main()
  // stops the port and exits: the same thread, the same log stream, the same exit.
  if (int rc = rte_eal_alarm_set(delay_us + 1, &log_from_interrupt_thread, nullptr); rc != 0) {
    std::fprintf(stderr, "dpdk_exit_peer %s: rte_eal_alarm_set: %s\n", role.c_str(),
                 std::strerror(-rc));
    return 5;
  }
  std::printf("%s leaving\n", role.c_str());  // buffered: exit() flushes it
  return 0;  // the port stops here (as a transport's close stops it); EAL stays up
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5 || (std::strcmp(argv[1], "server") != 0 && std::strcmp(argv[1], "client") != 0)) {
    std::fprintf(stderr, "usage: dpdk_exit_peer server|client SOCKET MAC DELAY_US\n");
    return 2;
  }
  return run(argv[1], argv[2], argv[3], static_cast<unsigned>(std::strtoul(argv[4], nullptr, 10)));
}
