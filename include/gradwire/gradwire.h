/* gradwire: gradient transport for distributed training. The C ABI.
 *
 * Conventions that hold for every call below:
 * - Every call returns gw_status_t (except the getters documented otherwise). On failure the
 *   outputs are left untouched and gw_last_error() returns a message that names the operation and,
 *   where one is involved, the peer rank.
 * - No C++ exception crosses this boundary.
 * - Collective calls (allreduce, broadcast, allgather, reduce_scatter, alltoall, barrier,
 *   iallreduce, comm_split) must be made by every rank of the communicator, in the same order, with
 * matching count, dtype, op and root. Arguments that disagree are reported as errors, not hangs.
 * - Collective calls block the calling thread until the operation completes locally, and at most
 *   GW_TIMEOUT_MS milliseconds (default 300000): a rank that died or stopped calling makes the
 *   others return GW_ERR_PEER or GW_ERR_TIMEOUT.
 * - Thread-safety: different communicators may be used concurrently from different threads.
 *   Calls on one communicator are serialised internally; issue collectives on it from one thread
 *   (the order defines the matching). gw_comm_abort, gw_comm_rank, gw_comm_size, gw_status_string,
 *   gw_last_error and gw_version are safe from any thread at any time.
 * - Once a communicator has failed with GW_ERR_PEER/GW_ERR_TIMEOUT its connections are in an
 *   unknown state: abort or destroy it and create a new one.
 */
#ifndef GRADWIRE_GRADWIRE_H_
#define GRADWIRE_GRADWIRE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GW_VERSION_MAJOR 0
#define GW_VERSION_MINOR 4
#define GW_VERSION_PATCH 0

typedef enum {
  GW_OK = 0,
  GW_ERR_INVALID_ARG = 1, /* bad argument: NULL pointer, unknown dtype/op, size overflow, ... */
  GW_ERR_TIMEOUT = 2,     /* a deadline (GW_TIMEOUT_MS) passed */
  GW_ERR_PEER = 3,        /* a peer closed, died or sent something unexpected */
  GW_ERR_SYSTEM = 4,      /* a system call failed */
  GW_ERR_UNSUPPORTED = 5, /* not available in this build or on this host */
  GW_ERR_NO_MEMORY = 6,
  GW_ERR_ABORTED = 7, /* the communicator was aborted (gw_comm_abort) */
  GW_ERR_INTERNAL = 8 /* a bug in gradwire: please report it with gw_last_error() */
} gw_status_t;

typedef enum {
  GW_FLOAT32 = 0,
  GW_FLOAT64 = 1,
  GW_FLOAT16 = 2,  /* IEEE half; reduced in float32 */
  GW_BFLOAT16 = 3, /* reduced in float32 */
  GW_INT32 = 4,
  GW_INT64 = 5,
  GW_UINT8 = 6
} gw_dtype_t;

typedef enum {
  GW_SUM = 0,
  GW_PROD = 1,
  GW_MIN = 2,
  GW_MAX = 3,
  GW_AVG = 4 /* sum divided by the number of ranks. Integers: the sum is taken in the dtype
              * itself and wraps on overflow before the division (uint8 255 and 255 average to
              * 127, not 255), then divides truncating toward zero, as NCCL's ncclAvg does;
              * average in a wider dtype when sums may overflow */
} gw_op_t;

typedef struct gw_comm* gw_comm_t;
typedef struct gw_request* gw_request_t;
typedef struct gw_mem_handle* gw_mem_handle_t; /* gw_mem_register */

/* Explicit configuration for gw_comm_init. Initialise it with GW_CONFIG_INIT, then set what you
 * need; a field left 0/NULL takes its value from the environment (GW_* variables, then
 * torchrun/Open MPI/Slurm) or its default:
 *
 *   gw_config_t cfg = GW_CONFIG_INIT;
 *   cfg.rank = r;
 *   cfg.world_size = n;
 *
 * size is the size of the struct the caller was compiled with (sizeof(gw_config_t), set by
 * GW_CONFIG_INIT). It lets later versions add fields at the end without breaking programs built
 * against this header: the library reads only the first `size` bytes and gives every field beyond
 * them its default. gw_comm_init refuses (GW_ERR_INVALID_ARG) a size of 0 or one that does not
 * reach world_size, and refuses (GW_ERR_UNSUPPORTED) a size larger than the library's own
 * gw_config_t (a program built against a newer header than the library: the fields the library
 * does not know would be ignored). New fields are only ever appended. */
typedef struct {
  size_t size;            /* sizeof(gw_config_t) (GW_CONFIG_INIT sets it) */
  int rank;               /* 0 <= rank < world_size */
  int world_size;         /* >= 1; 0: rank, size and store address from the launcher (then rank
                             must be 0) */
  const char* store_addr; /* "host:port" of the rendezvous store; rank 0 hosts it there.
                             NULL: GW_STORE, then MASTER_ADDR:MASTER_PORT. */
  const char* transport;  /* "auto" or a backend: "tcp", "shm", "dpdk", "verbs"; one this build
                             lacks fails with GW_ERR_UNSUPPORTED when a peer needs it
                             (gradwire-perf --dump-config says which are built). NULL:
                             GW_TRANSPORT (default auto) */
  int timeout_ms;         /* deadline of every wait; 0: GW_TIMEOUT_MS */
  const char* job_token;  /* shared secret for handshakes; NULL: GW_JOB_TOKEN or generated */
} gw_config_t;

