// Daemon mode's rooted and uneven collectives and its i-forms (capi/daemon_session.h).
//
// gw_reduce, gw_gather, gw_scatter and gw_alltoallv are composed in this front end over the
// daemon's own collectives (no new opcode, so any gradwired of this wire version runs them):
//   reduce     the root: allreduce into its recvbuf; the others: allreduce into arena scratch
//              (in place on their staged copy), thrown away. Same chunks as allreduce.
//   gather     the root: allgather into its recvbuf (gather's in place is allgather's); the
//              others: allgather into arena scratch, thrown away, slice by slice as allgather.
//   scatter    broadcast of the root's sendbuf (size() blocks); every rank keeps its own block
//              (the others receive into arena scratch, chunk by chunk, and copy out their part).
//   alltoallv  an allgather of every rank's sendcounts and recvcounts (2 x size() int64s: every
//              rank checks that the matrix agrees, so a mismatch fails every rank alike, and
//              takes the largest block m), then alltoall of blocks padded to m elements, packed
//              into and unpacked from arena scratch slice by slice.
// What they cost against direct mode's algorithms is in docs/daemon.md ("Which calls").
//
// The i-forms but gw_iallreduce (start()): a worker (coll::AsyncQueue, as direct mode's) runs the
// blocking call in issue order; blocking calls and iallreduce wait for / queue behind what is
// pending (in_order()), so every rank posts its collectives to the daemon in the order it issued
// them. gw_iallreduce with nothing queued keeps its own path (posted at once, several in flight).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "capi/daemon_session.h"
#include "capi/daemon_session_trace.h"
#include "core/log.h"

namespace gw::capi {

using daemon::Opcode;
using daemon::SqEntry;

namespace {

// The session whose worker this thread is (its calls do not wait for the queue they run in).
thread_local const DaemonSession* tl_worker = nullptr;

class QueuedRequest final : public SessionRequest {
 public:
  explicit QueuedRequest(std::unique_ptr<coll::AsyncOp> op) : op_(std::move(op)) {}
  Status wait(int64_t timeout_ms) override { return op_->wait(timeout_ms); }
  Status test(bool* done) override { return op_->test(done); }

 private:
  std::unique_ptr<coll::AsyncOp> op_;
};

SqEntry entry_of(Opcode opcode, coll::DataType dtype) {
  SqEntry e{};
  e.opcode = static_cast<uint16_t>(opcode);
  e.dtype = static_cast<uint8_t>(dtype);
  return e;
}

}  // namespace

// ---- issue order ------------------------------------------------------------------------------

void DaemonSession::in_order() {
  if (tl_worker == this || pending_.load() == 0) return;
  PhaseSpan waiting("wait for queued calls");
  queue_.wait_idle();  // bounded: each queued call ends within its deadline, or at once aborted
}

bool DaemonSession::behind_queue() const { return tl_worker != this && pending_.load() > 0; }

void DaemonSession::stop_queue() {
  queue_.shutdown([this] { client_->abort(); });
}

Result<std::unique_ptr<SessionRequest>> DaemonSession::start(const coll::CollectiveCall& call) {
  pending_.fetch_add(1);
  auto op = queue_.push(
      coll::call_name(call.kind),
      [this, call]() {
        tl_worker = this;
        Status s = run(call);
        tl_worker = nullptr;
        pending_.fetch_sub(1);
        return s;
      },
      timeout_ms_);
  return std::unique_ptr<SessionRequest>(new QueuedRequest(std::move(op)));
}

Result<std::unique_ptr<SessionRequest>> DaemonSession::queue_iallreduce(const void* sendbuf,
                                                                        void* recvbuf, size_t count,
                                                                        coll::DataType dtype,
                                                                        coll::ReduceOp op) {
  coll::CollectiveCall c;
  c.kind = coll::CallKind::kAllreduce;
  c.sendbuf = sendbuf;
  c.recvbuf = recvbuf;
  c.count = count;
  c.dtype = dtype;
  c.op = op;
  return start(c);
}

Status DaemonSession::run(const coll::CollectiveCall& call) {
  // One event for the call, whichever calls it is composed of (capi/daemon_session_trace.h).
  CallSpan span(coll::call_name(call.kind), call_bytes(call, size_), call.dtype,
                call.kind == coll::CallKind::kAllreduce || call.kind == coll::CallKind::kReduce ||
                        call.kind == coll::CallKind::kReduceScatter
                    ? &call.op
                    : nullptr);
  in_order();
  switch (call.kind) {
    case coll::CallKind::kReduce:
      return reduce_call(call);
    case coll::CallKind::kGather:
      return gather_call(call);
    case coll::CallKind::kScatter:
      return scatter_call(call);
    case coll::CallKind::kAlltoallv:
      return alltoallv_call(call);
    default:
      return Session::run(call);
  }
}

// ---- a collective whose receive side is arena scratch -----------------------------------------

Status DaemonSession::run_scratch(const ScratchCall& sc) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t elem = coll::dtype_size(sc.dtype);
  const size_t mult = sc.recv_blocks;
  if (sc.bytes == 0) {  // every rank submits the call, as the buffer's owners do
    SqEntry e = entry_of(sc.opcode, sc.dtype);
    e.op = static_cast<uint8_t>(sc.op);
    e.root = sc.root;
    return client_->submit(e, sc.what);
  }
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    Placed ps;
    if (sc.send != nullptr) {
      GW_ASSIGN_OR_RETURN(ps, client_->place(sc.send + off, len, true));
    }
    // In place on a staged copy of our own (allreduce); else scratch of the receive side's size.
    Placed pr = ps;
    if (!(sc.in_place_ok && ps.staged)) {
      auto o = client_->alloc(mult * len);
      if (!o.ok()) {
        if (sc.send != nullptr) client_->unplace(ps);
        return no_memory(
            "{}: {} bytes of scratch do not fit the free part of the daemon arena ({})", sc.what,
            mult * len, o.status().message());
      }
      pr = Placed{*o, true};
    }
    if (sc.send == nullptr) ps = pr;  // broadcast: one buffer
    SqEntry e = entry_of(sc.opcode, sc.dtype);
    e.op = static_cast<uint8_t>(sc.op);
    e.root = sc.root;
    e.count = len / elem;
    e.send_off = ps.off;
    e.recv_off = pr.off;
    auto seq = client_->post(e, sc.what);
    if (!seq.ok()) {
      client_->unplace(pr);
      if (ps.off != pr.off) client_->unplace(ps);
      return seq.status();
    }
    return Chunk{*seq, off, len, ps.off, pr.off, ps.staged, pr.staged};
  };
  auto finish_chunk = [&](const Chunk& c, bool ok) {
    if (ok && sc.keep) {
      PhaseSpan copying(kCopyFromArena, c.len);
      sc.keep(c.offset, c.len, data() + c.recv_off);
    }
    client_->unplace(Placed{c.recv_off, c.recv_staged});
    if (c.send_off != c.recv_off) client_->unplace(Placed{c.send_off, c.send_staged});
  };
  return run_chunks(sc.bytes, elem, sc.what, post_chunk, finish_chunk, sc.step);
}

