#include "tests/support/ranks.h"

#include <gtest/gtest.h>

#include <thread>

#include "tests/support/inproc_transport.h"

namespace gw::testing {

coll::CommInternalOptions internal_options_for(const std::string& backend) {
  coll::CommInternalOptions in;
  if (backend == "inproc") {
    in.transport_factory = [](const std::string&, const net::TransportOptions& t)
        -> Result<std::unique_ptr<net::Transport>> { return make_inproc_transport(t); };
  }
  return in;
}

Result<std::unique_ptr<coll::Communicator>> create_rank(const RankOptions& options, int rank,
                                                        int world,
                                                        const std::shared_ptr<Store>& store) {
  coll::CommOptions o;
  o.rank = rank;
  o.world_size = world;
  o.store = store;
  o.timeout_ms = options.timeout_ms;
  o.transport = options.backend == "inproc" ? "auto" : options.backend;
  if (!options.host_of.empty()) {
    o.host_id = options.host_prefix + std::to_string(options.host_of.at(static_cast<size_t>(rank)));
  }
  if (options.tweak) options.tweak(o, rank);
  return coll::create_communicator(o, internal_options_for(options.backend));
}

void run_threads(int n, const std::function<void(int rank)>& fn) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

void run_ranks(int n, const RankOptions& options,
               const std::function<void(std::unique_ptr<coll::Communicator>& comm, int rank)>& fn) {
  auto store = make_memory_store();
  run_threads(n, [&](int r) {
    auto comm = create_rank(options, r, n, store);
    if (!comm.ok()) {
      ADD_FAILURE() << "rank " << r << ": " << comm.status().to_string();
      return;
    }
    fn(*comm, r);
  });
}

std::vector<Status> create_statuses(int n, const RankOptions& options) {
  auto store = make_memory_store();
  std::vector<Status> status(static_cast<size_t>(n));
  run_threads(n, [&](int r) {
    status[static_cast<size_t>(r)] = create_rank(options, r, n, store).status();
  });
  return status;
}

}  // namespace gw::testing
