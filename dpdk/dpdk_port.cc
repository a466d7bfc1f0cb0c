#include "dpdk/dpdk_port.h"

#include <arpa/inet.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <netinet/in.h>
#include <rte_alarm.h>
#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_eth_ring.h>
#include <rte_ethdev.h>
#include <rte_interrupts.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>
#include <rte_ring.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <new>
#include <thread>

#include "core/log.h"
#include "core/net/socket_util.h"
#include "core/sys/time.h"
#include "dpdk/af_xdp_args.h"

namespace gw::dpdk {

namespace {

// EAL's log stream (see eal_log_stream). Writes straight to fd 2: no stdio stream, no syslog,
// no lock but the kernel's. Always reports the whole buffer written, so stdio never retries.
ssize_t eal_log_write(void* /*cookie*/, const char* buf, size_t size) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(STDERR_FILENO, buf + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // stderr closed or full: the line is lost, never waited for
    done += static_cast<size_t>(n);
  }
  return static_cast<ssize_t>(size);
}

// The stream EAL logs through in place of its default. DPDK 22.11's default stream copies each
// line to stderr with stdio and to syslog; its interrupt thread logs while it holds that
// stream's lock, and glibc's first syslog call opens /etc/localtime, which takes glibc's lock on
// the list of streams. exit() holds that list lock while it flushes every stream, EAL's
// included, and flushing EAL's stream calls syslog: when the interrupt thread logs as the
// process exits (a net_memif peer leaving at that moment), each waits for the other for ever.
// This stream takes no lock outside itself and is unbuffered, so exit() never has a line of it
// to flush; it lives until the process ends (the interrupt thread may log until then).
FILE* eal_log_stream() {
  static FILE* stream = [] {
    cookie_io_functions_t io{};
    io.write = &eal_log_write;
    FILE* f = ::fopencookie(nullptr, "w", io);
    if (f != nullptr) std::setvbuf(f, nullptr, _IONBF, 0);
    return f;
  }();
  return stream;
}

std::vector<std::string> add_af_xdp_queues(const std::vector<std::string>& words);

}  // namespace

Status eal_init_once(const std::string& args) {
  static std::once_flag once;
  static Status result;
  std::call_once(once, [&] {
    // Before rte_eal_init: its own lines, and its interrupt thread's, use this stream.
    FILE* log = eal_log_stream();
    if (log == nullptr || rte_openlog_stream(log) != 0) {
      result = internal_error("dpdk: cannot give EAL its log stream: {}", std::strerror(errno));
      return;
    }
    std::vector<std::string> words =
        add_af_xdp_queues(split_eal_args(args.empty() ? kDefaultEalArgs : args));
    words.insert(words.begin(), "gradwire");
    std::vector<char*> argv;
    for (auto& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    cpu_set_t saved;
    const bool have_mask = sched_getaffinity(0, sizeof(saved), &saved) == 0;
    int rc = rte_eal_init(static_cast<int>(words.size()), argv.data());
    if (have_mask) sched_setaffinity(0, sizeof(saved), &saved);
    if (rc < 0) {
      result = unsupported("dpdk: rte_eal_init({}) failed: {}",
                           args.empty() ? kDefaultEalArgs : args, rte_strerror(rte_errno));
    } else {
      GW_LOG_INFO("dpdk: EAL up ({}), {} ethdev(s)", args.empty() ? kDefaultEalArgs : args,
                  rte_eth_dev_count_avail());
    }
  });
  return result;
}

namespace {

// net_af_xdp: the veth pair of the testbed runs at 3498 with XDP attached (its page-sized
// buffers); a frame must also fit one 4 KiB umem chunk.
constexpr size_t kAfXdpMtu = 3498;

// The IPv4 addresses the kernel has on a network interface ("10.77.0.1, 10.0.0.5"), or "".
std::string kernel_ipv4(const std::string& iface) {
  auto all = net::list_interfaces();
  if (iface.empty() || !all.ok()) return "";
  std::string out;
  for (const net::Interface& i : *all) {
    if (i.name != iface || i.addr.ss_family != AF_INET) continue;
    char ip[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(&i.addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip)) == nullptr) continue;
    out += (out.empty() ? "" : ", ") + std::string(ip);
  }
  return out;
}

// The kernel MTU of a network interface, or 0.
size_t kernel_mtu(const std::string& iface) {
  if (iface.empty() || iface.size() >= IFNAMSIZ) return 0;
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return 0;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, iface.c_str(), iface.size());
  size_t mtu = ioctl(fd, SIOCGIFMTU, &ifr) == 0 ? static_cast<size_t>(ifr.ifr_mtu) : 0;
  close(fd);
  return mtu;
}

