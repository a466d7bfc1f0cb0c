// Ranks as threads of one process (gloo's test style): one thread per rank, each with its own
// communicator over a memory store, on the in-process transport (tests/support/inproc_transport.h,
// a send completes only once its receive is posted) or on a registered backend.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/communicator_impl.h"
#include "core/status.h"
#include "core/store.h"

namespace gw::testing {

// How each rank's communicator is made.
struct RankOptions {
  // "inproc": the in-process transport (CommOptions::transport stays "auto"); otherwise the name
  // of a registered backend, handed to CommOptions::transport.
  std::string backend = "inproc";
  int64_t timeout_ms = 20000;
  // Rank r's host id is host_prefix + host_of[r]; empty: CommOptions' default (the host's own).
  std::vector<int> host_of;
  std::string host_prefix = "host-";
  // Applied last to each rank's options (any field; may override the above).
  std::function<void(coll::CommOptions&, int rank)> tweak;
};

// A transport factory for the in-process transport when backend is "inproc"; else none (the
// registry's).
coll::CommInternalOptions internal_options_for(const std::string& backend);

// Rank `rank` of `world`'s communicator over store, made as options say. Call it from the rank's
// own thread: creation waits for the other ranks.
Result<std::unique_ptr<coll::Communicator>> create_rank(const RankOptions& options, int rank,
                                                        int world,
                                                        const std::shared_ptr<Store>& store);

// Runs fn(rank) on n threads, one per rank, and joins them all.
void run_threads(int n, const std::function<void(int rank)>& fn);

// Runs fn(comm, rank) on n ranks as threads over a fresh memory store. A rank whose
// communicator cannot be made adds a test failure naming the rank and does not run fn.
void run_ranks(int n, const RankOptions& options,
               const std::function<void(std::unique_ptr<coll::Communicator>& comm, int rank)>& fn);

// Makes the n ranks' communicators as threads over a fresh memory store and returns each rank's
// result of creation (for tests of what creation refuses); the communicators are destroyed.
std::vector<Status> create_statuses(int n, const RankOptions& options);

}  // namespace gw::testing
