// The client protocol of gradwired (docs/wire-daemon.md): the hello a trainer sends over the unix
// socket, the welcome the daemon answers with (and the descriptors passed beside it), and the
// shared-memory arena both then use: a submission ring (trainer -> daemon), a completion ring
// (daemon -> trainer) and the data region the requests point into.
//
// Shared by the daemon (daemon/job.cc, daemon/admission.cc) and its client (daemon/client.h); the
// rings themselves are read and written through daemon/ring.h. Every decoder
// here takes bytes the other side controls and checks every field and bound before anything uses
// it; none trusts shared memory twice (callers copy an entry out of the arena, then decode the
// copy). tests/fuzz/daemon_proto_fuzz.cc runs them on arbitrary bytes.
//
// Thread-compatible; no state.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "core/status.h"

namespace gw::daemon {

inline constexpr uint16_t kProtocolVersion = 8;
inline constexpr uint32_t kHelloMagic = 0x48445747;             // "GWDH" (little-endian bytes)
inline constexpr uint32_t kWelcomeMagic = 0x57445747;           // "GWDW"
inline constexpr uint64_t kArenaMagic = 0x31414e4552415747ull;  // "GWARENA1"

// Frames on the socket: a u32 little-endian body length, then the body.
inline constexpr size_t kFrameHeaderBytes = 4;
inline constexpr size_t kMaxHelloBytes = 2048;
inline constexpr size_t kMaxWelcomeBytes = 1024;
// Connections still in their hello, counted apart from the admitted trainers
// (GW_DAEMON_MAX_CLIENTS): a newcomer beyond it evicts the oldest, so silent or trickling
// connections cannot keep real trainers out; each is dropped at GW_DAEMON_HELLO_TIMEOUT anyway.
inline constexpr size_t kMaxPendingHellos = 64;
// A body as it goes on the socket: its length, then the body.
std::vector<uint8_t> frame_message(const std::vector<uint8_t>& body);

// Field bounds (decoders refuse anything beyond them).
inline constexpr size_t kMaxTokenBytes = 256;
inline constexpr size_t kMaxStoreHostBytes = 255;
inline constexpr size_t kMaxHostIdBytes = 512;
inline constexpr size_t kMaxMessageBytes = 512;
inline constexpr size_t kMaxTransportBytes = 64;
inline constexpr size_t kMaxKvAddressBytes = 128;  // "host:port" (version 6)
inline constexpr int32_t kMaxWorld = 1 << 20;
inline constexpr uint64_t kMinArenaBytes = 1ull << 20;  // 1 MiB
inline constexpr uint64_t kMaxArenaBytes = 1ull << 40;  // 1 TiB (the daemon's own cap is lower)
inline constexpr uint32_t kMaxRingEntries = 4096;
inline constexpr uint64_t kArenaHeaderBytes = 4096;
inline constexpr uint64_t kDataAlign = 4096;
// allreduce_compressed: the codec spec and tensor key it names in the data region.
inline constexpr uint32_t kMaxCodecSpecBytes = 256;
inline constexpr uint32_t kMaxTensorKeyBytes = 1024;

// What a trainer tells its daemon when it connects.
struct Hello {
  uint16_t version = kProtocolVersion;
  int32_t rank = 0;
  int32_t world_size = 1;
  int32_t host_index = 0;  // this trainer's host, 0..num_hosts-1 (bootstrap exchange_hosts)
  int32_t num_hosts = 1;
  int32_t local_rank = 0;  // index among this host's trainers of the job
  int32_t local_size = 1;
  int64_t timeout_ms = 300000;
  uint64_t arena_bytes = 0;  // the arena the trainer asks for
  std::string job_token;     // the job's agreed token (keys the job; daemons' handshakes)
  std::string store_token;   // the token the job's store requires ("" : none)
  std::string store_host;    // the job's rendezvous store ("" only when num_hosts == 1)
  uint16_t store_port = 0;
  std::string host_id;  // the trainer's host identity (must equal the daemon's)
};

std::vector<uint8_t> encode_hello(const Hello& h);
// kPeer naming the first field that is out of bounds or inconsistent.
Result<Hello> decode_hello(const uint8_t* data, size_t size);

// The daemon's answer. status 0: accepted, the geometry describes the arena passed with it (three
// descriptors in this order: the arena memfd, the submission eventfd, the completion eventfd).
// Otherwise a gw_status_t with message, and no descriptors.
struct Welcome {
  uint16_t version = kProtocolVersion;
  int32_t status = 0;
  std::string message;
  uint64_t client_id = 0;
  uint64_t arena_bytes = 0;
  uint64_t sq_offset = 0;
  uint32_t sq_entries = 0;
  uint64_t cq_offset = 0;
  uint32_t cq_entries = 0;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;
  std::string transport;  // the backend among the daemons of a job (gw_comm_describe)
  // Version 6: "host:port" of the job's parameter server in this daemon (gw_kv_create in daemon
  // mode connects there); "" when the daemon could not start one (the message says why).
  std::string kv_address;
};

std::vector<uint8_t> encode_welcome(const Welcome& w);
// Checks the geometry too (rings and data inside the arena, aligned, not overlapping).
Result<Welcome> decode_welcome(const uint8_t* data, size_t size);

// The arena's geometry for a size: header, rings of `entries` each, data region after them.
// kInvalidArg when the size cannot hold them.
Result<Welcome> arena_geometry(uint64_t arena_bytes, uint32_t entries);

// Opcodes of a submission.
enum class Opcode : uint16_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kAllgather = 3,
  kBarrier = 4,
  kReduceScatter = 5,
  kAlltoall = 6,
  kAllreduceCompressed = 7,
  // Version 5: a trainer's device allocation, exported once (ImportRecord at meta_off), and its
  // release. Per trainer, not collective: the daemon answers each at once, in sequence order.
  kImport = 8,
  kRelease = 9,
  // Version 7: point-to-point (daemon/job_p2p.h). Per trainer, not collective: root is the peer
  // rank (recv: or -1, any source), spec_len the tag (0..2^31-1), count the bytes (dtype 0), the
  // buffer at send_off (send) or recv_off (recv). Completed when matched, in any order relative
  // to the trainer's other submissions; a successful one carries a P2pDone. Version 8: key_len
  // non-zero names a dma-buf registration of this trainer (kRegisterDmabuf's id) instead of the
  // data region, the offset then into that registration: a device buffer, moved by the NIC only.
  kSend = 10,
  kRecv = 11,
  // Version 8: a device buffer handed over as a dma-buf (its descriptor passed beside, on the
  // socket: FdRecord), registered with the NIC of the job's link to another host; and its
  // deregistration. Per trainer, not collective, answered in any order (a registration's
  // success carries its id: P2pDone.bytes). register_dmabuf: root the peer rank on another host
  // the buffer is for, spec_len the record's ticket, send_off the offset in the dma-buf, count
  // the bytes, key_len what for (kDmabufSends | kDmabufReceives). deregister_dmabuf: spec_len
  // the id.
  kRegisterDmabuf = 12,
  kDeregisterDmabuf = 13,
  // Version 8: after a completed recv into a dma-buf registration: its NIC's flush of
  // [recv_off, + count) of registration spec_len (NCCL's iflush: the device then sees every byte
  // the NIC wrote). Per trainer, answered at once; the success's P2pDone.bytes is 1 when a flush
  // ran, 0 when the daemon's link says nothing needs doing.
  kFlushDmabuf = 14,
};
inline constexpr uint32_t kDmabufSends = 1;
inline constexpr uint32_t kDmabufReceives = 2;
// The most registrations a trainer holds at once, and descriptors passed but not yet named by a
// registration (the daemon cuts a trainer past either).
inline constexpr uint32_t kMaxDmabufsPerClient = 1024;
inline constexpr size_t kMaxPassedDmabufs = 64;
// The largest dma-buf range a registration names (2^48 bytes).
inline constexpr uint64_t kMaxDmabufBytes = 1ull << 48;