/* The defaults of every field, with size set: `gw_config_t cfg = GW_CONFIG_INIT;` */
#define GW_CONFIG_INIT \
  { sizeof(gw_config_t), 0, 0, NULL, NULL, 0, NULL }

/* Sets a setting at the API layer, the highest of the configuration's layers (defaults < the TOML
 * file named by GW_CONFIG_FILE < environment < API; docs/configuration.md). name is the GW_*
 * variable ("GW_ALGO") or its file key ("algo"); value is spelled as in the environment; NULL
 * clears the API value. Process-wide; it applies to communicators created afterwards.
 * GW_ERR_INVALID_ARG for an unknown name or a value that does not parse as the setting's type
 * (nothing is changed then). Thread-safe. */
gw_status_t gw_config_set(const char* name, const char* value);

/* Creates a communicator from the launcher's environment (GW_RANK/GW_WORLD_SIZE/GW_STORE, torchrun,
 * Open MPI or Slurm variables). Collective over all ranks: blocks until every rank has joined or
 * GW_TIMEOUT_MS passes. On success *comm is set.
 * It may be called again, in the same process, for more communicators of the same job (this and
 * gw_comm_init alike): communicators made with the same store address and job token share this
 * process's store (rank 0 hosts its server once, until its last such communicator is destroyed),
 * each under its own keys. Every rank must then create them in the same order, and collectives on
 * each are matched among that communicator's ranks only, as for gw_comm_split.
 * Daemon mode (GW_DAEMON=unix:PATH): no gradwired at PATH (no file there, or a socket file nobody
 * listens on, a dead daemon's) is GW_ERR_PEER on every rank within about a second; a malformed
 * GW_DAEMON is GW_ERR_INVALID_ARG. */
gw_status_t gw_comm_init_from_env(gw_comm_t* comm);

/* Same, with explicit configuration (see gw_config_t). config must not be NULL and config->size
 * must be set (GW_CONFIG_INIT). */
gw_status_t gw_comm_init(gw_comm_t* comm, const gw_config_t* config);

/* Frees the communicator (one made by gw_comm_init* or gw_comm_split). Not collective. Work still
 * pending is aborted first, as by gw_comm_abort: an iallreduce in flight and calls blocked on
 * other threads end with GW_ERR_ABORTED, and this returns only once none of them can still write
 * a buffer (GW_ERR_TIMEOUT if a call on another thread did not return within 5 s of the abort;
 * the communicator is then freed when it returns). Outstanding requests stay valid: gw_wait /
 * gw_test report how they ended and free them. After this the handle is invalid; a later call
 * with it is undefined unless the library can still detect it (then GW_ERR_INVALID_ARG). NULL
 * is accepted and does nothing. */
gw_status_t gw_comm_destroy(gw_comm_t comm);

/* Aborts: every pending and later call on comm returns GW_ERR_ABORTED, promptly. Thread-safe,
 * never blocks, idempotent. The communicator must still be destroyed. */
gw_status_t gw_comm_abort(gw_comm_t comm);

/* Splits comm into sub-communicators. Collective over every rank of comm (each calls it, in the
 * same order relative to the other collectives on comm). Ranks passing the same color >= 0 form
 * one new communicator, ranked in it by key and then by their rank in comm, and *newcomm is set
 * to it. A rank passing color < 0 joins none: *newcomm is set to NULL and the call returns GW_OK
 * (like MPI_UNDEFINED). The new communicator has comm's transport, deadline and job token; it
 * lives until gw_comm_destroy, is destroyed independently of comm (either may go first) and may
 * be used beside comm from the same thread: collectives on each are matched among that
 * communicator's ranks only. NULL comm or newcomm is
 * GW_ERR_INVALID_ARG, an aborted comm GW_ERR_ABORTED; on failure *newcomm is untouched.
 * Blocking. */
gw_status_t gw_comm_split(gw_comm_t comm, int color, int key, gw_comm_t* newcomm);

/* Rank and size into *out. */
gw_status_t gw_comm_rank(gw_comm_t comm, int* rank);
gw_status_t gw_comm_size(gw_comm_t comm, int* size);

