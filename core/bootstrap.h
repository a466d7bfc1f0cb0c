// Where a process learns who it is: rank, world size, local rank and the store address, from
// the environment of the launcher that started it, and which ranks share its host.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/store.h"

namespace gw {

struct LaunchInfo {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;  // -1 when the launcher does not say
  int local_world_size = -1;
  std::string store_host;  // empty when the launcher gives no address
  int store_port = 0;
  std::string source;        // "GW_*", "torchrun", "Open MPI", "Slurm", "PMIx"
  std::string store_source;  // "GW_STORE", "MASTER_ADDR/MASTER_PORT", "PMIx", "" (no address)
  std::string job_token;     // rank 0's, through PMIx, when GW_JOB_TOKEN is unset; else empty
};

// Order: GW_RANK/GW_WORLD_SIZE/GW_STORE; torchrun (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); Open MPI (OMPI_COMM_WORLD_RANK,
// OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK); Slurm (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID). The store address falls back to MASTER_ADDR/MASTER_PORT for every launcher,
// then, in a job a PMIx launcher started (mpirun, srun --mpi=pmix), to one rank 0 publishes
// through PMIx with a job token (core/pmix_bootstrap.h; collective: every rank must call); a PMIx
// job with none of these variables takes its rank and size from PMIx too.
// Missing or malformed values are kInvalidArg naming the variable.
Result<LaunchInfo> detect_launch();

// This process's host identity: GW_HOSTID/NCCL_HOSTID if set, else hostname + boot id + the
// network namespace inode (namespaces used as hosts in tests are distinct hosts).
std::string host_identity();

// The key prefix of the next communicator this rank makes on `store` ("gw/comm<N>/"): each rank
// counts the communicators it creates there, and ranks create them in the same order, so the
// counts agree. Direct-mode communicators and daemon-mode sessions take theirs alike, so the two
// kinds of rank of a job meet under the same keys.
Result<std::string> next_communicator_prefix(Store& store, int rank, Deadline deadline);

// Publishes this rank's host identity and reads everyone's. Returns, for each rank, the index of
// its host (0..nhosts-1, in order of first appearance).
struct HostMap {
  std::vector<int> host_of_rank;
  std::vector<std::vector<int>> ranks_of_host;
  std::vector<std::string> host_ids;  // by host index
  int my_host = -1;
  int local_rank = -1;  // position of this rank among the ranks of its host
};
//
// Every rank's mode (the C ABI's "direct" or "daemon"; empty for the C++ API) is exchanged with its
// identity and compared: ranks that differ fail at once, every one of them, kInvalidArg naming
// which ranks run how (rather than each waiting for keys the others never write). So are its world
// size and its launcher (LaunchInfo::source; "" is not compared): a rank that reads another's
// entry and finds a different world size or launcher fails at once, kInvalidArg naming both
// values, as does every rank whose entry the other reads (each reads rank 0's first). A rank
// whose entry says it failed to set up (publish_setup_failure) fails the reader at once, kPeer
// naming it and why. Rank 0 hosts the store: on any of these failures it returns once the other
// ranks have said they know, 2 s at most, so each fails with the reason, not a closed store.
Result<HostMap> exchange_hosts(Store& store, int rank, int world, Deadline deadline,
                               const std::string& mode = "", const std::string& launcher = "");

// A rank that fails during a communicator's set-up once it can reach the job's store (a setting
// it refused, checked before the rendezvous) says why there, under the keys the other ranks read
// next (its host entry; rank 0 also the job token's), so their exchange_hosts / agree_job_token
// fail at once naming it and its reason instead of waiting out GW_TIMEOUT_MS. Takes this rank's
// next communicator prefix on `store` (the unprefixed store), as a communicator would. Rank 0
// returns once every other rank has read it, or after 2 s (it hosts the store). Best effort: the
// caller returns its own error whatever this returns.
Status publish_setup_failure(Store& store, int rank, int world, const Status& why,
                             Deadline deadline);

// The end of a communicator's set-up after the rendezvous (its transports made, its settings
// checked against the host map): every rank says under `store` (the communicator's own, prefixed)
// whether that went well (`mine`) and reads what the others said, so a rank that failed there (an
// interface GW_SOCKET_IFNAME does not name, a transport it cannot make) fails the others at once,
// kPeer naming it and why, instead of leaving them waiting out GW_TIMEOUT_MS for keys it never
// writes. Returns `mine` when it failed; else the first failure read, or ok once every rank said
// ok. Rank 0 hosts the store: on a failure it returns once the other ranks have said they know,
// 2 s at most.
Status agree_setup_outcome(Store& store, int rank, int world, const Status& mine,
                           Deadline deadline);

// The kernel a host identity runs on: host_identity()'s "hostname/boot_id/netns:N" without the
// network namespace (namespace or container "hosts" of one machine share it, and its CPUs); any
// other identity (GW_HOSTID) is its own kernel.
std::string kernel_of_host_id(const std::string& host_id);

// Reads key_of(r) for every rank r < world (the value each rank publishes when it joins), waiting
// until `deadline` for those not there yet. Every GW_JOIN_REPORT_MS of waiting it names at INFO
// the ranks still missing ("communicator: waiting for ranks 2, 5 to join (8 of 10 joined, 10 s
// of the 300 s deadline)"). kTimeout at the deadline names the first missing rank.
// `check`, when given, sees each value as it is read (rank, value) and may end the wait with its
// error at once.
Result<std::vector<Bytes>> gather_joined(
    Store& store, int world, const std::function<std::string(int)>& key_of, Deadline deadline,
    const std::function<Status(int, const Bytes&)>& check = nullptr);

// Job token: GW_JOB_TOKEN if set; else rank 0 generates 128 random bits and publishes them in the
// store, and the others read them.
// n bytes as 2n lowercase hex digits (tokens and the names derived from them).
std::string to_hex(const uint8_t* p, size_t n);

// A new job token: 16 bytes from the CSPRNG (getrandom, never a fallback), in hex.
Result<std::string> fresh_job_token();

// `world` (0: unknown) bounds how long rank 0 keeps its store when it published a failure
// instead (publish_setup_failure): the others then fail kPeer naming rank 0 and why.
Result<std::string> agree_job_token(Store& store, int rank, Deadline deadline, int world = 0);

// Whether `host` (a store address's host: a name or a literal) reaches only this host: every
// address it resolves to is in 127.0.0.0/8 or ::1. "0.0.0.0", a name that does not resolve, and
// any other address are not. May block on the resolver (as the store's own connect would).
bool is_loopback_host(const std::string& host);

// The WARN a token-less job logs at start-up when its store listens beyond this host (issue 33,
// docs/security.md): what a stranger who reaches the store can do and how to set a token. Empty
// when there is nothing to say: a token was given (by the user, config.job_token or PMIx), the job
// has one rank, or the store is on loopback.
std::string tokenless_job_warning(const std::string& token_source, int world_size,
                                  const std::string& store_host, int store_port);

}  // namespace gw
