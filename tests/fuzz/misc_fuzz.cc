// The NCCL plugin's handle, the TOML configuration loader, a peer's announcement in the store,
// the direct allreduce's per-call descriptors and the AF_XDP vdevs of DPDK's EAL arguments
// (fuzz_targets.h).
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "collectives/connection_pool.h"
#include "collectives/shm_direct.h"
#include "core/config_file.h"
#include "core/net/shm_transport.h"
#include "core/net/tcp_transport.h"
#include "core/net/transport.h"
#include "dpdk/af_xdp_args.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

namespace {

std::vector<std::unique_ptr<net::Transport>>& handle_transports() {
  static auto* v = [] {
    setenv("GW_SOCKET_IFNAME", "lo", 1);
    auto* all = new std::vector<std::unique_ptr<net::Transport>>();
    net::TransportOptions o;
    o.job_token = "fuzz-token";
    o.timeout_ms = 100;
    o.host_id = "fuzz-host";
    auto tcp = net::make_tcp_transport(o);
    check(tcp.ok(), "handle fuzz: tcp");
    all->push_back(std::move(*tcp));
    auto shm = net::make_shm_transport(o);
    check(shm.ok(), "handle fuzz: shm");
    all->push_back(std::move(*shm));
    return all;
  }();
  return *v;
}

}  // namespace

// NCCL hands the plugin 128 bytes it got from the peer's listen(); connect() decodes them. The
// connector is dropped without polling: polling would dial whatever address the bytes name.
int plugin_handle(const uint8_t* data, size_t size) {
  net::Handle h;
  std::memcpy(h.bytes.data(), data, std::min(size, h.bytes.size()));
  for (auto& t : handle_transports()) {
    auto c = t->connect(h);
    if (!c.ok()) {
      check(c.status().code() == Code::kInvalidArg || c.status().code() == Code::kUnsupported,
            "handle: a bad handle is kInvalidArg or kUnsupported");
    }
  }
  return 0;
}

int config_toml(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto file = config::ConfigFile::parse(text, "fuzz.toml");
  check(file != nullptr, "config: parse returns a file");
  check(file->entries().empty() || file->errors().empty(), "config: entries or errors");
  check(size <= config::ConfigFile::kMaxBytes || !file->errors().empty(),
        "config: text over the size cap is refused");
  for (const auto& [key, entry] : file->entries()) {
    // (An empty quoted key, '' = 1, is valid TOML: the registry reports it as unknown.)
    check(file->find(key) == &entry, "config: find");
  }
  return 0;
}

std::vector<std::vector<uint8_t>> plugin_handle_seeds() {
  std::vector<std::vector<uint8_t>> out;
  for (auto& t : handle_transports()) {
    net::Handle h;
    auto l = t->listen(&h);
    if (l.ok()) out.emplace_back(h.bytes.begin(), h.bytes.end());
  }
  return out;
}

std::vector<std::vector<uint8_t>> config_seeds() {
  std::vector<std::vector<uint8_t>> out = text_seeds(
      {"timeout_ms = 60000\ntransport = \"tcp\"\n",
       "[dpdk]\nport = \"ring\"\nmtu = 1500\n[socket]\nifname = \"=eth0\"\n",
       "compress = \"topk:0.01\"\nspin_us = 1.5\nflag = true\nlist = [1, 2, [3]]\n",
       "a.b.c = 1\n[x.y]\nz = 'lit'\n[[arr]]\nk = 1\n[[arr]]\nk = 2\n",
       "s = \"\"\"\nmulti\nline\"\"\"\nd = 1979-05-27T07:32:00Z\ni = { p = 1, q = 'x' }\n",
       "bad = \n", "[unterminated\n", "x = 0x7fffffffffffffff\ny = -9223372036854775808\n"});
  // At the depth cap (ConfigFile::kMaxDepth = 16 parts) and one past it: a header, a dotted key
  // under a header, inline tables within inline tables, an array of inline tables.
  auto parts = [](int n, std::string_view sep) {
    std::string k;
    for (int i = 0; i < n; ++i) k += std::string(i ? sep : "") + "k";
    return k;
  };
  for (int n : {config::ConfigFile::kMaxDepth, config::ConfigFile::kMaxDepth + 1}) {
    std::string inl = "x = ";
    for (int i = 1; i < n; ++i) inl += "{ a = ";
    inl += "1";
    inl.append(static_cast<size_t>(n - 1), '}');
    inl += "\n";
    // Appends to a string that starts with the literal: GCC 12's -Wrestrict misreads
    // `"literal" + std::string&&` (a false positive, seen in release builds).
    auto cat = [](std::string head, const std::string& mid, const char* tail) {
      return head.append(mid).append(tail);
    };
    for (const std::string& s :
         {cat("[", parts(n - 1, "."), "]\nx = 1\n"), cat("[a.b]\n", parts(n - 2, " . "), " = 1\n"),
          inl, cat("x = [ { ", parts(n - 1, "."), " = 1 }, { y = 2 } ]\n")}) {
      out.emplace_back(s.begin(), s.end());
    }
  }
  return out;
}