/* What comm resolved at creation, as text (the parts of the start-up INFO line). key:
 *   "transport"              the transport of the links across hosts, or of every link when all
 *                            ranks share one host: never "auto"; "none" for a world of one,
 *                            "daemon" in daemon mode
 *   "transport_within_hosts" the links between ranks of one host (same as "transport" unless
 *                            the job spans several hosts with several ranks on one)
 *   "interface"              tcp's interface and address ("eth0:10.0.0.1"), "" otherwise; in
 *                            daemon mode the daemon's socket path
 *   "channels", "chunk"      the channels rule and the chunk size (daemon mode: "the daemon's",
 *                            and the chunk of GW_DAEMON_CHUNK)
 *   "allreduce"              the algorithm table's choice by size ("1 KiB-64 KiB rhd, ..."); in
 *                            daemon mode how the daemons run it
 *   "daemon_transport"       daemon mode only: the backend among the daemons of the job
 *   "summary"                all of the above in one line
 * Copies at most len - 1 bytes and a NUL into buf (buf may be NULL when len is 0); *needed (may
 * be NULL) gets the full length plus one. A key this communicator has no value for is
 * GW_ERR_INVALID_ARG. Not collective. */
gw_status_t gw_comm_describe(gw_comm_t comm, const char* key, char* buf, size_t len,
                             size_t* needed);

/* ---- Plain collectives: host memory, and device memory in direct mode -----------------------
 *
 * gw_allreduce, gw_broadcast, gw_allgather, gw_reduce_scatter, gw_alltoall, gw_reduce, gw_gather,
 * gw_scatter, gw_alltoallv, the non-blocking forms (gw_iallreduce, gw_ibroadcast...) and
 * point-to-point (gw_send, gw_isend...) move host memory (malloc'd, pinned, or CUDA managed
 * memory, which is used in place) and, in direct mode, CUDA device memory (cudaMalloc'd):
 * - The caller has finished writing the input before the call (its stream synchronised, or an
 *   event waited); when the call returns (the non-blocking forms: when gw_wait / gw_test report
 *   completion) the output is in device memory and visible to every stream.
 * - How: the device ranges the call reads are copied into page-locked host memory, the call runs
 *   there, and the ranges it writes are copied back (docs/gpudirect.md: which bytes move, and
 *   how to see the path taken: the INFO line, gw_comm_describe's "device_memory").
 * - Daemon mode (GW_DAEMON): gw_allreduce, gw_broadcast, gw_allgather, gw_reduce_scatter and
 *   gw_alltoall give the device buffers to gradwired, which imports each allocation once (CUDA
 *   IPC) and reads and writes it itself (docs/daemon.md, "Device buffers"); the other calls
 *   stage them as direct mode does.
 * The check asks the CUDA driver when the process has loaded it (one pointer-attribute query per
 * buffer); without a loaded driver no pointer can be device memory and nothing is checked. */

/* Reduces count elements across all ranks; every rank gets the result in recvbuf.
 * sendbuf == recvbuf means in place; otherwise the buffers must not overlap. count may be 0
 * (the buffers may then be NULL). Device memory: see above. Blocking. */
gw_status_t gw_allreduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                         gw_dtype_t dtype, gw_op_t op);

/* Copies count elements from root's buf to every rank's buf. Device memory: see above. Blocking. */
gw_status_t gw_broadcast(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype, int root);

/* Gathers sendcount elements from every rank into recvbuf (size * sendcount elements, rank r's
 * block at offset r * sendcount). Device memory: see above. Blocking. */
gw_status_t gw_allgather(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                         gw_dtype_t dtype);

/* sendbuf holds size * recvcount elements; rank r receives the reduction of block r. Device memory:
 * see above. Blocking. */
gw_status_t gw_reduce_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t recvcount,
                              gw_dtype_t dtype, gw_op_t op);

/* All-to-all: sendbuf holds size * count elements, block j (at offset j * count) goes to rank j;
 * recvbuf (size * count elements) receives rank j's block for this rank at offset j * count.
 * sendbuf == recvbuf means in place (the library copies the input first); otherwise the buffers
 * must not overlap. count may be 0 (the buffers may then be NULL). Ranks that pass different
 * counts all fail with GW_ERR_INVALID_ARG or GW_ERR_PEER, never a hang. Device memory: see
 * above. Blocking. */
gw_status_t gw_alltoall(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                        gw_dtype_t dtype);

/* Returns once every rank has entered the barrier. No buffers. Blocking. */
gw_status_t gw_barrier(gw_comm_t comm);

/* Rooted collectives and all-to-all-v (both modes; daemon mode composes them over the daemon's
 * collectives, moving more bytes: docs/daemon.md, "Which calls"). Every
 * rank passes the same count, dtype, op and root (root in 0..size-1, else GW_ERR_INVALID_ARG).
 * Ranks that disagree on any of them, or on the collective, all fail (GW_ERR_INVALID_ARG where a
 * rank sees the mismatch, GW_ERR_PEER where a peer's failure ended the call), never a hang and
 * never GW_OK with partial data. A buffer used only at the root may be NULL elsewhere; any buffer
 * may be NULL when its count is 0. Device memory: see above. Blocking. */

/* Reduces count elements of every rank's sendbuf with op into root's recvbuf (unused elsewhere).
 * At the root sendbuf == recvbuf means in place; otherwise they must not overlap. A binomial tree
 * for small buffers, a pipelined chain for large ones (the cost model chooses). */
gw_status_t gw_reduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                      gw_dtype_t dtype, gw_op_t op, int root);

