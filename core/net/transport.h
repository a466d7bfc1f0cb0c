// The one transport interface every backend implements (tcp, shm, dpdk, verbs). Backends
// are found by name through the registry (core/net/backend_registry.h).
//
// Its shape follows the NCCL net API on purpose, so plugin/ is a thin adapter and the
// collectives run on exactly the code NCCL runs on:
//
//   receiver: Transport::listen(&handle) -> Listener; handle travels out of band (the store,
//             or NCCL's bootstrap) to the sender; Listener::accept() -> RecvComm
//   sender:   Transport::connect(handle) -> Connector; Connector::poll() -> SendComm
//   data:     SendComm::isend / RecvComm::irecv post a request; Comm::test polls it
//
// Contract (every backend; the conformance suite in tests/unit/transport_conformance_test.cc
// checks each point):
// - Connections are one-way: a SendComm only sends, a RecvComm only receives.
// - No call blocks. accept()/poll() return nullptr for "not yet"; isend/irecv return nullptr
//   for "no free request slot now, retry after testing an older request".
// - At least kMaxRequests requests may be in flight per comm.
// - Sends and receives match in posting order (FIFO). The receive's tag must equal the send's
//   tag, or be kAnyTag; a mismatch fails the receive with kInternal ("tag mismatch").
// - A receive may be larger than the matching send (test reports the bytes received); a send
//   larger than its receive fails both sides' requests with kInvalidArg ("message truncated"),
//   made with truncated_error (Status::truncated(), core/status.h).
// - 0-byte messages are delivered like any other.
// - Requests of one comm complete in posting order; test() may be called on any outstanding
//   request, and after it reports done the request is dead (its slot reused).
// - A peer that closes or dies makes outstanding and later requests fail with kPeer, naming
//   the peer; a Connector whose peer never answers fails with kTimeout after timeout_ms.
// - Destroying a comm with requests in flight is allowed: they are abandoned, never completed,
//   and destruction does not block for longer than a short bounded linger.
// - Thread-safety: different comms may be used from different threads at once. One comm is used
//   by one thread at a time, except reg_mr/dereg_mr, which may race with isend/irecv/test.
//   A backend may move bytes on its own helper threads (tcp with GW_SOCKET_NTHREADS > 0); the
//   points above hold unchanged, and wait_fds then offers a descriptor those threads signal.
// - Handshakes prove the job token without sending it (tcp, shm, verbs, dpdk: an HMAC
//   challenge-response in both directions, core/net/handshake.h); a peer without the token is
//   refused (kPeer on the connector side, the accept side drops it and keeps listening), and a
//   connector refuses a listener that cannot prove the token.
// - A listener told its expected peer (Listener::expect_peer) refuses a connector stating another
//   rank and keeps listening (tcp, shm, verbs, dpdk).
#pragma once

#include <poll.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config_snapshot.h"
#include "core/status.h"

namespace gw::net {

inline constexpr size_t kHandleSize = 128;  // NCCL_NET_HANDLE_MAXSIZE
inline constexpr int kMaxRequests = 32;     // NCCL_NET_MAX_REQUESTS
inline constexpr int kAnyTag = -1;

// Opaque connection address produced by listen() and consumed by connect().
struct Handle {
  std::array<uint8_t, kHandleSize> bytes{};
};

enum class MemType { kHost = 0, kCuda = 1 };

// Registered memory. Backends derive from it to keep keys; tcp/shm need nothing more.
struct MemRegion {
  virtual ~MemRegion() = default;
  void* base = nullptr;
  size_t size = 0;
  MemType type = MemType::kHost;
};

class Request;  // backend-defined, owned by the comm that created it

class Comm {
 public:
  virtual ~Comm() = default;
  // Registration is optional for tcp/shm (nullptr mr is always accepted), required by verbs.
  virtual Result<MemRegion*> reg_mr(void* data, size_t size, MemType type) = 0;
  virtual Status dereg_mr(MemRegion* mr) = 0;
  // Registers device memory [data, data+size) given as a dma-buf: `fd` exports the allocation and
  // `data` lies `offset` bytes into it (NCCL's regMrDmaBuf). The fd may be closed afterwards.
  // Only backends that can register device memory with their NIC implement it (verbs).
  virtual Result<MemRegion*> reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd) {
    return Status(Code::kUnsupported,
                  "reg_mr_dmabuf: this transport cannot register device memory with a NIC");
  }
  // Polls a request. On completion sets *done = true and *size = bytes transferred (for a
  // receive, what the sender sent) and frees the request. On error the request is freed too.
  virtual Status test(Request* request, bool* done, size_t* size) = 0;
  // "rank 3 via tcp 10.0.0.2:41234" style description for error messages.
  virtual std::string peer_name() const = 0;
  // For a caller with nothing else to do: appends the descriptors (with poll() events) that
  // become ready when this comm can make progress on its outstanding requests, and returns true.
  // Returns false when the backend progresses by polling memory (shm) and cannot be waited on
  // this way; the caller then spins or yields. Never blocks.
  virtual bool wait_fds(std::vector<pollfd>* fds) const { return false; }
};

