#include "collectives/group.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <map>
#include <tuple>

#include "core/bootstrap.h"

namespace gw::coll {
namespace {

// Renumbers host ids 0..H-1 in order of first appearance (the numbering hosts_from_map expects).
std::vector<int> renumber(const std::vector<int>& ids) {
  std::map<int, int> index;
  std::vector<int> out;
  out.reserve(ids.size());
  for (int id : ids) out.push_back(index.emplace(id, static_cast<int>(index.size())).first->second);
  return out;
}

// The kernel of each host (kernel_of_host_id of its identity, by host index), numbered in order of
// first appearance.
std::vector<int> kernels_of(const std::vector<std::string>& host_ids) {
  std::map<std::string, int> index;
  std::vector<int> out;
  out.reserve(host_ids.size());
  for (const std::string& id : host_ids) {
    out.push_back(
        index.emplace(kernel_of_host_id(id), static_cast<int>(index.size())).first->second);
  }
  return out;
}

Result<std::pair<int, int>> parse_color_key(const Bytes& v) {
  std::string s(v.begin(), v.end());
  const auto space = s.find(' ');
  int color = 0, key = 0;
  if (space != std::string::npos) {
    auto a = std::from_chars(s.data(), s.data() + space, color);
    auto b = std::from_chars(s.data() + space + 1, s.data() + s.size(), key);
    if (a.ec == std::errc() && b.ec == std::errc() && a.ptr == s.data() + space &&
        b.ptr == s.data() + s.size()) {
      return std::make_pair(color, key);
    }
  }
  return peer_error("split: malformed (color, key) entry '{}'", s);
}

}  // namespace

Group::Group(int rank, const std::vector<int>& host_of_rank)
    : rank_(rank), host_of_rank_(renumber(host_of_rank)) {
  index_hosts();
}

void Group::index_hosts() {
  hosts_ = hosts_from_map(host_of_rank_);
  const auto& mine = hosts_[host()];
  local_rank_ = static_cast<int>(std::find(mine.begin(), mine.end(), rank_) - mine.begin());
}

int Group::max_hosts_per_kernel() const {
  std::map<int, int> count;
  int most = 1;
  for (int k : kernel_of_host_) most = std::max(most, ++count[k]);
  return most;
}

int Group::max_local_size() const {
  size_t most = 0;
  for (const auto& h : hosts_) most = std::max(most, h.size());
  return static_cast<int>(most);
}

Result<Group> Group::create(const GroupOptions& o, Deadline deadline) {
  if (o.world_size < 1) return invalid_arg("communicator: world size {} < 1", o.world_size);
  if (o.rank < 0 || o.rank >= o.world_size) {
    return invalid_arg("communicator: rank {} out of range 0..{}", o.rank, o.world_size - 1);
  }
  if (!o.store) return invalid_arg("communicator: a store is required");
  Group g;
  g.rank_ = o.rank;
  const int world = o.world_size;
  auto prefix = next_communicator_prefix(*o.store, o.rank, deadline);
  if (!prefix.ok()) return prefix.status().with_context("communicator");
  g.prefix_ = *prefix;
  g.store_ = make_prefix_store(o.store, g.prefix_);

  if (!o.job_token.empty()) {
    g.token_ = o.job_token;
  } else {
    auto tok = agree_job_token(*g.store_, o.rank, deadline, world);
    if (!tok.ok()) return tok.status().with_context("communicator");
    g.token_ = *tok;
  }
  if (o.host_id.empty()) {
    g.host_id_ = host_identity();
    auto hosts = exchange_hosts(*g.store_, o.rank, world, deadline, o.mode, o.launcher);
    if (!hosts.ok()) return hosts.status().with_context("communicator");
    g.host_of_rank_ = hosts->host_of_rank;
    g.kernel_of_host_ = kernels_of(hosts->host_ids);
  } else {
    // The caller names the host: exchange those names the same way exchange_hosts does.
    g.host_id_ = o.host_id;
    GW_RETURN_IF_ERROR(g.store_->set(fmt::format("hostid/{}", o.rank),
                                     Bytes(g.host_id_.begin(), g.host_id_.end()), deadline));
    auto joined = gather_joined(
        *g.store_, world, [](int r) { return fmt::format("hostid/{}", r); }, deadline);
    if (!joined.ok()) return joined.status().with_context("communicator");
    std::vector<std::string> ids;
    for (int r = 0; r < world; ++r) {
      const Bytes& v = (*joined)[static_cast<size_t>(r)];
      std::string id(v.begin(), v.end());
      auto it = std::find(ids.begin(), ids.end(), id);
      g.host_of_rank_.push_back(static_cast<int>(it - ids.begin()));
      if (it == ids.end()) ids.push_back(id);
    }
    g.kernel_of_host_ = kernels_of(ids);
  }
  if (static_cast<int>(g.host_of_rank_.size()) != world) {
    return internal_error("communicator: host map has {} ranks, expected {}",
                          g.host_of_rank_.size(), world);
  }
  g.index_hosts();
  return g;
}

Result<std::optional<Group>> Group::split(int color, int key, Deadline deadline) {
  if (!store_) return invalid_arg("split: the group has no store");
  const int64_t n = splits_++;
  const std::string base = fmt::format("split{}/", n);
  const std::string mine = fmt::format("{} {}", color, key);
  GW_RETURN_IF_ERROR(
      store_->set(base + std::to_string(rank_), Bytes(mine.begin(), mine.end()), deadline)
          .with_context("split: publishing this rank's color and key"));
  // Every rank reads every entry: each needs the other colors' members only to skip them, but
  // reading them all keeps one code path and p is small (p gets per split).
  std::vector<std::tuple<int, int, int>> members;  // (key, parent rank, host) of my color
  for (int r = 0; r < size(); ++r) {
    Result<Bytes> v = r == rank_ ? Result<Bytes>(Bytes(mine.begin(), mine.end()))
                                 : store_->get(base + std::to_string(r), deadline);
    if (!v.ok()) {
      return v.status().with_context(fmt::format("split: waiting for rank {}'s color", r));
    }
    GW_ASSIGN_OR_RETURN(auto ck, parse_color_key(*v));
    if (color >= 0 && ck.first == color) members.emplace_back(ck.second, r, host_of_rank_[r]);
  }
  if (color < 0) return std::optional<Group>();
  std::sort(members.begin(), members.end());
  Group child;
  std::vector<int> hosts;
  for (size_t i = 0; i < members.size(); ++i) {
    if (std::get<1>(members[i]) == rank_) child.rank_ = static_cast<int>(i);
    hosts.push_back(std::get<2>(members[i]));
  }
  child.host_of_rank_ = renumber(hosts);
  if (!kernel_of_host_.empty()) {
    child.kernel_of_host_.assign(static_cast<size_t>(*std::max_element(child.host_of_rank_.begin(),
                                                                       child.host_of_rank_.end())) +
                                     1,
                                 0);
    for (size_t i = 0; i < hosts.size(); ++i) {
      child.kernel_of_host_[static_cast<size_t>(child.host_of_rank_[i])] =
          kernel_of_host_[static_cast<size_t>(hosts[i])];
    }
  }
  child.index_hosts();
  child.host_id_ = host_id_;
  child.token_ = token_;
  const std::string sub = fmt::format("{}{}/", base, color);
  child.prefix_ = prefix_ + sub;
  child.store_ = make_prefix_store(store_, sub);
  return std::optional<Group>(std::move(child));
}

}  // namespace gw::coll
