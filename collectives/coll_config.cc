#include "collectives/coll_config.h"

#include "collectives/algorithms.h"

namespace gw::coll::coll_config {

using config::Type;

namespace {

// The value must name an entry of the collective's table (or be auto).
template <Collective kKind>
Status check_collective_algo(std::string_view text) {
  return parse_collective_algo(kKind, text).status();
}

}  // namespace

constinit const config::Row kSpinUs{
    "GW_SPIN_US", Type::Int, "50", "",
    "microseconds to busy-poll before yielding the CPU while waiting"};
constinit const config::Row kAlgo{
    "GW_ALGO", Type::String, "auto", "",
    "allreduce algorithm: auto (cost model), ring, rhd (recursive halving-doubling), "
    "host_ring, hier, hier_leader, tree (double binary tree), bblocks (binary blocks), pair (2 "
    "ranks: one exchange)"};
constinit const config::Row kAlgoBroadcast{
    "GW_ALGO_BROADCAST",
    Type::String,
    "auto",
    "",
    "broadcast algorithm: auto (cost model), ring (pipelined chain in rank order), hier (chain "
    "in host order; same number of ranks on every host, several hosts)",
    &check_collective_algo<Collective::kBroadcast>};
constinit const config::Row kAlgoAllgather{
    "GW_ALGO_ALLGATHER",
    Type::String,
    "auto",
    "",
    "allgather algorithm: auto (cost model), ring, hier (ring across hosts per local rank, then "
    "within the host; same number of ranks on every host, several hosts)",
    &check_collective_algo<Collective::kAllgather>};
constinit const config::Row kAlgoReduceScatter{
    "GW_ALGO_REDUCE_SCATTER",
    Type::String,
    "auto",
    "",
    "reduce-scatter algorithm: auto (cost model), ring, hier (within the host, then a ring "
    "across hosts per local rank; same number of ranks on every host, several hosts)",
    &check_collective_algo<Collective::kReduceScatter>};
constinit const config::Row kNchannels{
    "GW_NCHANNELS", Type::Int, "0", "",
    "parallel ring channels per collective (0 = choose from message size)"};
constinit const config::Row kChunkSize{
    "GW_CHUNK_SIZE", Type::Size, "0", "",
    "pipeline chunk of the collectives (0 = auto: 128K over shm, 512K otherwise)"};
constinit const config::Row kCostAlphaUs{
    "GW_COST_ALPHA_US", Type::Double, "0", "",
    "per-message latency for the cost model (0 = transport default)"};
constinit const config::Row kCostBwGbps{
    "GW_COST_BW_GBPS", Type::Double, "0", "",
    "link bandwidth in GB/s for the cost model (0 = transport default)"};
constinit const config::Row kCostIntraAlphaUs{
    "GW_COST_INTRA_ALPHA_US", Type::Double, "0", "",
    "per-message latency within a host for the cost model (0 = GW_COST_ALPHA_US, else probed)"};
constinit const config::Row kCostIntraBwGbps{
    "GW_COST_INTRA_BW_GBPS", Type::Double, "0", "",
    "link bandwidth in GB/s within a host for the cost model (0 = GW_COST_BW_GBPS, else probed)"};
constinit const config::Row kCostInterAlphaUs{
    "GW_COST_INTER_ALPHA_US", Type::Double, "0", "",
    "per-message latency between hosts for the cost model (0 = GW_COST_ALPHA_US, else probed)"};
constinit const config::Row kCostInterBwGbps{
    "GW_COST_INTER_BW_GBPS", Type::Double, "0", "",
    "a host's link bandwidth in GB/s for the cost model (0 = GW_COST_BW_GBPS, else probed)"};

constinit const config::Row kCostCpus{
    "GW_COST_CPUS", Type::Int, "0", "",
    "CPUs the cost model assumes a host gives its ranks' network work, so that more flows "
    "crossing hosts at once than CPUs (hosts sharing one machine's kernel count together) make "
    "messages slower (0 = this process's CPU affinity; -1 = not considered)"};

constinit const config::Row kStallWarnS{
    "GW_STALL_WARN_S", Type::Double, "60", "",
    "seconds a collective may wait for its peers before every waiting rank logs a WARN naming "
    "the ranks that have not entered it, repeated every period (0 = off)"};

constinit const config::Row kFusionThreshold{
    "GW_FUSION_THRESHOLD", Type::Size, "64M", "",
    "the C library fuses gw_iallreduce calls of at most 1 MiB each, queued on one communicator, "
    "of one dtype and op, into allreduces of at most this many bytes (0 = off); "
    "capi/fusion_queue.h"};
constinit const config::Row kCycleTimeMs{
    "GW_CYCLE_TIME_MS", Type::Double, "0.25", "",
    "milliseconds a queued gw_iallreduce waits for others to fuse with before the ranks agree on a "
    "batch (a wait or test on it, or another collective, starts one at once)"};

constinit const config::Row kShmDirectMin{
    "GW_SHM_DIRECT_MIN", Type::Size, "1M", "",
    "an allreduce, reduce-scatter, allgather or alltoall of at least this many bytes (its whole "
    "buffer) "
    "among ranks of one host over shm reads the peers' buffers directly (process_vm_readv, the "
    "allreduce writing its result into theirs with process_vm_writev; or their mappings when "
    "gw_mem_alloc gave them; broadcast too then) instead of going "
    "through the ring; 0 = always the ring. Every rank must set the same"};

constinit const config::Row kShmHugepages{
    "GW_SHM_HUGEPAGES", Type::Bool, "1", "",
    "a heap buffer of 8 MiB or more that the direct shm collectives see a second time is turned "
    "into transparent huge pages (MADV_COLLAPSE, Linux 6.1+; same bytes and addresses), so that "
    "the peers' kernel copies pin 2 MiB pages instead of 4 KiB ones; 0 = leave buffers alone"};

const config::RowSet& rows() {
  static const config::RowSet set(
      "collectives",
      {&kSpinUs, &kAlgo, &kAlgoBroadcast, &kAlgoAllgather, &kAlgoReduceScatter, &kNchannels,
       &kChunkSize, &kCostAlphaUs, &kCostBwGbps, &kCostIntraAlphaUs, &kCostIntraBwGbps,
       &kCostInterAlphaUs, &kCostInterBwGbps, &kCostCpus, &kStallWarnS, &kFusionThreshold,
       &kCycleTimeMs, &kShmDirectMin, &kShmHugepages});
  return set;
}

namespace {
[[maybe_unused]] const config::RowSet& registered = rows();
}  // namespace

}  // namespace gw::coll::coll_config