int af_xdp_eal_args(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string> words = dpdk::split_eal_args(text);
  for (const std::string& w : words) {
    check(!w.empty(), "af_xdp: no empty word");
    for (char c : w)
      check(!std::isspace(static_cast<unsigned char>(c)), "af_xdp: no blank in a word");
  }
  for (const dpdk::AfXdpVdev& v : dpdk::af_xdp_vdevs(words)) {
    ++counter("af_xdp.vdev");
    check(v.name.rfind("net_af_xdp", 0) == 0 && v.name.find(',') == std::string::npos,
          "af_xdp: a vdev's name is net_af_xdp<...> up to its first comma");
    check(v.iface == dpdk::devarg(v.args, "iface"), "af_xdp: iface is the args' iface=");
    check(v.names_queue == (!dpdk::devarg(v.args, "start_queue").empty() ||
                            !dpdk::devarg(v.args, "queue_count").empty()),
          "af_xdp: names_queue iff start_queue= or queue_count= is given");
    check(!v.first_queue().empty(), "af_xdp: a first queue is always named");
    // The ethdev names the port adds for further queues map back to their queue, and only those.
    for (size_t q = 0; q <= dpdk::kAfXdpMaxQueues; ++q) {
      const auto back = dpdk::af_xdp_queue_of(dpdk::af_xdp_queue_vdev(v.name, q), v.name);
      if (q >= 1 && q < dpdk::kAfXdpMaxQueues) {
        check(back && *back == q, "af_xdp: a queue's ethdev name maps back to its queue");
      } else {
        check(!back, "af_xdp: queue 0 and queues past the cap have no ethdev of their own");
      }
    }
    // Any word read as an ethdev name: what maps to a queue is exactly that queue's name.
    for (const std::string& w : words) {
      const auto q = dpdk::af_xdp_queue_of(w, v.name);
      if (!q) continue;
      ++counter("af_xdp.queue_name");
      check(*q >= 1 && *q < dpdk::kAfXdpMaxQueues, "af_xdp: a named queue is within the cap");
      check(dpdk::af_xdp_queue_vdev(v.name, *q) == w, "af_xdp: a queue's name round-trips");
    }
  }
  return 0;
}

std::vector<std::vector<uint8_t>> af_xdp_eal_args_seeds() {
  return text_seeds(
      {"--vdev net_af_xdp0,iface=d0 net_af_xdp0q1 net_af_xdp0q15 net_af_xdp0q16",
       "-l 0 --vdev=net_af_xdp1,iface=eth1,start_queue=2 --no-pci net_af_xdp1q02",
       "--vdev net_af_xdp,iface=veth0,queue_count=4,framesz=9216 --vdev net_memif0,role=client",
       "--vdev net_af_xdp2 --vdev=net_af_xdp3,,iface=,start_queue= net_af_xdp3q7 net_af_xdp2q",
       "--vdev", "--vdev= --vdev=net_af_xdp9,iface=a,iface=b net_af_xdp9q1x"});
}

