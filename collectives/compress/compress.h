// Compressed allreduce over the public Communicator API, with per-tensor error-feedback state.
//
// A Compressor belongs to one Communicator (it borrows it; the owner destroys the Compressor
// first) and keeps, per tensor key, the codec, the worker residual, the sign codec's server
// residual and PowerSGD's warm-start Q. All of it is freed with the Compressor.
//
// allreduce(buf, count, dtype, spec, key) is collective: every rank calls it in the same order
// with the same count, dtype, spec and key. On return every rank's buf holds the same values:
// the sum over ranks of what each rank's codec delivered (the decoded compressed gradients). What
// the codec could not deliver stays in that rank's residual and is added to the next call with
// the same key (error feedback). How each codec is aggregated:
//   fp16/bf16   encode (cast) -> allreduce in f16/bf16 (f32 accumulation in the ring) -> widen
//   randomk     shared-seed indices (same on every rank) -> allreduce of the k f32 values
//   topk, qsgd  encode -> allgather of the encodings -> decode-and-sum in rank order
//   sign        1-bit Adam: worker encode per partition (worker EF) -> all-to-all of the
//               partitions (partition j of every worker goes to rank j) -> each rank decodes and
//               sums its partition from every worker, re-encodes it with its server EF ->
//               allgather of the server partitions -> decode
//   powersgd    P = M Q allreduced, orthogonalised; Q = M^T P allreduced; result P Q^T; EF
//               residual M - P Q_local^T; Q kept for the next step (warm start)
//   none        plain allreduce
// The first call with a key checks with one tiny allgather that every rank passes the same spec,
// key, count and dtype (kInvalidArg naming the first rank that differs); a key reused later with
// another spec, count or dtype is kInvalidArg on every rank without communication.
//
// Byte accounting (stats()): bytes_sent is the payload this rank hands to the transport for
// compressed collectives, derived from the volume the ring/RHD schedules send per rank:
// allreduce of B bytes sends 2(p-1)/p * B, allgather of B bytes per rank sends (p-1) * B,
// all-to-all of B bytes per destination block sends (p-1) * B (the own block is a local copy).
// bytes_uncompressed is what the same allreduce without compression would have sent:
// 2(p-1)/p * count * dtype_size. Both are 0 when p == 1. calls counts allreduce() calls.
//
// Hierarchical form (GW_COMPRESS_HIER: auto, the default, when the communicator spans more than
// one host and some host has several ranks; on: whenever it spans more than one host; off: never).
// Only what crosses hosts is compressed; a host's ranks are summed exactly (in f32):
//   hosts of equal size S (shards): reduce_scatter within the host gives local rank i the host's
//     exact sum of shard i (count split in S shards of ceil(count/S), zero-padded); the ranks with
//     local index i (one per host) run the codec above on that shard (error feedback, PowerSGD's
//     Q, sign's server residual: per rank, under "<key>#<i>"); allgather within the host.
//   hosts of unequal size (leader): allreduce within the host; local rank 0 of every host runs the
//     codec on the whole host sum (state under "<key>#0"); broadcast within the host.
// The sub-communicators (split from this one: host, and local index across hosts) are made by
// the first call that needs them and kept. "none" stays the communicator's own allreduce, and the
// externally encoded forms below (GPU memory) stay flat. Every rank still ends with the same bits.
// Byte accounting counts both legs: the exact intra-host collectives (f32, with the formulas
// above, reduce_scatter of B per rank (p-1) * B, chain broadcast B per rank but the chain's last)
// plus the codec's exchange over the inter-host ranks; bytes_uncompressed stays the flat f32
// (or f16/bf16) allreduce over the whole communicator.
//
// Threading: calls are serialised on an internal mutex (the Communicator serialises too);
// stats() and reset_stats() are safe from any thread. Every wait is the Communicator's, so it has
// its deadline; a failed collective leaves the residuals of that key in an unspecified but finite
// state and the Communicator unusable, as any failed collective does.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/compress/codec.h"
#include "core/config_snapshot.h"
#include "core/status.h"

namespace gw::coll {

struct CompressStats {
  uint64_t bytes_sent = 0;
  uint64_t bytes_uncompressed = 0;
  uint64_t calls = 0;
  uint64_t nonfinite_steps = 0;  // calls summed uncompressed for a NaN/Inf input (nonfinite=skip)
};

// Per-rank send volume of the collectives the compressed allreduce uses (see above).
uint64_t allreduce_send_bytes(uint64_t bytes, int nranks);
uint64_t allgather_send_bytes(uint64_t bytes_per_rank, int nranks);
uint64_t alltoall_send_bytes(uint64_t bytes_per_block, int nranks);
uint64_t reduce_scatter_send_bytes(uint64_t bytes_per_rank, int nranks);
// A chain broadcast: every rank but the chain's last (position nranks-1 from the root) sends B.
uint64_t broadcast_send_bytes(uint64_t bytes, int nranks, int position_from_root);

class Compressor {
 public:
  // fp16/bf16 tensors of at least 2 slices (spec option slice, this by default) are reduced slice
  // by slice, the casts overlapping the exchange (see run_cast_pipelined in compress.cc).
  static constexpr size_t kCastSlice = kDefaultCastSlice;  // elements

