#include "plugin/daemon_transport.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <type_traits>
#include <vector>

#include "core/bootstrap.h"
#include "core/config.h"
#include "core/net/socket_util.h"
#include "core/store.h"
#include "core/sys/time.h"
#include "core/sys/unix_socket.h"
#include "daemon/client.h"
#include "daemon/control.h"
#include "daemon/daemon_config.h"
#include "gpudirect/cuda_driver.h"
#include "plugin/daemon_handle.h"
#include "plugin/daemon_meeting.h"

namespace gw::plugin {

namespace {

using daemon::Client;
using daemon::Opcode;
using daemon::SqEntry;
using daemon_mode::announce_key;
using daemon_mode::conn_name;
using daemon_mode::connection_token;
using daemon_mode::join_and_post;
using daemon_mode::joined;
using daemon_mode::Joining;
using daemon_mode::listen_store;
using daemon_mode::Shared;
using daemon_mode::StorePlace;

// How often test() looks at the daemon's socket while a request is pending (a dead daemon).
constexpr int64_t kAliveEveryNs = 1'000'000;

// How often a listener's accept() looks in its store for a connector of another host.
constexpr int64_t kStoreLookEveryNs = 2'000'000;

// A message of at least kChunkBytes travels as several daemon messages on its tag (the header's
// "Pipelining" rules): the first exactly kChunkBytes, of which the last kSizeBytes give the
// message's size, then the rest in chunks of at most kChunkBytes. Both ends must agree on it: a
// constant, not a knob.
constexpr size_t kChunkBytes = size_t{4} << 20;
constexpr size_t kSizeBytes = 8;
constexpr size_t kFirstPayload = kChunkBytes - kSizeBytes;
// A comm's chunks after the first of their message in flight at once: the arena room and the
// daemons' unexpected bytes one comm holds stay bounded. The receiver keeps more receives posted
// than the sender has chunks in flight, so that across daemons a chunk finds its receive posted
// and lands in the receiver's arena, not in the remote daemon's unexpected buffer (an allocation
// and one more copy): measured on the loaded 2-core VM, two daemons gave a median 64 % of direct
// mode's bandwidth at 4 receives ahead, 91 % at 8 (7 alternating runs each; 12: 72 %, 4 runs).
constexpr size_t kSendsAhead = 4;
constexpr size_t kReceivesAhead = 8;

void put_size(uint8_t* p, uint64_t v) {
  for (size_t i = 0; i < kSizeBytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_size(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < kSizeBytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// One daemon message of a request: its submission, its staging in the arena, where its payload
// lies in the caller's buffer.
struct Chunk {
  uint64_t seq = 0;
  Client::Placed placed;
  size_t at = 0;   // offset in the caller's buffer
  size_t len = 0;  // bytes sent, or the receive's capacity (the first chunk's size included)
  bool first = false;
};

struct DaemonRequest {
  bool in_use = false;
  bool send = false;
  int tag = 0;
  uint8_t* user = nullptr;
  size_t size = 0;       // send: the message; recv: the buffer
  size_t total = 0;      // recv: the message's size once known
  bool known = false;    // recv: total is known (the first chunk arrived)
  bool started = false;  // the first chunk is submitted
  size_t next = 0;       // payload bytes submitted (send) or asked for (recv), the first's included
  size_t got = 0;        // recv: payload bytes arrived and copied out
  // A device buffer (a dma-buf region): the daemon's registration id and the offset in it. Such a
  // message is one daemon message naming the region (no staging, no chunks): the NICs move it.
  uint32_t dmabuf = 0;
  uint64_t dev_off = 0;
  // iflush of a device receive: one flush_dmabuf submission (of [dev_off, + size) of dmabuf),
  // answered by the receiving daemon once its NIC's flush ran; no message, no tag.
  bool flush = false;
  // Submitted, completion not yet read (in order; at most 1 + kReceivesAhead). A vector whose
  // room the slot keeps from one request to the next: no allocation per message.
  std::vector<Chunk> chunks;
  Status failed;
};

// One side of a connection: its client of the daemon and its requests (the backend's
// net::Request is a DaemonRequest of this comm). Thread-safe (mu_): NCCL registers on one thread
// while its proxy thread moves the data on another.
//
// Every call moves the whole comm (pump): it reads the completions of every request's chunks
// (copying a receive's chunk out while the later ones move), then submits what is due in posting
// order, keeping each tag's chunks in message order.
class DaemonComm {
 public:
  DaemonComm(std::unique_ptr<Client> client, std::string name, int peer, int64_t timeout_ms)
      : client_(std::move(client)), name_(std::move(name)), peer_(peer), timeout_ms_(timeout_ms) {}

  Result<net::Request*> post(bool send, void* data, size_t size, int tag, uint32_t dmabuf = 0,
                             uint64_t dev_off = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    const char* what = send ? "isend" : "irecv";
    if (tag < 0) {
      return Status(
          Code::kUnsupported,
          fmt::format("{}: tag {}: daemon mode matches exact tags (0..2^31-1) only", what, tag));
    }
    if (!broken_.ok()) return broken_.with_context(name_);
    DaemonRequest* r = nullptr;
    for (DaemonRequest& q : reqs_) {
      if (!q.in_use) {
        r = &q;
        break;
      }
    }
    if (r == nullptr) return static_cast<net::Request*>(nullptr);
    r->in_use = true;
    r->send = send;
    r->tag = tag;
    r->user = static_cast<uint8_t*>(data);
    r->size = size;
    r->dmabuf = dmabuf;
    r->dev_off = dev_off;
    order_.push_back(r);
    Status st = pump();
    if (st.ok()) st = r->failed;
    if (!st.ok()) {
      release(*r);
      return st.with_context(fmt::format("{} on {}", what, name_));
    }
    return reinterpret_cast<net::Request*>(r);
  }

  Status test(net::Request* request, bool* done, size_t* size) {
    std::lock_guard<std::mutex> lock(mu_);
    *done = false;
    auto* r = reinterpret_cast<DaemonRequest*>(request);
    if (r < reqs_.data() || r >= reqs_.data() + reqs_.size() || !r->in_use) {
      return internal_error("request {} is not in flight on {}", (void*)request, name_);
    }
    const char* what = r->send ? "isend" : "irecv";
    Status st = pump();
    if (st.ok()) st = r->failed;
    if (st.ok() && !finished(*r)) {
      // The daemon's thread must run for this request to progress: on a host with more runnable
      // threads than cores, NCCL's polling proxy thread gives its core up between looks (as the
      // C ABI's client does while it waits).
      sched_yield();
      const int64_t now = sys::now_ns();
      if (now - last_alive_ns_ < kAliveEveryNs) return ok_status();
      last_alive_ns_ = now;
      st = client_->check_alive(what);
      if (st.ok()) return ok_status();
    }
    const size_t got = r->send ? r->size : r->got;
    release(*r);
    if (!st.ok()) return st.with_context(name_);
    *done = true;
    *size = got;
    return ok_status();
  }

  const std::string& name() const { return name_; }

  // regMrDmaBuf: lends the dma-buf to the daemon (Client::pass_fd) and has it registered with the
  // NIC of this connection's link to the peer's host, for this end's direction; the daemon's id.
  // One thread at a time, as every call on the comm.
  Result<uint32_t> register_dmabuf(int fd, uint64_t offset, size_t size, bool send) {
    const char* what = "regMrDmaBuf";
    std::lock_guard<std::mutex> lock(mu_);
    GW_RETURN_IF_ERROR(broken_);
    GW_ASSIGN_OR_RETURN(uint32_t ticket, client_->pass_fd(fd, what));
    SqEntry e{};
    e.opcode = static_cast<uint16_t>(Opcode::kRegisterDmabuf);
    e.root = peer_;
    e.spec_len = ticket;
    e.send_off = offset;
    e.count = size;
    e.key_len = send ? daemon::kDmabufSends : daemon::kDmabufReceives;
    daemon::CompressedDone info;
    GW_RETURN_IF_ERROR(call(e, what, &info));
    const uint64_t id = daemon::p2p_done(info).bytes;
    if (id == 0 || id > 0x7fffffffu) {
      return client_->broken(peer_error("gradwired answered a dma-buf registration id {}", id));
    }
    return static_cast<uint32_t>(id);
  }
  // iflush of a device receive: the daemon runs its NIC's flush of [off, + size) of registration
  // id (on the data connection the receive came on). A request that test() completes once the
  // daemon answered (NCCL's proxy thread never waits for the daemon in iflush); nullptr when all
  // of the comm's request slots are taken (NCCL calls again).
  Result<net::Request*> post_flush(uint32_t id, uint64_t off, size_t size) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!broken_.ok()) return broken_.with_context(name_);
    DaemonRequest* r = nullptr;
    for (DaemonRequest& q : reqs_) {
      if (!q.in_use) {
        r = &q;
        break;
      }
    }
    if (r == nullptr) return static_cast<net::Request*>(nullptr);
    SqEntry e{};
    e.opcode = static_cast<uint16_t>(Opcode::kFlushDmabuf);
    e.spec_len = id;
    e.recv_off = off;
    e.count = size;
    GW_ASSIGN_OR_RETURN(uint64_t seq, client_->post(e, "iflush"));
    r->in_use = true;
    r->flush = true;
    r->dmabuf = id;
    r->dev_off = off;
    r->size = size;
    r->next = size;
    r->started = true;
    r->chunks.push_back(Chunk{seq, Client::Placed{}, 0, size, true});
    order_.push_back(r);
    return reinterpret_cast<net::Request*>(r);
  }
  Status deregister_dmabuf(uint32_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    SqEntry e{};
    e.opcode = static_cast<uint16_t>(Opcode::kDeregisterDmabuf);
    e.spec_len = id;
    return call(e, "deregMr");
  }

 private:
  // One request the daemon answers by itself (not a message): posted, then waited for (the
  // daemon's deadline), the comm's other requests' completions kept for them meanwhile.
  Status call(const SqEntry& e, const char* what, daemon::CompressedDone* info = nullptr) {
    GW_ASSIGN_OR_RETURN(uint64_t seq, client_->post(e, what));
    bool done = false;
    Status st = client_->wait_for(seq, sys::deadline_after_ms(timeout_ms_), &done, what, info);
    if (!done) {
      return client_->broken(
          timeout_error("{}: gradwired did not answer within {} ms", what, timeout_ms_));
    }
    return st;
  }

  // Whether every chunk of r's message is submitted (a receive: asked for).
  static bool all_out(const DaemonRequest& r) {
    if (!r.started) return false;
    if (r.dmabuf != 0) return true;  // one daemon message
    if (r.send) return r.next == r.size;
    return r.known ? r.next == r.total : r.chunks.front().len < kChunkBytes;
  }
  static bool finished(const DaemonRequest& r) {
    return r.chunks.empty() && r.started && (r.send ? r.next == r.size : r.known);
  }

  // Frees the request's slot and whatever arena it still holds. A chunk still pending in the
  // daemon may leave its staging only once the comm places nothing more (broken_ is set first).
  void release(DaemonRequest& r) {
    for (const Chunk& c : r.chunks) client_->unplace(c.placed);
    order_.erase(std::find(order_.begin(), order_.end(), &r));
    std::vector<Chunk> room = std::move(r.chunks);
    room.clear();
    r = DaemonRequest{};
    r.chunks = std::move(room);
  }

  // A request failed. Chunks of its message (or of the message a receive took part of) may still
  // be in the daemon and would be matched by the next message on the tag: then the comm ends
  // (direct mode's connection ends with a truncation or a dead peer too).
  void fail(DaemonRequest& r, const Status& s, bool leaves_chunks) {
    r.failed = s;
    if (leaves_chunks && broken_.ok()) broken_ = s;
  }

  Status pump() {
    if (!broken_.ok()) return broken_;
    for (DaemonRequest* r : order_) {
      if (r->failed.ok()) reap(*r);
      if (!broken_.ok()) return broken_;
    }
    submit();
    return broken_;
  }

  // Reads the completions of r's chunks (they complete in order on one tag).
  void reap(DaemonRequest& r) {
    const char* what = r.send ? "isend" : "irecv";
    while (!r.chunks.empty()) {
      const Chunk c = r.chunks.front();
      bool fin = false;
      daemon::CompressedDone info;
      Status st = client_->wait_for(c.seq, sys::kNoWait, &fin, what, &info);
      if (!fin) return;
      r.chunks.erase(r.chunks.begin());
      if (!c.first && ahead_ > 0) --ahead_;
      size_t bytes = 0;
      if (st.ok()) {
        const daemon::P2pDone d = daemon::p2p_done(info);
        if (d.bytes > c.len) {
          st = client_->broken(
              peer_error("gradwired answered {} bytes for a buffer of {} bytes", d.bytes, c.len));
        }
        bytes = static_cast<size_t>(d.bytes);
      }
      if (st.ok() && r.flush) {
        r.known = true;  // the daemon's NIC flush ran (or its link needed none)
      } else if (st.ok() && !r.send && r.dmabuf != 0) {
        r.total = r.next = r.got = bytes;  // the NIC wrote it into the device buffer
        r.known = true;
      } else if (st.ok() && !r.send) {
        st = arrived(r, c, bytes);
      }
      client_->unplace(c.placed);
      if (!st.ok()) {
        // A receive's failure may leave the rest of its message in the daemon, a chunked send's
        // the chunks after it; a device message is one daemon message (refused whole).
        fail(r, st, r.dmabuf == 0 && (!r.send || r.size >= kChunkBytes));
        return;
      }
    }
  }

  // A receive's chunk c arrived with `bytes`: learns the message's size from the first chunk of a
  // chunked one, posts the receives now due, then copies the payload out.
  Status arrived(DaemonRequest& r, const Chunk& c, size_t bytes) {
    const uint8_t* staged = c.placed.staged ? client_->data() + c.placed.off : r.user + c.at;
    size_t payload = bytes;
    if (c.first) {
      if (bytes < kChunkBytes) {
        r.total = r.next = bytes;  // one chunk: the whole message
      } else {
        const uint64_t total = get_size(staged + kFirstPayload);
        if (total < kChunkBytes) {
          return peer_error("the first chunk of a message gives {} bytes (at least {} expected)",
                            total, kChunkBytes);
        }
        if (total > r.size) {
          // Refuse the next chunk too (a receive of 0 bytes), so that the sender learns it.
          SqEntry e{};
          e.opcode = static_cast<uint16_t>(Opcode::kRecv);
          e.root = peer_;
          e.spec_len = static_cast<uint32_t>(r.tag);
          (void)client_->post(e, "irecv");
          return truncated_error(
              "message truncated: the peer sent {} bytes with tag {}, more than the receive's {}",
              total, r.tag, r.size);
        }
        r.total = total;
        payload = kFirstPayload;
      }
      r.known = true;
      holding_ = true;  // c's staging is still taken: a full arena is "not yet"
      submit_receives(r);
      holding_ = false;
    } else if (bytes != c.len) {
      return peer_error("a chunk of {} bytes arrived where {} were due (tag {})", bytes, c.len,
                        r.tag);
    }
    if (payload > 0 && c.placed.staged) std::memcpy(r.user + c.at, staged, payload);
    r.got += payload;
    return ok_status();
  }

  bool any_in_flight() const {
    for (const DaemonRequest* r : order_) {
      if (!r->chunks.empty()) return true;
    }
    return holding_;
  }

  // Stages and submits r's next chunk: `len` bytes of which `payload` come from the caller's buffer
  // at r.next (the first chunk of a chunked message adds its size). False when the arena has no
  // room now (retried at the next call); a failure is r's.
  bool submit_chunk(DaemonRequest& r, size_t len, size_t payload) {
    const char* what = r.send ? "isend" : "irecv";
    const bool first = !r.started;
    Result<Client::Placed> placed = Client::Placed{};
    if (len != payload) {
      // The size rides in the staging: always staged, whatever the caller's buffer is.
      auto off = client_->alloc(len);
      if (off.ok()) {
        placed = Client::Placed{*off, true};
      } else {
        placed = no_memory("a {} byte chunk does not fit the free part of the daemon arena ({})",
                           len, off.status().message());
      }
    } else {
      placed = client_->place(r.user + r.next, len, r.send);
    }
    if (!placed.ok()) {
      // The arena is held by chunks in flight: they complete and free it.
      if (placed.status().code() == Code::kNoMemory && any_in_flight()) return false;
      fail(r, placed.status().with_context(what), r.started);
      return false;
    }
    if (r.send && len != payload) {
      std::memcpy(client_->data() + placed->off, r.user, payload);
      put_size(client_->data() + placed->off + payload, r.size);
    }
    SqEntry e{};
    e.opcode = static_cast<uint16_t>(r.send ? Opcode::kSend : Opcode::kRecv);
    e.root = peer_;
    e.count = len;
    (r.send ? e.send_off : e.recv_off) = placed->off;
    e.spec_len = static_cast<uint32_t>(r.tag);
    auto seq = client_->post(e, what);
    if (!seq.ok()) {
      client_->unplace(*placed);
      fail(r, seq.status(), true);
      return false;
    }
    r.chunks.push_back(Chunk{*seq, *placed, r.next, len, first});
    r.next += payload;
    r.started = true;
    return true;
  }

  // A device message: one submission naming the daemon's dma-buf registration (the offset in it),
  // whatever its size; the daemon's NIC moves it (docs/wire-daemon.md, "Device buffers").
  void submit_device(DaemonRequest& r) {
    const char* what = r.send ? "isend" : "irecv";
    SqEntry e{};
    e.opcode = static_cast<uint16_t>(r.send ? Opcode::kSend : Opcode::kRecv);
    e.root = peer_;
    e.count = r.size;
    (r.send ? e.send_off : e.recv_off) = r.dev_off;
    e.spec_len = static_cast<uint32_t>(r.tag);
    e.key_len = r.dmabuf;
    auto seq = client_->post(e, what);
    if (!seq.ok()) {
      fail(r, seq.status(), true);
      return;
    }
    r.chunks.push_back(Chunk{*seq, Client::Placed{}, 0, r.size, true});
    r.next = r.size;
    r.started = true;
  }

  // A receive's chunks after the first, once its size is known, while fewer than kReceivesAhead
  // such chunks of the comm are in flight.
  void submit_receives(DaemonRequest& r) {
    while (r.failed.ok() && r.known && r.next < r.total && ahead_ < kReceivesAhead) {
      const size_t n = std::min(kChunkBytes, r.total - r.next);
      if (!submit_chunk(r, n, n)) return;
      ++ahead_;
    }
  }

  // Submits what is due, in posting order. A message's chunks go after every chunk of the
  // messages posted before it on its tag (the daemon matches per tag in order), both ways: a send
  // waits for the earlier send's last chunk to be out, a receive for the earlier receive's last
  // one to be posted (a receive posted beyond the end of a message would take the next one's).
  // A message's first chunk goes regardless of the others in flight (each message makes progress
  // by itself, as in direct mode); later ones while fewer than kSendsAhead (sends) or
  // kReceivesAhead (receives) are in flight.
  void submit() {
    ahead_ = 0;
    for (const DaemonRequest* r : order_) {
      for (const Chunk& c : r->chunks) ahead_ += c.first ? 0 : 1;
    }
    open_tags_.clear();
    for (DaemonRequest* r : order_) {
      if (!r->failed.ok() || r->flush) continue;   // a flush is submitted when posted
      const int key = r->send ? r->tag : ~r->tag;  // sends and receives apart (tags are >= 0)
      const bool waits = std::find(open_tags_.begin(), open_tags_.end(), key) != open_tags_.end();
      if (r->dmabuf != 0) {
        if (!waits && !r->started) submit_device(*r);
        if (!r->failed.ok() || !all_out(*r)) open_tags_.push_back(key);
        continue;
      }
      if (!waits && !r->started) {
        if (r->send) {
          const bool chunked = r->size >= kChunkBytes;
          submit_chunk(*r, chunked ? kChunkBytes : r->size, chunked ? kFirstPayload : r->size);
        } else {
          const size_t n = std::min(kChunkBytes, r->size);
          if (n == kChunkBytes) {
            submit_chunk(*r, n, kFirstPayload);  // the size lands in the staging
          } else {
            submit_chunk(*r, n, n);
          }
        }
      }
      if (r->send) {
        while (r->started && r->failed.ok() && r->next < r->size && ahead_ < kSendsAhead) {
          const size_t n = std::min(kChunkBytes, r->size - r->next);
          if (!submit_chunk(*r, n, n)) break;
          ++ahead_;
        }
      } else {
        submit_receives(*r);
      }
      if (!r->failed.ok() || !all_out(*r)) open_tags_.push_back(key);
    }
  }

  // The data path (one thread: PluginComm's lock) and the registrations (NCCL's other thread,
  // regMrDmaBuf / deregMr) share the client: one at a time.
  std::mutex mu_;
  std::unique_ptr<Client> client_;
  std::string name_;
  int peer_;
  int64_t timeout_ms_;
  std::array<DaemonRequest, net::kMaxRequests> reqs_{};
  std::vector<DaemonRequest*> order_;  // in flight, in posting order
  std::vector<int> open_tags_;         // submit()'s scratch
  size_t ahead_ = 0;                   // chunks after their message's first in flight
  Status broken_;                      // set once a failure may have left chunks in the daemon
  bool holding_ = false;               // reap() holds a chunk's staging while posting the next
  int64_t last_alive_ns_ = 0;
};

// A region of a daemon-mode comm: host memory (copied through the arena), or a dma-buf the daemon
// registered with its NIC (dmabuf_id != 0, its id in the daemon).
struct DaemonRegion : net::MemRegion {
  uint32_t dmabuf_id = 0;
};

Result<net::MemRegion*> host_region(void* data, size_t size) {
  auto* mr = new DaemonRegion;
  mr->base = data;
  mr->size = size;
  mr->type = net::MemType::kHost;
  return mr;
}

// regMr(NCCL_PTR_CUDA): device memory with no dma-buf handed in. As the direct verbs path does
// with GPUDirect, the plugin exports one itself through the CUDA driver
// (cuMemGetHandleForAddressRange over the allocation's pages) and hands it to `reg` (the daemon's
// register_dmabuf) for the pages of [data, + size); the descriptor is closed after (the daemon's
// registration holds the buffer). A driver that is missing or cannot export is an error naming
// it: device memory never falls back to a host path here (the CPU cannot copy it).
struct Exported {
  uintptr_t begin = 0;  // the registered pages: [begin, begin + bytes)
  size_t bytes = 0;
  uint64_t offset = 0;  // begin's offset in the dma-buf
};
Result<Exported> export_dmabuf(void* data, size_t size,
                               const std::function<Status(int fd, const Exported&)>& reg) {
  const char* what = "regMr(NCCL_PTR_CUDA) in daemon mode";
  const cuda::Driver* d = cuda::resident_driver();
  if (d == nullptr) {
    return Status(
        Code::kUnsupported,
        fmt::format("{}: no CUDA driver in this process to export the buffer's dma-buf", what));
  }
  if (d->cuMemGetHandleForAddressRange == nullptr || d->cuMemGetAddressRange == nullptr) {
    return Status(Code::kUnsupported,
                  fmt::format("{}: the CUDA driver ({}) cannot export dma-bufs "
                              "(cuMemGetHandleForAddressRange needs CUDA 11.7 or later)",
                              what, d->version));
  }
  const auto ptr = reinterpret_cast<cuda::CUdeviceptr>(data);
  cuda::CUdeviceptr base = 0;
  size_t alloc = 0;
  if (cuda::CUresult r = d->cuMemGetAddressRange(&base, &alloc, ptr); r != cuda::kCudaSuccess) {
    return cuda::cuda_error(*d, r, fmt::format("{}: cuMemGetAddressRange({:#x})", what, ptr));
  }
  if (ptr < base || size > alloc || ptr - base > alloc - size) {
    return invalid_arg("{}: [{:#x}, +{}) is not inside one CUDA allocation ({:#x}, +{})", what, ptr,
                       size, base, alloc);
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t export_size = (alloc + page - 1) & ~(page - 1);
  int fd = -1;
  if (cuda::CUresult r = d->cuMemGetHandleForAddressRange(&fd, base, export_size,
                                                          cuda::kMemRangeHandleDmaBufFd, 0);
      r != cuda::kCudaSuccess) {
    return cuda::cuda_error(*d, r,
                            fmt::format("{}: cuMemGetHandleForAddressRange(DMA_BUF_FD)", what));
  }
  Exported e;
  e.begin = std::max<uintptr_t>(ptr & ~(page - 1), base);
  const uintptr_t end =
      std::min<uintptr_t>((ptr + size + page - 1) & ~(page - 1), base + export_size);
  e.bytes = end - e.begin;
  e.offset = e.begin - base;
  Status s = reg(fd, e);
  ::close(fd);
  if (!s.ok()) return s;
  return e;
}

// A buffer in a device region (docs/nccl-plugin.md "Daemon mode"): the daemon's registration id
// and the buffer's offset in it (0 for a host buffer, copied through the arena).
struct DeviceAt {
  uint32_t id = 0;
  uint64_t off = 0;
};
Result<DeviceAt> device_at(net::MemRegion* mr, const void* data, size_t size, const char* what);

Result<DeviceAt> device_at(net::MemRegion* mr, const void* data, size_t size, const char* what) {
  if (mr == nullptr || mr->type == net::MemType::kHost) return DeviceAt{};
  const auto* r = static_cast<const DaemonRegion*>(mr);
  const auto* base = static_cast<const uint8_t*>(r->base);
  const auto* p = static_cast<const uint8_t*>(data);
  if (r->dmabuf_id == 0 || p < base || static_cast<size_t>(p - base) > r->size ||
      size > r->size - static_cast<size_t>(p - base)) {
    return invalid_arg("{}: {} bytes at {} outside the device region [{}, +{})", what, size, data,
                       r->base, r->size);
  }
  return DeviceAt{r->dmabuf_id, static_cast<uint64_t>(p - base)};
}

// What a send comm and a receive comm over the daemon share: regions, test and the peer's name
// from the connection.
template <class Base>
class DaemonEnd : public Base {
 public:
  explicit DaemonEnd(std::unique_ptr<DaemonComm> c) : c_(std::move(c)) {}
  Result<net::MemRegion*> reg_mr(void* data, size_t size, net::MemType type) override {
    if (type == net::MemType::kHost) return host_region(data, size);
    if (data == nullptr || size == 0) return invalid_arg("regMr: {} bytes at {}", size, data);
    uint32_t id = 0;
    GW_ASSIGN_OR_RETURN(Exported e, export_dmabuf(data, size, [&](int fd, const Exported& x) {
                          auto got = c_->register_dmabuf(fd, x.offset, x.bytes, kSend);
                          if (got.ok()) id = *got;
                          return got.status();
                        }));
    auto* mr = new DaemonRegion;
    mr->base = reinterpret_cast<void*>(e.begin);
    mr->size = e.bytes;
    mr->type = net::MemType::kCuda;
    mr->dmabuf_id = id;
    return mr;
  }
  // The dma-buf goes to the daemon, which registers it on the NIC of the job's link to the peer's
  // host (for this end's direction); the daemon never maps it.
  Result<net::MemRegion*> reg_mr_dmabuf(void* data, size_t size, uint64_t offset, int fd) override {
    if (data == nullptr || size == 0) {
      return invalid_arg("regMrDmaBuf: {} bytes at {}", size, data);
    }
    GW_ASSIGN_OR_RETURN(uint32_t id, c_->register_dmabuf(fd, offset, size, kSend));
    auto* mr = new DaemonRegion;
    mr->base = data;
    mr->size = size;
    mr->type = net::MemType::kCuda;
    mr->dmabuf_id = id;
    return mr;
  }
  Status dereg_mr(net::MemRegion* mr) override {
    auto* r = static_cast<DaemonRegion*>(mr);
    Status s;
    if (r != nullptr && r->dmabuf_id != 0) s = c_->deregister_dmabuf(r->dmabuf_id);
    delete r;
    return s;
  }
  Status test(net::Request* r, bool* done, size_t* size) override {
    return c_->test(r, done, size);
  }
  std::string peer_name() const override { return c_->name(); }

 protected:
  static constexpr bool kSend = std::is_same_v<Base, net::SendComm>;
  std::unique_ptr<DaemonComm> c_;
};

class DaemonSend final : public DaemonEnd<net::SendComm> {
 public:
  using DaemonEnd::DaemonEnd;
  Result<net::Request*> isend(const void* data, size_t size, int tag, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(DeviceAt d, device_at(mr, data, size, "isend"));
    return c_->post(true, const_cast<void*>(data), size, tag, d.id, d.off);
  }
};

class DaemonRecv final : public DaemonEnd<net::RecvComm> {
 public:
  using DaemonEnd::DaemonEnd;
  Result<net::Request*> irecv(void* data, size_t size, int tag, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(DeviceAt d, device_at(mr, data, size, "irecv"));
    return c_->post(false, data, size, tag, d.id, d.off);
  }
  // A device receive's flush runs in the receiving daemon (its NIC wrote the bytes): a request
  // that completes when the daemon answered, as direct mode's GDR flush is one. Host buffers, and
  // an empty receive, need none (no request).
  Result<net::Request*> iflush(void* data, size_t size, net::MemRegion* mr) override {
    GW_ASSIGN_OR_RETURN(DeviceAt d, device_at(mr, data, size, "iflush"));
    if (d.id == 0 || size == 0) return static_cast<net::Request*>(nullptr);
    return c_->post_flush(d.id, d.off, size);
  }
};

// Joining side of a connection: its client and the 0-byte message that proves the job complete.
// The listener joins its host's daemon as for a connector of this host on its first accept, and
// meanwhile looks (every kStoreLookEveryNs) in the store it hosts for a connector of another
// host's announcement: then it leaves that job and joins the two-host one instead.
class DaemonListener final : public net::Listener {
 public:
  DaemonListener(std::shared_ptr<const Shared> s, DaemonHandle h, std::shared_ptr<TcpStore> store,
                 StorePlace place)
      : s_(std::move(s)),
        h_(std::move(h)),
        token_(connection_token(s_->options.job_token, h_.nonce)),
        store_(std::move(store)),
        place_(std::move(place)) {}
  Result<std::unique_ptr<net::RecvComm>> accept() override {
    if (!j_.client) {
      GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, false));
    }
    if (!xhost_ && store_) {
      const int64_t now = sys::now_ns();
      if (now - last_look_ns_ >= kStoreLookEveryNs) {
        last_look_ns_ = now;
        // A counter: add(0) reads it without waiting for the key (get would wait).
        auto v =
            store_->add(announce_key(token_), 0, sys::deadline_after_ms(s_->options.timeout_ms));
        if (!v.ok()) return v.status().with_context("accept: the listener's store");
        if (*v > 0) {
          xhost_ = true;
          (void)store_->erase(announce_key(token_), sys::deadline_after_ms(s_->options.timeout_ms));
          j_ = Joining{};  // leaves the one-host job (never complete)
          GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, false, &place_));
        }
      }
    }
    GW_ASSIGN_OR_RETURN(bool ready, joined(j_, "accept"));
    if (!ready) return std::unique_ptr<net::RecvComm>();
    auto c = std::make_unique<DaemonComm>(std::move(j_.client), conn_name(token_, h_, false), 0,
                                          s_->options.timeout_ms);
    j_ = Joining{};
    return std::unique_ptr<net::RecvComm>(std::make_unique<DaemonRecv>(std::move(c)));
  }