// Version 8: the only bytes a trainer sends on its socket after the hello: 16-byte records, each
// with one descriptor (SCM_RIGHTS) travelling with its first byte: magic, a ticket (1..2^31-1,
// not in use by this trainer) that a register_dmabuf names, and 8 zero bytes.
inline constexpr uint32_t kFdRecordMagic = 0x44465747;  // "GWFD"
inline constexpr size_t kFdRecordBytes = 16;
std::vector<uint8_t> encode_fd_record(uint32_t ticket);
// kPeer unless `data` (kFdRecordBytes) is a well-formed record; then its ticket.
Result<uint32_t> decode_fd_record(const uint8_t* data);
// The collectives (1..7), which the counters keep apart; kImport and kRelease are not counted.
inline constexpr int kNumOpcodes = 7;
const char* opcode_name(Opcode op);

// One submission, as it lies in the ring (64 bytes, little-endian host layout).
struct SqEntry {
  uint64_t seq;       // 1, 2, 3... per client
  uint16_t opcode;    // Opcode
  uint8_t dtype;      // gw_dtype_t
  uint8_t op;         // gw_op_t (allreduce, reduce_scatter)
  int32_t root;       // broadcast
  uint64_t count;     // elements (allgather: per rank; reduce_scatter: received per rank)
  uint64_t send_off;  // offsets into the data region
  uint64_t recv_off;
  // allreduce_compressed: the codec spec then the tensor key, back to back at meta_off in the
  // data region. import: its ImportRecord at meta_off, spec_len its size. 0 otherwise.
  uint64_t meta_off;
  // allreduce_compressed: the spec's and the key's bytes. allreduce, broadcast, allgather,
  // reduce_scatter and alltoall (version 5): the send and the receive buffer's allocation, 0 the
  // data region, else an id this trainer imported (send_off / recv_off are then offsets in that
  // allocation). release: spec_len is the id released.
  uint32_t spec_len;
  uint32_t key_len;
  // allgather: bytes from one rank's block to the next in the receive buffer; reduce_scatter: in
  // the send buffer; alltoall: in both. 0: packed (the block's size). A client runs a collective
  // larger than its arena as chunks, each a slice of every block, straight in a gw_mem_alloc
  // buffer: the blocks of a slice then lie a whole block apart.
  uint64_t stride;
};
static_assert(sizeof(SqEntry) == 64);