// How many receive queues a network interface has: ethtool's channel counts (combined ones plus
// receive-only ones), else its rx-N entries in sysfs; 0 when neither says.
size_t kernel_rx_queues(const std::string& iface) {
  if (iface.empty() || iface.size() >= IFNAMSIZ) return 0;
  if (int fd = socket(AF_INET, SOCK_DGRAM, 0); fd >= 0) {
    ethtool_channels ch{};
    ch.cmd = ETHTOOL_GCHANNELS;
    ifreq ifr{};
    std::memcpy(ifr.ifr_name, iface.c_str(), iface.size());
    ifr.ifr_data = reinterpret_cast<char*>(&ch);
    const int rc = ioctl(fd, SIOCETHTOOL, &ifr);
    close(fd);
    if (rc == 0 && ch.combined_count + ch.rx_count > 0) return ch.combined_count + ch.rx_count;
  }
  std::error_code ec;
  size_t n = 0;
  for (const auto& e :
       std::filesystem::directory_iterator("/sys/class/net/" + iface + "/queues", ec)) {
    if (e.path().filename().string().rfind("rx-", 0) == 0) ++n;
  }
  return n;
}

// An AF_XDP socket receives the frames of one queue of its interface, and an interface of several
// receive queues spreads its incoming flows over them (RSS): a port on one queue would never see
// the peers whose flows land elsewhere. So for each net_af_xdp vdev of the EAL arguments that
// names no queue (no start_queue, no queue_count) on an interface of N > 1 receive queues, one
// more vdev per other queue, "<vdev>q<k>,<its arguments>,start_queue=k" (k = 1 .. N-1, at most
// kAfXdpMaxQueues in all), which DpdkPort opens as one port with it. (The 22.11 PMD's own
// queue_count is refused above the interface's combined channels, so on a veth, which reports
// none, and it would give one umem per queue anyway.)
std::vector<std::string> add_af_xdp_queues(const std::vector<std::string>& words) {
  std::vector<std::string> extra;
  for (const AfXdpVdev& v : af_xdp_vdevs(words)) {
    if (v.names_queue) continue;
    const size_t nq = kernel_rx_queues(v.iface);
    if (nq <= 1) continue;
    const size_t take = std::min(nq, kAfXdpMaxQueues);
    for (size_t q = 1; q < take; ++q) {
      extra.push_back("--vdev");
      extra.push_back(fmt::format("{},{},start_queue={}", af_xdp_queue_vdev(v.name, q), v.args, q));
    }
    GW_LOG_INFO("dpdk: {} on {}: {} receive queues, the port takes {} (ethdevs {}q1 .. {}q{})",
                v.name, v.iface, nq, take == nq ? "every one" : fmt::format("{}", take), v.name,
                v.name, take - 1);
  }
  std::vector<std::string> out = words;
  out.insert(out.end(), extra.begin(), extra.end());
  return out;
}

// Stops a port. A net_memif port is stopped on EAL's interrupt thread (an alarm, waited for):
// DPDK 22.11's memif tears its connection down (memif_disconnect, which frees the shared regions)
// both from that thread, when the peer leaves, and from the caller's, on dev_stop, with no lock
// between the two; both at once free the same regions twice: "EAL: Error: Invalid memory", and
// in about one run of dpdk_exit_test in ten (both ends of 80 pairs leaving together) a SIGSEGV
// in EAL's heap on the interrupt thread. On one thread they run one after the other, and the
// second finds nothing left to free.
void stop_port(uint16_t port, bool memif) {
  if (!memif || rte_thread_is_intr()) {
    rte_eth_dev_stop(port);
    return;
  }
  struct Stop {
    uint16_t port;
    std::atomic<bool> done{false};
  };
  auto* stop = new Stop{port};
  rte_eal_alarm_callback cb = [](void* arg) {
    auto* s = static_cast<Stop*>(arg);
    rte_eth_dev_stop(s->port);
    s->done.store(true, std::memory_order_release);
  };
  if (int rc = rte_eal_alarm_set(1, cb, stop); rc != 0) {
    delete stop;
    GW_LOG_DEBUG("dpdk: port {}: no alarm to stop it on EAL's interrupt thread ({}): stopped here",
                 port, rte_strerror(-rc));
    rte_eth_dev_stop(port);
    return;
  }
  auto wait_done = [stop](int64_t ms) {
    const int64_t until = sys::now_ns() / 1000 + ms * 1000;
    while (!stop->done.load(std::memory_order_acquire) && sys::now_ns() / 1000 < until) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return stop->done.load(std::memory_order_acquire);
  };
  if (wait_done(2000)) {
    delete stop;
    return;
  }
  // The interrupt thread is busy elsewhere: take the alarm back and stop the port here, or, when
  // the alarm is already running, give it the time it needs.
  if (rte_eal_alarm_cancel(cb, stop) > 0) {
    delete stop;
    GW_LOG_WARN("dpdk: port {}: EAL's interrupt thread did not stop it within 2 s; stopped here",
                port);
    rte_eth_dev_stop(port);
  } else if (wait_done(2000)) {
    delete stop;
  } else {
    GW_LOG_WARN("dpdk: port {}: stopping it on EAL's interrupt thread takes more than 4 s", port);
    // `stop` stays allocated: the alarm still uses it.
  }
}

class DpdkPort : public FramePort {
 public:
  ~DpdkPort() override {
    if (started_) stop_port(port_id_, memif_);
    for (uint16_t q : queue_ports_) rte_eth_dev_stop(q);
    // The mempool stays: the PMD may still reference mbufs of it until the process ends.
  }

