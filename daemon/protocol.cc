#include "daemon/protocol.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace gw::daemon {
namespace {

class Writer {
 public:
  template <typename T>
  void put(T v) {
    // Little-endian hosts only (x86-64, aarch64).
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void str(const std::string& s) {
    put<uint16_t>(static_cast<uint16_t>(s.size()));
    out_.append(s);
  }
  std::vector<uint8_t> take() const { return std::vector<uint8_t>(out_.begin(), out_.end()); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const char* what) : p_(p), n_(n), what_(what) {}
  template <typename T>
  Status get(const char* field, T* v) {
    if (n_ - off_ < sizeof(T)) return truncated(field);
    std::memcpy(v, p_ + off_, sizeof(T));
    off_ += sizeof(T);
    return ok_status();
  }
  Status str(const char* field, size_t max, std::string* s) {
    uint16_t len = 0;
    GW_RETURN_IF_ERROR(get(field, &len));
    if (len > max)
      return peer_error("{}: field {} has {} bytes (at most {})", what_, field, len, max);
    if (n_ - off_ < len) return truncated(field);
    s->assign(reinterpret_cast<const char*>(p_ + off_), len);
    off_ += len;
    return ok_status();
  }
  Status done() const {
    if (off_ != n_) return peer_error("{}: {} trailing bytes", what_, n_ - off_);
    return ok_status();
  }

 private:
  Status truncated(const char* field) const {
    return peer_error("{}: truncated at field {} ({} of {} bytes read)", what_, field, off_, n_);
  }
  const uint8_t* p_;
  size_t n_;
  size_t off_ = 0;
  const char* what_;
};

Status check_version(const char* what, uint32_t magic, uint32_t want_magic, uint16_t version) {
  if (magic != want_magic) return peer_error("{}: bad magic {:#x}", what, magic);
  if (version != kProtocolVersion) {
    return unsupported("{}: protocol version {} (this side speaks {})", what, version,
                       kProtocolVersion);
  }
  return ok_status();
}

// [off, off + bytes) inside [0, limit)?
bool range_ok(uint64_t off, uint64_t bytes, uint64_t limit) {
  return off <= limit && bytes <= limit - off;
}

}  // namespace

std::vector<uint8_t> encode_hello(const Hello& h) {
  Writer w;
  w.put<uint32_t>(kHelloMagic);
  w.put<uint16_t>(h.version);
  w.put<int32_t>(h.rank);
  w.put<int32_t>(h.world_size);
  w.put<int32_t>(h.host_index);
  w.put<int32_t>(h.num_hosts);
  w.put<int32_t>(h.local_rank);
  w.put<int32_t>(h.local_size);
  w.put<int64_t>(h.timeout_ms);
  w.put<uint64_t>(h.arena_bytes);
  w.str(h.job_token);
  w.str(h.store_token);
  w.str(h.store_host);
  w.put<uint16_t>(h.store_port);
  w.str(h.host_id);
  return w.take();
}

Result<Hello> decode_hello(const uint8_t* data, size_t size) {
  if (size > kMaxHelloBytes)
    return peer_error("hello: {} bytes (at most {})", size, kMaxHelloBytes);
  Reader r(data, size, "hello");
  Hello h;
  uint32_t magic = 0;
  GW_RETURN_IF_ERROR(r.get("magic", &magic));
  GW_RETURN_IF_ERROR(r.get("version", &h.version));
  GW_RETURN_IF_ERROR(check_version("hello", magic, kHelloMagic, h.version));
  GW_RETURN_IF_ERROR(r.get("rank", &h.rank));
  GW_RETURN_IF_ERROR(r.get("world_size", &h.world_size));
  GW_RETURN_IF_ERROR(r.get("host_index", &h.host_index));
  GW_RETURN_IF_ERROR(r.get("num_hosts", &h.num_hosts));
  GW_RETURN_IF_ERROR(r.get("local_rank", &h.local_rank));
  GW_RETURN_IF_ERROR(r.get("local_size", &h.local_size));
  GW_RETURN_IF_ERROR(r.get("timeout_ms", &h.timeout_ms));
  GW_RETURN_IF_ERROR(r.get("arena_bytes", &h.arena_bytes));
  GW_RETURN_IF_ERROR(r.str("job_token", kMaxTokenBytes, &h.job_token));
  GW_RETURN_IF_ERROR(r.str("store_token", kMaxTokenBytes, &h.store_token));
  GW_RETURN_IF_ERROR(r.str("store_host", kMaxStoreHostBytes, &h.store_host));
  GW_RETURN_IF_ERROR(r.get("store_port", &h.store_port));
  GW_RETURN_IF_ERROR(r.str("host_id", kMaxHostIdBytes, &h.host_id));
  GW_RETURN_IF_ERROR(r.done());
  if (h.world_size < 1 || h.world_size > kMaxWorld) {
    return peer_error("hello: world_size {} out of 1..{}", h.world_size, kMaxWorld);
  }
  if (h.rank < 0 || h.rank >= h.world_size) {
    return peer_error("hello: rank {} out of 0..{}", h.rank, h.world_size - 1);
  }
  if (h.num_hosts < 1 || h.num_hosts > h.world_size) {
    return peer_error("hello: num_hosts {} out of 1..{}", h.num_hosts, h.world_size);
  }
  if (h.host_index < 0 || h.host_index >= h.num_hosts) {
    return peer_error("hello: host_index {} out of 0..{}", h.host_index, h.num_hosts - 1);
  }
  if (h.local_size < 1 || h.local_size > h.world_size - (h.num_hosts - 1)) {
    return peer_error("hello: local_size {} out of range for {} ranks on {} hosts", h.local_size,
                      h.world_size, h.num_hosts);
  }
  if (h.local_rank < 0 || h.local_rank >= h.local_size) {
    return peer_error("hello: local_rank {} out of 0..{}", h.local_rank, h.local_size - 1);
  }
  if (h.timeout_ms <= 0 || h.timeout_ms > std::numeric_limits<int32_t>::max()) {
    return peer_error("hello: timeout_ms {} out of 1..{}", h.timeout_ms,
                      std::numeric_limits<int32_t>::max());
  }
  if (h.arena_bytes < kMinArenaBytes || h.arena_bytes > kMaxArenaBytes) {
    return peer_error("hello: arena_bytes {} out of {}..{}", h.arena_bytes, kMinArenaBytes,
                      kMaxArenaBytes);
  }
  if (h.job_token.empty()) return peer_error("hello: empty job_token");
  if (h.num_hosts > 1 && (h.store_host.empty() || h.store_port == 0)) {
    return peer_error("hello: {} hosts but no store address", h.num_hosts);
  }
  if (h.host_id.empty()) return peer_error("hello: empty host_id");
  return h;
}

std::vector<uint8_t> encode_welcome(const Welcome& w) {
  Writer o;
  o.put<uint32_t>(kWelcomeMagic);
  o.put<uint16_t>(w.version);
  o.put<int32_t>(w.status);
  o.str(w.message.substr(0, kMaxMessageBytes));
  o.put<uint64_t>(w.client_id);
  o.put<uint64_t>(w.arena_bytes);
  o.put<uint64_t>(w.sq_offset);
  o.put<uint32_t>(w.sq_entries);
  o.put<uint64_t>(w.cq_offset);
  o.put<uint32_t>(w.cq_entries);
  o.put<uint64_t>(w.data_offset);
  o.put<uint64_t>(w.data_bytes);
  o.str(w.transport.substr(0, kMaxTransportBytes));
  o.str(w.kv_address.substr(0, kMaxKvAddressBytes));
  return o.take();
}

Result<Welcome> decode_welcome(const uint8_t* data, size_t size) {
  if (size > kMaxWelcomeBytes) {
    return peer_error("welcome: {} bytes (at most {})", size, kMaxWelcomeBytes);
  }
  Reader r(data, size, "welcome");
  Welcome w;
  uint32_t magic = 0;
  GW_RETURN_IF_ERROR(r.get("magic", &magic));
  GW_RETURN_IF_ERROR(r.get("version", &w.version));
  GW_RETURN_IF_ERROR(check_version("welcome", magic, kWelcomeMagic, w.version));
  GW_RETURN_IF_ERROR(r.get("status", &w.status));
  GW_RETURN_IF_ERROR(r.str("message", kMaxMessageBytes, &w.message));
  GW_RETURN_IF_ERROR(r.get("client_id", &w.client_id));
  GW_RETURN_IF_ERROR(r.get("arena_bytes", &w.arena_bytes));
  GW_RETURN_IF_ERROR(r.get("sq_offset", &w.sq_offset));
  GW_RETURN_IF_ERROR(r.get("sq_entries", &w.sq_entries));
  GW_RETURN_IF_ERROR(r.get("cq_offset", &w.cq_offset));
  GW_RETURN_IF_ERROR(r.get("cq_entries", &w.cq_entries));
  GW_RETURN_IF_ERROR(r.get("data_offset", &w.data_offset));
  GW_RETURN_IF_ERROR(r.get("data_bytes", &w.data_bytes));
  GW_RETURN_IF_ERROR(r.str("transport", kMaxTransportBytes, &w.transport));
  GW_RETURN_IF_ERROR(r.str("kv_address", kMaxKvAddressBytes, &w.kv_address));
  GW_RETURN_IF_ERROR(r.done());
  if (w.status < 0 || w.status > static_cast<int32_t>(Code::kInternal)) {
    return peer_error("welcome: unknown status {}", w.status);
  }
  if (w.status != 0) return w;  // a refusal: no geometry
  // The geometry must be exactly what arena_geometry() gives for this size and ring length, so a
  // daemon cannot point the client at overlapping or out-of-arena rings.
  if (w.arena_bytes < kMinArenaBytes || w.arena_bytes > kMaxArenaBytes) {
    return peer_error("welcome: arena_bytes {} out of {}..{}", w.arena_bytes, kMinArenaBytes,
                      kMaxArenaBytes);
  }
  auto g = arena_geometry(w.arena_bytes, w.sq_entries);
  if (!g.ok()) return peer_error("welcome: {}", g.status().message());
  if (g->sq_offset != w.sq_offset || g->cq_offset != w.cq_offset || g->cq_entries != w.cq_entries ||
      g->data_offset != w.data_offset || g->data_bytes != w.data_bytes) {
    return peer_error("welcome: arena geometry does not match protocol version {}",
                      kProtocolVersion);
  }
  return w;
}

Result<Welcome> arena_geometry(uint64_t arena_bytes, uint32_t entries) {
  if (entries == 0 || entries > kMaxRingEntries || (entries & (entries - 1)) != 0) {
    return invalid_arg("ring of {} entries (a power of two in 1..{})", entries, kMaxRingEntries);
  }
  Welcome w;
  w.arena_bytes = arena_bytes;
  w.sq_offset = kArenaHeaderBytes;
  w.sq_entries = entries;
  w.cq_offset = w.sq_offset + uint64_t{entries} * sizeof(SqEntry);
  w.cq_entries = entries;
  const uint64_t rings_end = w.cq_offset + uint64_t{entries} * sizeof(CqEntry);
  w.data_offset = (rings_end + kDataAlign - 1) / kDataAlign * kDataAlign;
  if (arena_bytes <= w.data_offset) {
    return invalid_arg("an arena of {} bytes cannot hold rings of {} entries", arena_bytes,
                       entries);
  }
  w.data_bytes = arena_bytes - w.data_offset;
  return w;
}

std::vector<uint8_t> frame_message(const std::vector<uint8_t>& body) {
  std::vector<uint8_t> frame(kFrameHeaderBytes + body.size());
  const uint32_t len = static_cast<uint32_t>(body.size());
  std::memcpy(frame.data(), &len, sizeof(len));
  std::copy(body.begin(), body.end(), frame.begin() + kFrameHeaderBytes);
  return frame;
}

const char* opcode_name(Opcode op) {
  switch (op) {
    case Opcode::kAllreduce:
      return "allreduce";
    case Opcode::kBroadcast:
      return "broadcast";
    case Opcode::kAllgather:
      return "allgather";
    case Opcode::kBarrier:
      return "barrier";
    case Opcode::kReduceScatter:
      return "reduce_scatter";
    case Opcode::kAlltoall:
      return "alltoall";
    case Opcode::kAllreduceCompressed:
      return "allreduce_compressed";
    case Opcode::kImport:
      return "import";
    case Opcode::kRelease:
      return "release";
    case Opcode::kSend:
      return "send";
    case Opcode::kRecv:
      return "recv";
    case Opcode::kRegisterDmabuf:
      return "register_dmabuf";
    case Opcode::kDeregisterDmabuf:
      return "deregister_dmabuf";
    case Opcode::kFlushDmabuf:
      return "flush_dmabuf";
  }
  return "?";
}

std::vector<uint8_t> encode_fd_record(uint32_t ticket) {
  std::vector<uint8_t> b(kFdRecordBytes, 0);
  std::memcpy(b.data(), &kFdRecordMagic, 4);
  std::memcpy(b.data() + 4, &ticket, 4);
  return b;
}

Result<uint32_t> decode_fd_record(const uint8_t* data) {
  uint32_t magic = 0, ticket = 0;
  uint64_t zero = 0;
  std::memcpy(&magic, data, 4);
  std::memcpy(&ticket, data + 4, 4);
  std::memcpy(&zero, data + 8, 8);
  if (magic != kFdRecordMagic || zero != 0) {
    return peer_error("descriptor record: magic {:#x}, reserved {:#x} (not a record)", magic, zero);
  }
  if (ticket == 0 || ticket > 0x7fffffffu) {
    return peer_error("descriptor record: ticket {} (1..2^31-1)", ticket);
  }
  return ticket;
}

namespace {

// import and release: per-trainer messages (version 5).
Result<Request> decode_import(const SqEntry& e, Request r, const uint8_t* data, uint64_t data_bytes,
                              const AllocSizes* allocs) {
  if (e.dtype != 0 || e.op != 0 || e.root != 0 || e.count != 0 || e.send_off != 0 ||
      e.recv_off != 0 || e.stride != 0 || e.key_len != 0) {
    return peer_error("submission {}: {} with collective arguments", e.seq, opcode_name(r.opcode));
  }
  const size_t held = allocs ? allocs->size() : 0;
  if (r.opcode == Opcode::kRelease) {
    if (e.meta_off != 0 || e.spec_len == 0 || allocs == nullptr || allocs->count(e.spec_len) == 0) {
      return peer_error("submission {}: release of allocation {}, which is not imported", e.seq,
                        e.spec_len);
    }
    r.alloc_id = e.spec_len;
    return r;
  }
  if (e.spec_len != sizeof(ImportWire) || !range_ok(e.meta_off, sizeof(ImportWire), data_bytes)) {
    return peer_error(
        "submission {}: import record [{}, +{}) (must be {} bytes in the data region)", e.seq,
        e.meta_off, e.spec_len, sizeof(ImportWire));
  }
  ImportWire w;
  std::memcpy(&w, data + e.meta_off, sizeof(w));  // one copy: the client cannot change it after
  if (w.kind != kImportCudaIpc) {
    return peer_error("submission {}: import of unknown kind {}", e.seq, w.kind);
  }
  if (w.alloc_id == 0 || w.alloc_id > 0x7fffffffu || (allocs && allocs->count(w.alloc_id) != 0)) {
    return peer_error("submission {}: import id {} (1..2^31-1, not in use)", e.seq, w.alloc_id);
  }
  if (held >= kMaxImportsPerClient) {
    return peer_error("submission {}: more than {} imported allocations", e.seq,
                      kMaxImportsPerClient);
  }
  if (w.bytes == 0 || w.bytes > (1ull << 48) || w.device < 0 || w.device > 1023 ||
      w.reserved != 0) {
    return peer_error("submission {}: import of {} bytes on device {} (reserved {})", e.seq,
                      w.bytes, w.device, w.reserved);
  }
  r.import_kind = w.kind;
  r.alloc_id = w.alloc_id;
  r.alloc_bytes = w.bytes;
  r.device = w.device;
  std::memcpy(r.handle, w.handle, sizeof(r.handle));
  return r;
}

// send and recv (version 7): per-trainer messages, matched by the daemon (daemon/job_p2p.h).
Result<Request> decode_p2p(const SqEntry& e, Request r, uint64_t data_bytes, int32_t world_size) {
  const bool send = r.opcode == Opcode::kSend;
  if (e.dtype != 0 || e.op != 0 || e.meta_off != 0 || e.stride != 0 ||
      (send ? e.recv_off : e.send_off) != 0) {
    return peer_error("submission {}: {} with collective arguments", e.seq, opcode_name(r.opcode));
  }
  const int32_t lowest = send ? 0 : -1;
  if (e.root < lowest || e.root >= world_size) {
    return peer_error("submission {}: {} peer {} out of {}..{}", e.seq, opcode_name(r.opcode),
                      e.root, lowest, world_size - 1);
  }
  if (e.spec_len > 0x7fffffffu) {
    return peer_error("submission {}: tag {} (0..2^31-1)", e.seq, e.spec_len);
  }
  const uint64_t off = send ? e.send_off : e.recv_off;
  if (e.key_len > 0x7fffffffu) {
    return peer_error("submission {}: dma-buf id {} (1..2^31-1)", e.seq, e.key_len);
  }
  r.dmabuf = e.key_len;
  if (e.key_len != 0 ? !range_ok(off, e.count, kMaxDmabufBytes)
                     : !range_ok(off, e.count, data_bytes)) {
    return peer_error("submission {}: {} range [{}, +{}) outside the data region ({} bytes)", e.seq,
                      opcode_name(r.opcode), off, e.count, data_bytes);
  }
  r.tag = static_cast<int32_t>(e.spec_len);
  if (send) {
    r.send_bytes = e.count;
  } else {
    r.recv_bytes = e.count;
  }
  return r;
}

// register_dmabuf and deregister_dmabuf (version 8): per-trainer messages. Whether the ticket's
// descriptor came, the id is this trainer's and the job's link can register are the job thread's
// to answer (a completion with the error, not a refusal: the trainer may go on with host buffers).
Result<Request> decode_dmabuf(const SqEntry& e, Request r, int32_t world_size) {
  if (r.opcode == Opcode::kFlushDmabuf) {
    if (e.dtype != 0 || e.op != 0 || e.root != 0 || e.send_off != 0 || e.meta_off != 0 ||
        e.stride != 0 || e.key_len != 0 || e.spec_len == 0 || e.spec_len > 0x7fffffffu ||
        e.recv_off > kMaxDmabufBytes || e.count > kMaxDmabufBytes - e.recv_off) {
      return peer_error("submission {}: flush_dmabuf of id {}, [{}, +{}) (an id, a range)", e.seq,
                        e.spec_len, e.recv_off, e.count);
    }
    r.alloc_id = e.spec_len;
    r.recv_off = e.recv_off;
    r.recv_bytes = e.count;
    return r;
  }
  if (e.dtype != 0 || e.op != 0 || e.recv_off != 0 || e.meta_off != 0 || e.stride != 0) {
    return peer_error("submission {}: {} with collective arguments", e.seq, opcode_name(r.opcode));
  }
  if (r.opcode == Opcode::kDeregisterDmabuf) {
    if (e.root != 0 || e.count != 0 || e.send_off != 0 || e.key_len != 0 || e.spec_len == 0 ||
        e.spec_len > 0x7fffffffu) {
      return peer_error("submission {}: deregister_dmabuf of id {} (1..2^31-1, nothing else)",
                        e.seq, e.spec_len);
    }
    r.alloc_id = e.spec_len;
    return r;
  }
  if (e.root < 0 || e.root >= world_size) {
    return peer_error("submission {}: register_dmabuf for peer {} out of 0..{}", e.seq, e.root,
                      world_size - 1);
  }
  if (e.spec_len == 0 || e.spec_len > 0x7fffffffu) {
    return peer_error("submission {}: register_dmabuf ticket {} (1..2^31-1)", e.seq, e.spec_len);
  }
  if (e.count == 0 || e.count > kMaxDmabufBytes || e.send_off > kMaxDmabufBytes) {
    return peer_error("submission {}: register_dmabuf of {} bytes at offset {} (1..2^48 bytes)",
                      e.seq, e.count, e.send_off);
  }
  if (e.key_len == 0 || (e.key_len & ~(kDmabufSends | kDmabufReceives)) != 0) {
    return peer_error("submission {}: register_dmabuf for {:#x} (sends 1, receives 2)", e.seq,
                      e.key_len);
  }
  r.ticket = e.spec_len;
  r.dmabuf_use = e.key_len;
  r.alloc_bytes = e.count;
  return r;
}

}  // namespace

Result<Request> decode_request(const SqEntry& e, uint64_t expected_seq, const uint8_t* data,
                               uint64_t data_bytes, int32_t world_size, const AllocSizes* allocs) {
  if (e.seq != expected_seq) {
    return peer_error("submission: sequence {} where {} was due", e.seq, expected_seq);
  }
  Request r;
  r.seq = e.seq;
  r.root = e.root;
  r.count = e.count;
  r.send_off = e.send_off;
  r.recv_off = e.recv_off;
  switch (e.opcode) {
    case static_cast<uint16_t>(Opcode::kAllreduce):
    case static_cast<uint16_t>(Opcode::kBroadcast):
    case static_cast<uint16_t>(Opcode::kAllgather):
    case static_cast<uint16_t>(Opcode::kBarrier):
    case static_cast<uint16_t>(Opcode::kReduceScatter):
    case static_cast<uint16_t>(Opcode::kAlltoall):
    case static_cast<uint16_t>(Opcode::kAllreduceCompressed):
      r.opcode = static_cast<Opcode>(e.opcode);
      break;
    case static_cast<uint16_t>(Opcode::kImport):
    case static_cast<uint16_t>(Opcode::kRelease):
      r.opcode = static_cast<Opcode>(e.opcode);
      return decode_import(e, r, data, data_bytes, allocs);
    case static_cast<uint16_t>(Opcode::kSend):
    case static_cast<uint16_t>(Opcode::kRecv):
      r.opcode = static_cast<Opcode>(e.opcode);
      return decode_p2p(e, r, data_bytes, world_size);
    case static_cast<uint16_t>(Opcode::kRegisterDmabuf):
    case static_cast<uint16_t>(Opcode::kDeregisterDmabuf):
    case static_cast<uint16_t>(Opcode::kFlushDmabuf):
      r.opcode = static_cast<Opcode>(e.opcode);
      return decode_dmabuf(e, r, world_size);
    default:
      return peer_error("submission {}: unknown opcode {}", e.seq, e.opcode);
  }
  const bool compressed = r.opcode == Opcode::kAllreduceCompressed;
  // Version 5: spec_len / key_len name the buffers' allocations on the collectives of buffers.
  const bool buffers = !compressed && r.opcode != Opcode::kBarrier;
  if (buffers) {
    r.send_alloc = e.spec_len;
    r.recv_alloc = e.key_len;
  }
  if (!compressed && (e.meta_off != 0 || (!buffers && (e.spec_len != 0 || e.key_len != 0)))) {
    return peer_error("submission {}: codec fields on a {}", e.seq, opcode_name(r.opcode));
  }
  // The size of the region each buffer lies in: the data region or an imported allocation.
  uint64_t send_region = data_bytes, recv_region = data_bytes;
  for (auto [id, region] : {std::pair<uint32_t, uint64_t*>{r.send_alloc, &send_region},
                            std::pair<uint32_t, uint64_t*>{r.recv_alloc, &recv_region}}) {
    if (id == 0) continue;
    auto it = allocs ? allocs->find(id) : AllocSizes::const_iterator{};
    if (allocs == nullptr || it == allocs->end()) {
      return peer_error("submission {}: allocation {} is not imported", e.seq, id);
    }
    *region = it->second;
  }
  const uint64_t region_bytes = std::max(send_region, recv_region);
  if (r.opcode == Opcode::kBarrier) {
    if (e.count != 0 || e.send_off != 0 || e.recv_off != 0 || e.root != 0 || e.dtype != 0 ||
        e.op != 0 || e.stride != 0) {
      return peer_error("submission {}: barrier with arguments", e.seq);
    }
    return r;
  }
  if (!coll::valid_dtype(e.dtype)) return peer_error("submission {}: dtype {}", e.seq, e.dtype);
  r.dtype = static_cast<coll::DataType>(e.dtype);
  if (r.opcode == Opcode::kAllreduce || r.opcode == Opcode::kReduceScatter) {
    if (!coll::valid_op(e.op)) return peer_error("submission {}: op {}", e.seq, e.op);
    r.op = static_cast<coll::ReduceOp>(e.op);
  } else if (e.op != 0) {
    return peer_error("submission {}: op {} on a {}", e.seq, e.op, opcode_name(r.opcode));
  }
  if (r.opcode == Opcode::kBroadcast) {
    if (e.root < 0 || e.root >= world_size) {
      return peer_error("submission {}: root {} out of 0..{}", e.seq, e.root, world_size - 1);
    }
  } else if (e.root != 0) {
    return peer_error("submission {}: root {} on a {}", e.seq, e.root, opcode_name(r.opcode));
  }
  const uint64_t elem = coll::dtype_size(r.dtype);
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(e.count, elem, &bytes) || bytes > region_bytes) {
    return peer_error("submission {}: {} elements of {} bytes exceed the data region ({} bytes)",
                      e.seq, e.count, elem, data_bytes);
  }
  r.send_bytes = bytes;
  r.recv_bytes = bytes;
  const bool gathers = r.opcode == Opcode::kAllgather || r.opcode == Opcode::kAlltoall;
  const bool scatters = r.opcode == Opcode::kReduceScatter || r.opcode == Opcode::kAlltoall;
  if (!gathers && !scatters && e.stride != 0) {
    return peer_error("submission {}: stride {} on a {}", e.seq, e.stride, opcode_name(r.opcode));
  }
  // Only the collectives of world_size blocks span more than their count: an allreduce or a
  // broadcast of up to the whole data region is one block.
  if (gathers || scatters) {
    const uint64_t stride = e.stride == 0 ? bytes : e.stride;
    if (stride < bytes) {
      return peer_error("submission {}: {} blocks of {} bytes {} bytes apart overlap", e.seq,
                        opcode_name(r.opcode), bytes, stride);
    }
    // world_size blocks `stride` apart: the last one ends (world_size - 1) x stride + bytes in.
    uint64_t span = 0;
    if (__builtin_mul_overflow(stride, static_cast<uint64_t>(world_size - 1), &span) ||
        __builtin_add_overflow(span, bytes, &span) || span > region_bytes) {
      return peer_error("submission {}: {} of {} x {} bytes, {} apart, exceeds the data region",
                        e.seq, opcode_name(r.opcode), world_size, bytes, stride);
    }
    if (gathers) {
      r.recv_bytes = span;
      r.recv_stride = stride;
    }
    if (scatters) {
      r.send_bytes = span;
      r.send_stride = stride;
    }
  }
  if (r.opcode == Opcode::kBroadcast || compressed) {
    // One buffer, in place.
    if (e.send_off != e.recv_off || r.send_alloc != r.recv_alloc) {
      return peer_error("submission {}: {} with two buffers", e.seq, opcode_name(r.opcode));
    }
  }
  if (compressed) {
    if (r.dtype != coll::DataType::kF32 && r.dtype != coll::DataType::kF16 &&
        r.dtype != coll::DataType::kBF16) {
      return peer_error("submission {}: allreduce_compressed of {}", e.seq,
                        coll::dtype_name(r.dtype));
    }
    if (e.spec_len == 0 || e.spec_len > kMaxCodecSpecBytes || e.key_len == 0 ||
        e.key_len > kMaxTensorKeyBytes) {
      return peer_error("submission {}: codec spec of {} bytes, tensor key of {} (1..{}, 1..{})",
                        e.seq, e.spec_len, e.key_len, kMaxCodecSpecBytes, kMaxTensorKeyBytes);
    }
    const uint64_t meta = uint64_t{e.spec_len} + e.key_len;
    if (!range_ok(e.meta_off, meta, data_bytes)) {
      return peer_error("submission {}: codec spec and key [{}, +{}) outside the data region",
                        e.seq, e.meta_off, meta);
    }
    const char* m = reinterpret_cast<const char*>(data + e.meta_off);
    r.spec.assign(m, e.spec_len);
    r.key.assign(m + e.spec_len, e.key_len);
  }
  if (!range_ok(r.send_off, r.send_bytes, send_region)) {
    return peer_error("submission {}: send range [{}, +{}) outside its region ({} bytes)", e.seq,
                      r.send_off, r.send_bytes, send_region);
  }
  if (!range_ok(r.recv_off, r.recv_bytes, recv_region)) {
    return peer_error("submission {}: receive range [{}, +{}) outside its region ({} bytes)", e.seq,
                      r.recv_off, r.recv_bytes, recv_region);
  }
  return r;
}