// One completion (128 bytes).
struct CqEntry {
  uint64_t seq;
  int32_t status;  // gw_status_t
  uint32_t msg_len;
  char msg[112];
};
static_assert(sizeof(CqEntry) == 128);
inline constexpr size_t kCqMessageBytes = sizeof(CqEntry::msg);

// A decoded, checked submission: every byte range lies inside the data region.
struct Request {
  uint64_t seq = 0;
  Opcode opcode = Opcode::kBarrier;
  coll::DataType dtype = coll::DataType::kU8;
  coll::ReduceOp op = coll::ReduceOp::kSum;
  int32_t root = 0;
  uint64_t count = 0;
  // bytes spans: from the first byte touched to the last (strided blocks included).
  uint64_t send_off = 0, send_bytes = 0;
  uint64_t recv_off = 0, recv_bytes = 0;
  // Bytes from one rank's block to the next (the block's size when packed; 0 where the side
  // holds one block).
  uint64_t send_stride = 0, recv_stride = 0;
  std::string spec, key;  // allreduce_compressed (copied out of the data region)
  // The allocations the offsets are in: 0 the data region, else an imported allocation's id.
  uint32_t send_alloc = 0, recv_alloc = 0;
  // import (copied out of the data region); release: import.alloc_id is the id released.
  uint32_t import_kind = 0;
  uint32_t alloc_id = 0;
  uint64_t alloc_bytes = 0;
  int32_t device = 0;
  uint8_t handle[64] = {};
  // send / recv (version 7): the tag (root is the peer; recv: -1 any source).
  int32_t tag = 0;
  // register_dmabuf (version 8): the ticket of its descriptor, [send_off, + count) of the
  // dma-buf, root the peer, what for (kDmabufSends | kDmabufReceives). deregister_dmabuf: the id
  // in alloc_id.
  uint32_t ticket = 0;
  uint32_t dmabuf_use = 0;
  // send / recv (version 8): a dma-buf registration's id (0: the data region); send_off /
  // recv_off are then offsets into it, checked by the job (the decoder does not know it).
  uint32_t dmabuf = 0;
};

// What an import names (88 bytes in the data region, little-endian host layout).
inline constexpr uint32_t kImportCudaIpc = 1;  // handle: a CUipcMemHandle (cuIpcGetMemHandle)
inline constexpr uint32_t kMaxImportsPerClient = 1024;
struct ImportWire {
  uint32_t kind;      // kImportCudaIpc
  uint32_t alloc_id;  // 1..2^31-1, not in use by this trainer
  uint64_t bytes;     // the allocation's size: 1 .. 2^48
  int32_t device;     // the CUDA device ordinal it lies on: 0..1023
  uint32_t reserved;  // 0
  uint8_t handle[64];
};
static_assert(sizeof(ImportWire) == 88);

// A trainer's imported allocations as the decoder sees them: id -> bytes.
using AllocSizes = std::map<uint32_t, uint64_t>;

