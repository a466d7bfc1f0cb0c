#include "capi/daemon_session.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "capi/daemon_session_trace.h"
#include "capi/direct_session.h"
#include "capi/setup_checks.h"
#include "collectives/compress/codec.h"
#include "collectives/cost_model.h"
#include "core/bootstrap.h"
#include "core/config.h"
#include "core/log.h"
#include "core/net/handshake.h"
#include "core/sys/time.h"
#include "daemon/daemon_config.h"
#include "gpudirect/cuda_driver.h"

namespace gw::capi {

using daemon::Opcode;
using daemon::SqEntry;

// ---- the data path -----------------------------------------------------------------------------

namespace {

// The calls that do not take device memory in daemon mode (the compressed allreduce takes it in
// direct mode, not yet here). Managed memory passes: the CPU copies it into the arena.
Status refuse_device(const void* buf, const char* call) {
  if (buf != nullptr && cuda::resident_memory_kind(buf) == cuda::MemoryKind::kDevice) {
    return unsupported(
        "{}: CUDA device memory is not supported in daemon mode yet (GW_DAEMON; allreduce, "
        "broadcast, allgather, reduce_scatter and alltoall take it)",
        call);
  }
  return ok_status();
}

SqEntry entry(Opcode op) {
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(op);
  return e;
}

}  // namespace

Status DaemonSession::run_chunks(
    size_t bytes, size_t elem, const char* what,
    const std::function<Result<Chunk>(size_t offset, size_t len)>& post_chunk,
    const std::function<void(const Chunk&, bool ok)>& finish_chunk, size_t step_bytes) {
  const size_t step = std::max(elem, (step_bytes ? step_bytes : chunk_bytes_) / elem * elem);
  std::vector<Chunk> flight;  // oldest first
  Status first;
  auto retire = [&]() {
    Chunk c = flight.front();
    flight.erase(flight.begin());
    bool done = false;
    Status st = client_->wait_for(c.seq, sys::deadline_after_ms(timeout_ms_), &done, what);
    if (!done) {
      st = client_->broken(
          timeout_error("{}: no completion from gradwired within {} ms", what, timeout_ms_));
    }
    finish_chunk(c, st.ok());
    if (first.ok() && !st.ok()) first = st;
  };
  for (size_t off = 0; off < bytes && first.ok();) {
    const size_t len = std::min(step, bytes - off);
    if (flight.size() >= kChunksInFlight) {
      retire();
      continue;
    }
    auto c = post_chunk(off, len);
    if (!c.ok()) {
      // The arena is full of chunks in flight: make room. With none in flight it cannot fit.
      if (c.status().code() == Code::kNoMemory && !flight.empty()) {
        retire();
        continue;
      }
      first = c.status();
      break;
    }
    flight.push_back(*c);
    off += len;
  }
  while (!flight.empty()) retire();  // a failed chunk fails the job: the rest end at once
  return first;
}

Status DaemonSession::allreduce(const void* sendbuf, void* recvbuf, size_t count,
                                coll::DataType dtype, coll::ReduceOp op) {
  CallSpan span("allreduce", count * coll::dtype_size(dtype), dtype, &op);
  in_order();
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = coll::dtype_size(dtype);
  const size_t bytes = count * elem;
  const bool in_place = recvbuf == sendbuf;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  auto* rb = static_cast<uint8_t*>(recvbuf);
  if (bytes == 0) {
    SqEntry e = entry(Opcode::kAllreduce);
    e.dtype = static_cast<uint8_t>(dtype);
    e.op = static_cast<uint8_t>(op);
    return client_->submit(e, "allreduce");
  }
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    GW_ASSIGN_OR_RETURN(auto placed, client_->place_pair(sb + off, rb + off, len));
    SqEntry e = entry(Opcode::kAllreduce);
    e.dtype = static_cast<uint8_t>(dtype);
    e.op = static_cast<uint8_t>(op);
    e.count = len / elem;
    e.send_off = placed.first.off;
    e.recv_off = placed.second.off;
    auto seq = client_->post(e, "allreduce");
    if (!seq.ok()) {
      client_->unplace_pair(placed.first, placed.second, in_place);
      return seq.status();
    }
    return Chunk{*seq,
                 off,
                 len,
                 placed.first.off,
                 placed.second.off,
                 placed.first.staged,
                 placed.second.staged};
  };
  auto finish_chunk = [&](const Chunk& c, bool ok) {
    if (ok && c.recv_staged) copy_from_arena(rb + c.offset, data() + c.recv_off, c.len);
    client_->unplace_pair(Placed{c.send_off, c.send_staged}, Placed{c.recv_off, c.recv_staged},
                          in_place);
  };
  return run_chunks(bytes, elem, "allreduce", post_chunk, finish_chunk);
}

