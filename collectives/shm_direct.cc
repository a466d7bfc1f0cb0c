#include "collectives/shm_direct.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "collectives/coll_config.h"
#include "collectives/reduce.h"
#include "collectives/schedule.h"
#include "collectives/shared_host_memory.h"
#include "core/log.h"
#include "core/net/shm_cma.h"
#include "core/net/shm_config.h"

namespace gw::coll {
namespace {

std::atomic<uint64_t> g_calls{0};
std::atomic<uint64_t> g_bytes_read{0};
std::atomic<uint64_t> g_bytes_written{0};
std::atomic<uint64_t> g_shared_calls{0};

// What a peer reads to learn that it may read this process's memory.
constexpr uint64_t kProbeValue = 0x31544345524944ull;  // "DIRECT1"
const volatile uint64_t g_probe_word = kProbeValue;
// What a peer writes (kProbeValue, every peer the same) to learn that it may write here too.
volatile uint64_t g_probe_sink = 0;

// A piece of a peer's block read at a time in the reduction: it stays in cache between the read
// and the sum.
constexpr size_t kPiece = size_t{256} * 1024;
// The gather reads at most this much per call, so the deadline and abort are looked at often.
constexpr size_t kGatherStep = size_t{8} << 20;

constexpr uint64_t kDescMagic = ShmDirect::kCallMagic;

struct ProbeDesc {
  uint64_t magic;
  int64_t pid;
  uint64_t probe_addr;
  uint64_t sink_addr;
};

using CallDesc = ShmDirect::CallDesc;

// Where [p, p + bytes) lies in a shared region, or gen 0 when in none.
ShmDirect::SharedRef ref_of(const void* p, size_t bytes) {
  return shared_host_memory::find(p, bytes).value_or(ShmDirect::SharedRef{});
}

// Peers' regions kept mapped per peer beyond the ones the current call uses.
constexpr size_t kRegionsPerPeer = 4;
// From this many bytes the shared path writes an output that is not also its rank's input with
// non-temporal stores: the buffers do not fit in a last-level cache slice anyway, and the stores
// then cost no read of the destination's lines. Below, and in place (the lines were just read
// into cache), plain stores. Measured on a 2-core EPYC VM (32 MiB L3 slice; sysconf reports the
// whole socket's 320 MiB, so the size is fixed here): out of place, plain stores win up to 8 MiB
// and lose from 16 MiB (64 MiB: 6.6 against 8.4 GB/s busbw); in place plain stores win at every
// size (64 MiB: 13 against 9.5 GB/s). docs/perf.md, "Shared buffers".
constexpr size_t kStreamMin = size_t{16} << 20;

// Copies n bytes with non-temporal stores (x86-64; memcpy elsewhere). finish_streaming() must run
// before anyone is told the bytes are there.
void stream_copy(uint8_t* dst, const uint8_t* src, size_t n) {
#if defined(__x86_64__)
  size_t i = std::min(n, (16 - reinterpret_cast<uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, i);
  for (; i + 64 <= n; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_loadu_si128(s), b = _mm_loadu_si128(s + 1);
    const __m128i c = _mm_loadu_si128(s + 2), e = _mm_loadu_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  for (; i + 16 <= n; i += 16) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)));
  }
  std::memcpy(dst + i, src + i, n - i);
#else
  std::memcpy(dst, src, n);
#endif
}

void finish_streaming() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