/* Gathers sendcount elements from every rank into root's recvbuf (size * sendcount elements,
 * rank r's block at offset r * sendcount; unused elsewhere). At the root, sendbuf may be its own
 * block of recvbuf (in place); otherwise the buffers must not overlap. */
gw_status_t gw_gather(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                      gw_dtype_t dtype, int root);

/* Scatters root's sendbuf (size * recvcount elements; unused elsewhere): rank r receives block r
 * (at offset r * recvcount) in recvbuf. At the root, recvbuf may be its own block of sendbuf (in
 * place); otherwise the buffers must not overlap. */
gw_status_t gw_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t recvcount,
                       gw_dtype_t dtype, int root);

/* All-to-all with per-rank counts (elements; size entries per array, none NULL): sendcounts[j]
 * elements at sdispls[j] of sendbuf go to rank j, which receives them at rdispls[i] of its recvbuf
 * (recvcounts[i] elements from rank i). recvcounts[i] on rank j must equal sendcounts[j] on rank
 * i (else every rank fails as above), and sendcounts[me] == recvcounts[me]. The receive blocks
 * must not overlap each other; displacement + count must not overflow; sendbuf == recvbuf means
 * in place (the library copies the input first), otherwise the used ranges must not overlap. Any
 * of these is GW_ERR_INVALID_ARG with a message. Pairwise exchange with several peers at once. */
gw_status_t gw_alltoallv(gw_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                         const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                         const size_t* rdispls, gw_dtype_t dtype);

/* Starts an allreduce and returns at once with *request set. The buffers must stay valid and
 * unmodified until gw_wait/gw_test report completion or gw_comm_destroy returns (which aborts
 * it). Requests complete in issue order. Device memory: see above.
 * Tensor fusion (direct mode): a call of at most 1 MiB and at most GW_FUSION_THRESHOLD bytes
 * (default 64M; 0: off) is queued and reduced with its neighbours of the same dtype and op as one
 * allreduce of a fusion buffer (the result is the same). The ranks agree on each batch, so they
 * may call and wait at different times and in different orders. A batch starts when its oldest
 * call has waited GW_CYCLE_TIME_MS (default 0.25), when gw_wait/gw_test is called on a queued
 * request, or before any other collective on the communicator (which keeps its place after the
 * queued calls). A queued call that gw_comm_destroy ends fails with GW_ERR_ABORTED. */
gw_status_t gw_iallreduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                          gw_dtype_t dtype, gw_op_t op, gw_request_t* request);

/* The non-blocking form of every collective: the blocking call's arguments, then request. Each
 * checks its arguments at once (GW_ERR_INVALID_ARG, no request made), then returns with *request
 * set, completed by gw_wait/gw_test. Requires: the buffers stay valid and unmodified (receive
 * buffers untouched) until the request is done; the count arrays of gw_ialltoallv are copied and
 * may be freed at once. Every rank must issue its collectives, blocking or not, in the same order.
 * Guarantees: requests of any kinds may be in flight together with each other and with
 * point-to-point; the collectives run one at a time in issue order (a blocking collective waits
 * for the pending ones first); gw_comm_abort and gw_comm_destroy end the pending ones with
 * GW_ERR_ABORTED. Thread-safe like the blocking calls. Both modes (daemon mode: a worker of the
 * trainer runs them in issue order). */
gw_status_t gw_ibroadcast(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype, int root,
                          gw_request_t* request);
gw_status_t gw_iallgather(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                          gw_dtype_t dtype, gw_request_t* request);
gw_status_t gw_ireduce_scatter(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t recvcount,
                               gw_dtype_t dtype, gw_op_t op, gw_request_t* request);
gw_status_t gw_ialltoall(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                         gw_dtype_t dtype, gw_request_t* request);
gw_status_t gw_ialltoallv(gw_comm_t comm, const void* sendbuf, const size_t* sendcounts,
                          const size_t* sdispls, void* recvbuf, const size_t* recvcounts,
                          const size_t* rdispls, gw_dtype_t dtype, gw_request_t* request);
gw_status_t gw_ireduce(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t count,
                       gw_dtype_t dtype, gw_op_t op, int root, gw_request_t* request);
gw_status_t gw_igather(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t sendcount,
                       gw_dtype_t dtype, int root, gw_request_t* request);
gw_status_t gw_iscatter(gw_comm_t comm, const void* sendbuf, void* recvbuf, size_t recvcount,
                        gw_dtype_t dtype, int root, gw_request_t* request);
gw_status_t gw_ibarrier(gw_comm_t comm, gw_request_t* request);

/* Waits up to timeout_ms (-1: until the communicator's deadline) for the request. Returns the
 * operation's status and frees the request, or GW_ERR_TIMEOUT if it is still running (the request
 * stays valid; wait again). Blocking. */
gw_status_t gw_wait(gw_request_t request, int timeout_ms);

/* Non-blocking: sets *done to 1 and returns the operation's status (freeing the request) when it
 * has finished, else sets *done to 0 and returns GW_OK. */
gw_status_t gw_test(gw_request_t request, int* done);