// An iallreduce in flight: its staging stays allocated until it is waited for. It reaches the
// session through its Link, so that it may outlive it (then it ends in kAborted).
class DaemonRequest final : public SessionRequest {
 public:
  DaemonRequest(std::shared_ptr<DaemonSession::Link> link, uint64_t seq, DaemonSession::Placed send,
                DaemonSession::Placed recv, void* user_recv, size_t bytes, bool in_place,
                coll::DataType dtype, coll::ReduceOp op, int64_t posted_us)
      : link_(std::move(link)),
        seq_(seq),
        send_(send),
        recv_(recv),
        user_recv_(user_recv),
        bytes_(bytes),
        in_place_(in_place),
        dtype_(dtype),
        op_(op),
        posted_us_(posted_us) {}
  ~DaemonRequest() override {
    if (!finished_) (void)wait(-1);  // bounded by the communicator's deadline
  }
  Status wait(int64_t timeout_ms) override {
    std::lock_guard<std::mutex> held(link_->mu);
    DaemonSession* s = link_->session;
    if (s == nullptr) return orphaned();
    std::lock_guard<std::mutex> lock(s->mu_);
    return step(s, sys::deadline_after_ms(timeout_ms < 0 ? s->timeout_ms_ : timeout_ms));
  }
  Status test(bool* done) override {
    std::lock_guard<std::mutex> held(link_->mu);
    DaemonSession* s = link_->session;
    if (s == nullptr) {
      *done = true;
      return orphaned();
    }
    std::lock_guard<std::mutex> lock(s->mu_);
    Status st = step(s, sys::kNoWait);
    *done = finished_;
    return finished_ ? st : ok_status();
  }

 private:
  Status orphaned() {
    if (!finished_) {
      finished_ = true;
      final_ = aborted_error("iallreduce: the communicator was destroyed before it completed");
    }
    return final_;
  }
  Status step(DaemonSession* s, sys::Deadline deadline) {
    if (finished_) return final_;
    bool done = false;
    Status st = s->client_->wait_for(seq_, deadline, &done, "iallreduce");
    if (!done) return st;  // kTimeout: still running
    if (st.ok() && recv_.staged) copy_from_arena(user_recv_, s->data() + recv_.off, bytes_);
    s->client_->unplace_pair(send_, recv_, in_place_);
    finished_ = true;
    final_ = st;
    if (posted_us_ >= 0) {  // its event: from the post to the completion seen here
      timeline::CallNotes notes;
      notes.first_seq = seq_;
      notes.submissions = 1;
      notes.failed = !st.ok();
      record_call("iallreduce", posted_us_, bytes_, dtype_, &op_, notes);
    }
    return st;
  }
  std::shared_ptr<DaemonSession::Link> link_;
  uint64_t seq_;
  DaemonSession::Placed send_, recv_;
  void* user_recv_;
  size_t bytes_;
  bool in_place_;
  coll::DataType dtype_;
  coll::ReduceOp op_;
  int64_t posted_us_;  // -1: the timeline was off
  bool finished_ = false;
  Status final_;
};