// n bytes from src to dst, with non-temporal stores when `stream` (kStreamMin: see there).
void copy_out(uint8_t* dst, const uint8_t* src, size_t n, bool stream) {
  if (stream) {
    stream_copy(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

}  // namespace

namespace {

// process_vm_readv (write false: remote -> local) or process_vm_writev (local -> remote) of len
// bytes with rank `peer` (pid), to the end; the errors as shm_direct_read_peer's.
Status copy_with_peer(bool write, int64_t pid, int peer, char* local, uint64_t remote, size_t len,
                      const char* what) {
  size_t done = 0;
  while (done < len) {
    iovec l{local + done, len - done};
    iovec r{reinterpret_cast<void*>(remote + done), len - done};
    ssize_t n = write ? process_vm_writev(static_cast<pid_t>(pid), &l, 1, &r, 1, 0)
                      : process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == ESRCH || (err == EFAULT && net::shm::peer_exiting(pid))) {
        return peer_error("{}: rank {} (pid {}) is gone: connection closed by peer", what, peer,
                          pid);
      }
      if (err == EFAULT) {
        return peer_error(
            "{}: rank {}'s {} (pid {}, {} bytes at {:#x}) is no longer mapped{}: it "
            "freed or unmapped its buffer before the collective ended",
            what, peer, write ? "output" : "buffer", pid, len - done, remote + done,
            write ? " or not writable" : "");
      }
      return internal_error("{}: {} rank {}'s buffer (pid {}) failed: {}", what,
                            write ? "writing" : "reading", peer, pid, std::strerror(err));
    }
    if (n == 0) {
      return internal_error("{}: rank {}'s buffer ends early ({} of {} bytes)", what, peer, done,
                            len);
    }
    done += static_cast<size_t>(n);
  }
  (write ? g_bytes_written : g_bytes_read).fetch_add(len, std::memory_order_relaxed);
  return ok_status();
}

}  // namespace

Status shm_direct_read_peer(int64_t pid, int peer, void* local, uint64_t remote, size_t len,
                            const char* what) {
  return copy_with_peer(false, pid, peer, static_cast<char*>(local), remote, len, what);
}

Status shm_direct_write_peer(int64_t pid, int peer, const void* local, uint64_t remote, size_t len,
                             const char* what) {
  return copy_with_peer(true, pid, peer, const_cast<char*>(static_cast<const char*>(local)), remote,
                        len, what);
}

namespace {

Status check_stop(Deadline deadline, const std::atomic<bool>* aborted,
                  const char* what = "allreduce") {
  if (aborted && aborted->load(std::memory_order_relaxed)) {
    return aborted_error("{}: communicator aborted", what);
  }
  if (expired(deadline)) {
    return timeout_error("{}: deadline passed reading peers' buffers", what);
  }
  return ok_status();
}

}  // namespace

ShmDirectOptions shm_direct_options(const config::Snapshot& config) {
  ShmDirectOptions o;
  o.min_bytes =
      static_cast<size_t>(std::max<int64_t>(0, config.get_int(coll_config::kShmDirectMin)));
  o.inject_refuse = config.get_bool(net::shm_config::kShmCmaInjectRefuse);
  o.hugepages = config.get_bool(coll_config::kShmHugepages);
  return o;
}

uint64_t ShmDirect::calls() { return g_calls.load(std::memory_order_relaxed); }
uint64_t ShmDirect::bytes_read() { return g_bytes_read.load(std::memory_order_relaxed); }
uint64_t ShmDirect::bytes_written() { return g_bytes_written.load(std::memory_order_relaxed); }
uint64_t ShmDirect::shared_calls() { return g_shared_calls.load(std::memory_order_relaxed); }

Result<int> ShmDirect::first_refusal(const Exchange& exchange, bool mine_ok,
                                     const char* what) const {
  std::vector<uint8_t> ok(static_cast<size_t>(size_), 0);
  ok[rank_] = mine_ok ? 1 : 2;
  GW_RETURN_IF_ERROR(exchange(ok.data(), 1));
  int refused_by = -1;
  for (int r = 0; r < size_; ++r) {
    if (ok[r] != 1 && ok[r] != 2) return internal_error("allreduce: corrupt {} verdict", what);
    if (ok[r] == 2 && refused_by < 0) refused_by = r;
  }
  return refused_by;
}

Status ShmDirect::decode_calls(const uint8_t* buf, int n, int rank, uint64_t bytes,
                               std::vector<CallDesc>* d) {
  d->assign(static_cast<size_t>(n), CallDesc{});
  for (int r = 0; r < n; ++r) {
    CallDesc& c = (*d)[static_cast<size_t>(r)];
    std::memcpy(&c, buf + static_cast<size_t>(r) * sizeof(CallDesc), sizeof(CallDesc));
    if (c.magic != kDescMagic) {
      return internal_error("allreduce: rank {} sent a corrupt buffer descriptor", r);
    }
    if (c.bytes != bytes) {
      return invalid_arg("allreduce: ranks disagree on count: rank {} has {} bytes, rank {} {}",
                         rank, bytes, r, c.bytes);
    }
  }
  return ok_status();
}

