#include "collectives/shm_direct.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "collectives/coll_config.h"
#include "collectives/reduce.h"
#include "collectives/schedule.h"
#include "core/log.h"
#include "core/net/shm_cma.h"
#include "core/net/shm_config.h"

namespace gw::coll {
namespace {

std::atomic<uint64_t> g_calls{0};
std::atomic<uint64_t> g_bytes_read{0};

// What a peer reads to learn that it may read this process's memory.
constexpr uint64_t kProbeValue = 0x31544345524944ull;  // "DIRECT1"
const volatile uint64_t g_probe_word = kProbeValue;

// A piece of a peer's block read at a time in the reduction: it stays in cache between the read
// and the sum.
constexpr size_t kPiece = size_t{256} * 1024;
// The gather reads at most this much per call, so the deadline and abort are looked at often.
constexpr size_t kGatherStep = size_t{8} << 20;

constexpr uint64_t kDescMagic = 0x4357445247ull;  // "GRDWC"

struct ProbeDesc {
  uint64_t magic;
  int64_t pid;
  uint64_t probe_addr;
};

struct CallDesc {
  uint64_t magic;
  uint64_t in;
  uint64_t out;
  uint64_t bytes;
};

}  // namespace

Status shm_direct_read_peer(int64_t pid, int peer, void* local, uint64_t remote, size_t len) {
  auto* dst = static_cast<char*>(local);
  size_t done = 0;
  while (done < len) {
    iovec l{dst + done, len - done};
    iovec r{reinterpret_cast<void*>(remote + done), len - done};
    ssize_t n = process_vm_readv(static_cast<pid_t>(pid), &l, 1, &r, 1, 0);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      if (err == ESRCH || (err == EFAULT && net::shm::peer_exiting(pid))) {
        return peer_error("allreduce: rank {} (pid {}) is gone: connection closed by peer", peer,
                          pid);
      }
      if (err == EFAULT) {
        return peer_error(
            "allreduce: rank {}'s buffer (pid {}, {} bytes at {:#x}) is no longer mapped: it "
            "freed or unmapped its buffer before the collective ended",
            peer, pid, len - done, remote + done);
      }
      return internal_error("allreduce: reading rank {}'s buffer (pid {}) failed: {}", peer, pid,
                            std::strerror(err));
    }
    if (n == 0) {
      return internal_error("allreduce: rank {}'s buffer ends early ({} of {} bytes)", peer, done,
                            len);
    }
    done += static_cast<size_t>(n);
  }
  g_bytes_read.fetch_add(len, std::memory_order_relaxed);
  return ok_status();
}

namespace {

Status check_stop(Deadline deadline, const std::atomic<bool>* aborted) {
  if (aborted && aborted->load(std::memory_order_relaxed)) {
    return aborted_error("allreduce: communicator aborted");
  }
  if (expired(deadline)) return timeout_error("allreduce: deadline passed reading peers' buffers");
  return ok_status();
}

}  // namespace

ShmDirectOptions shm_direct_options(const config::Snapshot& config) {
  ShmDirectOptions o;
  o.min_bytes =
      static_cast<size_t>(std::max<int64_t>(0, config.get_int(coll_config::kShmDirectMin)));
  o.inject_refuse = config.get_bool(net::shm_config::kShmCmaInjectRefuse);
  return o;
}

uint64_t ShmDirect::calls() { return g_calls.load(std::memory_order_relaxed); }
uint64_t ShmDirect::bytes_read() { return g_bytes_read.load(std::memory_order_relaxed); }

Status ShmDirect::probe(const Exchange& exchange) {
  const size_t n = static_cast<size_t>(size_);
  xbuf_.assign(n * sizeof(ProbeDesc), 0);
  ProbeDesc mine{kDescMagic, static_cast<int64_t>(getpid()),
                 reinterpret_cast<uint64_t>(&g_probe_word)};
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
    }
  }
  // Everyone's verdict, so that all ranks choose alike.
  std::vector<uint8_t> ok(n, 0);
  ok[rank_] = why.empty() ? 1 : 2;
  GW_RETURN_IF_ERROR(exchange(ok.data(), 1));
  int refused_by = -1;
  for (int r = 0; r < size_; ++r) {
    if (ok[r] != 1 && ok[r] != 2) return internal_error("allreduce: corrupt probe verdict");
    if (ok[r] == 2 && refused_by < 0) refused_by = r;
  }
  if (refused_by < 0) {
    state_ = State::kOn;
    GW_LOG_INFO(
        "allreduce within the host: ranks read each other's buffers straight into the sum "
        "(process_vm_readv) from {} bytes (GW_SHM_DIRECT_MIN)",
        options_.min_bytes);
  } else {
    state_ = State::kOff;
    GW_LOG_WARN(
        "allreduce within the host: cross-memory reads refused ({}); every rank keeps the ring "
        "(ptrace_scope, different users or a container can cause this; GW_SHM_DIRECT_MIN=0 "
        "silences this)",
        why.empty() ? fmt::format("rank {} could not read a peer's memory", refused_by) : why);
  }
  return ok_status();
}