Result<std::unique_ptr<SessionRequest>> DaemonSession::iallreduce(const void* sendbuf,
                                                                  void* recvbuf, size_t count,
                                                                  coll::DataType dtype,
                                                                  coll::ReduceOp op) {
  if (behind_queue()) return queue_iallreduce(sendbuf, recvbuf, count, dtype, op);
  const int64_t posted_us = timeline::on() ? timeline::now_us() : -1;
  std::lock_guard<std::mutex> lock(mu_);
  const size_t bytes = count * coll::dtype_size(dtype);
  GW_ASSIGN_OR_RETURN(auto placed, client_->place_pair(sendbuf, recvbuf, bytes));
  const auto [s, r] = placed;
  SqEntry e = entry(Opcode::kAllreduce);
  e.dtype = static_cast<uint8_t>(dtype);
  e.op = static_cast<uint8_t>(op);
  e.count = count;
  e.send_off = s.off;
  e.recv_off = r.off;
  auto seq = client_->post(e, "iallreduce");
  if (!seq.ok()) {
    client_->unplace_pair(s, r, recvbuf == sendbuf);
    return seq.status();
  }
  return std::unique_ptr<SessionRequest>(new DaemonRequest(
      link_, *seq, s, r, recvbuf, bytes, recvbuf == sendbuf, dtype, op, posted_us));
}

Status DaemonSession::broadcast(void* buf, size_t count, coll::DataType dtype, int root) {
  CallSpan span("broadcast", count * coll::dtype_size(dtype), dtype, nullptr);
  in_order();
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = coll::dtype_size(dtype);
  const size_t bytes = count * elem;
  auto* b = static_cast<uint8_t*>(buf);
  if (bytes == 0) {
    SqEntry e = entry(Opcode::kBroadcast);
    e.dtype = static_cast<uint8_t>(dtype);
    e.root = root;
    return client_->submit(e, "broadcast");
  }
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    GW_ASSIGN_OR_RETURN(Placed p, client_->place(b + off, len, rank_ == root));
    SqEntry e = entry(Opcode::kBroadcast);
    e.dtype = static_cast<uint8_t>(dtype);
    e.root = root;
    e.count = len / elem;
    e.send_off = p.off;
    e.recv_off = p.off;
    auto seq = client_->post(e, "broadcast");
    if (!seq.ok()) {
      client_->unplace(p);
      return seq.status();
    }
    return Chunk{*seq, off, len, p.off, p.off, p.staged, p.staged};
  };
  auto finish_chunk = [&](const Chunk& c, bool ok) {
    if (ok && c.recv_staged && rank_ != root)
      copy_from_arena(b + c.offset, data() + c.recv_off, c.len);
    client_->unplace(Placed{c.recv_off, c.recv_staged});
  };
  return run_chunks(bytes, elem, "broadcast", post_chunk, finish_chunk);
}