bool ShmDirect::all_shared(const std::vector<CallDesc>& d) {
  for (const CallDesc& c : d) {
    if (c.in_ref.gen == 0 || c.out_ref.gen == 0) return false;
  }
  return !d.empty();
}

std::string ShmDirect::check_ref(const SharedRef& ref, uint64_t bytes) {
  if (ref.gen == 0) return "not in shared memory";
  if (ref.fd < 0 || ref.fd > INT32_MAX) return fmt::format("descriptor {} out of range", ref.fd);
  if (ref.region_bytes == 0 || ref.offset > ref.region_bytes ||
      bytes > ref.region_bytes - ref.offset) {
    return fmt::format("{} bytes at offset {} do not fit its region of {} bytes", bytes, ref.offset,
                       ref.region_bytes);
  }
  return {};
}

Result<uint8_t*> ShmDirect::map_peer_buffer(int peer, const SharedRef& ref, uint64_t bytes) {
  const std::string bad = check_ref(ref, bytes);
  if (!bad.empty()) return internal_error("rank {}'s shared buffer: {}", peer, bad);
  for (PeerRegion& m : peer_regions_) {
    if (m.rank == peer && m.gen == ref.gen && m.ino == ref.ino &&
        m.region.size() == ref.region_bytes) {
      m.last_use = use_clock_;
      return static_cast<uint8_t*>(m.region.data()) + ref.offset;
    }
  }
  const std::string path = fmt::format("/proc/{}/fd/{}", pids_[peer], ref.fd);
  sys::Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!fd.valid())
    return system_error(fmt::format("open {} (rank {}'s region)", path, peer), errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return system_error(fmt::format("fstat {}", path), errno);
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_ino) != ref.ino) {
    return peer_error("{} is not rank {}'s region (inode {}, expected {})", path, peer, st.st_ino,
                      ref.ino);
  }
  // Only a region whose size no one can change: a shrink under the mapping would turn this
  // rank's loads into SIGBUS.
  const int seals = ::fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return peer_error("rank {}'s region {} is not sealed against shrinking", peer, path);
  }
  GW_ASSIGN_OR_RETURN(sys::MemfdRegion region,
                      sys::MemfdRegion::map(std::move(fd), ref.region_bytes));
  region.close_fd();
  // Let go of this peer's least recently used regions beyond the few kept (never one of this
  // call's).
  size_t mine = 0;
  for (const PeerRegion& m : peer_regions_) mine += m.rank == peer ? 1 : 0;
  while (mine >= kRegionsPerPeer) {
    auto oldest = peer_regions_.end();
    for (auto it = peer_regions_.begin(); it != peer_regions_.end(); ++it) {
      if (it->rank == peer && it->last_use != use_clock_ &&
          (oldest == peer_regions_.end() || it->last_use < oldest->last_use)) {
        oldest = it;
      }
    }
    if (oldest == peer_regions_.end()) break;
    peer_regions_.erase(oldest);
    --mine;
  }
  PeerRegion m;
  m.rank = peer;
  m.gen = ref.gen;
  m.ino = ref.ino;
  m.last_use = use_clock_;
  m.region = std::move(region);
  auto* base = static_cast<uint8_t*>(m.region.data());
  peer_regions_.push_back(std::move(m));
  return base + ref.offset;
}