 private:
  std::shared_ptr<const Shared> s_;
  DaemonHandle h_;
  std::string token_;
  std::shared_ptr<TcpStore> store_;
  StorePlace place_;
  bool xhost_ = false;
  int64_t last_look_ns_ = 0;
  Joining j_;
};

class DaemonConnector final : public net::Connector {
 public:
  DaemonConnector(std::shared_ptr<const Shared> s, DaemonHandle h)
      : s_(std::move(s)),
        h_(std::move(h)),
        token_(connection_token(s_->options.job_token, h_.nonce)),
        deadline_(sys::deadline_after_ms(s_->options.timeout_ms)) {}
  Result<std::unique_ptr<net::SendComm>> poll() override {
    if (!j_.client) {
      if (h_.host == s_->host) {
        GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, true));
      } else {
        GW_RETURN_IF_ERROR(announce());
        GW_ASSIGN_OR_RETURN(j_, join_and_post(*s_, token_, true, &place_));
      }
    }
    GW_ASSIGN_OR_RETURN(bool ready, joined(j_, "connect"));
    if (!ready) {
      if (sys::expired(deadline_)) {
        return timeout_error(
            "connect: no process of this job accepted on the handle (listener pid {}) within {} "
            "ms through gradwired ({}): the listener closed, or it runs with another "
            "GW_JOB_TOKEN",
            h_.pid, s_->options.timeout_ms, s_->options.address);
      }
      return std::unique_ptr<net::SendComm>();
    }
    auto c = std::make_unique<DaemonComm>(std::move(j_.client), conn_name(token_, h_, true), 1,
                                          s_->options.timeout_ms);
    j_ = Joining{};
    store_.reset();
    return std::unique_ptr<net::SendComm>(std::make_unique<DaemonSend>(std::move(c)));
  }

 private:
  // A connector of another host: tells the listener through its store (which requires the job
  // token: another job's process is refused there) to join the two-host job.
  Status announce() {
    if (h_.store.empty()) {
      return Status(Code::kUnsupported,
                    fmt::format("connect: the listener (pid {}) is on another host and its "
                                "handle names no store (an older plugin)",
                                h_.pid));
    }
    GW_RETURN_IF_ERROR(split_store_address(h_.store, &place_.host, &place_.port));
    TcpStoreOptions o;
    o.host = place_.host;
    o.port = place_.port;
    o.host_server = false;
    o.token = s_->options.job_token;
    o.connect_timeout_ms = std::max(1, sys::ms_until(deadline_));
    auto made = TcpStore::create(o);
    if (!made.ok()) {
      return made.status().with_context(fmt::format(
          "connect: the listener's store at {} (listener pid {} on another host; the same "
          "GW_JOB_TOKEN on every rank?)",
          h_.store, h_.pid));
    }
    store_ = *made;
    return store_->add(announce_key(token_), 1, deadline_)
        .status()
        .with_context("connect: announcing this connector in the listener's store");
  }

  std::shared_ptr<const Shared> s_;
  DaemonHandle h_;
  std::string token_;
  sys::Deadline deadline_;
  StorePlace place_;
  std::shared_ptr<TcpStore> store_;
  Joining j_;
};