int pool_announcement(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto a = coll::parse_announcement(text);
  if (!a) return 0;
  ++counter("pool.announcement_parsed");
  check(a->pid > 0 && a->pidns > 0, "announcement: pid and pid namespace are set");
  const auto again = coll::parse_announcement(coll::format_announcement(*a));
  check(again && again->pid == a->pid && again->start == a->start && again->pidns == a->pidns,
        "announcement: formats back to itself");
  return 0;
}

std::vector<std::vector<uint8_t>> pool_announcement_seeds() {
  return text_seeds({"4242 123456 4026531836", "1 0 1", "4194304 18446744073709551615 7",
                     "4194305 1 1", "0 1 1", "12 34", "12  34 56", "-1 2 3", "1 2 3 ", "+1 2 3",
                     "1 2 0", "99999999999999999999999 1 1"});
}

// Byte 0: ranks (1-8) and this rank; bytes 1-8: the call's size; the rest: the exchange buffer
// (zero-padded). Whatever decodes names the call's size on every rank, and a shared reference
// check_ref accepts stays inside its region.
int shm_direct_calls(const uint8_t* data, size_t size) {
  using coll::ShmDirect;
  if (size < 9) return 0;
  const int n = 1 + (data[0] & 7);
  const int rank = (data[0] >> 3) % n;
  uint64_t bytes = 0;
  std::memcpy(&bytes, data + 1, 8);
  std::vector<uint8_t> buf(static_cast<size_t>(n) * sizeof(ShmDirect::CallDesc), 0);
  std::memcpy(buf.data(), data + 9, std::min(buf.size(), size - 9));
  std::vector<ShmDirect::CallDesc> d;
  const Status s = ShmDirect::decode_calls(buf.data(), n, rank, bytes, &d);
  if (!s.ok()) {
    check(s.code() == Code::kInternal || s.code() == Code::kInvalidArg,
          "direct calls: a bad descriptor is kInternal or kInvalidArg");
    return 0;
  }
  ++counter("direct.calls_decoded");
  check(d.size() == static_cast<size_t>(n), "direct calls: one descriptor per rank");
  for (const ShmDirect::CallDesc& c : d) {
    check(c.bytes == bytes, "direct calls: every rank's size is the call's");
    for (const ShmDirect::SharedRef& r : {c.in_ref, c.out_ref}) {
      if (!ShmDirect::check_ref(r, bytes).empty()) continue;
      ++counter("direct.refs_accepted");
      check(r.gen != 0 && r.fd >= 0 && r.fd <= INT32_MAX, "direct calls: accepted descriptor");
      check(r.offset <= r.region_bytes && bytes <= r.region_bytes - r.offset,
            "direct calls: an accepted reference stays in its region");
    }
  }
  if (ShmDirect::all_shared(d)) ++counter("direct.all_shared");
  return 0;
}

std::vector<std::vector<uint8_t>> shm_direct_calls_seeds() {
  using coll::ShmDirect;
  std::vector<std::vector<uint8_t>> out;
  const uint64_t bytes = 1 << 20;
  for (int n : {1, 2, 3}) {
    for (bool shared : {false, true}) {
      std::vector<uint8_t> s(9 + static_cast<size_t>(n) * sizeof(ShmDirect::CallDesc), 0);
      s[0] = static_cast<uint8_t>((n - 1) | (1 << 3));
      std::memcpy(s.data() + 1, &bytes, 8);
      for (int r = 0; r < n; ++r) {
        ShmDirect::CallDesc c{};
        c.magic = ShmDirect::kCallMagic;
        c.in = 0x10000 * static_cast<uint64_t>(r + 1);
        c.out = c.in + bytes;
        c.bytes = bytes;
        if (shared) {
          c.in_ref = {static_cast<uint64_t>(2 * r + 1), 77, 2 * bytes, 0, 5};
          c.out_ref = {static_cast<uint64_t>(2 * r + 2), 78, 2 * bytes, bytes, 6};
        }
        std::memcpy(s.data() + 9 + static_cast<size_t>(r) * sizeof(c), &c, sizeof(c));
      }
      out.push_back(s);
    }
  }
  return out;
}

}  // namespace gw::fuzz