/* ---- Point-to-point ----------------------------------------------------------------------------
 *
 * Tagged messages between two ranks of a communicator. Not collective: only the two ranks call.
 * - tag >= 0. peer is a rank of comm and may be the caller's own rank; a receive may also name
 *   GW_ANY_SOURCE and then takes the first matching message from any rank.
 * - Messages from one sender to one receiver with the same tag are received in the order they
 *   were sent (non-overtaking). A receive matches the earliest message it can take; receives are
 *   matched in the order they were posted.
 * - Sizes are in bytes (count x dtype size); the dtype of the two sides is not compared. A
 *   receive smaller than the message fails with GW_ERR_INVALID_ARG ("message truncated", naming
 *   both sizes): only the receive for a message of at most 16 KiB (its send had completed
 *   already, below), both sides for a larger one. A larger receive receives the message, and
 *   gw_wait_recv / gw_test_recv report its real count and its source.
 * - A send of at most 16 KiB (eager) completes once its bytes are copied out of the buffer and
 *   handed to the transport, whether or not the receiver has posted its receive (MPI's standard
 *   mode); it is delivered even if the sender destroys its communicator right after. A larger
 *   send completes once the receiver has matched it and taken its bytes (synchronous mode): two
 *   ranks that each gw_send a large message to the other before receiving wait for each other,
 *   so use gw_isend there. Sends and receives may be posted in any order otherwise, from any
 *   thread, interleaved with collectives on the same communicator: point-to-point has
 *   connections of its own and never delays or reorders a collective.
 * - Every send and receive has the communicator's deadline (GW_TIMEOUT_MS): a peer that died or
 *   never answers ends it with GW_ERR_PEER or GW_ERR_TIMEOUT; the connections with that peer are
 *   then closed and its other pending sends and receives end too (later ones to it fail at once,
 *   except receives of eager messages it sent before it died, which are still received).
 * - gw_comm_abort and gw_comm_destroy end every pending request with GW_ERR_ABORTED, as
 *   gw_iallreduce's.
 * - Device memory: as the collectives (above), the received bytes copied back by the wait. A
 *   buffer may be NULL only when
 *   count is 0. The buffers of gw_isend/gw_irecv must stay valid (a send's unmodified) until the
 *   request is done.
 * - Daemon mode (GW_DAEMON): the same rules (through the gradwired of the hosts; a message must
 *   fit the arena); a send to a peer on another host completes once that host's daemon has the
 *   message (docs/daemon.md, "Point-to-point"). */
#define GW_ANY_SOURCE (-1)

/* Blocking send / receive: return once the buffer is free (send: at most 16 KiB, once copied
 * out; larger, once the receiver took the message) or holds the message (receive), or at the
 * deadline. */
gw_status_t gw_send(gw_comm_t comm, const void* buf, size_t count, gw_dtype_t dtype, int peer,
                    int tag);
gw_status_t gw_recv(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype, int peer, int tag);

/* Non-blocking forms: return at once with *request set, completed by gw_wait/gw_test (or
 * gw_wait_recv/gw_test_recv). Requests of every kind may be in flight together and complete in
 * any order. */
gw_status_t gw_isend(gw_comm_t comm, const void* buf, size_t count, gw_dtype_t dtype, int peer,
                     int tag, gw_request_t* request);
gw_status_t gw_irecv(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype, int peer, int tag,
                     gw_request_t* request);

/* gw_wait / gw_test for a gw_isend or gw_irecv request that also report, once it completed with
 * GW_OK, the elements transferred (*count, in the request's dtype: the message's real size) and
 * the source rank (*source: for a send the caller's own rank). count and source may be NULL.
 * Another kind of request is GW_ERR_INVALID_ARG (and stays valid). */
gw_status_t gw_wait_recv(gw_request_t request, int timeout_ms, size_t* count, int* source);
gw_status_t gw_test_recv(gw_request_t request, int* done, size_t* count, int* source);

/* ---- Memory for collectives (daemon mode: docs/daemon.md) ------------------------------------
 *
 * gw_mem_alloc sets *ptr to `bytes` (> 0) bytes of host memory, 64-byte aligned, that the
 * collectives of comm use best. In daemon mode (GW_DAEMON) it lies in the shared arena this trainer
 * and its gradwired both map, so a collective on it is zero-copy; any other buffer is copied into
 * the arena and back. In direct mode, when all ranks of comm share one host over shm (and
 * GW_SHM_DIRECT_MIN is not 0), it is shared memory (a memfd region, page-aligned) that the ranks
 * map into each other, so a large allreduce or reduce-scatter whose buffers all come from here
 * runs with no kernel copy, and so do an allgather whose outputs, a broadcast whose root's
 * buffer and an out-of-place alltoall whose inputs come from here (docs/wire-shm.md "Shared
 * buffers"); a child the process forks shares it instead of
 * getting a copy. Otherwise plain aligned host memory. GW_ERR_NO_MEMORY when the
 * arena (GW_DAEMON_ARENA) has no free range that large. The memory belongs to comm: free it with
 * gw_mem_free before gw_comm_destroy, which frees (in daemon mode: unmaps) what is left.
 * gw_mem_free with NULL does nothing; a pointer gw_mem_alloc did not return for comm is
 * GW_ERR_INVALID_ARG. Not collective; thread-safe as the collectives are (one thread per comm).
 * GPU buffers are not supported in daemon mode (GW_ERR_UNSUPPORTED): see gw_mem_register. */