  static Result<std::unique_ptr<FramePort>> open(const DpdkPortOptions& o) {
    auto p = std::unique_ptr<DpdkPort>(new DpdkPort());
    GW_RETURN_IF_ERROR(p->init(o));
    return std::unique_ptr<FramePort>(std::move(p));
  }

  MacAddr mac() const override { return mac_; }
  size_t mtu() const override { return mtu_; }
  bool tx_l4_offload() const override { return tx_offload_; }
  std::string name() const override { return name_; }

  bool alloc(FrameBuf* buf) override {
    rte_mbuf* m = rte_pktmbuf_alloc(pool_);
    if (m == nullptr) return false;
    buf->opaque = m;
    buf->data = rte_pktmbuf_mtod(m, uint8_t*);
    buf->cap = rte_pktmbuf_tailroom(m);
    buf->len = 0;
    buf->l4_checksum_ok = false;
    return true;
  }
  void free(FrameBuf& buf) override {
    rte_pktmbuf_free(static_cast<rte_mbuf*>(buf.opaque));
    buf = FrameBuf{};
  }
  bool zero_copy() const override { return zero_copy_; }
  bool attach_external(FrameBuf* buf, const uint8_t* data, size_t len, TxRef* const* refs,
                       int n) override {
    if (!zero_copy_ || len == 0 || len > UINT16_MAX || n < 0 || n > kMaxZcRefs) return false;
    rte_mbuf* e = rte_pktmbuf_alloc(pool_);
    if (e == nullptr) return false;
    // The segment's shared info lives in the segment mbuf's own data room, which the external
    // buffer leaves unused: DPDK calls zc_release from rte_pktmbuf_detach before it restores the
    // mbuf's buffer and returns it to the pool, so the room is ours until then (no allocation).
    auto* z = new (e->buf_addr) ZcSeg();
    z->shinfo.free_cb = &DpdkPort::zc_release;
    z->shinfo.fcb_opaque = z;
    rte_mbuf_ext_refcnt_set(&z->shinfo, 1);
    z->n = n;
    for (int i = 0; i < n; ++i) {
      z->refs[i] = refs[i];
      refs[i]->frame_attached();
    }
    void* va = const_cast<uint8_t*>(data);  // read only: the PMD never writes a TX segment
    const rte_iova_t iova = rte_eal_iova_mode() == RTE_IOVA_VA
                                ? static_cast<rte_iova_t>(reinterpret_cast<uintptr_t>(va))
                                : RTE_BAD_IOVA;
    rte_pktmbuf_attach_extbuf(e, va, iova, static_cast<uint16_t>(len), &z->shinfo);
    e->data_len = static_cast<uint16_t>(len);
    e->pkt_len = static_cast<uint32_t>(len);
    rte_mbuf* head = static_cast<rte_mbuf*>(buf->opaque);
    head->next = e;
    head->nb_segs = 2;
    buf->data2 = data;
    buf->len2 = len;
    return true;
  }
  void tx_cleanup() override { rte_eth_tx_done_cleanup(port_id_, 0, 0); }
  size_t tx_burst(FrameBuf* bufs, size_t n) override {
    rte_mbuf* ms[512];
    n = std::min<size_t>(n, 512);
    if (!started_) {  // a net_memif client not connected yet: the link drops what it is given
      for (size_t i = 0; i < n; ++i) free(bufs[i]);
      return n;
    }
    for (size_t i = 0; i < n; ++i) {
      rte_mbuf* m = static_cast<rte_mbuf*>(bufs[i].opaque);
      m->data_len = static_cast<uint16_t>(bufs[i].len);
      m->pkt_len = static_cast<uint32_t>(bufs[i].len + bufs[i].len2);
      if (tx_offload_) {
        m->l2_len = kEthLen;
        m->l3_len = kIpLen;
        m->ol_flags |= RTE_MBUF_F_TX_IPV4 | RTE_MBUF_F_TX_UDP_CKSUM;
      }
      ms[i] = m;
    }
    const int64_t t0 = mono_us();
    const uint16_t sent = rte_eth_tx_burst(port_id_, 0, ms, static_cast<uint16_t>(n));
    note_time(t0, &slow_tx_, &max_tx_us_);
    return sent;
  }
  Drops drops() const override {
    Drops d;
    // Every queue's ethdev of an AF_XDP port (add_af_xdp_queues) drops on its own.
    for (size_t i = 0; i <= queue_ports_.size(); ++i) {
      rte_eth_stats st;
      if (rte_eth_stats_get(i == 0 ? port_id_ : queue_ports_[i - 1], &st) != 0) continue;
      d.rx_missed += st.imissed;
      d.rx_errors += st.ierrors;
      d.rx_nombuf += st.rx_nombuf;
      d.tx_errors += st.oerrors;
    }
    d.slow_rx = slow_rx_;
    d.slow_tx = slow_tx_;
    d.max_rx_us = max_rx_us_;
    d.max_tx_us = max_tx_us_;
    return d;
  }
  size_t rx_ring_size() const override { return rx_desc_; }
  bool check_link() override {
    rte_eth_link l{};
    if (rte_eth_link_get_nowait(port_id_, &l) != 0) return true;  // the port cannot tell
    const int64_t now = mono_us();
    if (l.link_status == RTE_ETH_LINK_UP) {
      if (down_logged_) GW_LOG_INFO("dpdk: port {} link up", name_);
      seen_up_ = true;
      down_logged_ = false;
      down_since_us_ = 0;
      return true;
    }
    if (down_since_us_ == 0) {
      down_since_us_ = now;
      last_restart_us_ = now;
    }
    // A link that was up and went down is news at once; one that has not come up since the port
    // started (a peer still starting) after a second.
    if (!down_logged_ && (seen_up_ || now - down_since_us_ >= 1000000)) {
      GW_LOG_WARN("dpdk: port {} link down{}", name_,
                  memif_client_ ? " (net_memif client: connecting to its server again every "
                                  "500 ms)"
                                : "");
      down_logged_ = true;
    }
    // A net_memif client connects to its server once, when the port starts: a server that was
    // not listening yet (the other host's daemon started later) or went away and came back is
    // only reached by starting the port again. Not more often than every 500 ms, so a
    // connection the server is still answering is not cut short.
    if (memif_client_ && now - last_restart_us_ >= 500000) {
      last_restart_us_ = now;
      if (started_) stop_port(port_id_, memif_);
      // The PMD logs every failed connect at ERR; said once above, so quiet while retrying.
      const int type = rte_log_register("pmd.net.memif");
      const int level = type >= 0 ? rte_log_get_level(static_cast<uint32_t>(type)) : -1;
      if (level >= 0) rte_log_set_level(static_cast<uint32_t>(type), RTE_LOG_CRIT);
      const int rc = rte_eth_dev_start(port_id_);
      if (level >= 0) rte_log_set_level(static_cast<uint32_t>(type), static_cast<uint32_t>(level));
      started_ = rc == 0;
      if (rc != 0) GW_LOG_DEBUG("dpdk: starting port {} again: {}", name_, rte_strerror(-rc));
    }
    return false;
  }
  size_t rx_burst(FrameBuf* bufs, size_t n) override {
    if (!started_) return 0;
    rte_mbuf* ms[512];
    n = std::min<size_t>(n, 512);
    const int64_t t0 = mono_us();
    uint16_t got = 0;
    if (queue_ports_.empty()) {
      got = rte_eth_rx_burst(port_id_, 0, ms, static_cast<uint16_t>(n));
    } else {
      // An AF_XDP port over several queues (add_af_xdp_queues): each in turn, starting with the
      // next one each call, so that a busy queue cannot starve the others. An empty queue costs
      // a system call (the PMD's busy-poll recvfrom), and a flow stays on its queue (the NIC's
      // hash), so a queue that received nothing for kIdleQueueUs is looked at only every
      // kIdleQueueEvery-th call: 4 queues all looked at every call added 17-19 us to an 8-byte
      // message on the testbed, where one queue carries the flow.
      const size_t k = queue_ports_.size() + 1;
      const bool sweep = ++rx_calls_ % kIdleQueueEvery == 0;
      for (size_t i = 0; i < k && got < n; ++i) {
        const size_t at = (rx_next_ + i) % k;
        if (!sweep && t0 - rx_last_us_[at] > kIdleQueueUs) continue;
        const uint16_t pid = at == 0 ? port_id_ : queue_ports_[at - 1];
        const uint16_t q = rte_eth_rx_burst(pid, 0, ms + got, static_cast<uint16_t>(n - got));
        if (q > 0) rx_last_us_[at] = t0;
        got += q;
      }
      rx_next_ = (rx_next_ + 1) % k;
    }
    note_time(t0, &slow_rx_, &max_rx_us_);
    size_t out = 0;
    for (uint16_t i = 0; i < got; ++i) {
      rte_mbuf* m = ms[i];
      bufs[out].data2 = nullptr;
      bufs[out].len2 = 0;
      if (m->nb_segs == 2 && m->data_len == kHeadersLen && m->next != nullptr) {
        // Headers + payload segments, as a zero-copy sender builds them (net_ring hands us the
        // sender's mbufs): the payload is read where it lies.
        bufs[out].data2 = rte_pktmbuf_mtod(m->next, uint8_t*);
        bufs[out].len2 = m->next->data_len;
      } else if (m->nb_segs != 1 && rte_pktmbuf_linearize(m) != 0) {
        rte_pktmbuf_free(m);  // cannot happen with our mbuf size; counted by the decoder as lost
        continue;
      }
      bufs[out].opaque = m;
      bufs[out].data = rte_pktmbuf_mtod(m, uint8_t*);
      bufs[out].len = rte_pktmbuf_data_len(m);
      bufs[out].cap = bufs[out].len;
      bufs[out].l4_checksum_ok =
          rx_offload_ && (m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_MASK) == RTE_MBUF_F_RX_L4_CKSUM_GOOD;
      ++out;
    }
    return out;
  }