Status DaemonSession::run_sliced(Opcode opcode, const void* sendbuf, void* recvbuf, size_t block,
                                 coll::DataType dtype, coll::ReduceOp op, const char* what) {
  const size_t elem = coll::dtype_size(dtype);
  const size_t world = static_cast<size_t>(size_);
  const size_t total = block * world;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  auto* rb = static_cast<uint8_t*>(recvbuf);
  // How many blocks each side holds, and where a side of world_size blocks lies in the arena.
  const bool send_all = opcode != Opcode::kAllgather;
  const bool recv_all = opcode != Opcode::kReduceScatter;
  uint64_t send_at = 0, recv_at = 0;
  bool send_direct = send_all && client_->in_data(sendbuf, total, &send_at);
  bool recv_direct = recv_all && client_->in_data(recvbuf, total, &recv_at);
  if (send_all && recv_all && send_direct != recv_direct) {
    send_direct = recv_direct = false;  // one stride for both sides: stage both
  }
  const bool direct = send_all ? send_direct : recv_direct;
  // A slice of every block: world_size x step bytes at most, two chunks (each slice is a
  // collective of its own among the daemons: fewer, larger ones cost less; staged ones still
  // fit the arena, a chunk being at most an eighth of it).
  const size_t step = std::max<size_t>(1, slice_bytes() / (world * elem)) * elem;
  auto place_side = [&](bool all, bool direct_side, uint64_t at, const uint8_t* base, size_t off,
                        size_t len, bool copy_in) -> Result<Placed> {
    if (!all) return client_->place(base + off, len, copy_in);
    if (direct_side) return Placed{at + off, false};
    auto o = client_->alloc(world * len);
    if (!o.ok()) {
      return no_memory(
          "{}: a slice of {} bytes does not fit the free part of the daemon arena ({})", what,
          world * len, o.status().message());
    }
    if (copy_in) {
      PhaseSpan copying(kCopyToArena, world * len);
      for (size_t b = 0; b < world; ++b)
        std::memcpy(data() + *o + b * len, base + b * block + off, len);
    }
    return Placed{*o, true};
  };
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    GW_ASSIGN_OR_RETURN(Placed ps, place_side(send_all, send_direct, send_at, sb, off, len, true));
    auto pr = place_side(recv_all, recv_direct, recv_at, rb, off, len, false);
    if (!pr.ok()) {
      client_->unplace(ps);
      return pr.status();
    }
    SqEntry e = entry(opcode);
    e.dtype = static_cast<uint8_t>(dtype);
    if (opcode == Opcode::kReduceScatter) e.op = static_cast<uint8_t>(op);
    e.count = len / elem;
    e.send_off = ps.off;
    e.recv_off = pr->off;
    e.stride = direct ? block : 0;
    auto seq = client_->post(e, what);
    if (!seq.ok()) {
      client_->unplace(ps);
      client_->unplace(*pr);
      return seq.status();
    }
    return Chunk{*seq, off, len, ps.off, pr->off, ps.staged, pr->staged};
  };
  auto finish_chunk = [&](const Chunk& c, bool ok) {
    if (ok && c.recv_staged) {
      if (!recv_all) {
        copy_from_arena(rb + c.offset, data() + c.recv_off, c.len);
      } else {
        PhaseSpan copying(kCopyFromArena, world * c.len);
        for (size_t b = 0; b < world; ++b) {
          std::memcpy(rb + b * block + c.offset, data() + c.recv_off + b * c.len, c.len);
        }
      }
    }
    client_->unplace(Placed{c.send_off, c.send_staged});
    client_->unplace(Placed{c.recv_off, c.recv_staged});
  };
  return run_chunks(block, elem, what, post_chunk, finish_chunk, step);
}

Status DaemonSession::allgather(const void* sendbuf, void* recvbuf, size_t sendcount,
                                coll::DataType dtype) {
  CallSpan span("allgather", sendcount * coll::dtype_size(dtype) * static_cast<size_t>(size_),
                dtype, nullptr);
  in_order();
  std::lock_guard<std::mutex> lock(mu_);
  const size_t block = sendcount * coll::dtype_size(dtype);
  const size_t total = block * static_cast<size_t>(size_);
  if (total > slice_bytes()) {
    return run_sliced(Opcode::kAllgather, sendbuf, recvbuf, block, dtype, coll::ReduceOp::kSum,
                      "allgather");
  }
  GW_ASSIGN_OR_RETURN(Placed r, client_->place(recvbuf, total, false));
  Placed s;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  const auto* rb = static_cast<const uint8_t*>(recvbuf);
  bool inside = block > 0 && sb >= rb && sb + block <= rb + total;
  if (inside) {
    s.off = r.off + static_cast<uint64_t>(sb - rb);
    if (r.staged) copy_to_arena(data() + s.off, sendbuf, block);
  } else {
    auto ps = client_->place(sendbuf, block, true);
    if (!ps.ok()) {
      client_->unplace(r);
      return ps.status();
    }
    s = *ps;
  }
  SqEntry e = entry(Opcode::kAllgather);
  e.dtype = static_cast<uint8_t>(dtype);
  e.count = sendcount;
  e.send_off = s.off;
  e.recv_off = r.off;
  Status st = client_->submit(e, "allgather");
  if (st.ok() && r.staged) copy_from_arena(recvbuf, data() + r.off, total);
  if (!inside) client_->unplace(s);
  client_->unplace(r);
  return st;
}