CqEntry make_completion(uint64_t seq, const Status& s, const CompressedDone* done) {
  CqEntry c{};
  c.seq = seq;
  c.status = static_cast<int32_t>(s.code());
  if (s.ok() && done != nullptr) {
    std::memcpy(c.msg, &done->bytes_sent, 8);
    std::memcpy(c.msg + 8, &done->nonfinite, 8);
    c.msg_len = 16;
    return c;
  }
  const std::string& m = s.message();
  c.msg_len = static_cast<uint32_t>(std::min(m.size(), kCqMessageBytes));
  std::memcpy(c.msg, m.data(), c.msg_len);
  return c;
}

Status decode_completion(const CqEntry& e, uint64_t expected_seq, Status* carried,
                         CompressedDone* done) {
  if (e.seq != expected_seq) {
    return peer_error("completion of sequence {} where {} was due", e.seq, expected_seq);
  }
  return decode_completion_in(e, expected_seq, expected_seq, carried, done);
}

Status decode_completion_in(const CqEntry& e, uint64_t lowest, uint64_t highest, Status* carried,
                            CompressedDone* done) {
  if (e.seq < lowest || e.seq > highest) {
    return peer_error("completion of sequence {} where one of {}..{} was due", e.seq, lowest,
                      highest);
  }
  if (e.status < 0 || e.status > static_cast<int32_t>(Code::kInternal)) {
    return peer_error("completion {}: unknown status {}", e.seq, e.status);
  }
  if (e.msg_len > kCqMessageBytes) {
    return peer_error("completion {}: message of {} bytes (at most {})", e.seq, e.msg_len,
                      kCqMessageBytes);
  }
  if (done != nullptr) *done = CompressedDone{};
  if (e.status == 0) {
    if (e.msg_len != 0 && e.msg_len != 16) {
      return peer_error("completion {}: a success carrying {} bytes (0 or 16)", e.seq, e.msg_len);
    }
    if (e.msg_len == 16 && done != nullptr) {
      std::memcpy(&done->bytes_sent, e.msg, 8);
      std::memcpy(&done->nonfinite, e.msg + 8, 8);
    }
    *carried = ok_status();
  } else {
    *carried = Status(static_cast<Code>(e.status), "gradwired: " + std::string(e.msg, e.msg_len));
  }
  return ok_status();
}

Status check_ring(uint64_t head, uint64_t tail, uint32_t entries, const char* which) {
  if (tail - head > entries) {
    return peer_error("{} ring: tail {} head {} (more than {} entries)", which, tail, head,
                      entries);
  }
  return ok_status();
}

}  // namespace gw::daemon
