// Allreduce among the ranks of one host over shm by reading the peers' buffers straight into the
// sum and writing the result straight into theirs (cross-memory attach, process_vm_readv and
// process_vm_writev), instead of streaming every byte through the ring buffers twice
// (docs/wire-shm.md, "Direct allreduce"). Rank i owns block i of the vector (block_range): it
// reads that block of every peer's input in cache-sized pieces, reduces each piece at once in
// cache, and writes it into its own output and every peer's; a barrier then keeps every buffer
// alive until no peer reads or writes it. The small exchanges (addresses, barriers) run over the
// communicator's connections, through the `Exchange` the communicator hands in, so they have its
// deadline and its peer-death reports. A heap buffer of 8 MiB or more seen a second time is
// turned into transparent huge pages (GW_SHM_HUGEPAGES, core/sys/huge_pages.h), which the peers'
// kernel copies pin 512 times less often.
//
// When every rank's input and output lie in shared host memory (gw_mem_alloc's, collectives/
// shared_host_memory.h), the ranks map each other's regions once and skip the kernel: rank i reads
// block i of every input with plain loads, reduces it in cache-sized pieces and writes the result
// into every rank's output with non-temporal stores; one barrier ends the call (docs/wire-shm.md,
// "Shared buffers"). A rank that cannot map a peer's region turns that for good, on every rank,
// back to the cross-memory copies.
//
// The first call that takes the path checks once whether every rank may read and write every
// other's memory (the kernel's ptrace access check: Yama's ptrace_scope, other users, a
// non-dumpable process, other pid namespaces; a seccomp filter); when any may not, every rank
// keeps the ring for good and says why once. Not thread-safe: the communicator calls it under its
// collective lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collectives/shared_host_memory.h"
#include "collectives/types.h"
#include "core/config_snapshot.h"
#include "core/status.h"
#include "core/sys/huge_pages.h"
#include "core/sys/memfd_region.h"
#include "core/sys/time.h"

namespace gw::coll {

using sys::Deadline;
using sys::expired;

struct ShmDirectOptions {
  size_t min_bytes = 0;        // GW_SHM_DIRECT_MIN; 0: never
  bool inject_refuse = false;  // GW_SHM_CMA_INJECT_REFUSE: the probe reads address 0
  bool hugepages = true;       // GW_SHM_HUGEPAGES
};

// GW_SHM_DIRECT_MIN, GW_SHM_HUGEPAGES and GW_SHM_CMA_INJECT_REFUSE from the communicator's
// settings.
ShmDirectOptions shm_direct_options(const config::Snapshot& config);

// Reads len bytes at `remote` in process pid (rank `peer`) into `local`. A peer that is gone or
// dying (its memory already released) is kPeer, and so is one whose buffer is no longer mapped;
// other failures are kInternal.
// `what` names the collective in the errors.
Status shm_direct_read_peer(int64_t pid, int peer, void* local, uint64_t remote, size_t len,
                            const char* what = "allreduce");
// Writes len bytes from `local` to `remote` in process pid (rank `peer`); errors as
// shm_direct_read_peer's (a buffer no longer mapped, or not writable, is kPeer).
Status shm_direct_write_peer(int64_t pid, int peer, const void* local, uint64_t remote, size_t len,
                             const char* what = "allreduce");

// Gathers every rank's `blk` bytes at buf + r * blk (this rank's already there) to every rank.
using Exchange = std::function<Status(uint8_t* buf, size_t blk)>;

class ShmDirect {
 public:
  enum class State { kUnknown, kOn, kOff };

  ShmDirect(int rank, int size, ShmDirectOptions options)
      : rank_(rank), size_(size), options_(options), huge_(options.hugepages) {}

  // Set by the communicator once it knows every link of the group is shm within one host.
  void set_eligible(bool eligible) { eligible_ = eligible; }
  // Whether an allreduce of `bytes` takes this path (the same answer on every rank of a group
  // whose ranks agree on GW_SHM_DIRECT_MIN).
  bool wants(size_t bytes) const {
    return eligible_ && options_.min_bytes > 0 && bytes >= options_.min_bytes &&
           state_ != State::kOff && size_ > 1;
  }
  // The allreduce (in == out in place). When the first call's probe finds that some rank may not
  // read another's memory, it returns ok with *ran = false and the caller runs the ring instead
  // (every rank alike). A peer gone mid-call is kPeer; the deadline kTimeout; abort kAborted.
  Status allreduce(const uint8_t* in, uint8_t* out, size_t count, DataType dtype, ReduceOp op,
                   Deadline deadline, const std::atomic<bool>* aborted, const Exchange& exchange,
                   bool* ran);