gw_status_t gw_mem_alloc(gw_comm_t comm, size_t bytes, void** ptr);
gw_status_t gw_mem_free(gw_comm_t comm, void* ptr);

/* gw_mem_register: declares [ptr, ptr + bytes) a buffer the collectives of comm will see again
 * and again (the shape of ncclCommRegister). Direct mode, CUDA device memory: the range must lie
 * in one allocation; it gets a page-locked staging buffer of its own, allocated now, so its calls
 * take none from the per-call pool. Host and managed memory: nothing to do (the collectives use
 * it in place); the handle is valid all the same. Without registration, device buffers are
 * cached by allocation (cuMemGetAddressRange) and staged through a pool of page-locked buffers.
 * A registered allocation that is freed (its address possibly handed out again) is noticed by
 * its buffer id at the next call on the range: that call stages through the pool, never through
 * the stale registration, whose handle gw_mem_deregister still takes. Daemon mode:
 * GW_ERR_UNSUPPORTED. ptr NULL, bytes 0 or handle NULL: GW_ERR_INVALID_ARG.
 * gw_mem_deregister frees the registration; a NULL handle, one from another communicator or one
 * deregistered already is GW_ERR_INVALID_ARG. Registrations go with gw_comm_destroy. Not
 * collective; thread-safe. */
gw_status_t gw_mem_register(gw_comm_t comm, const void* ptr, size_t bytes, gw_mem_handle_t* handle);
gw_status_t gw_mem_deregister(gw_comm_t comm, gw_mem_handle_t handle);

/* Static text for a status code ("GW_ERR_PEER: a peer closed, died or ..."). Never NULL. */
const char* gw_status_string(gw_status_t status);

/* The message of the last failed call on this thread ("" if none). Valid until the next gradwire
 * call on this thread. Never NULL. */
const char* gw_last_error(void);

/* "MAJOR.MINOR.PATCH" of the library, e.g. "0.2.0" (compare GW_VERSION_* of the header the
 * program was built with). Never NULL. */
const char* gw_version(void);

/* ---- Gradient compression (collectives/compress/compress.h, docs/compression.md) --------------
 *
 * gw_allreduce_compressed sums a gradient across ranks through a codec, in place. codec_spec
 * selects the codec and its options: "none", "fp16", "bf16", "topk:RATIO", "randomk:RATIO",
 * "sign", "qsgd:LEVELS", "powersgd:RANK", each optionally followed by ",key=value" options
 * (ef=0|1 error feedback, seed=N, chunk=N, bucket=N, cols=N, warm=0|1, slice=N,
 * nonfinite=skip|keep), e.g. "topk:0.01", "powersgd:4,ef=1". A malformed spec is
 * GW_ERR_INVALID_ARG with the reason in gw_last_error(). With error feedback, a call whose input
 * holds a NaN or Inf on any rank is summed uncompressed and leaves the residuals as they were
 * (nonfinite=skip, the default; host memory only); docs/compression.md.
 *
 * tensor_key names the tensor (non-empty, NUL-terminated): the error-feedback residual and the
 * codec state (PowerSGD's warm start) live under it, per communicator, and are freed with the
 * communicator (gw_comm_destroy) or earlier by gw_comm_release_compression. Reusing a key with
 * another spec, count or dtype is GW_ERR_INVALID_ARG. On return every rank's buf holds the same
 * values: the sum over ranks of each rank's decoded compressed gradient (what a codec could not
 * send stays in that rank's residual and is added to the next call with the same key).
 *
 * Requirements: a collective call (same order, spec, key, count and dtype on every rank; the first
 * call with a key checks this and reports the first rank that differs); dtype GW_FLOAT32,
 * GW_FLOAT16 or GW_BFLOAT16 (others: GW_ERR_INVALID_ARG); buf may be NULL only when count is 0.
 * Blocking, with the communicator's deadline like every collective.
 *
 * buf may be GPU memory (cudaMalloc'd; the CUDA driver is loaded at run time when present). fp16
 * and bf16 on float32 then cast and keep their error feedback on the GPU (residuals in GPU
 * memory, freed with the communicator) and move only the halves across PCIe; other codecs and
 * dtypes are staged through host memory. Results are bit for bit those of a host buffer. The call
 * uses the legacy default stream and returns when buf holds the result: work writing buf on a
 * non-blocking stream must be finished first. A key used with GPU memory cannot be reused with
 * host memory for fp16/bf16 (GW_ERR_INVALID_ARG). Thread-safety: as the other
 * collectives (one thread per communicator); gw_comm_stats and gw_comm_reset_stats may be
 * called from any thread (they wait for a compressed allreduce in progress on another thread). */