class SendComm : public Comm {
 public:
  // Returns nullptr when no request slot is free now.
  virtual Result<Request*> isend(const void* data, size_t size, int tag, MemRegion* mr) = 0;
};

class RecvComm : public Comm {
 public:
  // Returns nullptr when no request slot is free now. `size` is the capacity of `data`.
  virtual Result<Request*> irecv(void* data, size_t size, int tag, MemRegion* mr) = 0;
  // After a completed receive into device memory [data, data+size) registered as `mr`: makes
  // every byte the NIC wrote there visible to the GPU (NCCL's iflush; verbs reads a byte back
  // through a loopback QP). nullptr when nothing needs doing (host memory, backends that copy
  // through the CPU), else a request to test() until done.
  virtual Result<Request*> iflush(void* data, size_t size, MemRegion* mr) {
    return static_cast<Request*>(nullptr);
  }
};

class Listener {
 public:
  virtual ~Listener() = default;
  // Only the connector of this rank may connect (-1, the default: any rank). Call before the
  // handle is handed out. Every backend checks it (tcp, shm, verbs, dpdk).
  void expect_peer(int rank) {
    expected_peer_ = rank;
    on_expect_peer(rank);
  }
  int expected_peer() const { return expected_peer_; }
  // Returns nullptr until a peer has connected and completed the handshake.
  virtual Result<std::unique_ptr<RecvComm>> accept() = 0;

 protected:
  // For a backend whose handshakes run outside accept() (dpdk: in the engine's progress).
  virtual void on_expect_peer(int rank) {}

 private:
  int expected_peer_ = -1;
};

class Connector {
 public:
  virtual ~Connector() = default;
  // Returns nullptr until the connection is established; kTimeout after timeout_ms.
  virtual Result<std::unique_ptr<SendComm>> poll() = 0;
};

struct Properties {
  std::string name;           // "tcp", "shm"
  std::string interfaces;     // e.g. "eth0:10.0.0.1" (tcp), "" otherwise
  int sockets_per_conn = 1;   // tcp striping
  int io_threads = 0;         // tcp: I/O worker threads per comm (0 = the caller's thread)
  int speed_mbps = 0;         // link speed, 0 when unknown
  double latency_us = 0;      // typical small-message one-way latency, for the cost model
  double bandwidth_gbps = 0;  // typical per-connection bandwidth (GB/s), for the cost model
  bool supports_cuda = false;
};

struct TransportOptions {
  std::string job_token;       // compared in every handshake
  int64_t timeout_ms = 30000;  // connector deadline
  std::string host_id;         // this process's host identity (shm refuses other hosts)
  int rank = -1;               // for names in messages only
  // tcp only, used when GW_SOCKET_NTHREADS / GW_SOCKET_NSOCKS are 0 (auto): the caller's choice
  // of I/O worker threads per comm (0 = progress on the caller's thread) and of sockets per
  // connection (0 = tcp's own rule). The Communicator leaves both 0; the NCCL plugin sets them.
  int socket_threads = 0;
  int socket_nsocks = 0;
  // The configuration the backend reads its rows from; empty: captured when it is made.
  config::Snapshot config;
  // tcp: with GW_SOCKET_IFNAME unset, the interface is the one the routing table uses to reach
  // this host (the store's, as NCCL follows the route to its bootstrap address). "": none known.
  std::string route_host;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const Properties& properties() const = 0;
  virtual Result<std::unique_ptr<Listener>> listen(Handle* handle) = 0;
  virtual Result<std::unique_ptr<Connector>> connect(const Handle& handle) = 0;
  // What the transport can do with CUDA device memory now (GPUDirect RDMA): `reg` when its comms'
  // reg_mr takes MemType::kCuda, `dmabuf` when reg_mr_dmabuf works as well; `why` says what was
  // found. It may change once the process loads the CUDA driver.
  struct DeviceMemory {
    bool reg = false;
    bool dmabuf = false;
    std::string why = "the transport moves host memory only";
  };
  virtual DeviceMemory device_memory() const { return {}; }
  // Whether the transport's NIC takes dma-buf registrations (reg_mr_dmabuf), asked of the NIC
  // alone, with no CUDA driver in the process (gradwired asks it: it never exports a dma-buf, its
  // trainers hand theirs over). `why` is one line for logs and replies.
  struct NicDmabuf {
    bool ok = false;
    std::string why = "the transport moves bytes through the CPU, not a NIC's DMA";
  };
  virtual NicDmabuf nic_dmabuf() const { return {}; }
};

// A transport of the registered backend `name` (not "auto": core/net/auto_backend.h resolves
// that). kInvalidArg listing the registered names for an unknown name; kUnsupported with the
// probe's reason for a backend this process cannot use. Tunables come from options.config (its
// rows).
Result<std::unique_ptr<Transport>> make_transport(const std::string& name,
                                                  const TransportOptions& options);

}  // namespace gw::net
