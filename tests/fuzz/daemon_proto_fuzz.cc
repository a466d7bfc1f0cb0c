// libFuzzer target for the daemon's client protocol (docs/wire-daemon.md). Every decoder must
// refuse what is malformed and, when it accepts, return values inside the bounds it promises:
// those invariants are checked here and abort() when broken, so the fuzzer reports them.
#include "tests/fuzz/daemon_proto_fuzz.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "daemon/control.h"
#include "daemon/protocol.h"
#include "daemon/transport_offer.h"

namespace gw::daemon::fuzz {
namespace {

Counts g_counts;

void check(bool ok) {
  if (!ok) std::abort();
}

void tally(bool ok) { ok ? ++g_counts.accepted : ++g_counts.refused; }

void fuzz_hello(const uint8_t* p, size_t n) {
  auto h = decode_hello(p, n);
  tally(h.ok());
  if (!h.ok()) return;
  check(h->rank >= 0 && h->rank < h->world_size && h->world_size <= kMaxWorld);
  check(h->host_index >= 0 && h->host_index < h->num_hosts);
  check(h->local_rank >= 0 && h->local_rank < h->local_size);
  check(h->arena_bytes >= kMinArenaBytes && h->arena_bytes <= kMaxArenaBytes);
  // Round trip: what was accepted encodes to the same bytes.
  auto again = encode_hello(*h);
  check(again.size() == n && std::memcmp(again.data(), p, n) == 0);
}

void fuzz_offer(const uint8_t* p, size_t n) {
  const std::string text(reinterpret_cast<const char*>(p), n);
  auto names = decode_offer(text);
  tally(names.ok());
  if (!names.ok()) return;
  check(!names->empty() && names->size() <= kMaxOfferNames);
  for (const std::string& name : *names) {
    check(!name.empty() && name.size() <= kMaxOfferNameBytes);
  }
  // Round trip, and an agreement with itself picks its first name.
  check(encode_offer(*names) == text);
  auto agreed = agree_transport({*names, *names});
  check(agreed.ok() && *agreed == names->front());
}

void fuzz_welcome(const uint8_t* p, size_t n) {
  auto w = decode_welcome(p, n);
  tally(w.ok());
  if (!w.ok()) return;
  check(w->kv_address.size() <= kMaxKvAddressBytes);
  if (w->status != 0) return;
  check(w->sq_offset >= kArenaHeaderBytes);
  check(w->sq_offset + uint64_t{w->sq_entries} * sizeof(SqEntry) <= w->cq_offset);
  check(w->cq_offset + uint64_t{w->cq_entries} * sizeof(CqEntry) <= w->data_offset);
  check(w->data_offset + w->data_bytes == w->arena_bytes);
}

void fuzz_submissions(const uint8_t* p, size_t n) {
  if (n < 3) return;
  // A real data region (up to 1 MiB) for the codec spec and key of allreduce_compressed.
  const uint64_t data_bytes = (uint64_t{p[0]} + 1) << (p[1] % 13);
  const int32_t world = 1 + p[1] % 9;
  const bool own_seq = (p[2] & 1) == 0;  // take each entry's own sequence, to get past that check
  p += 3;
  n -= 3;
  std::vector<uint8_t> data(data_bytes, 'k');
  uint64_t expected = 1;
  for (; n >= sizeof(SqEntry); p += sizeof(SqEntry), n -= sizeof(SqEntry)) {
    SqEntry e;
    std::memcpy(&e, p, sizeof(e));
    auto r = decode_request(e, own_seq ? e.seq : expected, data.data(), data_bytes, world);
    tally(r.ok());
    if (!r.ok()) continue;
    ++expected;
    // A range lies in the data region, or (version 8) in a dma-buf registration, whose size
    // only the job knows (it checks the range against it): a send's or recv's that names one
    // (dmabuf), a flush's. There, within kMaxDmabufBytes.
    const bool in_registration = r->dmabuf != 0 || r->opcode == Opcode::kFlushDmabuf;
    const uint64_t region = in_registration ? kMaxDmabufBytes : data_bytes;
    check(r->send_off <= region && r->send_bytes <= region - r->send_off);
    check(r->recv_off <= region && r->recv_bytes <= region - r->recv_off);
    if (r->opcode == Opcode::kBroadcast) check(r->root >= 0 && r->root < world);
    if (r->opcode == Opcode::kAllreduceCompressed) {
      check(!r->spec.empty() && r->spec.size() <= kMaxCodecSpecBytes);
      check(!r->key.empty() && r->key.size() <= kMaxTensorKeyBytes);
    } else {
      check(r->spec.empty() && r->key.empty());
    }
  }
}

void fuzz_completions(const uint8_t* p, size_t n) {
  for (; n >= sizeof(CqEntry); p += sizeof(CqEntry), n -= sizeof(CqEntry)) {
    CqEntry e;
    std::memcpy(&e, p, sizeof(e));
    Status carried;
    CompressedDone done;
    Status s = decode_completion(e, (e.seq >> 63) != 0 ? e.seq + 1 : e.seq, &carried, &done);
    tally(s.ok());
    if (s.ok()) check(static_cast<int>(carried.code()) == e.status);
  }
}

void fuzz_ring(const uint8_t* p, size_t n) {
  if (n < 20) return;
  uint64_t head, tail;
  uint32_t entries;
  std::memcpy(&head, p, 8);
  std::memcpy(&tail, p + 8, 8);
  std::memcpy(&entries, p + 16, 4);
  Status s = check_ring(head, tail, entries, "fuzz");
  tally(s.ok());
  if (s.ok()) check(tail - head <= entries);
}

void fuzz_control_request(const uint8_t* p, size_t n) {
  auto c = decode_control_request(p, n);
  tally(c.ok());
  if (!c.ok()) return;
  check(n <= kMaxControlRequestBytes);
  // What was accepted names a command that encodes and decodes to itself.
  const std::string again = encode_control_request(*c);
  auto back = decode_control_request(reinterpret_cast<const uint8_t*>(again.data()), again.size());
  check(back.ok() && *back == *c);
}

void fuzz_control_response(const uint8_t* p, size_t n) {
  if (n < 1) return;
  const auto command = static_cast<ControlCommand>(p[0] % 5);  // status .. kv
  auto r = decode_control_response(p + 1, n - 1, command);
  tally(r.ok());
  if (!r.ok()) return;
  // The promise renderers rely on: an object for status, arrays of objects for the rest.
  if (command == ControlCommand::kStatus) {
    check(r->is_object() && r->contains("pid") && (*r)["pid"].is_number_integer());
  } else {
    check(r->is_array());
    for (const auto& row : *r) check(row.is_object());
  }
  // Re-encoding what was accepted never throws (bad UTF-8 is replaced).
  const std::string again = encode_control_result(command, *r);
  check(!again.empty());
}

}  // namespace

Counts counts() { return g_counts; }

std::vector<std::vector<uint8_t>> seeds() {
  std::vector<std::vector<uint8_t>> out;
  auto with = [&](uint8_t target, const std::vector<uint8_t>& body) {
    std::vector<uint8_t> v{target};
    v.insert(v.end(), body.begin(), body.end());
    out.push_back(std::move(v));
  };
  Hello h;
  h.rank = 3;
  h.world_size = 4;
  h.host_index = 1;
  h.num_hosts = 2;
  h.local_rank = 1;
  h.local_size = 2;
  h.arena_bytes = 64 << 20;
  h.job_token = "token-0123456789";
  h.store_host = "10.0.0.1";
  h.store_port = 29500;
  h.host_id = "hostA/boot/netns:1";
  with(kHello, encode_hello(h));
  h.num_hosts = 1;
  h.host_index = 0;
  h.store_host.clear();
  h.store_port = 0;
  with(kHello, encode_hello(h));
  auto g = arena_geometry(64 << 20, 64);
  with(kWelcome, encode_welcome(*g));
  g->kv_address = "10.0.0.1:41234";  // version 6: the job's kv server
  with(kWelcome, encode_welcome(*g));
  Welcome refusal;
  refusal.status = 3;
  refusal.message = "refused";
  with(kWelcome, encode_welcome(refusal));
  std::vector<uint8_t> subs{200, 12, 0};
  const Opcode ops[] = {
      Opcode::kAllreduce,     Opcode::kBroadcast, Opcode::kAllgather,          Opcode::kBarrier,
      Opcode::kReduceScatter, Opcode::kAlltoall,  Opcode::kAllreduceCompressed};
  uint64_t seq = 1;
  for (Opcode op : ops) {
    SqEntry e{};
    e.seq = seq++;
    e.opcode = static_cast<uint16_t>(op);
    if (op != Opcode::kBarrier) {
      e.dtype = 2;
      e.count = 100;
      e.send_off = 4096;
      const bool one_buffer = op == Opcode::kBroadcast || op == Opcode::kAllreduceCompressed;
      e.recv_off = one_buffer ? 4096 : 65536;
      e.root = op == Opcode::kBroadcast ? 1 : 0;
      e.op = op == Opcode::kAllreduce || op == Opcode::kReduceScatter ? 4 : 0;
      // Slices of blocks a stride apart (the largest buffer's blocks), and packed ones.
      if (op == Opcode::kAllgather || op == Opcode::kAlltoall) e.stride = 1000;
      if (op == Opcode::kAllreduceCompressed) {
        e.dtype = 0;  // float32
        e.meta_off = 200000;
        e.spec_len = 9;
        e.key_len = 12;
      }
    }
    const auto* b = reinterpret_cast<const uint8_t*>(&e);
    subs.insert(subs.end(), b, b + sizeof(e));
  }
  with(kSubmission, subs);
  std::vector<uint8_t> comps;
  for (int i = 0; i < 3; ++i) {
    CqEntry c = make_completion(i + 1, i == 0 ? ok_status() : peer_error("rank {} left", i));
    const auto* b = reinterpret_cast<const uint8_t*>(&c);
    comps.insert(comps.end(), b, b + sizeof(c));
  }
  with(kCompletion, comps);
  std::vector<uint8_t> ring(20, 0);
  ring[8] = 5;
  ring[16] = 64;
  with(kRing, ring);
  for (ControlCommand c : {ControlCommand::kStatus, ControlCommand::kJobs, ControlCommand::kClients,
                           ControlCommand::kConfig, ControlCommand::kKv}) {
    const std::string req = encode_control_request(c);
    with(kControlRequest, std::vector<uint8_t>(req.begin(), req.end()));
  }
  nlohmann::json status = {{"version", "0.2.0"},
                           {"pid", 42},
                           {"uptime_s", 1.5},
                           {"socket", "/s"},
                           {"control_socket", "/s.ctl"},
                           {"transport", "tcp"},
                           {"host_id", "h"},
                           {"clients", 2},
                           {"jobs", 1},
                           {"arenas", 2},
                           {"accepted", 2},
                           {"refused", 0},
                           {"collectives", 9},
                           {"failed", 0}};
  nlohmann::json jobs = nlohmann::json::array({{{"job", "0123456789abcdef"},
                                                {"world", 4},
                                                {"hosts", 2},
                                                {"host_index", 0},
                                                {"local_trainers", 2},
                                                {"local_size", 2},
                                                {"state", "running"},
                                                {"collectives", 9},
                                                {"errors", 0},
                                                {"transport", "dpdk"}}});
  nlohmann::json clients = nlohmann::json::array({{{"id", 1},
                                                   {"pid", 100},
                                                   {"uid", 1000},
                                                   {"job", "0123456789abcdef"},
                                                   {"rank", 0},
                                                   {"local_rank", 0},
                                                   {"arena_bytes", 1 << 20},
                                                   {"requests", 9}}});
  nlohmann::json config = nlohmann::json::array({{{"name", "GW_TIMEOUT_MS"},
                                                  {"key", "timeout_ms"},
                                                  {"value", "300000"},
                                                  {"default", "300000"},
                                                  {"source", "default"}}});
  nlohmann::json kv = nlohmann::json::array({{{"job", "0123456789abcdef"},
                                              {"host_index", 1},
                                              {"store", 3},
                                              {"mode", "ssp:2"},
                                              {"update", "sum"},
                                              {"codec", "topk:0.01,ef=1"},
                                              {"workers", 4},
                                              {"live", 3},
                                              {"keys", 2},
                                              {"partitions", 5},
                                              {"bytes", 4096},
                                              {"min_clock", 7},
                                              {"max_clock", 9},
                                              {"lag", 2},
                                              {"dropped", 0},
                                              {"lost", 1},
                                              {"state", "open"}}});
  const std::pair<ControlCommand, nlohmann::json*> answers[] = {
      {ControlCommand::kStatus, &status},
      {ControlCommand::kJobs, &jobs},
      {ControlCommand::kClients, &clients},
      {ControlCommand::kConfig, &config},
      {ControlCommand::kKv, &kv}};
  for (const auto& [c, result] : answers) {
    const std::string body = encode_control_result(c, *result);
    std::vector<uint8_t> v{static_cast<uint8_t>(c)};
    v.insert(v.end(), body.begin(), body.end());
    with(kControlResponse, v);
  }
  for (const char* offer : {"tcp", "dpdk,tcp", "verbs,dpdk,tcp"}) {
    with(kOffer, std::vector<uint8_t>(offer, offer + std::strlen(offer)));
  }
  return out;
}

}  // namespace gw::daemon::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gw::daemon::fuzz;
  if (size == 0) return 0;
  const uint8_t* p = data + 1;
  const size_t n = size - 1;
  switch (data[0] % kTargets) {
    case kHello:
      fuzz_hello(p, n);
      break;
    case kWelcome:
      fuzz_welcome(p, n);
      break;
    case kSubmission:
      fuzz_submissions(p, n);
      break;
    case kCompletion:
      fuzz_completions(p, n);
      break;
    case kRing:
      fuzz_ring(p, n);
      break;
    case kControlRequest:
      fuzz_control_request(p, n);
      break;
    case kControlResponse:
      fuzz_control_response(p, n);
      break;
    default:
      fuzz_offer(p, n);
      break;
  }
  return 0;
}