Status ShmDirect::allreduce_shared(const uint8_t* in, uint8_t* out, size_t count, DataType dtype,
                                   ReduceOp op, Deadline deadline, const std::atomic<bool>* aborted,
                                   const std::vector<CallDesc>& d, const Exchange& exchange,
                                   bool* ran) {
  *ran = false;
  const size_t es = dtype_size(dtype);
  const size_t bytes = count * es;
  const size_t n = static_cast<size_t>(size_);
  // Every rank's input and output in this process (this rank's own as they are).
  std::vector<const uint8_t*> ins(n);
  std::vector<uint8_t*> outs(n);
  std::vector<uint8_t*> mapped_ins(n);
  std::vector<PeerMapping> wants;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    wants.push_back({r, d[r].in_ref, bytes, &mapped_ins[r]});
    wants.push_back({r, d[r].out_ref, bytes, &outs[r]});
  }
  bool mapped = false;
  GW_RETURN_IF_ERROR(map_peers(wants, exchange, &mapped, "allreduce"));
  if (!mapped) return ok_status();  // the cross-memory reads, this call and every later one
  for (int r = 0; r < size_; ++r) ins[r] = mapped_ins[r];
  ins[rank_] = in;
  outs[rank_] = out;
  *ran = true;

  // This rank's block: reduced piece by piece into cache-resident scratch, then written to every
  // rank's output. Block i of any buffer is touched by rank i alone, so in place is safe.
  const Range mine_r = block_range(count, size_, rank_);
  const size_t piece_elems = std::max<size_t>(1, kPiece / es);
  std::vector<uint8_t> streaming(n);
  for (size_t r = 0; r < n; ++r) streaming[r] = bytes >= kStreamMin && outs[r] != ins[r];
  tmp_.resize(piece_elems * es);
  uint8_t* acc = tmp_.data();
  for (size_t off = 0; off < mine_r.count; off += piece_elems) {
    GW_RETURN_IF_ERROR(check_stop(deadline, aborted));
    const size_t elems = std::min(piece_elems, mine_r.count - off);
    const size_t at = (mine_r.offset + off) * es;
    reduce(dtype, op, ins[rank_] + at, ins[(rank_ + 1) % size_] + at, acc, elems);
    for (int k = 2; k < size_; ++k) {
      reduce(dtype, op, acc, ins[(rank_ + k) % size_] + at, acc, elems);
    }
    if (op == ReduceOp::kAvg) finalize_avg(dtype, acc, elems, size_);
    for (size_t r = 0; r < n; ++r) {
      if (streaming[r]) {
        stream_copy(outs[r] + at, acc, elems * es);
      } else {
        std::memcpy(outs[r] + at, acc, elems * es);
      }
    }
  }
  finish_streaming();

  return barrier(exchange);  // no rank hands its output back while a peer may still write into it
}

Status ShmDirect::probe(const Exchange& exchange) {
  const size_t n = static_cast<size_t>(size_);
  xbuf_.assign(n * sizeof(ProbeDesc), 0);
  ProbeDesc mine{kDescMagic, static_cast<int64_t>(getpid()),
                 reinterpret_cast<uint64_t>(&g_probe_word),
                 reinterpret_cast<uint64_t>(&g_probe_sink)};
  std::memcpy(xbuf_.data() + rank_ * sizeof(ProbeDesc), &mine, sizeof(mine));
  GW_RETURN_IF_ERROR(exchange(xbuf_.data(), sizeof(ProbeDesc)));
  pids_.assign(n, 0);
  std::string why;  // this rank's first failed read
  for (int r = 0; r < size_; ++r) {
    ProbeDesc d;
    std::memcpy(&d, xbuf_.data() + r * sizeof(ProbeDesc), sizeof(d));
    if (d.magic != kDescMagic || d.pid <= 0) {
      return internal_error("allreduce: rank {} sent a corrupt direct-read probe", r);
    }
    pids_[r] = d.pid;
    if (r == rank_ || !why.empty()) continue;
    uint64_t got = 0;
    iovec l{&got, sizeof(got)};
    iovec rem{reinterpret_cast<void*>(options_.inject_refuse ? 0 : d.probe_addr), sizeof(got)};
    ssize_t k = process_vm_readv(static_cast<pid_t>(d.pid), &l, 1, &rem, 1, 0);
    if (k != static_cast<ssize_t>(sizeof(got)) || got != kProbeValue) {
      why = fmt::format("rank {} may not read rank {}'s memory (pid {}: {})", rank_, r, d.pid,
                        k < 0 ? std::strerror(errno) : "wrong probe value");
      continue;
    }
    // The allreduce writes its result into the peers' outputs (process_vm_writev): the same
    // access check in the kernel, but a seccomp filter may allow one call and not the other.
    const uint64_t put = kProbeValue;
    iovec lw{const_cast<uint64_t*>(&put), sizeof(put)};
    iovec remw{reinterpret_cast<void*>(d.sink_addr), sizeof(put)};
    k = process_vm_writev(static_cast<pid_t>(d.pid), &lw, 1, &remw, 1, 0);
    if (k != static_cast<ssize_t>(sizeof(put))) {
      why = fmt::format("rank {} may not write rank {}'s memory (pid {}: {})", rank_, r, d.pid,
                        k < 0 ? std::strerror(errno) : "short write");
    }
  }
  GW_ASSIGN_OR_RETURN(const int refused_by, first_refusal(exchange, why.empty(), "probe"));
  if (refused_by < 0) {
    state_ = State::kOn;
    GW_LOG_INFO(
        "allreduce within the host: ranks read each other's buffers straight into the sum and "
        "write the result into each other's outputs (process_vm_readv/writev) from {} bytes "
        "(GW_SHM_DIRECT_MIN)",
        options_.min_bytes);
  } else {
    state_ = State::kOff;
    GW_LOG_WARN(
        "collectives within the host: cross-memory access refused ({}); every rank keeps the ring "
        "for allreduce, reduce-scatter, allgather, broadcast and alltoall (ptrace_scope, "
        "different users or a container can cause this; GW_SHM_DIRECT_MIN=0 silences this)",
        why.empty() ? fmt::format("rank {} could not read a peer's memory", refused_by) : why);
  }
  return ok_status();
}

