// The rendezvous store: a small key/value service hosted by rank 0 over TCP, used only while a
// communicator is set up (addresses, handles, host identities) and for barriers at teardown.
//
// Every call has a deadline; a missing key or a dead store ends in kTimeout / kPeer, never a
// hang. Keys are strings, values are bytes. The wire format is length-prefixed and every
// decoder is bounds-checked (docs/wire-store.md). Clients present the job token first; a
// server with a token refuses clients without it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/sys/time.h"

namespace gw {

// The store's deadlines are gw::sys's (core/sys/time.h); these names predate core/sys.
using sys::Clock;
using sys::Deadline;
using sys::deadline_after_ms;

using Bytes = std::vector<uint8_t>;

// Thread-safe: one Store may be used from several threads at once.
class Store {
 public:
  virtual ~Store() = default;
  virtual Status set(const std::string& key, const Bytes& value, Deadline deadline) = 0;
  // Blocks until the key exists or the deadline passes.
  virtual Result<Bytes> get(const std::string& key, Deadline deadline) = 0;
  // Atomically adds delta to an integer counter (created at 0) and returns the new value.
  virtual Result<int64_t> add(const std::string& key, int64_t delta, Deadline deadline) = 0;
  // Removes a key; missing keys are not an error.
  virtual Status erase(const std::string& key, Deadline deadline) = 0;
};

// Same keys seen through a prefix ("comm3/"), so several communicators share one store.
std::unique_ptr<Store> make_prefix_store(std::shared_ptr<Store> base, std::string prefix);

// In-process store for tests that run ranks as threads.
std::shared_ptr<Store> make_memory_store();

class TcpStoreServer;

// The TCP store server's limits (the host_server side); in TcpStoreOptions, 0 takes the
// configuration's value (GW_STORE_*, see docs/configuration.md), and the server holds them with
// every field resolved. Until a client's hello is accepted it may send one frame of at most a
// hello's size, must finish it within hello_timeout_ms, and counts against max_pending_hello (the
// oldest such client is dropped to make room); max_clients caps every connection, and at that cap
// a client still without hello is dropped first. An authenticated connection may set values of
// at most max_value_bytes, create at most max_keys_per_client keys and store at most
// max_bytes_per_client bytes of keys and values, and all connections together at most
// max_bytes_total; beyond them writes are refused. (A client opens a new connection after any
// error, with new budgets: max_bytes_total is what bounds the server's memory.)
struct TcpStoreLimits {
  int64_t hello_timeout_ms = 0;
  size_t max_clients = 0;
  size_t max_pending_hello = 0;
  size_t max_value_bytes = 0;
  size_t max_keys_per_client = 0;
  size_t max_bytes_per_client = 0;
  size_t max_bytes_total = 0;
};

// A client of the TCP store. If `host_server` is true (rank 0), a server is started first on
// host:port (port 0 picks a free one; see TcpStore::port()), with the limits of TcpStoreLimits.
struct TcpStoreOptions : TcpStoreLimits {
  std::string host = "127.0.0.1";
  int port = 0;
  bool host_server = false;
  std::string token;  // job token presented to / required by the server
  int64_t connect_timeout_ms = 30000;
};

class TcpStore : public Store {
 public:
  static Result<std::shared_ptr<TcpStore>> create(const TcpStoreOptions& options);
  ~TcpStore() override;
  int port() const;  // the server's port (useful when it was chosen by the kernel)
  Status set(const std::string& key, const Bytes& value, Deadline deadline) override;
  Result<Bytes> get(const std::string& key, Deadline deadline) override;
  Result<int64_t> add(const std::string& key, int64_t delta, Deadline deadline) override;
  Status erase(const std::string& key, Deadline deadline) override;

 private:
  struct Impl;
  explicit TcpStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Store-based barrier among `world` participants: every rank increments `key` and waits until
// it reaches `world`. Keys must be unique per use (callers add a sequence number).
Status store_barrier(Store& store, const std::string& key, int world, Deadline deadline);

// The last step of a set-up on a store that rank 0 hosts: every other rank says it is done with
// the store (under `key`), and rank 0 returns only once all `world - 1` have, so rank 0 may
// destroy its store as soon as it returns without taking it from a rank still reading. Unlike
// store_barrier, only rank 0 waits: a rank other than 0 never waits on a key rank 0 might not
// be there to serve. Keys must be unique per use, as for store_barrier.
Status store_release_host(Store& store, const std::string& key, int rank, int world,
                          Deadline deadline);

}  // namespace gw