Status DaemonSession::reduce_scatter(const void* sendbuf, void* recvbuf, size_t recvcount,
                                     coll::DataType dtype, coll::ReduceOp op) {
  CallSpan span("reduce_scatter", recvcount * coll::dtype_size(dtype) * static_cast<size_t>(size_),
                dtype, &op);
  in_order();
  std::lock_guard<std::mutex> lock(mu_);
  const size_t block = recvcount * coll::dtype_size(dtype);
  const size_t total = block * static_cast<size_t>(size_);
  if (total > slice_bytes()) {
    return run_sliced(Opcode::kReduceScatter, sendbuf, recvbuf, block, dtype, op, "reduce_scatter");
  }
  GW_ASSIGN_OR_RETURN(Placed s, client_->place(sendbuf, total, true));
  Placed r;
  const auto* sb = static_cast<const uint8_t*>(sendbuf);
  const auto* rb = static_cast<const uint8_t*>(recvbuf);
  // In place: recvbuf is this rank's block of sendbuf.
  const bool inside = block > 0 && rb >= sb && rb + block <= sb + total;
  if (inside) {
    r.off = s.off + static_cast<uint64_t>(rb - sb);
    r.staged = s.staged;
  } else {
    auto pr = client_->place(recvbuf, block, false);
    if (!pr.ok()) {
      client_->unplace(s);
      return pr.status();
    }
    r = *pr;
  }
  SqEntry e = entry(Opcode::kReduceScatter);
  e.dtype = static_cast<uint8_t>(dtype);
  e.op = static_cast<uint8_t>(op);
  e.count = recvcount;
  e.send_off = s.off;
  e.recv_off = r.off;
  Status st = client_->submit(e, "reduce_scatter");
  if (st.ok() && r.staged) copy_from_arena(recvbuf, data() + r.off, block);
  if (!inside) client_->unplace(r);
  client_->unplace(s);
  return st;
}

Status DaemonSession::barrier() {
  CallSpan span("barrier", 0, coll::DataType::kU8, nullptr);
  in_order();
  std::lock_guard<std::mutex> lock(mu_);
  return client_->submit(entry(Opcode::kBarrier), "barrier");
}

Status DaemonSession::alltoall(const void* sendbuf, void* recvbuf, size_t count,
                               coll::DataType dtype) {
  const size_t total = count * coll::dtype_size(dtype) * static_cast<size_t>(size_);
  CallSpan span("alltoall", total, dtype, nullptr);
  in_order();
  std::lock_guard<std::mutex> lock(mu_);
  if (total > slice_bytes()) {
    return run_sliced(Opcode::kAlltoall, sendbuf, recvbuf, count * coll::dtype_size(dtype), dtype,
                      coll::ReduceOp::kSum, "alltoall");
  }
  // In place is one buffer: the daemon packs every block before it writes any.
  GW_ASSIGN_OR_RETURN(auto placed, client_->place_pair(sendbuf, recvbuf, total));
  const auto [s, r] = placed;
  SqEntry e = entry(Opcode::kAlltoall);
  e.dtype = static_cast<uint8_t>(dtype);
  e.count = count;
  e.send_off = s.off;
  e.recv_off = r.off;
  Status st = client_->submit(e, "alltoall");
  if (st.ok() && r.staged) copy_from_arena(recvbuf, data() + r.off, total);
  client_->unplace_pair(s, r, recvbuf == sendbuf);
  return st;
}