Status ShmDirect::allreduce(const uint8_t* in, uint8_t* out, size_t count, DataType dtype,
                            ReduceOp op, Deadline deadline, const std::atomic<bool>* aborted,
                            const Exchange& exchange, bool* ran) {
  const size_t es = dtype_size(dtype);
  const size_t bytes = count * es;

  // 1. Everyone's buffers (and the proof that every rank has entered the call).
  std::vector<CallDesc> d;
  GW_RETURN_IF_ERROR(begin_call(in, bytes, out, bytes, bytes, exchange, &d, ran));
  if (!*ran) return ok_status();
  g_calls.fetch_add(1, std::memory_order_relaxed);
  // Every rank's buffers in shared host memory: map them, no kernel copies (the same choice on
  // every rank: it rests on the exchanged descriptors and the exchanged verdicts).
  if (shared_state_ != State::kOff && all_shared(d)) {
    bool shared = false;
    GW_RETURN_IF_ERROR(
        allreduce_shared(in, out, count, dtype, op, deadline, aborted, d, exchange, &shared));
    if (shared) return ok_status();
  }

  // 2. This rank's block, piece by piece: acc = in op peer_1 op peer_2 ... in a cache-resident
  // scratch, then written into this rank's output and every peer's (process_vm_writev). Block i
  // of any buffer is touched by rank i alone (in place too: rank i reads a piece of a peer's
  // input before it writes the same piece of that peer's output), so no barrier is needed
  // between the reads and the writes.
  const Range mine_r = block_range(count, size_, rank_);
  const size_t piece_elems = std::max<size_t>(1, kPiece / es);
  const bool stream = bytes >= kStreamMin && out != in;
  tmp_.resize(2 * piece_elems * es);
  uint8_t* piece = tmp_.data();
  uint8_t* acc = tmp_.data() + piece_elems * es;
  for (size_t off = 0; off < mine_r.count; off += piece_elems) {
    GW_RETURN_IF_ERROR(check_stop(deadline, aborted));
    const size_t elems = std::min(piece_elems, mine_r.count - off);
    const size_t at = (mine_r.offset + off) * es;
    for (int k = 1; k < size_; ++k) {
      const int peer = (rank_ + k) % size_;
      GW_RETURN_IF_ERROR(
          shm_direct_read_peer(pids_[peer], peer, piece, d[peer].in + at, elems * es));
      reduce(dtype, op, k == 1 ? in + at : acc, piece, acc, elems);
    }
    if (op == ReduceOp::kAvg) finalize_avg(dtype, acc, elems, size_);
    copy_out(out + at, acc, elems * es, stream);
    for (int k = 1; k < size_; ++k) {
      const int peer = (rank_ + k) % size_;
      GW_RETURN_IF_ERROR(
          shm_direct_write_peer(pids_[peer], peer, acc, d[peer].out + at, elems * es));
    }
  }
  if (stream) finish_streaming();

  // 3. No rank hands its buffers back while a peer may still read or write them.
  return barrier(exchange);
}