  // How the compressed allreduce of host-memory keys runs (see "Hierarchical form" above).
  enum class HierForm { kFlat, kShards, kLeader };

  // config: the settings read (GW_COMPRESS_HIER); empty: resolved now.
  explicit Compressor(Communicator* comm, const config::Snapshot& config = {});
  HierForm hier_form() const { return hier_; }
  ~Compressor();
  Compressor(const Compressor&) = delete;
  Compressor& operator=(const Compressor&) = delete;

  // In place; buf holds count elements of dtype (kF32, kF16 or kBF16; others are kInvalidArg).
  // spec: see codec.h. key: non-empty name of the tensor (error-feedback state lives under it).
  Status allreduce(void* buf, size_t count, DataType dtype, std::string_view spec,
                   std::string_view key);

  // For a caller that encodes and decodes a cast codec (fp16/bf16) itself, asynchronously, on
  // memory this class cannot touch (gpudirect/'s DeviceCompression: its kernels run the casts
  // and the error feedback on the device; a stream encodes slice s+1 and copies it to the host
  // while the ring sums slice s, and copies slice s-1 back and widens it meanwhile). Checks the
  // key as allreduce() does (on its first use every rank must agree; later uses must match spec,
  // count and dtype); the key is then marked as encoded elsewhere: allreduce() with it is
  // kInvalidArg, and vice versa. `spec` must be fp16 or bf16, dtype the caller's buffer dtype
  // (kF32), `wire` host memory of count halves. The same byte counts, and the same sum as
  // allreduce() bit for bit: the tensor is cut into the slices allreduce() uses for
  // this spec and count (the spec's slice option; one slice when it is 0 or the tensor is shorter
  // than two slices), each reduced by an allreduce of its own as allreduce() reduces it. After
  // the check (a refused call calls no hook), per slice s (elements [offset, offset + len) of
  // `wire`), on the calling thread, in this order:
  //   start(s, offset, len)  begin writing this rank's encoding of the slice into `wire`; may
  //                          return before it is there. start(s + 1) is called before ready(s),
  //                          start(s + 2) only after ready(s) returned: at most two slices are
  //                          started and not yet ready.
  //   ready(s, offset, len)  block (with a deadline) until the slice's encoding is in `wire`;
  //                          then its exchange starts (on the communicator's progress thread).
  //   done(s, offset, len)   the slice holds the sum; the Compressor no longer touches it. Called
  //                          for s - 1 after ready(s) (the exchanges queue back to back), in
  //                          slice order.
  // The first error, a hook's or a slice's exchange's (with the slice named), ends the call: no
  // hook runs after it, and the call returns only once no exchange it started can still touch
  // `wire`. Slices started but not done are the caller's to clean up (wait for its own work).
  struct CastSliceHooks {
    std::function<Status(size_t slice, size_t offset, size_t len)> start;
    std::function<Status(size_t slice, size_t offset, size_t len)> ready;
    std::function<Status(size_t slice, size_t offset, size_t len)> done;
  };
  Status allreduce_cast_encoded_sliced(uint16_t* wire, size_t count, DataType dtype,
                                       std::string_view spec, std::string_view key,
                                       const CastSliceHooks& hooks);

  // sign (1-bit Adam's two phases) for a caller that makes the worker side's encode and decode
  // itself, on memory this class cannot touch (gpudirect/'s DeviceCompression: its sign kernels,
  // with the worker residual on the device). Checks the key as allreduce() does (the key is then
  // marked as encoded elsewhere, as for the cast form), then:
  //   encode(blob, slot_bytes, parts)  write this rank's encoding of partition j (elements
  //       [parts[j].offset, + parts[j].len) of its tensor, with its worker error feedback) at
  //       blob + j * slot_bytes, for every j with len > 0; blob (host memory, p slots) is zeroed.
  //   decode(blob, slot_bytes, parts)  the sum: slot j holds partition j's server encoding;
  //       decode each into place (every element of the tensor is in one partition).
  // Between them the all-to-all, the server step (merge with the server residual, kept here) and
  // the allgather run as in allreduce(), with the same byte counts. With the CPU's encode and
  // decode the result is allreduce()'s bit for bit. f32 tensors only.
  struct Partition {
    size_t offset;
    size_t len;
  };
  struct TwoPhaseHooks {
    std::function<Status(uint8_t* blob, size_t slot_bytes, const std::vector<Partition>& parts)>
        encode;
    std::function<Status(const uint8_t* blob, size_t slot_bytes,
                         const std::vector<Partition>& parts)>
        decode;
  };
  Status allreduce_two_phase_encoded(size_t count, DataType dtype, std::string_view spec,
                                     std::string_view key, const TwoPhaseHooks& hooks);