size_t DaemonSession::slice_step(size_t elem) const {
  // run_sliced's slices: every rank of the job cuts them alike.
  return std::max<size_t>(1, slice_bytes() / (static_cast<size_t>(size_) * elem)) * elem;
}

// ---- reduce, gather, scatter ------------------------------------------------------------------

Status DaemonSession::reduce_call(const coll::CollectiveCall& c) {
  if (rank_ == c.root) return allreduce(c.sendbuf, c.recvbuf, c.count, c.dtype, c.op);
  ScratchCall sc;
  sc.opcode = Opcode::kAllreduce;
  sc.what = "reduce";
  sc.send = static_cast<const uint8_t*>(c.sendbuf);
  sc.bytes = c.count * coll::dtype_size(c.dtype);
  sc.dtype = c.dtype;
  sc.op = c.op;
  sc.in_place_ok = true;
  return run_scratch(sc);  // allreduce's chunks (step 0: chunk_bytes_)
}

Status DaemonSession::gather_call(const coll::CollectiveCall& c) {
  if (rank_ == c.root) return allgather(c.sendbuf, c.recvbuf, c.count, c.dtype);
  const size_t elem = coll::dtype_size(c.dtype);
  ScratchCall sc;
  sc.opcode = Opcode::kAllgather;
  sc.what = "gather";
  sc.send = static_cast<const uint8_t*>(c.sendbuf);
  sc.bytes = c.count * elem;
  sc.dtype = c.dtype;
  sc.recv_blocks = static_cast<size_t>(size_);
  // allgather's cut: one call up to slice_bytes() in all, else slices of every block.
  sc.step = sc.bytes * static_cast<size_t>(size_) > slice_bytes() ? slice_step(elem)
                                                                  : std::max(elem, sc.bytes);
  return run_scratch(sc);
}

Status DaemonSession::scatter_call(const coll::CollectiveCall& c) {
  const size_t elem = coll::dtype_size(c.dtype);
  const size_t block = c.count * elem;
  const size_t total = block * static_cast<size_t>(size_);
  if (rank_ == c.root) {
    // The daemon only reads the root's buffer of a broadcast.
    auto* whole = const_cast<uint8_t*>(static_cast<const uint8_t*>(c.sendbuf));
    GW_RETURN_IF_ERROR(broadcast(whole, total / elem, c.dtype, c.root).with_context("scatter"));
    const uint8_t* own = whole == nullptr ? nullptr : whole + static_cast<size_t>(rank_) * block;
    if (block > 0 && c.recvbuf != own) std::memcpy(c.recvbuf, own, block);
    return ok_status();
  }
  auto* out = static_cast<uint8_t*>(c.recvbuf);
  const size_t lo = static_cast<size_t>(rank_) * block;
  const size_t hi = lo + block;
  ScratchCall sc;
  sc.opcode = Opcode::kBroadcast;
  sc.what = "scatter";
  sc.bytes = total;
  sc.dtype = c.dtype;
  sc.root = c.root;
  sc.keep = [&](size_t off, size_t len, const uint8_t* got) {
    const size_t a = std::max(off, lo), b = std::min(off + len, hi);
    if (a < b) std::memcpy(out + (a - lo), got + (a - off), b - a);
  };
  return run_scratch(sc);  // broadcast's chunks
}