 private:
  DpdkPort() = default;

  Status init(const DpdkPortOptions& o) {
    GW_RETURN_IF_ERROR(eal_init_once(o.eal_args));
    const uint16_t avail = rte_eth_dev_count_avail();
    if (o.port == "ring" || (o.port.empty() && avail == 0)) {
      // A loopback ring port: what is sent comes back (one-process tests, no privileges).
      static std::mutex mu;
      static int count = 0;
      std::lock_guard<std::mutex> lock(mu);
      std::string rname = "gw_lo" + std::to_string(count++);
      rte_ring* r = rte_ring_create(rname.c_str(), 4096, SOCKET_ID_ANY, 0);
      if (r == nullptr) return unsupported("dpdk: rte_ring_create: {}", rte_strerror(rte_errno));
      int id = rte_eth_from_ring(r);
      if (id < 0) return unsupported("dpdk: rte_eth_from_ring: {}", rte_strerror(rte_errno));
      port_id_ = static_cast<uint16_t>(id);
    } else if (o.port.empty()) {
      uint16_t pid;
      RTE_ETH_FOREACH_DEV(pid) {
        port_id_ = pid;
        break;
      }
    } else {
      char* end = nullptr;
      long v = std::strtol(o.port.c_str(), &end, 10);
      if (*end != '\0' || v < 0 || v >= RTE_MAX_ETHPORTS || !rte_eth_dev_is_valid_port(v)) {
        return invalid_arg("dpdk: GW_DPDK_PORT '{}' is not 'ring' or a valid port id ({} ports)",
                           o.port, avail);
      }
      port_id_ = static_cast<uint16_t>(v);
    }
    rte_eth_dev_info info;
    if (int rc = rte_eth_dev_info_get(port_id_, &info); rc != 0) {
      return unsupported("dpdk: rte_eth_dev_info_get({}): {}", port_id_, rte_strerror(-rc));
    }
    char dev_name[RTE_ETH_NAME_MAX_LEN] = {};
    rte_eth_dev_get_name_by_port(port_id_, dev_name);
    name_ = fmt::format("{} (port {}, {})", dev_name, port_id_, info.driver_name);

    // mbufs hold a whole frame: no scatter on RX, one segment on TX.
    size_t want_mtu = std::max<size_t>(576, o.mtu);
    if (info.max_mtu > 0) want_mtu = std::min<size_t>(want_mtu, info.max_mtu);
    // At least 10 KiB: af_packet wants its whole frame slot (framesz) to fit in one mbuf.
    size_t room = std::max<size_t>(want_mtu + kEthLen + 64, 10240) + RTE_PKTMBUF_HEADROOM;
    const std::string pname = fmt::format("gw_pool{}", port_id_);
    const rte_devargs* da = info.device ? rte_dev_devargs(info.device) : nullptr;
    const std::string dargs = da && da->args ? da->args : "";
    if (std::strcmp(info.driver_name, "net_af_xdp") == 0) {
      find_queue_ports(dev_name, devarg(dargs, "iface"));
      // The PMD puts 2048 buffers in each queue's fill ring from the one pool.
      GW_RETURN_IF_ERROR(
          make_umem_pool(pname, o.nb_mbufs + 2048 * static_cast<int>(queue_ports_.size())));
      // The kernel puts a received frame XDP_PACKET_HEADROOM (256) after the mbuf's own
      // headroom, in a 4 KiB chunk that starts with the object header and struct rte_mbuf.
      const size_t frame_max =
          4096 - pool_->header_size - sizeof(rte_mbuf) - RTE_PKTMBUF_HEADROOM - 256;
      want_mtu = std::min<size_t>({want_mtu, frame_max - kEthLen, kAfXdpMtu});
    } else {
      pool_ = rte_pktmbuf_pool_create(pname.c_str(), static_cast<unsigned>(o.nb_mbufs), 256, 0,
                                      static_cast<uint16_t>(std::min<size_t>(room, 65535)),
                                      static_cast<int>(rte_socket_id()));
      if (pool_ == nullptr) {
        return no_memory(
            "dpdk: mbuf pool of {} x {} bytes: {} (raise -m in GW_DPDK_EAL_ARGS or "
            "lower GW_DPDK_NB_MBUFS)",
            o.nb_mbufs, room, rte_strerror(rte_errno));
      }
    }
    rte_eth_conf conf;
    std::memset(&conf, 0, sizeof(conf));
    GW_ASSIGN_OR_RETURN(zc_reason_, decide_zero_copy(o.zero_copy, info));
    if (zero_copy_) conf.txmode.offloads |= RTE_ETH_TX_OFFLOAD_MULTI_SEGS;
    const uint64_t tx_need = RTE_ETH_TX_OFFLOAD_IPV4_CKSUM | RTE_ETH_TX_OFFLOAD_UDP_CKSUM;
    if ((info.tx_offload_capa & tx_need) == tx_need) {
      conf.txmode.offloads |= tx_need;
      tx_offload_ = true;
    }
    if (info.rx_offload_capa & RTE_ETH_RX_OFFLOAD_UDP_CKSUM) {
      conf.rxmode.offloads |= RTE_ETH_RX_OFFLOAD_UDP_CKSUM;
      rx_offload_ = true;
    }
    if (int rc = rte_eth_dev_configure(port_id_, 1, 1, &conf); rc != 0) {
      return unsupported("dpdk: rte_eth_dev_configure({}): {}", name_, rte_strerror(-rc));
    }
    uint16_t nrx = static_cast<uint16_t>(o.nb_desc), ntx = static_cast<uint16_t>(o.nb_desc);
    rte_eth_dev_adjust_nb_rx_tx_desc(port_id_, &nrx, &ntx);
    rx_desc_ = nrx;
    const int sock = rte_eth_dev_socket_id(port_id_);
    const unsigned s = sock < 0 ? 0 : static_cast<unsigned>(sock);
    if (int rc = rte_eth_rx_queue_setup(port_id_, 0, nrx, s, nullptr, pool_); rc != 0) {
      return unsupported("dpdk: rx queue of {}: {}", name_, rte_strerror(-rc));
    }
    if (int rc = rte_eth_tx_queue_setup(port_id_, 0, ntx, s, nullptr); rc != 0) {
      return unsupported("dpdk: tx queue of {}: {}", name_, rte_strerror(-rc));
    }
    // Jumbo where the port allows it; otherwise whatever MTU it has.
    uint16_t cur = 0;
    if (std::strcmp(info.driver_name, "net_af_packet") == 0) {
      // net_af_packet (22.11) reports a 1518-byte max frame, but what really bounds a frame is
      // its ring slot (framesz, minus the kernel's tpacket header and alignment: 142 bytes is
      // safe) and the kernel interface's MTU. Its RX ring has framecnt slots.
      const std::string fs = devarg(dargs, "framesz"), fc = devarg(dargs, "framecnt");
      const size_t framesz = fs.empty() ? 2048 : std::strtoul(fs.c_str(), nullptr, 10);
      const size_t kmtu = kernel_mtu(devarg(dargs, "iface"));
      if (!fc.empty())
        rx_desc_ = std::strtoul(fc.c_str(), nullptr, 10);
      else
        rx_desc_ = 512;
      if (framesz > 142 + kEthLen && kmtu > 0) {
        mtu_ = std::min({want_mtu, kmtu, framesz - 142});
      } else {
        mtu_ = 1500;
      }
    } else if (const int mrc = rte_eth_dev_set_mtu(port_id_, static_cast<uint16_t>(want_mtu));
               mrc == 0 || (mrc == -ENOTSUP && info.max_rx_pktlen >= want_mtu + kEthLen)) {
      mtu_ = want_mtu;  // set, or a software port (net_ring) with no MTU of its own
    } else if (rte_eth_dev_get_mtu(port_id_, &cur) == 0 && cur > 0) {
      mtu_ = std::min<size_t>(cur, want_mtu);
    } else {
      mtu_ = std::min<size_t>(1500, want_mtu);
    }
    for (uint16_t q : queue_ports_) GW_RETURN_IF_ERROR(start_queue_port(q, conf, nrx, ntx, s));
    rx_last_us_.assign(queue_ports_.size() + 1, 0);
    memif_ = std::strcmp(info.driver_name, "net_memif") == 0;
    memif_client_ = memif_ && devarg(dargs, "role") == "client";
    if (int rc = rte_eth_dev_start(port_id_); rc == 0) {
      started_ = true;
    } else if (memif_client_) {
      // Its server is not listening yet (another host's process that starts later): check_link
      // starts the port again until it connects; meanwhile the link is down.
      GW_LOG_INFO(
          "dpdk: port {}: its net_memif server does not answer yet ({}); trying again "
          "every 500 ms",
          name_, rte_strerror(-rc));
    } else {
      return unsupported("dpdk: rte_eth_dev_start({}): {}", name_, rte_strerror(-rc));
    }
    if (std::strcmp(info.driver_name, "net_af_xdp") == 0) {
      // An AF_XDP port's XDP program hands this process every frame of its queue, ARP included:
      // the kernel's own traffic on the interface stops (on a one-queue veth, all of it) while
      // the port is open. Said where the kernel has addresses there that something may use.
      const std::string iface = devarg(dargs, "iface"), ips = kernel_ipv4(iface);
      const std::string first = af_xdp_first_queue(dargs);
      const std::string q = queue_ports_.empty() ? first : fmt::format("0-{}", queue_ports_.size());
      // A frame that the interface hashes to a queue the port does not hold (RSS, per flow)
      // goes to the kernel, which has no socket for it: the peers whose flows land there are
      // never heard, and their operations time out. (A vdev that names no queue holds them all,
      // up to kAfXdpMaxQueues: add_af_xdp_queues.)
      if (const size_t nq = kernel_rx_queues(iface); nq > queue_ports_.size() + 1) {
        GW_LOG_WARN(
            "dpdk: port {} receives on queue(s) {} of {} only, and {} has {} receive queues: "
            "frames it steers to another queue (by its hash of each flow) go to the kernel, so "
            "peers whose frames land there are never heard and their operations time out. Give "
            "{} fewer queues (`ethtool -L {} combined {}`; a veth: `rx 1 tx 1`), name no queue "
            "in the vdev (the port then takes up to {}), or steer the engine's UDP port "
            "(GW_DPDK_UDP_PORT, 47000 unless set) to queue {} (`ethtool -N {} flow-type udp4 "
            "dst-port 47000 action {}`)",
            name_, q, iface, iface, nq, iface, iface,
            queue_ports_.empty() ? size_t{1} : kAfXdpMaxQueues, kAfXdpMaxQueues, first, iface,
            first);
      }
      if (!ips.empty()) {
        GW_LOG_WARN(
            "dpdk: port {} takes the frames of {}'s queue(s) {} from the kernel while it is open: "
            "the kernel's traffic there ({}) stops (on a one-queue interface, all of it); run "
            "the store and other kernel TCP over another interface (GW_SOCKET_IFNAME)",
            name_, iface, q, ips);
      }
    }
    rte_eth_promiscuous_enable(port_id_);  // best effort (not every vdev supports it)
    rte_ether_addr a;
    rte_eth_macaddr_get(port_id_, &a);
    std::memcpy(mac_.data(), a.addr_bytes, 6);
    GW_LOG_INFO(
        "dpdk: port {} mac {} mtu {} tx-cksum-offload {} rx-cksum-offload {} zero-copy-tx {} ({})",
        name_, format_mac(mac_), mtu_, tx_offload_, rx_offload_, zero_copy_ ? "on" : "off",
        zc_reason_);
    return ok_status();
  }