class DaemonTransport final : public net::Transport {
 public:
  DaemonTransport(std::shared_ptr<const Shared> s, net::Properties p)
      : s_(std::move(s)), props_(std::move(p)) {}
  const net::Properties& properties() const override { return props_; }
  Result<std::unique_ptr<net::Listener>> listen(net::Handle* handle) override {
    DaemonHandle h;
    h.host = s_->host;
    h.pid = static_cast<uint32_t>(::getpid());
    std::random_device rd;
    for (size_t i = 0; i < h.nonce.size(); i += 4) {
      const uint32_t v = rd();
      std::memcpy(h.nonce.data() + i, &v, 4);
    }
    GW_ASSIGN_OR_RETURN(std::shared_ptr<TcpStore> store, listen_store(*s_, &h.store));
    StorePlace place;
    GW_RETURN_IF_ERROR(split_store_address(h.store, &place.host, &place.port));
    GW_RETURN_IF_ERROR(encode_daemon_handle(h, handle->bytes.data()));
    return std::unique_ptr<net::Listener>(
        std::make_unique<DaemonListener>(s_, std::move(h), std::move(store), std::move(place)));
  }
  Result<std::unique_ptr<net::Connector>> connect(const net::Handle& handle) override {
    GW_ASSIGN_OR_RETURN(DaemonHandle h,
                        decode_daemon_handle(handle.bytes.data(), handle.bytes.size()));
    return std::unique_ptr<net::Connector>(std::make_unique<DaemonConnector>(s_, std::move(h)));
  }
  // What gradwired said at start-up (daemon_device_buffers): device buffers go through it as
  // dma-bufs (regMrDmaBuf, or regMr(NCCL_PTR_CUDA) exporting one), or host buffers only.
  DeviceMemory device_memory() const override { return device_; }
  void set_device_memory(DeviceMemory d) { device_ = std::move(d); }

