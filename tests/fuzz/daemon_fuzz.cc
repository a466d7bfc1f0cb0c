// The daemon's decoders of bytes from a stranger, one libFuzzer binary each (fuzz_targets.h):
// gradwired's hello (daemon/protocol.h), its control requests (daemon/control.h) and the /metrics
// listener's HTTP request (daemon/http_request.h). tests/fuzz/daemon_proto_fuzz.cc fuzzes every
// protocol decoder behind one selector byte; these rows give the two a stranger reaches first, and
// the HTTP one, a whole fuzzing run each.
#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "daemon/control.h"
#include "daemon/http_request.h"
#include "daemon/p2p_xhost_wire.h"
#include "daemon/protocol.h"
#include "tests/fuzz/fuzz_targets.h"

namespace gw::fuzz {

using daemon::HttpRequest;

int daemon_hello(const uint8_t* data, size_t size) {
  auto h = daemon::decode_hello(data, size);
  if (!h.ok()) {
    ++counter("daemon.hello_refused");
    return 0;
  }
  ++counter("daemon.hello_accepted");
  check(h->rank >= 0 && h->rank < h->world_size && h->world_size <= daemon::kMaxWorld,
        "hello: rank within the world");
  check(h->host_index >= 0 && h->host_index < h->num_hosts, "hello: host index within the hosts");
  check(h->local_rank >= 0 && h->local_rank < h->local_size, "hello: local rank within the host");
  check(h->arena_bytes >= daemon::kMinArenaBytes && h->arena_bytes <= daemon::kMaxArenaBytes,
        "hello: arena within bounds");
  const std::vector<uint8_t> again = daemon::encode_hello(*h);
  check(again.size() == size && std::memcmp(again.data(), data, size) == 0,
        "hello: what was accepted encodes to the same bytes");
  return 0;
}

int daemon_control_request(const uint8_t* data, size_t size) {
  auto c = daemon::decode_control_request(data, size);
  if (!c.ok()) {
    ++counter("daemon.control_refused");
    return 0;
  }
  ++counter("daemon.control_accepted");
  check(size <= daemon::kMaxControlRequestBytes, "control: a request within the size cap");
  const std::string again = daemon::encode_control_request(*c);
  auto back =
      daemon::decode_control_request(reinterpret_cast<const uint8_t*>(again.data()), again.size());
  check(back.ok() && *back == *c, "control: the command round-trips");
  return 0;
}

int metrics_http_request(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const HttpRequest r = daemon::parse_http_request(in);
  switch (r.state) {
    case HttpRequest::State::kIncomplete:
      ++counter("http.incomplete");
      check(size <= HttpRequest::kMaxBytes, "http: over the cap is never incomplete");
      check(r.method.empty() && r.path.empty(), "http: incomplete sets nothing");
      break;
    case HttpRequest::State::kBad:
      ++counter("http.bad");
      break;
    case HttpRequest::State::kComplete: {
      ++counter("http.complete");
      check(!r.method.empty() && r.path.size() < HttpRequest::kMaxBytes,
            "http: a method and a bounded path");
      check(r.path.find_first_of(" ?\r\n") == std::string::npos, "http: a path without its query");
      // More bytes after a whole request (a pipelined one) do not change the verdict.
      std::string more(in);
      more += "GET /x HTTP/1.1\r\n";
      const HttpRequest again = daemon::parse_http_request(more);
      check(again.state == HttpRequest::State::kComplete && again.path == r.path,
            "http: a whole request stays whole");
      break;
    }
  }
  return 0;
}

int daemon_import(const uint8_t* data, size_t size) {
  // The first 88 bytes (zero-padded) lie at offset 0 of a 4 KiB data region (an import's record);
  // the rest are submissions, each with its own sequence number, decoded in order against the
  // imports the accepted ones made (as Job::consume keeps them).
  using daemon::Opcode;
  std::vector<uint8_t> region(4096, 0);
  const size_t head = std::min(size, sizeof(daemon::ImportWire));
  if (head > 0) std::memcpy(region.data(), data, head);
  daemon::AllocSizes allocs;
  for (size_t at = head; size - at >= sizeof(daemon::SqEntry); at += sizeof(daemon::SqEntry)) {
    daemon::SqEntry e;
    std::memcpy(&e, data + at, sizeof(e));
    auto r = daemon::decode_request(e, e.seq, region.data(), region.size(), 4, &allocs);
    if (!r.ok()) {
      ++counter("daemon.import_refused");
      continue;
    }
    if (r->opcode == Opcode::kImport) {
      ++counter("daemon.import_accepted");
      check(r->alloc_id != 0 && allocs.count(r->alloc_id) == 0 && r->alloc_bytes > 0 &&
                allocs.size() < daemon::kMaxImportsPerClient,
            "import: a new id of some bytes, within the cap");
      allocs[r->alloc_id] = r->alloc_bytes;
      continue;
    }
    if (r->opcode == Opcode::kRelease) {
      check(allocs.erase(r->alloc_id) == 1, "release: of an imported id");
      continue;
    }
    // A dma-buf's requests, and a send or receive naming a dma-buf registration, carry offsets
    // into that dma-buf, which the decoder does not know (the job checks them).
    if (r->opcode == Opcode::kRegisterDmabuf || r->opcode == Opcode::kDeregisterDmabuf ||
        r->opcode == Opcode::kFlushDmabuf || r->dmabuf != 0) {
      ++counter("daemon.dmabuf_request");
      continue;
    }
    auto region_of = [&](uint32_t id) -> uint64_t {
      if (id == 0) return region.size();
      auto it = allocs.find(id);
      check(it != allocs.end(), "collective: names imported allocations only");
      return it == allocs.end() ? 0 : it->second;
    };
    if (r->send_alloc != 0 || r->recv_alloc != 0) ++counter("daemon.device_collective");
    const uint64_t s = region_of(r->send_alloc), d = region_of(r->recv_alloc);
    check(r->send_off <= s && r->send_bytes <= s - r->send_off, "collective: send range inside");
    check(r->recv_off <= d && r->recv_bytes <= d - r->recv_off, "collective: recv range inside");
  }
  return 0;
}

int daemon_p2p(const uint8_t* data, size_t size) {
  // Submissions of 64 bytes, each made a send or a recv by its opcode's low bit (version 7),
  // decoded against a 64 KiB data region and 8 ranks; then each 128 bytes as a completion of a
  // window of open sequence numbers (the client's decode_completion_in). The same 64 bytes again
  // as a register_dmabuf or deregister_dmabuf (by the opcode's second bit; version 8), and every
  // 16 bytes as a descriptor record.
  using daemon::Opcode;
  constexpr uint64_t kRegion = 64 << 10;
  std::vector<uint8_t> region(kRegion, 0);
  for (size_t at = 0; size - at >= sizeof(daemon::SqEntry); at += sizeof(daemon::SqEntry)) {
    daemon::SqEntry e;
    std::memcpy(&e, data + at, sizeof(e));
    e.opcode = static_cast<uint16_t>((e.opcode & 1) ? Opcode::kRecv : Opcode::kSend);
    auto r = daemon::decode_request(e, e.seq, region.data(), region.size(), 8);
    if (!r.ok()) {
      ++counter("daemon.p2p_refused");
      continue;
    }
    ++counter(r->opcode == Opcode::kSend ? "daemon.p2p_send" : "daemon.p2p_recv");
    const bool send = r->opcode == Opcode::kSend;
    check(r->root >= (send ? 0 : -1) && r->root < 8, "p2p: the peer is a rank (or any)");
    check(r->tag >= 0, "p2p: the tag is >= 0");
    const uint64_t off = send ? r->send_off : r->recv_off;
    const uint64_t n = send ? r->send_bytes : r->recv_bytes;
    // Version 8: a dma-buf registration's range (key_len its id) is the job's to check against
    // the registration; the data region's otherwise.
    const uint64_t limit = r->dmabuf != 0 ? daemon::kMaxDmabufBytes : kRegion;
    check(r->dmabuf == e.key_len && r->dmabuf <= 0x7fffffffu, "p2p: the dma-buf id is key_len");
    check(n == r->count && off <= limit && n <= limit - off, "p2p: the range lies inside");
  }
  for (size_t at = 0; size - at >= sizeof(daemon::SqEntry); at += sizeof(daemon::SqEntry)) {
    daemon::SqEntry e;
    std::memcpy(&e, data + at, sizeof(e));
    const bool reg = (e.opcode & 2) == 0;
    e.opcode = static_cast<uint16_t>(reg ? Opcode::kRegisterDmabuf : Opcode::kDeregisterDmabuf);
    auto r = daemon::decode_request(e, e.seq, region.data(), region.size(), 8);
    if (!r.ok()) {
      ++counter("daemon.dmabuf_refused");
      continue;
    }
    ++counter(reg ? "daemon.dmabuf_register" : "daemon.dmabuf_deregister");
    if (reg) {
      check(r->root >= 0 && r->root < 8, "dmabuf: the peer is a rank");
      check(r->ticket >= 1 && r->ticket <= 0x7fffffffu, "dmabuf: a ticket");
      check(r->alloc_bytes >= 1 && r->alloc_bytes <= daemon::kMaxDmabufBytes, "dmabuf: bytes");
      check(r->dmabuf_use >= 1 && r->dmabuf_use <= 3, "dmabuf: its use");
    } else {
      check(r->alloc_id >= 1 && r->alloc_id <= 0x7fffffffu, "dmabuf: an id");
    }
  }
  for (size_t at = 0; size - at >= daemon::kFdRecordBytes; at += daemon::kFdRecordBytes) {
    auto t = daemon::decode_fd_record(data + at);
    if (t.ok()) {
      ++counter("daemon.fd_record");
      check(*t >= 1 && *t <= 0x7fffffffu, "fd record: a ticket");
    }
  }
  for (size_t at = 0; size - at >= sizeof(daemon::CqEntry); at += sizeof(daemon::CqEntry)) {
    daemon::CqEntry c;
    std::memcpy(&c, data + at, sizeof(c));
    Status carried;
    daemon::CompressedDone done;
    const uint64_t lo = c.seq & 0xff, hi = lo + 16;
    Status d = daemon::decode_completion_in(c, lo, hi, &carried, &done);
    if (d.ok()) {
      ++counter("daemon.p2p_completion");
      check(c.seq >= lo && c.seq <= hi, "p2p: a completion within the open window");
    }
  }
  return 0;
}

int daemon_p2p_xhost(const uint8_t* data, size_t size) {
  // The input as the daemon messages of one stream from another daemon of an 8-rank job that
  // takes at most 1 MiB (daemon/p2p_xhost_wire.h): each a 32-byte header, plus the payload that a
  // header flagged inline says follows it (as much of it as the input holds); the rest as one
  // short header.
  constexpr uint64_t kMax = 1 << 20;
  size_t at = 0;
  while (at < size) {
    size_t n = std::min(daemon::kXhostHeaderBytes, size - at);
    if (n == daemon::kXhostHeaderBytes) {
      uint16_t flags = 0;
      uint64_t bytes = 0;
      std::memcpy(&flags, data + at + 6, 2);
      std::memcpy(&bytes, data + at + 24, 8);
      if (flags == daemon::kXhostInline && bytes <= daemon::kXhostInlineBytes) {
        n = std::min<size_t>(size - at, daemon::kXhostHeaderBytes + bytes);
      }
    }
    auto h = daemon::decode_xhost_header(data + at, n, 8, kMax);
    if (!h.ok()) {
      ++counter("daemon.xhost_refused");
      check(h.status().code() == Code::kPeer, "xhost: a refusal is kPeer");
      at += n;
      continue;
    }
    ++counter(h->flags == daemon::kXhostInline ? "daemon.xhost_inline" : "daemon.xhost_accepted");
    const bool inl = h->flags == daemon::kXhostInline;
    check(n == daemon::kXhostHeaderBytes + (inl ? h->bytes : 0), "xhost: exactly its message");
    check(!inl || (h->bytes >= 1 && h->bytes <= daemon::kXhostInlineBytes), "xhost: inline size");
    // A device message and its refusal (version 3) both name the message's payload tag.
    const bool dev = h->flags == daemon::kXhostDevice || h->flags == daemon::kXhostRefuse;
    check(inl || dev || h->bytes == 0 || h->bytes > daemon::kXhostInlineBytes,
          "xhost: small is inline");
    check(!dev || (h->bytes >= 1 && h->payload_tag >= daemon::kXhostDeviceTagFirst),
          "xhost: a device message or its refusal has bytes and its own payload tag");
    check(dev || h->payload_tag == 0,
          "xhost: a payload tag on a device message or its refusal only");
    check(h->src >= 0 && h->src < 8 && h->dst >= 0 && h->dst < 8, "xhost: ranks in the job");
    check(h->tag >= 0 && h->bytes <= kMax, "xhost: tag and size in range");
    const auto again = daemon::encode_xhost_header(*h);
    check(std::memcmp(again.data(), data + at, again.size()) == 0, "xhost: round trip");
    at += n;
  }
  return 0;
}

std::vector<std::vector<uint8_t>> daemon_p2p_xhost_seeds() {
  std::vector<uint8_t> v;
  for (const auto& h :
       {daemon::XhostHeader{daemon::kXhostInline, 1, 2, 7, 100}, daemon::XhostHeader{0, 3, 0, 0, 0},
        daemon::XhostHeader{0, 7, 6, 1 << 20, 1 << 20},
        daemon::XhostHeader{daemon::kXhostHello, 0, 0, 0, 0},
        daemon::XhostHeader{daemon::kXhostBye, 5, 0, 0, 0}}) {
    const auto b = daemon::encode_xhost_header(h);
    v.insert(v.end(), b.begin(), b.end());
    if (h.flags == daemon::kXhostInline) v.insert(v.end(), h.bytes, uint8_t{0x5a});
  }
  return {v};
}

std::vector<std::vector<uint8_t>> daemon_p2p_seeds() {
  std::vector<uint8_t> v;
  auto add = [&](const daemon::SqEntry& e) {
    const auto* b = reinterpret_cast<const uint8_t*>(&e);
    v.insert(v.end(), b, b + sizeof(e));
  };
  daemon::SqEntry e{};
  e.seq = 1;
  e.opcode = 10;  // send of 100 bytes to rank 3, tag 7
  e.root = 3;
  e.count = 100;
  e.send_off = 4096;
  e.spec_len = 7;
  add(e);
  e = daemon::SqEntry{};
  e.seq = 2;
  e.opcode = 11;  // recv of 1000 bytes from any source, tag 7
  e.root = -1;
  e.count = 1000;
  e.recv_off = 8192;
  e.spec_len = 7;
  add(e);
  e.seq = 3;
  e.count = 1 << 20;  // outside the region
  add(e);
  return {v};
}

namespace {
std::vector<uint8_t> bytes(std::string_view s) { return {s.begin(), s.end()}; }
}  // namespace

std::vector<std::vector<uint8_t>> daemon_import_seeds() {
  // An import of allocation 5 (1 MiB), an allreduce on it, a broadcast, a release.
  using daemon::Opcode;
  daemon::ImportWire w{};
  w.kind = daemon::kImportCudaIpc;
  w.alloc_id = 5;
  w.bytes = 1 << 20;
  // The record, then four entries: sized once (no growth to reason about).
  std::vector<uint8_t> v(sizeof(w) + 4 * sizeof(daemon::SqEntry));
  std::memcpy(v.data(), &w, sizeof(w));
  size_t at = sizeof(w);
  auto add = [&](const daemon::SqEntry& e) {
    std::memcpy(v.data() + at, &e, sizeof(e));
    at += sizeof(e);
  };
  daemon::SqEntry e{};
  e.seq = 1;
  e.opcode = static_cast<uint16_t>(Opcode::kImport);
  e.spec_len = sizeof(w);
  add(e);
  e = daemon::SqEntry{};
  e.seq = 2;
  e.opcode = static_cast<uint16_t>(Opcode::kAllreduce);
  e.dtype = 2;  // float32
  e.count = 1000;
  e.recv_off = 8192;
  e.spec_len = 5;
  e.key_len = 5;
  add(e);
  e.seq = 3;
  e.opcode = static_cast<uint16_t>(Opcode::kBroadcast);
  e.root = 3;
  e.recv_off = 0;
  add(e);
  e = daemon::SqEntry{};
  e.seq = 4;
  e.opcode = static_cast<uint16_t>(Opcode::kRelease);
  e.spec_len = 5;
  add(e);
  return {v};
}

std::vector<std::vector<uint8_t>> daemon_hello_seeds() {
  std::vector<std::vector<uint8_t>> out;
  daemon::Hello h;
  h.rank = 3;
  h.world_size = 4;
  h.host_index = 1;
  h.num_hosts = 2;
  h.local_rank = 1;
  h.local_size = 2;
  h.arena_bytes = 64 << 20;
  h.timeout_ms = 30000;
  h.job_token = "token-0123456789";
  h.store_token = "store-token";
  h.store_host = "10.0.0.1";
  h.store_port = 29500;
  h.host_id = "hostA/boot/netns:1";
  out.push_back(daemon::encode_hello(h));
  h.num_hosts = 1;
  h.host_index = 0;
  h.rank = 0;
  h.world_size = 1;
  h.local_rank = 0;
  h.local_size = 1;
  h.store_host.clear();
  h.store_port = 0;
  out.push_back(daemon::encode_hello(h));
  return out;
}

std::vector<std::vector<uint8_t>> daemon_control_seeds() {
  std::vector<std::vector<uint8_t>> out;
  for (auto c : {daemon::ControlCommand::kStatus, daemon::ControlCommand::kJobs,
                 daemon::ControlCommand::kClients, daemon::ControlCommand::kConfig,
                 daemon::ControlCommand::kKv}) {
    out.push_back(bytes(daemon::encode_control_request(c)));
  }
  out.push_back(bytes(R"({"command":"status","extra":[1,2,{"x":null}]})"));
  out.push_back(bytes(R"({"command":"nope"})"));
  return out;
}

std::vector<std::vector<uint8_t>> metrics_http_seeds() {
  return {bytes("GET /metrics HTTP/1.1\r\nHost: localhost:9464\r\nUser-Agent: Prometheus/2.45\r\n"
                "Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n"
                "X-Prometheus-Scrape-Timeout-Seconds: 10\r\n\r\n"),
          bytes("HEAD /metrics?x=1 HTTP/1.0\n\n"), bytes("POST / HTTP/1.1\r\n\r\n"),
          bytes("GET /metrics HTTP/1.1\r\nX-Slow: 1\r\n")};
}

}  // namespace gw::fuzz