  CompressStats stats() const;
  void reset_stats();
  size_t num_keys() const;
  // The worker residual of a key (empty when none): exposed for tests of the EF invariant.
  std::vector<float> residual(std::string_view key) const;

 private:
  struct TensorState;
  // Wall time per phase of the current call, logged at debug level (GW_LOG_LEVEL=debug), so a
  // slow codec shows where its time goes without a profiler.
  struct PhaseTimes {
    enum { kEncode, kExchange, kDecode, kCount };
    PhaseTimes();
    std::chrono::steady_clock::time_point last;
    double last_cpu_ms = 0;  // the calling thread's CPU time at the previous mark
    double ms[kCount] = {0, 0, 0};
    double cpu_ms[kCount] = {0, 0, 0};  // the calling thread's CPU time in each phase
    void mark(int phase);  // charges the wall and CPU time since the previous mark to phase
  };
  // The flat algorithms run over `net`: the whole communicator, or in the hierarchical form the
  // ranks that exchange one shard across hosts.
  Status run(Communicator& net, TensorState& t, float* x);
  Status run_summable(Communicator& net, TensorState& t, float* x);
  Status run_cast_pipelined(Communicator& net, TensorState& t, float* x);
  // The fp16/bf16 slice length for spec and count: spec.slice when the tensor holds at least two
  // slices, else the whole tensor (one slice). The host path and the externally encoded one must
  // cut the same slices to give the same bits.
  static size_t cast_slice_len(const CodecSpec& spec, size_t count);
  // The slice schedule both share: the hooks in the order allreduce_cast_encoded_sliced documents,
  // each slice's exchange an iallreduce (a blocking allreduce where there is none); errors name
  // the slice; returns only when no exchange it started can still touch `wire`. Counts the bytes.
  Status run_cast_slices(Communicator& net, uint16_t* wire, DataType wire_dtype, size_t count,
                         size_t slice_len, const CastSliceHooks& hooks);
  Status run_gather(Communicator& net, TensorState& t, float* x);
  Status run_two_phase(Communicator& net, TensorState& t, float* x);
  Status run_two_phase(Communicator& net, TensorState& t, const TwoPhaseHooks& hooks);
  // Sign's partitions of t (chunk-aligned, one per rank, the last ones possibly empty) and the
  // fixed size of one partition's slot in the exchanged blobs.
  static std::vector<Partition> two_phase_partitions(const Communicator& net, const TensorState& t);
  static size_t two_phase_slot_bytes(const Communicator& net, const TensorState& t);
  Status run_low_rank(Communicator& net, TensorState& t, float* x);
  // The hierarchical form (see "Hierarchical form" above): exact sum within the host, t's
  // inter-host state compressed over cross_, exact spread within the host.
  Status run_hier(TensorState& t, float* x);
  // Splits local_ and cross_ from comm_ on the first hierarchical call (collective: every rank
  // makes that call, as every rank makes every compressed call).
  Status ensure_hier_comms();
  // t's inter-host state (the shard or, for the leader form, the whole tensor this rank
  // compresses), made on first use under the key "<key>#<shard>", without communication (t's
  // agreement covers it).
  TensorState& inter_state(TensorState& t, size_t shard, size_t offset, size_t len);
  Result<TensorState*> state_for(std::string_view key, const CodecSpec& spec, size_t count,
                                 DataType dtype, bool external = false);
  void count_sent(uint64_t bytes) { bytes_sent_.fetch_add(bytes, std::memory_order_relaxed); }

  Communicator* comm_;
  HostLayout layout_;
  HierForm hier_ = HierForm::kFlat;      // for host-memory keys; external keys are flat
  std::unique_ptr<Communicator> local_;  // this rank's host (hierarchical form)
  std::unique_ptr<Communicator> cross_;  // the inter-host exchange; null: not in it
  bool hier_comms_ready_ = false;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<TensorState>, std::less<>> tensors_;
  std::vector<float> work_;      // f32 copy of f16/bf16 buffers
  std::vector<uint8_t> enc_;     // this rank's encoding
  std::vector<uint8_t> gather_;  // received encodings (sign: this rank's partition per worker)
  std::vector<uint8_t> server_;  // sign: this rank's re-encoded partition
  std::vector<float> hier_buf_;  // the padded tensor when count is not a multiple of the shards
  std::vector<float> shard_;     // this rank's shard of the host sum
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_uncompressed_{0};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> nonfinite_steps_{0};
  PhaseTimes phases_;  // of the call in progress (under mu_)
};

}  // namespace gw::coll
