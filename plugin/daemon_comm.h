// Daemon mode's comm (plugin/daemon_transport.cc): one side of a connection, its client of the
// daemon and its requests. Only daemon_transport.cc includes it.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/net/transport.h"
#include "core/status.h"
#include "core/sys/time.h"
#include "daemon/client.h"
#include "daemon/control.h"
#include "daemon/ring.h"
#include "plugin/plugin_config.h"

namespace gw::plugin::daemon_mode {

using daemon::Client;
using daemon::Opcode;
using daemon::SqEntry;

// How often test() looks at the daemon's socket while a request is pending (a dead daemon).
constexpr int64_t kAliveEveryNs = 1'000'000;
// A registration's wait for the daemon's answer (DaemonComm::call) naps without the comm's lock
// between looks: first kCallFirstNapNs, doubling up to kCallNapNs. The answer is seen at most
// about a nap after it came; the data path takes the lock between looks.
constexpr int64_t kCallFirstNapNs = 20'000;
constexpr int64_t kCallNapNs = 1'000'000;

// Napping (GW_PLUGIN_NAP_US): NCCL's proxy thread calls test() in a loop. In daemon mode the
// daemon moves the bytes, so on a host with fewer cores than runnable threads a proxy that only
// yields between looks takes the core from the daemon it waits for (two namespace hosts on two
// cores: the plugin processes ran 3.3-3.7 s of CPU against the daemons' 2 s, 11000-13000 context
// switches each). Once a request has been pending kNapAfterNs, test() sleeps instead until any
// daemon-mode comm of the process gets a completion (their eventfds, NapSet) or the nap ends;
// a request that completes sooner (a small message's round trip) never naps.
constexpr int64_t kNapAfterNs = 100'000;

// GW_PLUGIN_NAP_US, read once: -1 (auto) is 200 us on hosts with fewer than 8 online CPUs (where
// a spinning proxy competes with the daemon) and 0 (yield, as NCCL's own transports spin)
// elsewhere; at most 10 ms.
inline int64_t nap_us() {
  static const int64_t us = [] {
    int64_t v = config::get_int(plugin_config::kPluginNapUs);
    if (v < 0) v = sysconf(_SC_NPROCESSORS_ONLN) < 8 ? 200 : 0;
    return std::min<int64_t>(v, 10'000);
  }();
  return us;
}

// The completion eventfds of the process's daemon-mode comms. A nap polls them all, so that a
// comm's completion ends another comm's nap (one proxy thread serves many connections), and
// drains the readable ones (each comm finds its completions in its ring, not by the eventfd; a
// registration waiting in Client::wait_for looks at the ring at least every 10 ms). The set
// holds its own duplicate of each descriptor (the same eventfd), which a nap keeps open while it
// polls: a comm that goes meanwhile neither waits for the nap nor has its number reused under it.
class NapSet {
 public:
  static NapSet& get() {
    static NapSet* set = new NapSet;  // never destroyed: comms may outlive static destruction
    return *set;
  }
  // Adds owner's eventfd fd (duplicated); false when it cannot be duplicated (no nap sees it).
  bool add(const void* owner, int fd) {
    const int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (d < 0) return false;
    auto held = std::shared_ptr<const int>(new int(d), [](const int* p) {
      ::close(*p);
      delete p;
    });
    std::lock_guard<std::mutex> lock(mu_);
    fds_.emplace_back(owner, std::move(held));
    return true;
  }
  void remove(const void* owner) {
    std::lock_guard<std::mutex> lock(mu_);
    fds_.erase(std::remove_if(fds_.begin(), fds_.end(),
                              [owner](const auto& e) { return e.first == owner; }),
               fds_.end());
  }
  // Sleeps until one of the eventfds is readable or us pass; drains the readable ones.
  void nap(int64_t us) {
    thread_local std::vector<std::shared_ptr<const int>> held;
    thread_local std::vector<pollfd> polled;
    held.clear();
    polled.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& e : fds_) held.push_back(e.second);
    }
    for (const auto& fd : held) polled.push_back(pollfd{*fd, POLLIN, 0});
    const timespec ts{static_cast<time_t>(us / 1'000'000),
                      static_cast<long>(us % 1'000'000) * 1000};
    if (::ppoll(polled.data(), polled.size(), &ts, nullptr) > 0) {
      for (const pollfd& p : polled) {
        if (p.revents & POLLIN) daemon::drain_eventfd(p.fd);
      }
    }
    held.clear();  // the last holder of a gone comm's duplicate closes it
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<const void*, std::shared_ptr<const int>>> fds_;
};

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

inline void put_size(uint8_t* p, uint64_t v) {
  for (size_t i = 0; i < kSizeBytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t get_size(const uint8_t* p) {
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
  size_t size = 0;               // send: the message; recv: the buffer
  size_t total = 0;              // recv: the message's size once known
  bool known = false;            // recv: total is known (the first chunk arrived)
  bool started = false;          // the first chunk is submitted
  int64_t pending_since_ns = 0;  // when test() first found it not done (0: not yet)
  size_t next = 0;  // payload bytes submitted (send) or asked for (recv), the first's included
  size_t got = 0;   // recv: payload bytes arrived and copied out
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
// while its proxy thread moves the data on another. A registration holds mu_ only while it uses
// the client, never while it waits for the daemon's answer (call()): the daemon may hold that
// answer for seconds, and test() / isend / irecv go on meanwhile.
//
// Every call moves the whole comm (pump): it reads the completions of every request's chunks
// (copying a receive's chunk out while the later ones move), then submits what is due in posting
// order, keeping each tag's chunks in message order.
class DaemonComm {
 public:
  DaemonComm(std::unique_ptr<Client> client, std::string name, int peer, int64_t timeout_ms)
      : client_(std::move(client)), name_(std::move(name)), peer_(peer), timeout_ms_(timeout_ms) {
    (void)NapSet::get().add(this, client_->completion_fd());
  }
  ~DaemonComm() { NapSet::get().remove(this); }
  DaemonComm(const DaemonComm&) = delete;
  DaemonComm& operator=(const DaemonComm&) = delete;

  // A request slot not in use (mu_ held), or nullptr when all are taken (NCCL calls again).
  DaemonRequest* free_request_locked() {
    for (DaemonRequest& q : reqs_) {
      if (!q.in_use) return &q;
    }
    return nullptr;
  }

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
    DaemonRequest* r = free_request_locked();
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
    std::unique_lock<std::mutex> lock(mu_);
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
      // C ABI's client does while it waits), or naps once the request has waited a while.
      const int64_t now = sys::now_ns();
      if (r->pending_since_ns == 0) r->pending_since_ns = now;
      if (now - last_alive_ns_ >= kAliveEveryNs) {
        last_alive_ns_ = now;
        st = client_->check_alive(what);
      }
      if (st.ok()) {
        const int64_t nap = nap_us_;
        const bool napping = nap > 0 && now - r->pending_since_ns >= kNapAfterNs;
        lock.unlock();
        if (napping) {
          NapSet::get().nap(nap);
        } else {
          sched_yield();
        }
        return ok_status();
      }
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
  // Waits for the answer without the comm's lock (call()).
  Result<uint32_t> register_dmabuf(int fd, uint64_t offset, size_t size, bool send) {
    const char* what = "regMrDmaBuf";
    std::unique_lock<std::mutex> lock(mu_);
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
    GW_RETURN_IF_ERROR(call(lock, e, what, &info));
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
    DaemonRequest* r = free_request_locked();
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
  // deregMr of registration id. *refused: the daemon answered with an error (an op still names
  // the id): the registration stays in the daemon and the caller keeps its handle to try again.
  // Otherwise the registration is gone, with the comm's connection when that failed. Waits for
  // the answer without the comm's lock (call()).
  Status deregister_dmabuf(uint32_t id, bool* refused) {
    std::unique_lock<std::mutex> lock(mu_);
    *refused = false;
    SqEntry e{};
    e.opcode = static_cast<uint16_t>(Opcode::kDeregisterDmabuf);
    e.spec_len = id;
    Status s = call(lock, e, "deregMr");
    *refused = !s.ok() && client_->check_alive("deregMr").ok();
    return s;
  }

 private:
  // One request the daemon answers by itself (not a message): posted, then waited for until
  // GW_TIMEOUT_MS. `lock` holds mu_ on entry and on return, but not while the answer is awaited
  // (the daemon may hold a registration's answer for seconds: docs/wire-daemon.md): each look
  // reads the completions under it without waiting (kNoWait) and checks that the daemon still
  // holds the connection, then it is released for a nap (kCallFirstNapNs doubling up to
  // kCallNapNs), so that the data path runs meanwhile. Whoever reads the client's completions
  // keeps the others' for them: the data path's reap keeps this one's, and this the data path's.
  Status call(std::unique_lock<std::mutex>& lock, const SqEntry& e, const char* what,
              daemon::CompressedDone* info = nullptr) {
    GW_ASSIGN_OR_RETURN(uint64_t seq, client_->post(e, what));
    const sys::Deadline deadline = sys::deadline_after_ms(timeout_ms_);
    int64_t nap_ns = kCallFirstNapNs;
    for (;;) {
      bool done = false;
      Status st = client_->wait_for(seq, sys::kNoWait, &done, what, info);
      if (done) return st;  // the answer, or the connection broke (its Status)
      GW_RETURN_IF_ERROR(client_->check_alive(what));
      const int64_t left_ns = sys::ns_until(deadline);
      if (left_ns <= 0) {
        return client_->broken(
            timeout_error("{}: gradwired did not answer within {} ms", what, timeout_ms_));
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::nanoseconds(std::min(nap_ns, left_ns)));
      lock.lock();
      nap_ns = std::min(nap_ns * 2, kCallNapNs);
    }
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
  // regMrDmaBuf / deregMr) share the client (not thread-safe): one call at a time. A
  // registration releases it while it waits for the daemon (call()).
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
  const int64_t nap_us_ = nap_us();
};

}  // namespace gw::plugin::daemon_mode