Status ShmDirect::begin_call(const uint8_t* in, uint64_t in_bytes, const uint8_t* out,
                             uint64_t out_bytes, uint64_t bytes, const Exchange& exchange,
                             std::vector<CallDesc>* d, bool* ran) {
  *ran = false;
  if (state_ == State::kUnknown) GW_RETURN_IF_ERROR(probe(exchange));
  if (state_ != State::kOn) return ok_status();
  xbuf_.assign(static_cast<size_t>(size_) * sizeof(CallDesc), 0);
  CallDesc mine{kDescMagic, reinterpret_cast<uint64_t>(in), reinterpret_cast<uint64_t>(out),
                bytes,      ref_of(in, in_bytes),           ref_of(out, out_bytes)};
  // A heap buffer the peers will copy through the kernel, seen again: huge pages (no peer
  // touches it yet: they learn its address from the exchange below).
  const bool in_inside_out = in >= out && in + in_bytes <= out + out_bytes;  // allgather
  if (mine.in_ref.gen == 0 && !in_inside_out) huge_.note(in, in_bytes);
  if (mine.out_ref.gen == 0 && out != in) huge_.note(out, out_bytes);
  std::memcpy(xbuf_.data() + rank_ * sizeof(CallDesc), &mine, sizeof(mine));
  GW_RETURN_IF_ERROR(exchange(xbuf_.data(), sizeof(CallDesc)));
  GW_RETURN_IF_ERROR(decode_calls(xbuf_.data(), size_, rank_, bytes, d));
  *ran = true;
  return ok_status();
}

Status ShmDirect::barrier(const Exchange& exchange) {
  std::vector<uint8_t> flags(static_cast<size_t>(size_), 0);
  flags[rank_] = 1;
  return exchange(flags.data(), 1);
}

Status ShmDirect::copy_steps(uint8_t* dst, const uint8_t* src, size_t len, bool stream,
                             Deadline deadline, const std::atomic<bool>* aborted,
                             const char* what) {
  for (size_t off = 0; off < len; off += kGatherStep) {
    GW_RETURN_IF_ERROR(check_stop(deadline, aborted, what));
    copy_out(dst + off, src + off, std::min(kGatherStep, len - off), stream);
  }
  return ok_status();
}

Result<bool> ShmDirect::map_if_shared(const std::vector<CallDesc>& d, SharedRef CallDesc::*which,
                                      uint64_t bytes, std::vector<uint8_t*>* at,
                                      const Exchange& exchange, const char* what) {
  std::vector<PeerMapping> wants;
  if (!shared_peers(d, which, bytes, at, &wants)) return false;
  bool mapped = false;
  GW_RETURN_IF_ERROR(map_peers(wants, exchange, &mapped, what));
  return mapped;
}

Status ShmDirect::copy_peer_blocks(uint8_t* out, size_t blk, const std::vector<CallDesc>& d,
                                   uint64_t CallDesc::*buf, const std::vector<uint8_t*>* mapped,
                                   bool at_my_block, bool stream, Deadline deadline,
                                   const std::atomic<bool>* aborted, const char* what) {
  for (int k = 1; k < size_; ++k) {
    const int peer = (rank_ + k) % size_;
    const size_t from = static_cast<size_t>(at_my_block ? rank_ : peer) * blk;
    uint8_t* to = out + static_cast<size_t>(peer) * blk;
    if (mapped != nullptr) {
      GW_RETURN_IF_ERROR(
          copy_steps(to, (*mapped)[peer] + from, blk, stream, deadline, aborted, what));
      continue;
    }
    for (size_t off = 0; off < blk; off += kGatherStep) {
      GW_RETURN_IF_ERROR(check_stop(deadline, aborted, what));
      GW_RETURN_IF_ERROR(shm_direct_read_peer(pids_[peer], peer, to + off,
                                              d[peer].*buf + from + off,
                                              std::min(kGatherStep, blk - off), what));
    }
  }
  if (mapped != nullptr) finish_streaming();
  return ok_status();
}