 private:
  std::shared_ptr<const Shared> s_;
  net::Properties props_;
  DeviceMemory device_;
};

// Asks the daemon (its control socket's status: docs/wire-daemon.md "Control socket") whether
// device buffers can go through it: `device_buffers` and its one-line `device_buffers_why`. A
// daemon that does not answer in time, or an older one that does not say, means host buffers only.
net::Transport::DeviceMemory daemon_device_buffers(const std::string& address, int64_t timeout_ms) {
  net::Transport::DeviceMemory d;
  const std::string ctl = daemon::control_socket_path(address.substr(5));
  auto st = daemon::control_call(ctl, daemon::ControlCommand::kStatus,
                                 std::clamp<int64_t>(timeout_ms, 1, 5000));
  if (!st.ok()) {
    d.why = fmt::format("gradwired's status did not answer ({}): host buffers only",
                        st.status().message());
    return d;
  }
  const auto& r = *st;
  if (!r.contains("device_buffers") || !r["device_buffers"].is_boolean() ||
      !r.contains("device_buffers_why") || !r["device_buffers_why"].is_string()) {
    d.why =
        "gradwired does not say whether device buffers go through it (an older daemon): "
        "host buffers only";
    return d;
  }
  d.reg = d.dmabuf = r["device_buffers"].get<bool>();
  d.why = "gradwired says " + r["device_buffers_why"].get<std::string>();
  return d;
}

}  // namespace

Result<std::unique_ptr<net::Transport>> make_daemon_transport(const DaemonNetOptions& options,
                                                              const net::Properties& nic) {
  auto s = std::make_shared<Shared>();
  s->options = options;
  s->host_id = host_identity();
  s->host = host_hash(s->host_id);
  s->spin_ns = 0;  // test() never waits: NCCL's proxy thread polls
  auto t = std::make_unique<DaemonTransport>(s, nic);
  t->set_device_memory(daemon_device_buffers(options.address, options.timeout_ms));
  return std::unique_ptr<net::Transport>(std::move(t));
}

}  // namespace gw::plugin