// What the completion of a successful allreduce_compressed carries in its message field
// (msg_len 16): this trainer's share of the bytes the daemon sent across hosts for the call, and
// whether the call was summed uncompressed for a NaN/Inf input (nonfinite=skip).
struct CompressedDone {
  uint64_t bytes_sent = 0;
  uint64_t nonfinite = 0;
};

// What the completion of a successful send or recv carries (msg_len 16, version 7): the bytes
// moved (recv: the message's real size) and the source rank (send: the sender's own rank). It
// travels in the same 16 bytes as CompressedDone: p2p_done() reads it from one.
struct P2pDone {
  uint64_t bytes = 0;
  int32_t source = 0;
};
inline CompressedDone p2p_wire(const P2pDone& d) {
  return CompressedDone{d.bytes, static_cast<uint64_t>(static_cast<uint32_t>(d.source))};
}
inline P2pDone p2p_done(const CompressedDone& c) {
  return P2pDone{c.bytes_sent, static_cast<int32_t>(static_cast<uint32_t>(c.nonfinite))};
}
// Eager point-to-point: a send of at most this many bytes completes once the daemon holds a copy,
// matched or not (direct mode's rule: collectives/p2p); a larger one once its receive took it.
inline constexpr uint64_t kP2pEagerBytes = 16u << 10;

// kPeer unless the entry is well formed for a client of `world_size` ranks whose data region
// (`data_bytes` bytes at `data`) it points into and whose next sequence number is expected_seq.
// The codec spec and tensor key of allreduce_compressed are copied out of `data` once.
// `allocs`: the trainer's imports (a submission naming another allocation id is refused; null:
// none). An import of an id already there, or past kMaxImportsPerClient, is refused as well.
Result<Request> decode_request(const SqEntry& e, uint64_t expected_seq, const uint8_t* data,
                               uint64_t data_bytes, int32_t world_size,
                               const AllocSizes* allocs = nullptr);

// Fills the completion for a result (the message cut to fit); with `done`, an
// allreduce_compressed's success carries it.
CqEntry make_completion(uint64_t seq, const Status& s, const CompressedDone* done = nullptr);
// kPeer unless the entry is the completion of expected_seq with a known status; then *carried is
// the Status it carries (ok, or the daemon's error with its message), and *done (when given) what
// a success carried (zeros when it carried nothing).
Status decode_completion(const CqEntry& e, uint64_t expected_seq, Status* carried,
                         CompressedDone* done = nullptr);
// The same for a completion of any sequence number in [lowest, highest] (version 7: sends and
// receives complete out of order; the client checks the number is one it has not had answered).
Status decode_completion_in(const CqEntry& e, uint64_t lowest, uint64_t highest, Status* carried,
                            CompressedDone* done = nullptr);

// The arena header, at offset 0. Counters only grow; a ring holds tail - head entries.
struct alignas(64) ArenaHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t pad0;
  alignas(64) std::atomic<uint64_t> sq_tail;  // written by the client
  alignas(64) std::atomic<uint64_t> sq_head;  // written by the daemon
  alignas(64) std::atomic<uint64_t> cq_tail;  // written by the daemon
  alignas(64) std::atomic<uint64_t> cq_head;  // written by the client
  // 1 while the daemon's job thread busy-polls the submission ring (written by the daemon only):
  // a client that reads 1 after publishing sq_tail (a seq_cst fence between the two) may skip the
  // submission eventfd. The daemon clears it, fences, and checks sq_tail again before it sleeps.
  alignas(64) std::atomic<uint32_t> daemon_polling;
  // 1 while the client busy-polls the completion ring (written by the client only): the daemon,
  // reading 1 after publishing cq_tail (a seq_cst fence between the two), may skip the completion
  // eventfd. The client clears it, fences, and checks cq_tail again before it sleeps.
  alignas(64) std::atomic<uint32_t> client_spinning;
  // 1 once the client closes its connection on purpose (its Client goes: the session or the
  // plugin's comm closed), stored before the socket closes (written by the client only). The
  // daemon reads it when the socket closes: 0 there (a killed or crashed process, or a client
  // before this field) is a trainer that died, 1 one that left (docs/wire-daemon.md §5).
  alignas(64) std::atomic<uint32_t> client_leaving;
};
static_assert(sizeof(ArenaHeader) <= kArenaHeaderBytes);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// kPeer unless a ring's counters are consistent: 0 <= tail - head <= entries.
Status check_ring(uint64_t head, uint64_t tail, uint32_t entries, const char* which);

}  // namespace gw::daemon