Status ShmDirect::map_peers(const std::vector<PeerMapping>& wants, const Exchange& exchange,
                            bool* ok, const char* what) {
  *ok = false;
  ++use_clock_;
  std::string why;
  for (const PeerMapping& w : wants) {
    Result<uint8_t*> m = map_peer_buffer(w.peer, w.ref, w.bytes);
    if (!m.ok()) {
      why = fmt::format("rank {} could not map rank {}'s buffer: {}", rank_, w.peer,
                        m.status().message());
      break;
    }
    *w.at = m.value();
  }
  GW_ASSIGN_OR_RETURN(const int refused_by, first_refusal(exchange, why.empty(), "mapping"));
  if (refused_by >= 0) {
    shared_state_ = State::kOff;
    peer_regions_.clear();
    GW_LOG_WARN(
        "{} within the host: the ranks cannot map each other's gw_mem_alloc memory ({}); every "
        "rank goes on without mapping it (process_vm_readv or the ring)",
        what, why.empty() ? fmt::format("rank {} could not map a peer's buffer", refused_by) : why);
    return ok_status();
  }
  if (shared_state_ == State::kUnknown) {
    shared_state_ = State::kOn;
    GW_LOG_INFO(
        "{} within the host: buffers in gw_mem_alloc memory are mapped by every rank and read with "
        "no kernel copy",
        what);
  }
  *ok = true;
  g_shared_calls.fetch_add(1, std::memory_order_relaxed);
  return ok_status();
}

bool ShmDirect::shared_peers(const std::vector<CallDesc>& d, SharedRef CallDesc::*which,
                             uint64_t bytes, std::vector<uint8_t*>* at,
                             std::vector<PeerMapping>* wants) const {
  wants->clear();
  if (shared_state_ == State::kOff || d.empty()) return false;
  for (const CallDesc& c : d) {
    if ((c.*which).gen == 0) return false;
  }
  at->assign(d.size(), nullptr);
  for (int r = 0; r < static_cast<int>(d.size()); ++r) {
    if (r != rank_) wants->push_back({r, d[r].*which, bytes, &(*at)[r]});
  }
  return true;
}

Status ShmDirect::allgather(uint8_t* out, size_t blk, Deadline deadline,
                            const std::atomic<bool>* aborted, const Exchange& exchange, bool* ran) {
  *ran = false;
  const uint64_t total = static_cast<uint64_t>(blk) * static_cast<uint64_t>(size_);
  std::vector<CallDesc> d;
  bool on = false;
  GW_RETURN_IF_ERROR(begin_call(out + rank_ * blk, blk, out, total, blk, exchange, &d, &on));
  if (!on) return ok_status();
  // Every rank's own block is in its output already (the caller put it there before the
  // exchange) and no rank writes its own block during the call: each rank copies every peer's
  // block from the peer's output, mapped or with process_vm_readv (on the heap, one kernel copy
  // per byte where the ring makes two user copies; with huge pages, begin_call, the faster one:
  // docs/perf.md, "Heap buffers at the memory ceiling").
  std::vector<uint8_t*> outs;
  GW_ASSIGN_OR_RETURN(const bool mapped,
                      map_if_shared(d, &CallDesc::out_ref, total, &outs, exchange, "allgather"));
  *ran = true;
  g_calls.fetch_add(1, std::memory_order_relaxed);
  GW_RETURN_IF_ERROR(copy_peer_blocks(out, blk, d, &CallDesc::out, mapped ? &outs : nullptr,
                                      /*at_my_block=*/false, total >= kStreamMin, deadline, aborted,
                                      "allgather"));
  return barrier(exchange);  // no rank hands its output back while a peer still reads it
}

