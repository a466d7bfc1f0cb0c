// The trainer's side of gradwired's client protocol (docs/wire-daemon.md): the connection to the
// daemon's socket, the hello and the welcome, the shared arena with its two rings (daemon/ring.h)
// and its data region's allocator, and the waits for completions. What to submit, and where the
// caller's buffers go, is the session's business (capi/daemon_session.h).
//
// Every wait has a deadline. Once the connection is unusable (the daemon closed it, a malformed
// completion, a ring that stays full) every later call fails with the same Status (broken()).
//
// Thread-compatible: one caller at a time (DaemonSession holds its lock around every call), except
// abort() and aborted(), which are thread-safe.
#pragma once

#include <sys/socket.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "core/sys/fd.h"
#include "core/sys/memfd_region.h"
#include "core/sys/time.h"
#include "daemon/arena_allocator.h"
#include "daemon/protocol.h"
#include "daemon/ring.h"

namespace gw::daemon {

// Whether the process that answered on the daemon's socket may be given this trainer's hello (its
// job and store tokens): `daemon` is its SO_PEERCRED, `self` the trainer's effective uid, `group`
// GW_DAEMON_GROUP's gid when set (the daemon's gid or one of `daemon_groups` must match it).
// kPeer naming the uid found otherwise.
Status check_daemon_peer(const ucred& daemon, uid_t self, const gid_t* group,
                         const std::vector<gid_t>& daemon_groups, const std::string& path);

// The one answer, kPeer, when no gradwired answers at `path`, whichever way it is found: no file
// there, or a socket file nobody listens on (a gradwired that died left it; connect is refused).
// It names the path and what is there, and says what to do. Looks at `path` itself (stat).
Status no_daemon_error(const std::string& path);

class Client {
 public:
  // Connects to the daemon listening on `path` (retrying while it may still be starting: until
  // the hello's deadline, at most 10 s), sends `hello`, reads the welcome and maps the arena.
  // Before sending anything it checks who answered (check_daemon_peer): a process of another uid
  // listening on `path` gets no token. The daemon's refusal comes back as its Status with its
  // message. spin_ns: how long wait_for()
  // busy-polls the completion ring before sleeping (GW_DAEMON_SPIN_US).
  static Result<std::unique_ptr<Client>> connect(const std::string& path, const Hello& hello,
                                                 int64_t spin_ns);
  // Tells the daemon, through the arena, that this trainer leaves on purpose (client_leaving)
  // before the connection closes: its job then ends rather than fails.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The arena as the daemon described it (sizes, rings, the transport among the daemons).
  const Welcome& welcome() const { return geo_; }
  // The data region: welcome().data_bytes bytes that the submissions' offsets point into.
  uint8_t* data() const { return data_; }
  // Whether [p, p + bytes) lies in the data region; *off its offset there.
  bool in_data(const void* p, size_t bytes, uint64_t* off) const;
  // The data region's allocator (first fit; kNoMemory when nothing fits).
  Result<uint64_t> alloc(uint64_t bytes) { return alloc_.alloc(bytes); }
  Status free(uint64_t off) { return alloc_.free(off); }

  // A buffer's place in the data region: its own (it lies there) or staging (copied).
  struct Placed {
    uint64_t off = 0;
    bool staged = false;
  };
  // Where [p, p + bytes) goes: its own place, or staging from the allocator (copied in when
  // copy_in); kNoMemory saying so when staging does not fit.
  Result<Placed> place(const void* p, size_t bytes, bool copy_in);
  void unplace(const Placed& p);
  // allreduce's two buffers: sendbuf copied in if staged; recvbuf its own place, or sendbuf's
  // when in place. unplace_pair frees both (once when in place).
  Result<std::pair<Placed, Placed>> place_pair(const void* sendbuf, void* recvbuf, size_t bytes);
  void unplace_pair(const Placed& s, const Placed& r, bool in_place);

  // Puts one submission in the ring (its seq filled in), first waiting for completions (kept for
  // their callers) while the ring holds as many as it can; returns its sequence number.
  Result<uint64_t> post(SqEntry e, const char* what);
  // Until seq's completion is read (*done; its status returned, with `what` as context) or the
  // deadline passes (kTimeout, *done false; the collective goes on). A broken connection or an
  // abort ends it with *done true. *info (when given) gets what an allreduce_compressed's
  // completion carried.
  Status wait_for(uint64_t seq, sys::Deadline deadline, bool* done, const char* what,
                  CompressedDone* info = nullptr);
  // Without waiting: whether the daemon still holds the connection (its socket is not readable:
  // the daemon never writes after the welcome). A closed one breaks the client (kPeer). For
  // callers that poll with kNoWait (the NCCL plugin's test()), which never reach wait_for's poll.
  Status check_alive(const char* what);
  // The eventfd the daemon writes when it posts a completion while this side is not busy-polling
  // (daemon/ring.h): for a caller that sleeps on several clients at once (the NCCL plugin's
  // test(), plugin/daemon_comm.h), which may drain it. wait_for's sleep is sliced (kWaitSliceMs)
  // so that a wake-up drained there costs it at most a slice.
  int completion_fd() const { return cq_.wake_fd(); }
  // post, then wait_for with the hello's deadline (its expiry breaks the connection).
  Status submit(SqEntry e, const char* what, CompressedDone* info = nullptr);
  // Marks the connection unusable with s (the first such Status stays) and returns s.
  Status broken(Status s);

  // Version 8: lends the descriptor `fd` (a dma-buf) to the daemon in a descriptor record under
  // a new ticket (protocol.h FdRecord) and returns the ticket, for the register_dmabuf the caller
  // posts next. The caller keeps (and closes) its descriptor. kInvalidArg for a value that is not
  // an open descriptor of this process (nothing is sent); a failed send breaks the connection.
  Result<uint32_t> pass_fd(int fd, const char* what);

  // Ends every wait at once, and every later call, with kAborted. Thread-safe.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  Client() = default;
  // Reads every completion posted into done_.
  Status drain_completions();
  // Until fewer than sq_entries submissions are open (completions read meanwhile are kept).
  Status wait_room(sys::Deadline deadline, const char* what);

  std::string path_;
  int64_t timeout_ms_ = 0;
  int64_t spin_ns_ = 0;
  sys::Fd sock_;
  sys::Fd sq_efd_, cq_efd_, abort_efd_;
  sys::MemfdRegion arena_;
  Welcome geo_;
  uint8_t* data_ = nullptr;
  RingProducer<SqEntry> sq_;
  RingConsumer<CqEntry> cq_;
  uint64_t completed_ = 0;  // completions read
  // Submissions posted whose completion has not been read: sends and receives (version 7)
  // complete in any order, so a completion may answer any of them, once.
  std::set<uint64_t> open_;
  struct Done {
    Status status;
    CompressedDone info;
  };
  std::map<uint64_t, Done> done_;  // read, not yet claimed by their caller
  ArenaAllocator alloc_{0};
  uint32_t next_ticket_ = 1;
  Status broken_;  // set once the connection is unusable
  std::atomic<bool> aborted_{false};
};

}  // namespace gw::daemon