  // The other collectives of one host (docs/wire-shm.md, "Direct allgather, reduce-scatter,
  // broadcast and alltoall"), each one copy per byte where the ring makes two, and one barrier at
  // the end (no rank hands a buffer back while a peer still reads it). *ran, errors and the probe
  // as allreduce's; the caller decides with wants() on the call's whole buffer.
  // allgather: every rank's own block already at out + rank * blk (the caller moved it there),
  // each rank copies the others' blocks from their outputs: from their mappings when every
  // rank's output lies in shared host memory (gw_mem_alloc's), else with process_vm_readv.
  Status allgather(uint8_t* out, size_t blk, Deadline deadline, const std::atomic<bool>* aborted,
                   const Exchange& exchange, bool* ran);
  // reduce_scatter: block `rank` (recvcount elements) of every rank's input reduced into out,
  // read with process_vm_readv, or from the mapped inputs when all are in shared host memory.
  // An output that overlaps its input elsewhere than at its rank's block (on any rank) sends
  // every rank to the ring (*ran = false).
  Status reduce_scatter(const uint8_t* in, uint8_t* out, size_t recvcount, DataType dtype,
                        ReduceOp op, Deadline deadline, const std::atomic<bool>* aborted,
                        const Exchange& exchange, bool* ran);
  // alltoall: only when no rank's output overlaps its input (else *ran = false: the pairwise
  // exchange): rank i copies block i of every peer's input into its output (its own block
  // already there: the caller copied it), from their mappings when every input lies in shared
  // host memory, else with process_vm_readv.
  Status alltoall(const uint8_t* in, uint8_t* out, size_t blk, Deadline deadline,
                  const std::atomic<bool>* aborted, const Exchange& exchange, bool* ran);
  // broadcast: only when the root's buffer lies in shared host memory: every other rank copies
  // it from the mapping. Else *ran = false: the ring.
  Status broadcast(uint8_t* buf, size_t bytes, int root, Deadline deadline,
                   const std::atomic<bool>* aborted, const Exchange& exchange, bool* ran);

  State state() const { return state_; }
  // Whether gw_mem_alloc should hand out shared host memory for this communicator: the path may
  // run (fixed once set_eligible has been called, so any thread may ask).
  bool maps_shared_buffers() const { return eligible_ && options_.min_bytes > 0 && size_ > 1; }
  // Peers' regions this rank has mapped now (tests).
  size_t peer_regions() const { return peer_regions_.size(); }

  // Process-wide counters (tests and perf check which path ran): calls that ran the direct path,
  // and bytes read from peers and written into theirs by it.
  static uint64_t calls();
  static uint64_t bytes_read();
  static uint64_t bytes_written();
  // Calls that ran on shared buffers (no cross-memory reads).
  static uint64_t shared_calls();

  // One rank's buffer in the per-call exchange: where it lies in a shared region (gen 0: not in
  // one).
  using SharedRef = shared_host_memory::Ref;
  // The first word of every descriptor the exchanges carry.
  static constexpr uint64_t kCallMagic = 0x4357445247ull;  // "GRDWC"
  // One rank's buffers in the per-call exchange (its bytes as they travel).
  struct CallDesc {
    uint64_t magic;
    uint64_t in;
    uint64_t out;
    uint64_t bytes;
    SharedRef in_ref;   // gen 0: the input is not in shared host memory
    SharedRef out_ref;  // the same for the output
  };
  // The n ranks' descriptors of a call of `bytes` bytes from the exchange's n * sizeof(CallDesc)
  // bytes (this is rank `rank`): kInternal for a corrupt one, kInvalidArg when the ranks disagree
  // on the size. The references are not checked here (check_ref, when a rank maps them).
  static Status decode_calls(const uint8_t* buf, int n, int rank, uint64_t bytes,
                             std::vector<CallDesc>* d);
  // Whether every rank's input and output lie in shared regions (false for none).
  static bool all_shared(const std::vector<CallDesc>& d);
  // Whether a peer's reference can name `bytes` bytes of a region this rank may map: fd >= 0,
  // offset + bytes within region_bytes (no overflow), gen > 0. The empty string when so, else why.
  static std::string check_ref(const SharedRef& ref, uint64_t bytes);