// ---- alltoallv --------------------------------------------------------------------------------

Status DaemonSession::alltoallv_call(const coll::CollectiveCall& c) {
  const size_t p = static_cast<size_t>(size_);
  const size_t elem = coll::dtype_size(c.dtype);
  // Every rank's counts, both ways: each checks the whole matrix (so all fail alike) and takes
  // the largest block.
  std::vector<int64_t> mine(2 * p), all(2 * p * p);
  for (size_t j = 0; j < p; ++j) {
    mine[j] = static_cast<int64_t>(c.sendcounts[j]);
    mine[p + j] = static_cast<int64_t>(c.recvcounts[j]);
  }
  GW_RETURN_IF_ERROR(allgather(mine.data(), all.data(), 2 * p, coll::DataType::kI64)
                         .with_context("alltoallv: exchanging the counts"));
  int64_t most = 0;
  for (size_t i = 0; i < p; ++i) {
    for (size_t j = 0; j < p; ++j) {
      const int64_t sent = all[i * 2 * p + j];          // rank i to rank j
      const int64_t expected = all[j * 2 * p + p + i];  // rank j from rank i
      if (sent != expected) {
        return invalid_arg(
            "alltoallv: rank {} sends {} elements to rank {}, whose recvcounts[{}] is {} (every "
            "rank's sendcounts[j] must equal rank j's recvcounts for it)",
            i, sent, j, i, expected);
      }
      most = std::max(most, sent);
    }
  }
  if (most == 0) return ok_status();  // every rank saw the same matrix
  const size_t block = static_cast<size_t>(most) * elem;
  const auto* sb = static_cast<const uint8_t*>(c.sendbuf);
  auto* rb = static_cast<uint8_t*>(c.recvbuf);
  // In place over several slices: a slice's unpacking would overwrite what a later slice packs.
  const size_t step = block * p > slice_bytes() ? slice_step(elem) : block;
  std::vector<uint8_t> copy;
  if (sb == rb && step < block) {
    size_t end = 0;
    for (size_t j = 0; j < p; ++j) end = std::max(end, (c.sdispls[j] + c.sendcounts[j]) * elem);
    copy.assign(sb, sb + end);
    sb = copy.data();
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto post_chunk = [&](size_t off, size_t len) -> Result<Chunk> {
    auto o = client_->alloc(p * len);
    if (!o.ok()) {
      return no_memory(
          "alltoallv: a slice of {} bytes does not fit the free part of the daemon "
          "arena ({})",
          p * len, o.status().message());
    }
    uint8_t* at = data() + *o;
    PhaseSpan copying(kCopyToArena, p * len);
    for (size_t j = 0; j < p; ++j) {
      const size_t real = c.sendcounts[j] * elem;
      const size_t n = off < real ? std::min(len, real - off) : 0;
      if (n > 0) std::memcpy(at + j * len, sb + c.sdispls[j] * elem + off, n);
      if (n < len) std::memset(at + j * len + n, 0, len - n);
    }
    // One buffer, in place: the daemon packs every block before it writes any.
    SqEntry e = entry_of(Opcode::kAlltoall, c.dtype);
    e.count = len / elem;
    e.send_off = *o;
    e.recv_off = *o;
    auto seq = client_->post(e, "alltoallv");
    if (!seq.ok()) {
      (void)client_->free(*o);
      return seq.status();
    }
    return Chunk{*seq, off, len, *o, *o, true, true};
  };
  auto finish_chunk = [&](const Chunk& ch, bool ok) {
    if (ok) {
      PhaseSpan copying(kCopyFromArena, p * ch.len);
      const uint8_t* at = data() + ch.recv_off;
      for (size_t j = 0; j < p; ++j) {
        const size_t real = c.recvcounts[j] * elem;
        const size_t n = ch.offset < real ? std::min(ch.len, real - ch.offset) : 0;
        if (n > 0) std::memcpy(rb + c.rdispls[j] * elem + ch.offset, at + j * ch.len, n);
      }
    }
    (void)client_->free(ch.recv_off);
  };
  return run_chunks(block, elem, "alltoallv", post_chunk, finish_chunk, step);
}

}  // namespace gw::capi