gw_status_t gw_allreduce_compressed(gw_comm_t comm, void* buf, size_t count, gw_dtype_t dtype,
                                    const char* codec_spec, const char* tensor_key);

/* Byte counters of the compressed collectives of one communicator, on this rank.
 * bytes_sent: payload bytes this rank handed to the transport for gw_allreduce_compressed,
 *   derived from the schedule's per-rank volume: an allreduce of B bytes sends 2(p-1)/p * B, an
 *   allgather of B bytes per rank sends (p-1) * B (p = ranks; headers of the transport not
 *   included; the one-time key agreement of 8 bytes per rank is included).
 * bytes_uncompressed: what the same calls would have sent as a plain allreduce of the buffer in
 *   its own dtype: 2(p-1)/p * count * dtype size.
 * calls: number of gw_allreduce_compressed calls that completed, at any p. With p == 1 nothing
 *   crosses a wire: both byte counters stay 0 while calls still counts.
 * In daemon mode (GW_DAEMON) the host's daemon compresses the host's sum: bytes_sent is this
 *   trainer's share of what its daemon sent across hosts (0 when the job is on one host). */
typedef struct {
  uint64_t bytes_sent;
  uint64_t bytes_uncompressed;
  uint64_t calls;
} gw_comm_stats_t;

/* Copies the counters into *out. Not collective. */
gw_status_t gw_comm_stats(gw_comm_t comm, gw_comm_stats_t* out);
/* Sets the counters to 0. Not collective. */
gw_status_t gw_comm_reset_stats(gw_comm_t comm);
/* Frees the compression state (residuals, PowerSGD factors, counters) of comm now, e.g. when the
 * model's tensors change. Not collective. gw_comm_destroy frees it too. A later
 * gw_allreduce_compressed on comm starts from empty residuals. */
gw_status_t gw_comm_release_compression(gw_comm_t comm);

/* ---- Parameter server: a key-value store of tensors (direct mode) -----------------------------
 *
 * Keys are 64-bit integers, values tensors of any gw_dtype_t. A value is cut into partitions of
 * partition_bytes; partition p of key k lives on server (splitmix64(k) + p) % S of the S servers.
 * Servers: GW_KV_SERVERS server processes (GW_ROLE=server, running gw_kv_serve), or with
 * GW_KV_SERVERS=0 (the default) one server thread inside every worker (co-located). Each worker
 * has a clock, 0 at gw_kv_create, advanced by gw_kv_clock; a push belongs to the pusher's clock.
 * The modes (docs/wire-kv.md has the full rules and the wire format):
 *   GW_KV_BSP   a partition's clock c closes when every live worker has pushed it or moved past
 *               it; then the update applies the clock's aggregate once.
 *   GW_KV_SSP   pushes apply as they arrive; a worker at clock c pulls once the slowest live
 *               worker has finished clock c-S-1 (its clock >= c-S), and sees at least every push
 *               of clocks <= c-S-1 (Petuum's rule).
 *   GW_KV_ASP   pushes apply as they arrive; pulls never wait.
 *   GW_KV_SYNC  as BSP, but clock c closes as soon as sync_k pushes of it arrived; a later push of
 *               a closed clock is dropped and counted (gw_kv_stats), and a worker that fell behind
 *               joins the newest closed clock + 1 at its next gw_kv_clock.
 * Updates: GW_KV_UPDATE_SUM: in bsp/sync the value becomes the sum of the clock's pushes (push
 * then pull is an allreduce), in ssp/asp every push is added to the value. GW_KV_UPDATE_SGD:
 * value -= lr * v with v = momentum * v + g, g the mean of the clock's pushes (bsp/sync) or each
 * push (ssp/asp). Integer dtypes take sum only.
 * Errors: unknown key, wrong count or dtype, a second push of a key in one clock (bsp/sync):
 * GW_ERR_INVALID_ARG, never applied.
 * A dead worker under bsp: every worker's calls fail with GW_ERR_PEER naming it; under
 * ssp/asp/sync (sync: while sync_k workers live) the job goes on and gw_kv_stats counts it. A dead
 * server: every later call fails with GW_ERR_PEER naming the server and the keys it held. Every
 * wait ends by GW_TIMEOUT_MS. One thread at a time per gw_kv_t (requests complete on any). */
typedef struct gw_kv_s* gw_kv_t;
typedef enum { GW_KV_BSP = 0, GW_KV_SSP = 1, GW_KV_ASP = 2, GW_KV_SYNC = 3 } gw_kv_mode_t;
typedef enum { GW_KV_UPDATE_SUM = 0, GW_KV_UPDATE_SGD = 1 } gw_kv_update_t;
typedef struct {
  size_t size;            /* sizeof(gw_kv_config_t); set by GW_KV_CONFIG_INIT */
  gw_kv_mode_t mode;      /* bsp | ssp | asp | sync */
  int staleness;          /* ssp: S >= 0 */
  int sync_k;             /* sync: K of the N workers close a clock, 1 <= K <= N */
  gw_kv_update_t update;  /* sum | sgd */
  double lr;              /* sgd: > 0 */
  double momentum;        /* sgd: in [0, 1) */
  size_t partition_bytes; /* 0: GW_KV_PARTITION_BYTES (default 4 MiB) */
  const char* codec;      /* NULL, "" or "none": raw pushes; else the pushes' codec (float keys) */
} gw_kv_config_t;
#define GW_KV_CONFIG_INIT \
  { sizeof(gw_kv_config_t), GW_KV_BSP, 0, 0, GW_KV_UPDATE_SUM, 0.0, 0.0, 0, NULL }