  // Zero-copy TX sends a registered payload as a second, external-buffer segment. Whether a PMD
  // can take that is read from its 22.11 source, not only from its capabilities:
  //  - net_ring hands the mbufs to the receiver untouched: true zero copy (in one process);
  //  - net_af_packet and net_memif copy every segment of a chain into their ring slot: the
  //    PMD's copy remains, ours (into an mbuf) goes;
  //  - net_af_xdp advertises no MULTI_SEGS, and its TX copies pkt_len bytes from the first
  //    segment only: a chain would send garbage, so it stays on copy;
  //  - a hardware PMD would DMA from the user's memory, which nothing maps for the device
  //    (rte_extmem_register / rte_dev_dma_map at reg_mr): copy.
  // Returns the reason logged in the port's INFO line.
  Result<std::string> decide_zero_copy(const std::string& mode, const rte_eth_dev_info& info) {
    if (mode != "auto" && mode != "on" && mode != "off") {
      return invalid_arg("dpdk: GW_DPDK_ZERO_COPY '{}' is not auto, on or off", mode);
    }
    const std::string drv = info.driver_name;
    const bool multi_seg = (info.tx_offload_capa & RTE_ETH_TX_OFFLOAD_MULTI_SEGS) != 0;
    std::string why;
    bool able = false;
    if (!multi_seg) {
      why = drv + " has no multi-segment TX";
    } else if (drv == "net_ring") {
      able = true;
      why = "net_ring passes mbufs through: payload never copied on TX";
    } else if (drv == "net_af_packet" || drv == "net_memif") {
      able = true;
      why = drv + " copies each segment into its ring: one copy saved";
    } else {
      why = drv + ": registered memory is not DMA-mapped for the device";
    }
    if (mode == "off") {
      zero_copy_ = false;
      return std::string("GW_DPDK_ZERO_COPY=off");
    }
    if (mode == "on" && !able) {
      return unsupported("dpdk: GW_DPDK_ZERO_COPY=on but port {} cannot take it: {}", name_, why);
    }
    zero_copy_ = able;
    return why;
  }

