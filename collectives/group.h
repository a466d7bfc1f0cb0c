// A Group: the ranks of one communicator and where they run. It knows each rank's host (the host
// map every rank agreed through the store), the ranks grouped by host (HostRanks), this rank's
// local rank, the job token, and the store prefix the communicator's keys live under.
//
// A Group is a value: copying it shares the store. Groups made from a bare host map (no store)
// serve the cost model, the algorithm table and tests; create() and split() need a store.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "collectives/schedule.h"
#include "core/status.h"
#include "core/store.h"

namespace gw::coll {

struct GroupOptions {
  int rank = -1;
  int world_size = -1;
  std::shared_ptr<Store> store;  // required
  std::string job_token;         // "" : agree one through the store (GW_JOB_TOKEN wins if set)
  std::string host_id;           // "" : bootstrap host_identity() (GW_HOSTID)
  // How the C ABI runs this rank ("direct", "daemon"; "": not compared): exchanged with the host
  // map, so a job whose ranks differ fails at once on every rank (exchange_hosts).
  std::string mode;
  // How the rank learned its rank and world size (LaunchInfo::source; "": not compared).
  std::string launcher;
};

class Group {
 public:
  // A group without a store: rank `rank` of host_of_rank.size() ranks, rank r on host
  // host_of_rank[r] (any integers: equal values mean the same host). Requires
  // 0 <= rank < host_of_rank.size().
  Group(int rank, const std::vector<int>& host_of_rank);

  // Collective over options.world_size ranks that share options.store: numbers the group on the
  // store (every rank must create its groups on one store in the same order), agrees the job
  // token and exchanges host identities. Blocks until every rank has published, or the deadline.
  static Result<Group> create(const GroupOptions& options, Deadline deadline);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(host_of_rank_.size()); }
  // Host index of every rank, 0..nhosts()-1 in order of first appearance.
  const std::vector<int>& host_of_rank() const { return host_of_rank_; }
  const HostRanks& hosts() const { return hosts_; }
  int nhosts() const { return static_cast<int>(hosts_.size()); }
  int host() const { return host_of_rank_[rank_]; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return static_cast<int>(hosts_[host()].size()); }
  // Ranks on the largest host.
  int max_local_size() const;
  // The most hosts of this group that share one kernel, hence its CPUs (kernel_of_host_id:
  // namespace or container "hosts" of one machine); 1 when the identities do not tell.
  int max_hosts_per_kernel() const;
  bool multi_host() const { return hosts_.size() > 1; }
  bool same_host(int peer) const { return host_of_rank_[peer] == host(); }

  const std::string& host_id() const { return host_id_; }
  const std::string& token() const { return token_; }
  // This group's view of the store (keys under its own prefix); null without a store.
  Store* store() const { return store_.get(); }
  const std::string& prefix() const { return prefix_; }

  // Collective over this group (every rank calls it, in the same order as its other splits):
  // ranks passing the same color form a new group, ranked by key and then by rank in this group.
  // A rank passing color < 0 joins none and gets nullopt. The new group shares this group's
  // store under a prefix of its own, the token and the host identities.
  Result<std::optional<Group>> split(int color, int key, Deadline deadline);

 private:
  Group() = default;
  void index_hosts();

  int rank_ = 0;
  std::vector<int> host_of_rank_;
  HostRanks hosts_;
  std::vector<int> kernel_of_host_;  // by host index; empty: every host its own kernel
  int local_rank_ = 0;
  std::string host_id_;
  std::string token_;
  std::shared_ptr<Store> store_;
  std::string prefix_;
  int64_t splits_ = 0;  // split() calls so far: numbers each split's keys
};

}  // namespace gw::coll