Status DaemonSession::allreduce_compressed(void* buf, size_t count, coll::DataType dtype,
                                           std::string_view codec_spec,
                                           std::string_view tensor_key) {
  const coll::ReduceOp sum = coll::ReduceOp::kSum;
  CallSpan span("allreduce_compressed", count * coll::dtype_size(dtype), dtype, &sum);
  in_order();
  std::lock_guard<std::mutex> lock(mu_);
  const char* what = "allreduce_compressed";
  // What the daemon's Compressor would refuse is refused here, before the job depends on it.
  if (dtype != coll::DataType::kF32 && dtype != coll::DataType::kF16 &&
      dtype != coll::DataType::kBF16) {
    return invalid_arg(
        "compressed allreduce: dtype {} is not supported (float32, float16, bfloat16 only)",
        coll::dtype_name(dtype));
  }
  if (tensor_key.empty()) return invalid_arg("compressed allreduce: tensor key is empty");
  GW_ASSIGN_OR_RETURN(coll::CodecSpec parsed, coll::parse_codec_spec(codec_spec));
  const std::string spec = coll::format_codec_spec(parsed);
  const std::string key =
      epoch_ == 0 ? std::string(tensor_key) : fmt::format("{}#{}", tensor_key, epoch_);
  if (spec.size() > daemon::kMaxCodecSpecBytes || key.size() > daemon::kMaxTensorKeyBytes) {
    return invalid_arg(
        "compressed allreduce in daemon mode: codec spec of {} bytes or tensor key of {} (at "
        "most {} and {})",
        spec.size(), key.size(), daemon::kMaxCodecSpecBytes, daemon::kMaxTensorKeyBytes);
  }
  if (count > 0) GW_RETURN_IF_ERROR(refuse_device(buf, "gw_allreduce_compressed"));
  auto known = keys_.find(key);
  if (known != keys_.end() && (known->second.spec != spec || known->second.count != count ||
                               known->second.dtype != dtype)) {
    return invalid_arg(
        "compressed allreduce: tensor key \"{}\" was used with codec {}, {} x {} and now with "
        "codec {}, {} x {}; use one key per tensor",
        tensor_key, known->second.spec, known->second.count, coll::dtype_name(known->second.dtype),
        spec, count, coll::dtype_name(dtype));
  }
  const size_t bytes = count * coll::dtype_size(dtype);
  GW_ASSIGN_OR_RETURN(Placed b, client_->place(buf, bytes, true));
  const std::string meta = spec + key;
  auto m = client_->place(meta.data(), meta.size(), true);
  if (!m.ok()) {
    client_->unplace(b);
    return m.status();
  }
  const Placed mp = *m;  // staged: the string is this function's own
  SqEntry e = entry(Opcode::kAllreduceCompressed);
  e.dtype = static_cast<uint8_t>(dtype);
  e.count = count;
  e.send_off = b.off;
  e.recv_off = b.off;
  e.meta_off = mp.off;
  e.spec_len = static_cast<uint32_t>(spec.size());
  e.key_len = static_cast<uint32_t>(key.size());
  daemon::CompressedDone info;
  Status st = client_->submit(e, what, &info);
  if (st.ok() && b.staged) copy_from_arena(buf, data() + b.off, bytes);
  client_->unplace(mp);
  client_->unplace(b);
  if (!st.ok()) return st;
  if (known == keys_.end()) keys_.emplace(key, KeyUse{spec, count, dtype});
  const uint64_t p = static_cast<uint64_t>(size_);
  stats_.calls += 1;
  stats_.bytes_sent += info.bytes_sent;
  if (p > 1) stats_.bytes_uncompressed += 2 * (p - 1) * bytes / p;
  return ok_status();
}

Result<gw_comm_stats_t> DaemonSession::compression_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Status DaemonSession::reset_compression_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = gw_comm_stats_t{};
  return ok_status();
}

Status DaemonSession::release_compression() {
  // The residuals live in the daemons, shared by the job's trainers; later calls use fresh keys
  // there (so they start from empty residuals) and the old state goes with the job.
  std::lock_guard<std::mutex> lock(mu_);
  keys_.clear();
  stats_ = gw_comm_stats_t{};
  ++epoch_;
  return ok_status();
}

// ---- memory and abort --------------------------------------------------------------------------

Result<void*> DaemonSession::mem_alloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto off = client_->alloc(bytes);
  if (!off.ok()) {
    return no_memory("gw_mem_alloc of {} bytes: {} (GW_DAEMON_ARENA is {} bytes)", bytes,
                     off.status().message(), client_->welcome().arena_bytes);
  }
  user_[*off] = bytes;
  return static_cast<void*>(data() + *off);
}

Status DaemonSession::mem_free(void* ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t off = 0;
  if (!client_->in_data(ptr, 0, &off) || user_.count(off) == 0) {
    return invalid_arg("pointer {} was not returned by gw_mem_alloc on this communicator", ptr);
  }
  user_.erase(off);
  return client_->free(off);
}

void DaemonSession::abort() { client_->abort(); }

}  // namespace gw::capi