Status ShmDirect::allreduce(const uint8_t* in, uint8_t* out, size_t count, DataType dtype,
                            ReduceOp op, Deadline deadline, const std::atomic<bool>* aborted,
                            const Exchange& exchange, bool* ran) {
  *ran = false;
  if (state_ == State::kUnknown) GW_RETURN_IF_ERROR(probe(exchange));
  if (state_ != State::kOn) return ok_status();
  *ran = true;
  g_calls.fetch_add(1, std::memory_order_relaxed);
  const size_t es = dtype_size(dtype);
  const size_t bytes = count * es;
  const size_t n = static_cast<size_t>(size_);

  // 1. Everyone's buffers (and the proof that every rank has entered the call).
  xbuf_.assign(n * sizeof(CallDesc), 0);
  CallDesc mine{kDescMagic, reinterpret_cast<uint64_t>(in), reinterpret_cast<uint64_t>(out), bytes};
  std::memcpy(xbuf_.data() + rank_ * sizeof(CallDesc), &mine, sizeof(mine));
  GW_RETURN_IF_ERROR(exchange(xbuf_.data(), sizeof(CallDesc)));
  std::vector<CallDesc> d(n);
  for (size_t r = 0; r < n; ++r) {
    std::memcpy(&d[r], xbuf_.data() + r * sizeof(CallDesc), sizeof(CallDesc));
    if (d[r].magic != kDescMagic) {
      return internal_error("allreduce: rank {} sent a corrupt buffer descriptor", r);
    }
    if (d[r].bytes != bytes) {
      return invalid_arg("allreduce: ranks disagree on count: rank {} has {} bytes, rank {} {}",
                         rank_, bytes, r, d[r].bytes);
    }
  }

  // 2. This rank's block: out = in op peer_1 op peer_2 ..., piece by piece.
  const Range mine_r = block_range(count, size_, rank_);
  const size_t piece_elems = std::max<size_t>(1, kPiece / es);
  tmp_.resize(piece_elems * es);
  for (size_t off = 0; off < mine_r.count; off += piece_elems) {
    GW_RETURN_IF_ERROR(check_stop(deadline, aborted));
    const size_t elems = std::min(piece_elems, mine_r.count - off);
    const size_t at = (mine_r.offset + off) * es;
    const uint8_t* acc = in + at;
    for (int k = 1; k < size_; ++k) {
      const int peer = (rank_ + k) % size_;
      GW_RETURN_IF_ERROR(
          shm_direct_read_peer(pids_[peer], peer, tmp_.data(), d[peer].in + at, elems * es));
      reduce(dtype, op, acc, tmp_.data(), out + at, elems);
      acc = out + at;
    }
  }
  if (op == ReduceOp::kAvg && mine_r.count) {
    finalize_avg(dtype, out + mine_r.offset * es, mine_r.count, size_);
  }

  // 3. Every block is reduced before anyone reads it (and no one still reads an input block that
  // its owner's gather would overwrite in place).
  std::vector<uint8_t> flags(n, 0);
  flags[rank_] = 1;
  GW_RETURN_IF_ERROR(exchange(flags.data(), 1));

  // 4. The other blocks, from their owners' outputs straight into this one.
  for (int k = 1; k < size_; ++k) {
    const int peer = (rank_ + k) % size_;
    const Range r = block_range(count, size_, peer);
    const size_t base = r.offset * es, len = r.count * es;
    for (size_t off = 0; off < len; off += kGatherStep) {
      GW_RETURN_IF_ERROR(check_stop(deadline, aborted));
      const size_t step = std::min(kGatherStep, len - off);
      GW_RETURN_IF_ERROR(shm_direct_read_peer(pids_[peer], peer, out + base + off,
                                              d[peer].out + base + off, step));
    }
  }

  // 5. No rank hands its buffers back while a peer may still read them.
  std::fill(flags.begin(), flags.end(), 0);
  flags[rank_] = 1;
  return exchange(flags.data(), 1);
}

}  // namespace gw::coll