/* Collective over the communicator's ranks (the workers): every worker calls it with the same
 * config; waits until every server of the store answers (GW_TIMEOUT_MS). In daemon mode
 * (GW_DAEMON) the servers are the job's daemons, each serving a share of the keys (GW_KV_SERVERS
 * must then be unset: GW_ERR_INVALID_ARG). The store does not use comm once created. */
gw_status_t gw_kv_create(gw_comm_t comm, const gw_kv_config_t* cfg, gw_kv_t* kv);
/* Declares key with its first value. Every worker inits every key it uses, with the same count and
 * dtype (and value: the first init to reach a partition's server sets it). Waits, in every mode,
 * until the key's partitions are stored. */
gw_status_t gw_kv_init(gw_kv_t kv, uint64_t key, const void* value, size_t count, gw_dtype_t dtype);
/* Adds value to the worker's current clock. bsp/sync: at most once per key and clock. Waits (all
 * modes) only until the servers have received it; priority: higher is sent first among pending
 * requests of the same clock. */
gw_status_t gw_kv_push(gw_kv_t kv, uint64_t key, const void* value, size_t count, gw_dtype_t dtype,
                       int priority);
/* Copies the value into out. Waits: bsp/sync until every clock before this worker's (and the
 * current clock, when this worker pushed the key in it) has closed and applied; ssp until the
 * slowest live worker's clock >= this clock - S; asp: not at all (the servers' value now). */
gw_status_t gw_kv_pull(gw_kv_t kv, uint64_t key, void* out, size_t count, gw_dtype_t dtype,
                       int priority);
/* gw_kv_push then gw_kv_pull in one request (out may be value: in place). */
gw_status_t gw_kv_pushpull(gw_kv_t kv, uint64_t key, const void* value, void* out, size_t count,
                           gw_dtype_t dtype, int priority);
/* The non-blocking forms: the same checks (failing at once, nothing sent), then a request that
 * gw_wait/gw_test complete with the blocking call's status. Buffers stay the caller's, untouched
 * by it, until then. gw_kv_destroy fails the ones still pending with GW_ERR_ABORTED. */
gw_status_t gw_kv_ipush(gw_kv_t kv, uint64_t key, const void* value, size_t count, gw_dtype_t dtype,
                        int priority, gw_request_t* req);
gw_status_t gw_kv_ipull(gw_kv_t kv, uint64_t key, void* out, size_t count, gw_dtype_t dtype,
                        int priority, gw_request_t* req);
gw_status_t gw_kv_ipushpull(gw_kv_t kv, uint64_t key, const void* value, void* out, size_t count,
                            gw_dtype_t dtype, int priority, gw_request_t* req);
/* This worker finished its clock: sent to every server after every request issued before it.
 * Never waits for other workers (the waiting is in pull); waits until the servers have it. */
gw_status_t gw_kv_clock(gw_kv_t kv);
typedef struct {
  size_t size;             /* sizeof(gw_kv_stats_t): set it before the call */
  uint64_t clock;          /* this worker's clock */
  uint64_t min_clock;      /* the slowest live worker's clock, as the servers last said */
  uint64_t dropped_pushes; /* sync: pushes of closed clocks dropped, over the servers */
  uint64_t lost_workers;   /* workers the servers saw die (ssp/asp/sync went on) */
} gw_kv_stats_t;
/* Not collective, does not wait: what the servers' latest replies said. */
gw_status_t gw_kv_stats(gw_kv_t kv, gw_kv_stats_t* out);
/* Collective: says goodbye to every server, and (co-located servers) waits until every live worker
 * has said it to this worker's server, within GW_TIMEOUT_MS. Frees kv even when that fails. */
gw_status_t gw_kv_destroy(gw_kv_t kv);
/* The server role (direct mode): serves the stores of the job found through cfg (store_addr,
 * job_token, timeout_ms; NULL: all from the environment: MASTER_ADDR/MASTER_PORT or GW_STORE,
 * GW_JOB_TOKEN, GW_TIMEOUT_MS) as server GW_KV_SERVER_RANK of GW_KV_SERVERS. Returns GW_OK once
 * every store it served has been destroyed (or lost) by all its workers and then the job's
 * rendezvous store stops answering (rank 0 has gone) or GW_TIMEOUT_MS passes with no new store;
 * GW_ERR_TIMEOUT when no worker came within GW_TIMEOUT_MS. */
gw_status_t gw_kv_serve(const gw_config_t* cfg);

#ifdef __cplusplus
}
#endif

#endif /* GRADWIRE_GRADWIRE_H_ */