  struct ZcSeg {
    rte_mbuf_ext_shared_info shinfo;
    TxRef* refs[3];
    int n = 0;
  };
  static constexpr int kMaxZcRefs = 3;
  static void zc_release(void* /*addr*/, void* opaque) {
    auto* z = static_cast<ZcSeg*>(opaque);
    for (int i = 0; i < z->n; ++i) z->refs[i]->frame_released();
    z->~ZcSeg();
  }

  // net_af_xdp (22.11) registers the mempool itself as the XDP umem: from the first object's page
  // for populated_size x object size bytes, and the kernel rejects (silently drops) a TX or fill
  // descriptor outside that range. Objects must therefore tile the memory exactly: one object
  // per 4 KiB page, no spreading pad, one memory chunk. A pool made by rte_pktmbuf_pool_create
  // (objects padded to a page each, but counted at their own size) leaves its last mbufs
  // outside the umem: their frames vanish, the fill ring drains and the link stalls.
  Status make_umem_pool(const std::string& name, int n) {
    const unsigned hdr = sizeof(rte_mempool_objhdr);
    const unsigned hdr_aligned = RTE_ALIGN_CEIL(hdr, RTE_MEMPOOL_ALIGN);
    const unsigned elt = 4096 - hdr_aligned;  // struct rte_mbuf + data room
    rte_pktmbuf_pool_private priv{};
    priv.mbuf_data_room_size = static_cast<uint16_t>(elt - sizeof(rte_mbuf));
    priv.mbuf_priv_size = 0;
    rte_mempool* mp =
        rte_mempool_create_empty(name.c_str(), static_cast<unsigned>(n), elt, 256, sizeof(priv),
                                 static_cast<int>(rte_socket_id()), RTE_MEMPOOL_F_NO_SPREAD);
    if (mp == nullptr) {
      return no_memory("dpdk: af_xdp umem pool of {} x 4 KiB: {}", n, rte_strerror(rte_errno));
    }
    int rc = rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), nullptr);
    if (rc == 0) {
      rte_pktmbuf_pool_init(mp, &priv);
      rc = rte_mempool_populate_default(mp);
      rc = rc < 0 ? rc : 0;
    }
    if (rc != 0 || mp->header_size + mp->elt_size + mp->trailer_size != 4096 ||
        mp->nb_mem_chunks != 1) {
      const std::string why =
          rc != 0
              ? rte_strerror(-rc)
              : fmt::format("object {} B in {} memory chunk(s)",
                            mp->header_size + mp->elt_size + mp->trailer_size, mp->nb_mem_chunks);
      rte_mempool_free(mp);
      return no_memory(
          "dpdk: af_xdp umem pool of {} x 4 KiB: {} (raise -m in GW_DPDK_EAL_ARGS or lower "
          "GW_DPDK_NB_MBUFS)",
          n, why);
    }
    rte_mempool_obj_iter(mp, rte_pktmbuf_init, nullptr);
    pool_ = mp;
    return ok_status();
  }

  // The ethdevs add_af_xdp_queues made for the other queues of this AF_XDP port's interface.
  void find_queue_ports(const std::string& dev_name, const std::string& iface) {
    uint16_t pid;
    RTE_ETH_FOREACH_DEV(pid) {
      if (pid == port_id_) continue;
      char name[RTE_ETH_NAME_MAX_LEN] = {};
      rte_eth_dev_info qi;
      if (rte_eth_dev_get_name_by_port(pid, name) != 0 || rte_eth_dev_info_get(pid, &qi) != 0 ||
          std::strcmp(qi.driver_name, "net_af_xdp") != 0) {
        continue;
      }
      const rte_devargs* qa = qi.device ? rte_dev_devargs(qi.device) : nullptr;
      const std::string args = qa && qa->args ? qa->args : "";
      if (af_xdp_queue_of(name, dev_name) && devarg(args, "iface") == iface) {
        queue_ports_.push_back(pid);
      }
    }
  }
  // One more queue of an AF_XDP port: its ethdev with one RX queue on the port's pool (the same
  // umem memory) and one TX queue (the PMD pairs them; the port sends on its first queue only).
  Status start_queue_port(uint16_t pid, const rte_eth_conf& conf, uint16_t nrx, uint16_t ntx,
                          unsigned socket) {
    if (int rc = rte_eth_dev_configure(pid, 1, 1, &conf); rc != 0) {
      return unsupported("dpdk: rte_eth_dev_configure(port {}, a queue of {}): {}", pid, name_,
                         rte_strerror(-rc));
    }
    if (int rc = rte_eth_rx_queue_setup(pid, 0, nrx, socket, nullptr, pool_); rc != 0) {
      return unsupported("dpdk: rx queue of port {} (a queue of {}): {}", pid, name_,
                         rte_strerror(-rc));
    }
    if (int rc = rte_eth_tx_queue_setup(pid, 0, ntx, socket, nullptr); rc != 0) {
      return unsupported("dpdk: tx queue of port {} (a queue of {}): {}", pid, name_,
                         rte_strerror(-rc));
    }
    rte_eth_dev_set_mtu(pid, static_cast<uint16_t>(mtu_));
    if (int rc = rte_eth_dev_start(pid); rc != 0) {
      return unsupported("dpdk: rte_eth_dev_start(port {}, a queue of {}): {}", pid, name_,
                         rte_strerror(-rc));
    }
    return ok_status();
  }

  static int64_t mono_us() { return sys::now_ns() / 1000; }
  static void note_time(int64_t t0, uint64_t* slow, uint64_t* max_us) {
    const int64_t us = mono_us() - t0;
    if (us > 1000) ++*slow;
    if (us > 0 && static_cast<uint64_t>(us) > *max_us) *max_us = static_cast<uint64_t>(us);
  }

  uint16_t port_id_ = 0;
  std::vector<uint16_t> queue_ports_;  // an AF_XDP port's other queues (add_af_xdp_queues)
  size_t rx_next_ = 0;                 // rx_burst's first queue next time
  // rx_burst over several queues: when each last received (0 = never), and the calls so far.
  static constexpr int64_t kIdleQueueUs = 1000000;
  static constexpr uint64_t kIdleQueueEvery = 16;
  std::vector<int64_t> rx_last_us_;
  uint64_t rx_calls_ = 0;
  size_t rx_desc_ = 1024;
  uint64_t slow_rx_ = 0, slow_tx_ = 0, max_rx_us_ = 0, max_tx_us_ = 0;
  rte_mempool* pool_ = nullptr;
  MacAddr mac_{};
  size_t mtu_ = 1500;
  bool tx_offload_ = false;
  bool rx_offload_ = false;
  bool zero_copy_ = false;
  bool memif_ = false;  // net_memif: stopped on EAL's interrupt thread (stop_port)
  bool memif_client_ = false;
  bool started_ = false;  // rte_eth_dev_start succeeded (a net_memif client may start later)
  bool seen_up_ = false, down_logged_ = false;  // check_link's state
  int64_t down_since_us_ = 0, last_restart_us_ = 0;
  std::string zc_reason_;
  std::string name_;
};

}  // namespace

Result<std::unique_ptr<FramePort>> open_dpdk_port(const DpdkPortOptions& options) {
  return DpdkPort::open(options);
}

}  // namespace gw::dpdk