 private:
  // Every rank publishes its pid and the address of a known word; each reads every peer's word;
  // every rank publishes whether all its reads worked. kOn only when all did.
  Status probe(const Exchange& exchange);
  // Every rank's verdict (this one's: mine_ok), so that all ranks choose alike: the first rank
  // that said no, or -1. `what` names the verdict in the error for a corrupt one.
  Result<int> first_refusal(const Exchange& exchange, bool mine_ok, const char* what) const;
  // The shared-buffer call (class comment), after the buffer exchange `d` (every rank's
  // descriptor). *ran = false when some rank could not map a peer's region: nothing was written,
  // the caller goes on with the cross-memory reads.
  Status allreduce_shared(const uint8_t* in, uint8_t* out, size_t count, DataType dtype,
                          ReduceOp op, Deadline deadline, const std::atomic<bool>* aborted,
                          const std::vector<CallDesc>& d, const Exchange& exchange, bool* ran);
  // The start of the other collectives' calls: the probe when none ran yet, then every rank's
  // descriptor {in, out, bytes, where in and out lie in shared regions} into *d. *ran = false
  // (and nothing exchanged) when the path is refused on this host.
  Status begin_call(const uint8_t* in, uint64_t in_bytes, const uint8_t* out, uint64_t out_bytes,
                    uint64_t bytes, const Exchange& exchange, std::vector<CallDesc>* d, bool* ran);
  // A barrier over the exchange (one byte per rank): every rank has reached it.
  Status barrier(const Exchange& exchange);
  // len bytes from src (a peer's mapped buffer) to dst, in kGatherStep steps that look at the
  // deadline and abort between them; non-temporal stores when `stream`.
  Status copy_steps(uint8_t* dst, const uint8_t* src, size_t len, bool stream, Deadline deadline,
                    const std::atomic<bool>* aborted, const char* what);
  // shared_peers, then map_peers: true (the addresses in *at) when every rank mapped the peers'
  // `which` buffers, false (every rank alike) when they are not all shared or some rank could
  // not map them.
  Result<bool> map_if_shared(const std::vector<CallDesc>& d, SharedRef CallDesc::*which,
                             uint64_t bytes, std::vector<uint8_t*>* at, const Exchange& exchange,
                             const char* what);
  // For every peer, blk bytes of its buffer `buf` (CallDesc::in or ::out) at its block, or at
  // this rank's block when at_my_block, into out at the peer's block: from the mappings in
  // *mapped (non-temporal stores when `stream`), or, mapped null, with process_vm_readv;
  // kGatherStep at a time, the deadline and abort looked at between.
  Status copy_peer_blocks(uint8_t* out, size_t blk, const std::vector<CallDesc>& d,
                          uint64_t CallDesc::*buf, const std::vector<uint8_t*>* mapped,
                          bool at_my_block, bool stream, Deadline deadline,
                          const std::atomic<bool>* aborted, const char* what);
  // A peer's buffer to map: `bytes` at `ref` in rank `peer`'s region, its address here into *at.
  struct PeerMapping {
    int peer;
    SharedRef ref;
    uint64_t bytes;
    uint8_t** at;
  };
  // Maps every wanted buffer, then every rank's verdict: *ok = false on every rank when any could
  // not (shared_state_ off for good, one WARN naming `what`; nothing was written).
  Status map_peers(const std::vector<PeerMapping>& wants, const Exchange& exchange, bool* ok,
                   const char* what);
  // The peers' `which` buffers (`bytes` each) as mappings to ask for, their addresses into
  // (*at)[peer]: false, and nothing in *wants, unless the path maps shared buffers and every
  // rank's (d: begin_call's descriptors) is in shared memory.
  bool shared_peers(const std::vector<CallDesc>& d, SharedRef CallDesc::*which, uint64_t bytes,
                    std::vector<uint8_t*>* at, std::vector<PeerMapping>* wants) const;
  // Rank `peer`'s region that `ref` names, mapped here (once; kept for later calls, the least
  // recently used let go beyond a few per peer), and the buffer's address in this process.
  Result<uint8_t*> map_peer_buffer(int peer, const SharedRef& ref, uint64_t bytes);

  struct PeerRegion {
    int rank = -1;
    uint64_t gen = 0;
    uint64_t ino = 0;
    uint64_t last_use = 0;
    sys::MemfdRegion region;
  };

  int rank_;
  int size_;
  ShmDirectOptions options_;
  bool eligible_ = false;
  State state_ = State::kUnknown;
  std::vector<int64_t> pids_;             // every rank's pid, from the probe
  sys::HugePageCollapser huge_;           // this rank's heap buffers (begin_call)
  std::vector<uint8_t> tmp_;              // cache-sized pieces: a peer's block, the sum
  std::vector<uint8_t> xbuf_;             // exchange buffer
  State shared_state_ = State::kUnknown;  // mapping peers' shared regions: works / refused
  std::vector<PeerRegion> peer_regions_;
  uint64_t use_clock_ = 0;  // one tick per shared call, for peer_regions_' last_use
};

}  // namespace gw::coll