Status ShmDirect::reduce_scatter(const uint8_t* in, uint8_t* out, size_t recvcount, DataType dtype,
                                 ReduceOp op, Deadline deadline, const std::atomic<bool>* aborted,
                                 const Exchange& exchange, bool* ran) {
  const size_t es = dtype_size(dtype);
  const size_t blk = recvcount * es;
  const uint64_t total = static_cast<uint64_t>(blk) * static_cast<uint64_t>(size_);
  std::vector<CallDesc> d;
  GW_RETURN_IF_ERROR(begin_call(in, total, out, blk, total, exchange, &d, ran));
  if (!*ran) return ok_status();
  // Rank r writes block r of its output while its peers read the other blocks of its input:
  // an output that overlaps the input anywhere but at the rank's own block would change what they
  // read. Every rank sees every descriptor, so all of them decide alike and take the ring.
  for (int r = 0; r < size_; ++r) {
    const uint64_t i0 = d[r].in, o0 = d[r].out;
    const bool overlap = o0 < i0 + total && i0 < o0 + blk;
    if (blk && overlap && o0 != i0 + static_cast<uint64_t>(r) * blk) {
      *ran = false;
      return ok_status();
    }
  }
  // Every input in shared memory: map them and reduce from them directly; else read the peers'
  // pieces with process_vm_readv.
  std::vector<uint8_t*> ins;
  std::vector<PeerMapping> wants;
  bool mapped = false;
  if (shared_peers(d, &CallDesc::in_ref, total, &ins, &wants)) {
    GW_RETURN_IF_ERROR(map_peers(wants, exchange, &mapped, "reduce_scatter"));
  }
  g_calls.fetch_add(1, std::memory_order_relaxed);
  const size_t piece_elems = std::max<size_t>(1, kPiece / es);
  tmp_.resize(piece_elems * es);
  const size_t base = static_cast<size_t>(rank_) * blk;
  for (size_t off = 0; off < recvcount; off += piece_elems) {
    GW_RETURN_IF_ERROR(check_stop(deadline, aborted, "reduce_scatter"));
    const size_t elems = std::min(piece_elems, recvcount - off);
    const size_t at = base + off * es;
    const uint8_t* acc = in + at;
    for (int k = 1; k < size_; ++k) {
      const int peer = (rank_ + k) % size_;
      const uint8_t* theirs = tmp_.data();
      if (mapped) {
        theirs = ins[peer] + at;
      } else {
        GW_RETURN_IF_ERROR(shm_direct_read_peer(pids_[peer], peer, tmp_.data(), d[peer].in + at,
                                                elems * es, "reduce_scatter"));
      }
      reduce(dtype, op, acc, theirs, out + off * es, elems);
      acc = out + off * es;
    }
  }
  return barrier(exchange);  // no rank hands its input back while a peer still reads it
}

Status ShmDirect::alltoall(const uint8_t* in, uint8_t* out, size_t blk, Deadline deadline,
                           const std::atomic<bool>* aborted, const Exchange& exchange, bool* ran) {
  *ran = false;
  const uint64_t total = static_cast<uint64_t>(blk) * static_cast<uint64_t>(size_);
  std::vector<CallDesc> d;
  bool on = false;
  GW_RETURN_IF_ERROR(begin_call(in, total, out, total, blk, exchange, &d, &on));
  // Only out of place on every rank: rank j reads block j of this rank's input while this rank
  // writes its output.
  bool apart = on;
  for (const CallDesc& c : d) {
    apart = apart && (total == 0 || c.out >= c.in + total || c.in >= c.out + total);
  }
  if (!apart) return ok_status();
  // Block `rank` of every peer's input, mapped or with process_vm_readv.
  std::vector<uint8_t*> ins;
  GW_ASSIGN_OR_RETURN(const bool mapped,
                      map_if_shared(d, &CallDesc::in_ref, total, &ins, exchange, "alltoall"));
  *ran = true;
  g_calls.fetch_add(1, std::memory_order_relaxed);
  GW_RETURN_IF_ERROR(copy_peer_blocks(out, blk, d, &CallDesc::in, mapped ? &ins : nullptr,
                                      /*at_my_block=*/true, total >= kStreamMin, deadline, aborted,
                                      "alltoall"));
  return barrier(exchange);  // no rank hands its input back while a peer still reads it
}

Status ShmDirect::broadcast(uint8_t* buf, size_t bytes, int root, Deadline deadline,
                            const std::atomic<bool>* aborted, const Exchange& exchange, bool* ran) {
  *ran = false;
  std::vector<CallDesc> d;
  bool on = false;
  GW_RETURN_IF_ERROR(begin_call(buf, bytes, buf, bytes, bytes, exchange, &d, &on));
  // Only with the root's buffer in shared memory (allgather's reason: a cross-memory read of it
  // is slower than the ring's two copies at once).
  if (!on || shared_state_ == State::kOff || d[root].out_ref.gen == 0) return ok_status();
  uint8_t* root_buf = nullptr;
  std::vector<PeerMapping> wants;
  if (rank_ != root) wants.push_back({root, d[root].out_ref, bytes, &root_buf});
  GW_RETURN_IF_ERROR(map_peers(wants, exchange, ran, "broadcast"));
  if (!*ran) return ok_status();
  g_calls.fetch_add(1, std::memory_order_relaxed);
  if (rank_ != root) {
    GW_RETURN_IF_ERROR(
        copy_steps(buf, root_buf, bytes, bytes >= kStreamMin, deadline, aborted, "broadcast"));
    finish_streaming();
  }
  return barrier(exchange);  // the root keeps its buffer until every rank has read it
}

}  // namespace gw::coll
