// A worker's side of a store: one connection per server, each with a sender thread (the pending
// frames in order: clock, then priority, then issue order) and a receiver thread (replies
// complete the requests, pull replies land in the caller's buffer). Partition p of key k goes to
// server (splitmix64(k) + p) % S, in chunks of config.chunk_bytes (each chunk its own unit on
// that server, so the server sums and answers a chunk once every worker pushed it).
// Thread-compatible: one caller at a time issues requests; requests are waited on from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives/types.h"
#include "core/status.h"
#include "core/sys/time.h"
#include "kv/push_codec.h"
#include "kv/wire.h"

namespace gw::kv {

uint64_t splitmix64(uint64_t x);
// The server of partition p of key k among `servers` servers.
inline uint32_t server_of(uint64_t key, uint32_t partition, uint32_t servers) {
  return static_cast<uint32_t>((splitmix64(key) + partition) % servers);
}

// One request (init, push, pull, pushpull, clock) over its partitions' frames.
class Op {
 public:
  explicit Op(sys::Deadline deadline) : deadline_(deadline) {}
  // Waits until every frame is answered or the deadline (min of the op's and `until`).
  // kTimeout when still running; with `cancel_on_timeout`, the op is then abandoned: its buffer
  // is never written afterwards.
  Status wait(sys::Deadline until, bool cancel_on_timeout);
  bool done();
  Status result();

 private:
  friend class Client;
  friend class ServerLink;
  std::mutex mu;
  std::condition_variable cv;
  size_t pending = 0;
  bool cancelled = false;
  int reading = 0;  // receivers writing into the op's buffer now (not under mu)
  int writing = 0;  // senders reading the op's buffer now: the caller keeps it until they end
  Status status;
  const sys::Deadline deadline_;
  // Completes one frame: the first error wins.
  void finish_one(const Status& s);
  // The op is over for its caller: every frame answered and no sender still in the buffer.
  bool over() const { return pending == 0 && writing == 0; }
};

struct ClientOptions {
  uint32_t rank = 0;
  uint64_t store_id = 0;
  StoreConfig config;
  // The chunk of a streamed partition: -1 = GW_KV_CHUNK_BYTES (config.chunk_bytes is set from it
  // at connect); 0 = whole partitions. At least partition_bytes is whole partitions too.
  int64_t chunk_bytes = -1;
  std::string token;
  int64_t timeout_ms = 30000;
  std::vector<std::string> servers;  // addresses, by server index
};

struct ClientStats {
  uint64_t clock = 0;
  uint64_t min_clock = 0;
  uint64_t dropped = 0;
  uint64_t lost = 0;
};

class ServerLink;

class Client {
 public:
  enum class Kind { kInit, kPush, kPull, kPushPull };
  // Connects to every server and says hello; waits for their answers (the deadline).
  static Result<std::unique_ptr<Client>> connect(const ClientOptions& options);
  ~Client();

  // The local checks (unknown key, count, dtype; a second push in one clock under bsp/sync), then
  // one frame per partition, queued. Init of a known key checks its shape again.
  Result<std::shared_ptr<Op>> start(Kind kind, uint64_t key, const void* value, void* out,
                                    size_t count, coll::DataType dtype, int priority);
  // Ends the clock: a Clock frame to every server after everything queued; waits for the acks.
  Status clock();
  ClientStats stats() const;
  // Says goodbye to every server (pending requests: kAborted). Idempotent.
  Status close();
  // Not OK once a server failed or died: every later call returns it.
  Status broken() const;
  int64_t timeout_ms() const { return options_.timeout_ms; }

  // The store's push encoder and its residuals (null: raw pushes).
  const PushEncoder* encoder() const { return encoder_.get(); }

  // What the worker knows of a key: for the server-died message.
  std::string keys_of(uint32_t server) const;

 private:
  friend class ServerLink;
  struct Key {
    size_t count = 0;
    coll::DataType dtype = coll::DataType::kF32;
    uint32_t parts = 0;
    uint64_t pushed_clock = UINT64_MAX;  // bsp/sync: the clock this worker last pushed it in
  };
  explicit Client(const ClientOptions& options);
  void set_broken(const Status& s);
  // A reply's stats from server `server`.
  void note(uint32_t server, const Header& h);
  size_t part_elems(coll::DataType dtype) const;
  // Elements of one chunk (the unit a frame carries) of a partition of `dtype`.
  size_t chunk_elems(coll::DataType dtype) const;

  const ClientOptions options_;
  std::unique_ptr<PushEncoder> encoder_;  // options_.config.codec's (compressed pushes)
  std::vector<std::unique_ptr<ServerLink>> links_;
  std::map<uint64_t, Key> keys_;
  uint64_t clock_ = 0;
  uint64_t next_req_ = 1;
  bool closed_ = false;
  mutable std::mutex mu_;  // broken_, the stats below
  Status broken_;
  std::vector<uint64_t> min_clock_, dropped_, lost_, next_seen_;  // by server
};

}  // namespace gw::kv
